"""``anarchon ui``: a local web page of the jobs, the timeline of their runs and each run's story, live.

It serves on 127.0.0.1 only by default and acts with the user's own kubeconfig: what they may
read and do is what their RBAC allows, as with kubectl; it adds no endpoint to the cluster.
The page is kept live by the watches the replicas use (see :mod:`anarchon.ui`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import sys

from .common import Failure, add_kube_args, default_namespace, report

DEFAULT_PORT = 8090

DESCRIPTION = """\
A web page on this machine: the jobs (schedule in words, suspended and why, Ready or Invalid,
active runs, last outcome, success of the kept runs, next times), a timeline of their runs
(coloured by phase; tries, takeovers and skipped or missed slots marked; slot time apart from
the Pod's start) and each run's story (attempts, tries and Pods, Events, the Pod's last log
lines). It updates itself as things change. Trigger, suspend, resume and cancel each ask for
confirmation and are done with your own credentials; the API server's answer is shown, a
refusal in its own words.

It listens on 127.0.0.1 only (--address other than loopback opens it to other hosts, with your
credentials behind it: a warning is printed). --port 0 picks a free port; the URL is printed.
"""


def _port(value: str) -> int:
    if not value.isascii() or not value.isdigit() or int(value) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {value!r}")
    return int(value)


def loopback(address: str) -> bool:
    """Whether only this machine can reach ``address``: localhost, 127.0.0.0/8, ::1."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, not known to be loopback


def run(args: argparse.Namespace) -> int:
    from ..kube.api.client import CredentialsError, connect
    from ..ui.server import serve

    if not loopback(args.address):
        print(
            f"anarchon ui: warning: listening on {args.address}, not loopback: anyone who reaches it "
            "acts with your Kubernetes credentials",
            file=sys.stderr,
            flush=True,
        )
    namespaces = [] if args.all_namespaces else [args.namespace or default_namespace(args.kubeconfig)]
    scope = "every namespace" if args.all_namespaces else f"namespace {namespaces[0]}"

    def ready(url: str) -> None:
        print(f"anarchon ui: {url} ({scope}; Ctrl-C stops it)", flush=True)

    async def go() -> int:
        try:
            kube = await connect(args.kubeconfig)
        except CredentialsError as exc:
            raise Failure(str(exc), 2) from None
        try:
            await serve(
                kube,
                namespaces,
                address=args.address,
                port=args.port,
                scope=scope,
                action_timeout_s=args.request_timeout,
                ready=ready,
            )
        except OSError as exc:
            raise Failure(f"cannot listen on {args.address}:{args.port}: {exc.strerror or exc}") from None
        finally:
            await kube.close()
        return 0

    try:
        with contextlib.suppress(KeyboardInterrupt):
            return asyncio.run(go())
    except Failure as failure:
        return report("ui", failure)
    return 0


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ui = sub.add_parser(
        "ui",
        help="a local web page of the jobs, their runs over time and each run's story, live",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_kube_args(ui)
    ui.add_argument("--all-namespaces", "-A", action="store_true", help="the jobs of every namespace")
    ui.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"the port (default {DEFAULT_PORT}; 0: any free)")
    ui.add_argument(
        "--address", default="127.0.0.1", help="the address to listen on (default 127.0.0.1; another one warns)"
    )
    ui.set_defaults(func=run)
