"""The operator's API client against the real test API server."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest
from controlplane import ControlPlane

from anarchon.kube.client import call, connect
from tests.faults.apiproxy import ApiFaultProxy, Fault


async def test_requests_ignore_proxy_variables_and_netrc(
    control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """The requests go straight to the API server whatever the environment says.

    A session with ``trust_env=True`` (the client library's) sent them to the proxy named here,
    a closed port, and looked ``.netrc`` up in a thread on every request.
    """
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # discard port: nothing listens
    kube = await connect(str(control_plane.kubeconfig))
    try:
        listing = await kube.core.list_namespace(_request_timeout=10)
        assert any(ns.metadata.name == "default" for ns in listing.items)
        assert kube.api.rest_client.pool_manager.trust_env is False
    finally:
        await kube.close()


async def test_close_leaves_no_session_open(control_plane: ControlPlane) -> None:
    """Both sessions (the one sending, the one owning the pool) are closed: no ResourceWarning."""
    kube = await connect(str(control_plane.kubeconfig))
    await kube.core.list_namespace(_request_timeout=10)
    sessions = [kube.api.rest_client.pool_manager, kube.pool_owner]
    await kube.close()
    assert all(s is not None and s.closed for s in sessions)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del kube, sessions
        gc.collect()
    assert not [w for w in caught if "Unclosed" in str(w.message)]


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
            listings = await asyncio.gather(*(call("listing", kube.core.list_namespace) for _ in range(40)))
        finally:
            await kube.close()
        assert all(any(ns.metadata.name == "default" for ns in listing.items) for listing in listings)
        assert proxy.count(verb="list", resource="namespaces") == 40
        assert 2 <= proxy.max_in_flight <= 4, proxy.max_in_flight
