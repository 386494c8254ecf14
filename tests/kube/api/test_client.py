"""The operator's API client against the real test API server: requests, errors, credentials.

The client is a thin one over aiohttp; credentials are read by :mod:`anarchon.kube.api.kubeconfig`,
which hands only ``exec`` plugins and auth providers to kubernetes_asyncio's loader.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from controlplane import ControlPlane

from anarchon.engine.lag import LoopLag
from anarchon.kube.api import kubeconfig
from anarchon.kube.api.client import (
    ApiException,
    CredentialsError,
    _Turns,
    backlog_ms,
    call,
    connect,
    in_background,
    path,
)
from tests.faults.apiproxy import ApiFaultProxy, Fault

REVIEW = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


async def _who(kube: Any) -> str:
    """The user the API server takes the client for."""
    review = await kube.request("POST", REVIEW, {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return str(review["status"]["userInfo"]["username"])


async def _who_with(config_file: Path) -> str:
    """The user the API server takes a client connected with ``config_file`` for."""
    kube = await connect(str(config_file))
    try:
        return await _who(kube)
    finally:
        await kube.close()


def _config(cp: ControlPlane, cluster: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "ns-of-x"}}],
        "current-context": "x",
    }


async def test_requests_ignore_proxy_variables_and_netrc(
    control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The requests go straight to the API server whatever the environment says.

    A session with ``trust_env=True`` (kubernetes_asyncio's) sent them to the proxy named here,
    a closed port, and looked ``.netrc`` up in a thread on every request.
    """
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # discard port: nothing listens
    kube = await connect(str(control_plane.kubeconfig))
    try:
        listing = await kube.request("GET", "/api/v1/namespaces", timeout_s=10)
        assert any(ns["metadata"]["name"] == "default" for ns in listing["items"])
        assert kube.session.trust_env is False
    finally:
        await kube.close()


async def test_close_leaves_no_session_open(control_plane: ControlPlane) -> None:
    kube = await connect(str(control_plane.kubeconfig))
    await kube.request("GET", "/api/v1/namespaces", timeout_s=10)
    session = kube.session
    await kube.close()
    assert session.closed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del kube, session
        gc.collect()
    assert not [w for w in caught if "Unclosed" in str(w.message)]


async def test_an_error_status_is_an_api_exception_with_the_servers_message(
    control_plane: ControlPlane, crds: ControlPlane, namespace: str
) -> None:
    kube = await connect(str(control_plane.kubeconfig))
    try:
        with pytest.raises(ApiException) as missing:
            await kube.request("GET", path("anarchonruns", namespace, "nope"))
        assert (missing.value.status, missing.value.reason) == (404, "Not Found")
        assert '"nope" not found' in missing.value.message
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "twice"}}
        await kube.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", body)
        with pytest.raises(ApiException) as again:
            await kube.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", body)
        assert again.value.status == 409 and "already exists" in again.value.message
    finally:
        await kube.close()


async def test_no_more_than_api_concurrency_requests_are_in_flight_and_the_rest_wait(
    control_plane: ControlPlane,
) -> None:
    """Forty requests at once against a slow API server: at most API_CONCURRENCY reach it together,
    and every one of them succeeds (the wait for a turn is not the request's timeout).

    Before, the client's pool let 100 through at once (all 40 here): under overload the API
    server, not the replica, did the queueing, and answered with 429s, 500s and timeouts.
    """
    with ApiFaultProxy(control_plane) as proxy:
        proxy.add(Fault("latency", seconds=0.3, verb="list", resource="namespaces"))
        kube = await connect(str(proxy.kubeconfig), api_concurrency=4)  # the operator's --api-concurrency
        try:
            listings = await asyncio.gather(
                *(call("listing", lambda: kube.request("GET", "/api/v1/namespaces")) for _ in range(40))
            )
        finally:
            await kube.close()
        assert all(any(ns["metadata"]["name"] == "default" for ns in listing["items"]) for listing in listings)
        assert proxy.count(verb="list", resource="namespaces") == 40
        assert 2 <= proxy.max_in_flight <= 4, proxy.max_in_flight


