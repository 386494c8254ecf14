"""CPU per API request: an aiohttp session that trusts the environment vs the operator's (issue 13).

kubernetes_asyncio, the client the operator used before its own, made its session with
``trust_env=True``: aiohttp reads the proxy variables and looks ``~/.netrc`` up in a worker
thread on every request. ``anarchon.kube.api.client.Kube`` makes its session with
``trust_env=False``. Both are measured side by side in one run, against a small aiohttp
server on 127.0.0.1 (the server's own CPU is in a separate process and not counted), so the
ratio is the client's overhead alone.

    PYTHONPATH=operator:. python bench/bench_client.py [--requests 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import time

import aiohttp
from aiohttp import web


def _serve(port: int) -> None:
    async def ok(_: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "status": "Success"})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/default", ok)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


async def _cpu_per_request(port: int, trust_env: bool, n: int) -> float:
    """Process CPU seconds per request, over ``n`` requests, 8 in flight (as a busy replica)."""
    url = f"http://127.0.0.1:{port}/api/v1/namespaces/default"
    async with aiohttp.ClientSession(trust_env=trust_env) as session:

        async def one() -> None:
            async with session.get(url) as response:
                await response.read()

        for _ in range(50):  # warm up the pool
            await one()
        began = time.process_time()
        for _ in range(n // 8):
            await asyncio.gather(*(one() for _ in range(8)))
        return (time.process_time() - began) / (n // 8 * 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = multiprocessing.Process(target=_serve, args=(port,), daemon=True)
    server.start()
    try:
        time.sleep(1.0)
        results: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(3):  # interleaved, so machine noise hits both sides alike
            for trust in (True, False):
                results[trust].append(asyncio.run(_cpu_per_request(port, trust, args.requests)))
    finally:
        server.terminate()
    library, ours = min(results[True]), min(results[False])
    print(f"client CPU per request, best of 3 x {args.requests} requests:")
    print(f"  trust_env=True  (kubernetes_asyncio's)     : {library * 1e6:7.1f} µs")
    print(f"  trust_env=False (anarchon.kube.api.client.Kube):     {ours * 1e6:7.1f} µs")
    print(f"  ratio ours / library: {ours / library:.2f}")


if __name__ == "__main__":
    main()