async def test_background_requests_wait_until_no_other_request_waits(control_plane: ControlPlane) -> None:
    """One turn, held by a slow request; three background requests queue, then three others:
    the three others go first, then the background ones, each group in its order.

    At 3,000 jobs a minute the records of skipped slots, Events and job statuses queued before
    the Pods and runs of the slots a replica won (one queue, first come first served), which
    made those runs late, and their jobs' next slots skipped too.
    """
    with ApiFaultProxy(control_plane) as proxy:
        proxy.add(Fault("latency", seconds=0.5, verb="get", resource="namespaces", name="first"))
        kube = await connect(str(proxy.kubeconfig), api_concurrency=1)

        async def read(name: str) -> None:
            with contextlib.suppress(ApiException):  # 404: no such namespace, the request went all the same
                await call(f"reading {name}", lambda: kube.request("GET", f"/api/v1/namespaces/{name}"))

        try:
            first = asyncio.create_task(read("first"))
            await asyncio.sleep(0.2)  # it holds the one turn
            queued = [asyncio.create_task(in_background(read(f"background{i}"))) for i in range(3)]
            queued += [asyncio.create_task(read(f"urgent{i}")) for i in range(3)]
            await asyncio.wait_for(asyncio.gather(first, *queued), 30)
        finally:
            await kube.close()
        order = [r.name for r in proxy.requests if r.resource == "namespaces"]
        assert order == ["first", "urgent0", "urgent1", "urgent2", "background0", "background1", "background2"]


async def test_the_backlog_is_how_long_the_oldest_request_has_waited_for_a_turn(control_plane: ControlPlane) -> None:
    """What the engine counts as lag (a replica whose requests queue leaves new slots to the
    others): the wait of the oldest request queued for a turn, background work aside."""
    lag = LoopLag()
    lag.add_backlog(backlog_ms)
    with ApiFaultProxy(control_plane) as proxy:
        proxy.add(Fault("latency", seconds=2.5, verb="get", resource="namespaces", name="default", times=1))
        kube = await connect(str(proxy.kubeconfig), api_concurrency=1)

        async def read() -> None:
            await call("reading", lambda: kube.request("GET", "/api/v1/namespaces/default"))

        try:
            held = asyncio.create_task(read())
            await asyncio.sleep(0.3)  # it holds the one turn
            waiting = [asyncio.create_task(in_background(read()))]
            await asyncio.sleep(1.0)
            assert backlog_ms() == 0.0 and lag.penalty_ms() == 0  # background work only
            waiting.append(asyncio.create_task(read()))
            await asyncio.sleep(1.0)
            assert 900 <= backlog_ms() <= 1_500, backlog_ms()
            assert lag.penalty_ms() >= 900
            await asyncio.wait_for(asyncio.gather(held, *waiting), 30)
            assert backlog_ms() == 0.0
        finally:
            await kube.close()


async def test_a_request_cancelled_while_it_waits_for_a_turn_leaves_no_turn_taken() -> None:
    """Cancelled before its turn came, or just as it came: the turn goes to the next in line,
    and once all are given back every turn is free again (none is lost to a cancellation)."""
    turns = _Turns(1)
    await turns.take(False)
    cancelled_waiting = asyncio.create_task(turns.take(False))
    cancelled_given = asyncio.create_task(turns.take(False))
    last = asyncio.create_task(turns.take(True))
    await asyncio.sleep(0)  # all three wait
    cancelled_waiting.cancel()
    await asyncio.sleep(0)
    turns.give()  # to cancelled_given, which is cancelled before it runs
    cancelled_given.cancel()
    await asyncio.wait_for(last, 5)  # so the turn went on to the last one
    assert cancelled_waiting.cancelled() and cancelled_given.cancelled()
    assert turns.free == 0 and not any(turns.waiting)
    turns.give()
    assert turns.free == 1


async def test_a_request_cancelled_while_a_turn_is_given_out_stays_cancelled() -> None:
    """Cancelled while it waits, and a turn handed out before its cancellation ran: the hand-out
    drops the cancelled waiter from the queue. Before, the waiter's own removal then raised
    "not in deque", a ValueError in place of the cancellation (the 3,000-job benchmark's
    stopping replicas logged 35 status refreshes and Events failed so)."""
    turns = _Turns(1)
    await turns.take(False)
    waiter = asyncio.create_task(turns.take(False))
    await asyncio.sleep(0)  # it waits
    waiter.cancel()  # cancels the future it waits on now; its except clause runs later
    turns.give()  # pops that cancelled future, finds nobody else: the turn is free
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert turns.free == 1 and not any(turns.waiting)


def test_a_replica_never_imports_the_typed_models(control_plane: ControlPlane) -> None:
    """The operator's modules, loaded as a replica loads them, connected and sending requests,
    leave kubernetes_asyncio out: its client package imports every generated model (36 MB of
    RSS in each replica)."""
    code = f"""
import asyncio, sys
import anarchon.kube.main
from anarchon.kube.api.client import connect
async def go():
    kube = await connect({str(control_plane.kubeconfig)!r})
    await kube.request("GET", "/api/v1/namespaces/default")
    await kube.close()
asyncio.run(go())
print(sorted(m for m in sys.modules if "kubernetes" in m))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[3] / "operator"), *sys.path])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]", out.stdout


async def test_a_token_file_is_read_again_when_it_is_rotated(
    control_plane: ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``tokenFile`` (as a projected service-account token) is read again after TOKEN_REREAD_S:
    the kubelet rotates the token in place, and a replica must follow."""
    monkeypatch.setattr(kubeconfig, "TOKEN_REREAD_S", 0.0)
    token = tmp_path / "token"
    token.write_text(control_plane.user_tokens["alice"])
    cfg = tmp_path / "config"
    ca = {"server": control_plane.server, "certificate-authority": str(control_plane.ca_file)}
    cfg.write_text(json.dumps(_config(control_plane, ca, {"tokenFile": "token"})))  # relative to the file
    kube = await connect(str(cfg))
    try:
        assert await _who(kube) == "alice"
        token.write_text(control_plane.user_tokens["bob"])
        assert await _who(kube) == "bob"
    finally:
        await kube.close()


async def test_the_pods_service_account_is_used_in_a_cluster(
    control_plane: ControlPlane, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mount = tmp_path / "serviceaccount"
    mount.mkdir()
    (mount / "token").write_text(control_plane.service_account_token(namespace, "operator"))
    (mount / "ca.crt").write_bytes(control_plane.ca_file.read_bytes())
    (mount / "namespace").write_text(namespace)
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT", mount)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    host, port = control_plane.server.removeprefix("https://").rsplit(":", 1)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    kube = await connect(None)
    try:
        assert await _who(kube) == f"system:serviceaccount:{namespace}:operator"
    finally:
        await kube.close()
    assert kubeconfig.current_namespace(None) == namespace
    (mount / "token").unlink()
    with pytest.raises(CredentialsError, match=r"the Pod's service account .*token"):
        await connect(None)


async def test_an_exec_plugin_gives_the_token(control_plane: ControlPlane, tmp_path: Path) -> None:
    """A kubeconfig whose user runs a credential plugin (EKS, GKE, OIDC helpers) goes to
    kubernetes_asyncio's loader, which runs the plugin; the requests carry its token."""
    plugin = tmp_path / "plugin"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": control_plane.user_tokens["alice"]},
    }
    plugin.write_text(f"#!/bin/sh\ncat <<'END'\n{json.dumps(credential)}\nEND\n")
    plugin.chmod(0o755)
    user = {
        "exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin), "interactiveMode": "Never"}
    }
    cluster = {"server": control_plane.server, "certificate-authority": str(control_plane.ca_file)}
    cfg = tmp_path / "config"
    cfg.write_text(json.dumps(_config(control_plane, cluster, user)))
    assert await _who_with(cfg) == "alice"


async def test_tls_is_verified_unless_the_kubeconfig_says_to_skip_it(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    token = {"token": control_plane.user_tokens["alice"]}
    unverified = tmp_path / "unverified"
    unverified.write_text(json.dumps(_config(control_plane, {"server": control_plane.server}, token)))
    kube = await connect(str(unverified))  # the system's CAs do not know the test CA
    try:
        with pytest.raises(Exception, match=r"(?i)certificate"):
            await kube.request("GET", "/version")
    finally:
        await kube.close()
    skipping = tmp_path / "skipping"
    skipping.write_text(
        json.dumps(_config(control_plane, {"server": control_plane.server, "insecure-skip-tls-verify": True}, token))
    )
    assert await _who_with(skipping) == "alice"
    assert kubeconfig.current_namespace(str(skipping)) == "ns-of-x"


@pytest.mark.parametrize("embedded", [False, True], ids=["files", "data"])
async def test_client_certificates_authenticate(control_plane: ControlPlane, tmp_path: Path, embedded: bool) -> None:
    """A kubeconfig user with a client certificate and key (as files, or embedded as base64):
    the API server takes the client for the certificate's CN."""
    pki = control_plane.ca_file.parent
    cert, key = pki / "kubelet-client.crt", pki / "kubelet-client.key"  # CN kube-apiserver-kubelet-client
    if embedded:
        user = {
            "client-certificate-data": base64.b64encode(cert.read_bytes()).decode(),
            "client-key-data": base64.b64encode(key.read_bytes()).decode(),
        }
        cluster = {
            "server": control_plane.server,
            "certificate-authority-data": base64.b64encode(control_plane.ca_file.read_bytes()).decode(),
        }
    else:
        user = {"client-certificate": str(cert), "client-key": str(key)}
        cluster = {"server": control_plane.server, "certificate-authority": str(control_plane.ca_file)}
    cfg = tmp_path / "config"
    cfg.write_text(json.dumps(_config(control_plane, cluster, user)))
    assert await _who_with(cfg) == "kube-apiserver-kubelet-client"
