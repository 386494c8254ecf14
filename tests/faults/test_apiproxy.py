"""The API fault proxy: forwarding (the operator's client, kubectl), every action, matching, firing control."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from anarchon.kube.api.client import ApiException, Kube, path, transient
from anarchon.kube.constants import MERGE
from tests.faults.apiproxy import ApiFaultProxy, Fault, RequestInfo, parse_request

# ---------------------------------------------------------------------------------------------- helpers


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


def exists(cp: Any, path: str) -> bool:
    """Whether the object at ``path`` exists, asked of the API server directly (not through the proxy)."""
    try:
        cp.api("GET", path)
        return True
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return False
        raise


def http_status(url: str, token: str | None) -> int:
    """One GET with a plain HTTP client; the status code."""
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture
def proxy(control_plane: Any) -> Iterator[ApiFaultProxy]:
    with ApiFaultProxy(control_plane, seed=7) as p:
        yield p


# ---------------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/namespaces/ns/pods", {}, ("list", "ns", "pods", "", "")),
        ("GET", "/api/v1/namespaces/ns/pods", {"watch": "true"}, ("watch", "ns", "pods", "", "")),
        ("GET", "/api/v1/watch/namespaces/ns/pods", {}, ("watch", "ns", "pods", "", "")),
        ("GET", "/api/v1/namespaces/ns/pods", {"fieldSelector": "metadata.name=a"}, ("list", "ns", "pods", "", "a")),
        ("GET", "/api/v1/namespaces/ns/pods/a", {}, ("get", "ns", "pods", "", "a")),
        ("HEAD", "/api/v1/namespaces/ns/pods/a", {}, ("get", "ns", "pods", "", "a")),
        ("GET", "/api/v1/namespaces/ns/pods/a/status", {}, ("get", "ns", "pods", "status", "a")),
        ("POST", "/api/v1/namespaces/ns/pods", {}, ("create", "ns", "pods", "", "")),
        ("PUT", "/api/v1/namespaces/ns/pods/a", {}, ("update", "ns", "pods", "", "a")),
        ("DELETE", "/api/v1/namespaces/ns/pods/a", {}, ("delete", "ns", "pods", "", "a")),
        ("DELETE", "/api/v1/namespaces/ns/pods", {}, ("deletecollection", "ns", "pods", "", "")),
        (
            "POST",
            "/api/v1/namespaces/ns/serviceaccounts/sa/token",
            {},
            ("create", "ns", "serviceaccounts", "token", "sa"),
        ),
        ("GET", "/api/v1/namespaces", {}, ("list", "", "namespaces", "", "")),
        ("GET", "/api/v1/namespaces/ns", {}, ("get", "ns", "namespaces", "", "ns")),
        ("PUT", "/api/v1/namespaces/ns/finalize", {}, ("update", "ns", "namespaces", "finalize", "ns")),
        ("GET", "/api/v1/nodes/n1", {}, ("get", "", "nodes", "", "n1")),
        (
            "PATCH",
            "/apis/anarchon.io/v1alpha1/namespaces/ns/anarchonruns/r/status",
            {},
            ("patch", "ns", "anarchonruns", "status", "r"),
        ),
        ("GET", "/apis/anarchon.io/v1alpha1/anarchonjobs", {"watch": "1"}, ("watch", "", "anarchonjobs", "", "")),
        (
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l",
            {"watch": "true"},
            ("watch", "ns", "leases", "", "l"),
        ),
    ],
)
def test_requests_are_parsed_as_the_api_server_does(
    method: str, path: str, query: dict[str, str], expected: tuple[str, str, str, str, str]
) -> None:
    info = parse_request(method, path, query)
    assert (info.verb, info.namespace, info.resource, info.subresource, info.name) == expected


@pytest.mark.parametrize(
    ("method", "path", "verb"),
    [
        ("GET", "/version", "get"),
        ("GET", "/apis/anarchon.io/v1alpha1", "get"),
        ("GET", "/api", "get"),
        ("POST", "/x", "post"),
    ],
)
def test_non_resource_requests_have_no_resource(method: str, path: str, verb: str) -> None:
    assert parse_request(method, path) == RequestInfo(method=method, path=path, verb=verb)


def test_rules_are_checked_when_made() -> None:
    with pytest.raises(ValueError, match="unknown action"):
        Fault("explode")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown verb"):
        Fault("status", verb="post")
    with pytest.raises(ValueError, match="only applies to watches"):
        Fault("cut_watch", verb="get")
    with pytest.raises(ValueError, match="rate"):
        Fault("status", rate=1.5)
    # An empty subresource aims at the main resource only; None at both.
    main_only = Fault("status", resource="pods", subresource="")
    assert main_only.matches(parse_request("PATCH", "/api/v1/namespaces/ns/pods/a"))
    assert not main_only.matches(parse_request("PATCH", "/api/v1/namespaces/ns/pods/a/status"))
    assert Fault("status", resource="pods").matches(parse_request("PATCH", "/api/v1/namespaces/ns/pods/a/status"))


# ---------------------------------------------------------------------------------------------- forwarding


async def test_a_create_goes_through_to_the_api_server(
    proxy: ApiFaultProxy, through_proxy: Kube, control_plane: Any, namespace: str
) -> None:
    assert through_proxy.endpoint.server == proxy.url
    created = await through_proxy.request("POST", path("configmaps", namespace), configmap("plain"))
    assert created["metadata"]["name"] == "plain"
    assert exists(control_plane, f"/api/v1/namespaces/{namespace}/configmaps/plain")
    read = await through_proxy.request("GET", path("configmaps", namespace, "plain"))
    assert read["data"] == {"k": "v"}
    assert proxy.count(verb="create", resource="configmaps", namespace=namespace, upstream=201) == 1
    assert proxy.count(verb="get", resource="configmaps", name="plain", status=200) == 1


def test_the_clients_credentials_pass_through_unchanged(
    proxy: ApiFaultProxy, control_plane: Any, namespace: str
) -> None:
    url = f"{proxy.url}/api/v1/namespaces/{namespace}/configmaps"
    assert http_status(url, control_plane.admin_token) == 200
    assert http_status(url, control_plane.user_tokens["alice"]) == 403  # a user with no RBAC bindings
    # No credentials at all (client-go over http://): the proxy's token is added, unless told not to.
    assert http_status(url, None) == 200
    with ApiFaultProxy(control_plane, inject_token=False) as bare:
        assert http_status(f"{bare.url}/api/v1/namespaces/{namespace}/configmaps", None) in (401, 403)
        assert http_status(f"{bare.url}/api/v1/namespaces/{namespace}/configmaps", control_plane.admin_token) == 200


def test_start_and_stop_are_idempotent_and_a_restart_keeps_the_port(control_plane: Any) -> None:
    p = ApiFaultProxy(control_plane)
    try:
        assert p.start() is p
        port = p.port
        assert p.start().port == port
        cfg = json.loads(p.kubeconfig.read_text())
        assert cfg["clusters"][0]["cluster"]["server"] == f"http://127.0.0.1:{port}"
        assert cfg["users"][0]["user"]["token"] == control_plane.admin_token
        assert http_status(f"{p.url}/version", control_plane.admin_token) == 200
        p.stop()
        p.stop()
        assert not p.running
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"{p.url}/version", timeout=5)
        p.start()  # the API is reachable again at the same address
        assert p.port == port
        assert http_status(f"{p.url}/version", control_plane.admin_token) == 200
    finally:
        p.close()


def test_kubectl_works_through_the_proxy_and_retries_a_503(
    proxy: ApiFaultProxy, control_plane: Any, namespace: str
) -> None:
    fault = proxy.add(Fault("status", code=503, verb="create", resource="configmaps", times=1))

    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = ["kubectl", "--kubeconfig", str(proxy.kubeconfig), "-n", namespace, *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)

    created = kubectl("create", "configmap", "by-kubectl", "--from-literal=a=b")
    assert created.returncode == 0, created.stderr
    # client-go honours Retry-After on a 503: the first create was refused, the second went through.
    assert fault.fired == 1
    assert proxy.count(verb="create", resource="configmaps", fault="status", status=503) == 1
    assert proxy.count(verb="create", resource="configmaps", upstream=201) == 1
    got = kubectl("get", "configmap", "by-kubectl", "-o", "json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["data"] == {"a": "b"}
    assert exists(control_plane, f"/api/v1/namespaces/{namespace}/configmaps/by-kubectl")


# ---------------------------------------------------------------------------------------------- actions


@pytest.mark.parametrize(
    ("code", "reason", "retry_after"),
    [
        (500, "InternalError", None),
        (503, "ServiceUnavailable", "1"),
        (429, "TooManyRequests", "1"),
        (504, "Timeout", None),
    ],
)
async def test_a_status_fault_answers_a_kubernetes_status_without_forwarding(
    proxy: ApiFaultProxy,
    through_proxy: Kube,
    control_plane: Any,
    namespace: str,
    code: int,
    reason: str,
    retry_after: str | None,
) -> None:
    fault = proxy.add(Fault("status", code=code, verb="create", resource="configmaps"))
    with pytest.raises(ApiException) as raised:
        await through_proxy.request("POST", path("configmaps", namespace), configmap("refused"))
    assert raised.value.status == code
    body = json.loads(raised.value.body)
    assert body["kind"] == "Status" and body["apiVersion"] == "v1" and body["status"] == "Failure"
    assert (body["reason"], body["code"]) == (reason, code)
    assert raised.value.headers.get("Retry-After") == retry_after
    assert fault.fired == 1
    assert not exists(control_plane, f"/api/v1/namespaces/{namespace}/configmaps/refused")
    assert proxy.count(verb="create", resource="configmaps", forwarded=True) == 0


async def test_times_fires_on_the_first_matching_requests_only(
    proxy: ApiFaultProxy, through_proxy: Kube, control_plane: Any, namespace: str
) -> None:
    fault = proxy.add(Fault("status", code=500, verb="create", resource="configmaps", times=1))
    with pytest.raises(ApiException) as raised:
        await through_proxy.request("POST", path("configmaps", namespace), configmap("first"))
    assert raised.value.status == 500
    await through_proxy.request("POST", path("configmaps", namespace), configmap("second"))
    await through_proxy.request("POST", path("configmaps", namespace), configmap("first"))
    assert fault.fired == 1
    assert exists(control_plane, f"/api/v1/namespaces/{namespace}/configmaps/first")
    assert proxy.count(verb="create", resource="configmaps", status=201) == 2


def test_rate_fires_on_some_requests_reproducibly_from_the_seed(control_plane: Any, namespace: str) -> None:
    def pattern() -> tuple[list[int], int]:
        with ApiFaultProxy(control_plane, seed=42) as p:
            fault = p.add(Fault("status", code=500, verb="list", resource="configmaps", rate=0.5))
            url = f"{p.url}/api/v1/namespaces/{namespace}/configmaps"
            codes = [http_status(url, control_plane.admin_token) for _ in range(24)]
            return codes, fault.fired

    codes, fired = pattern()
    assert set(codes) == {200, 500}
    assert fired == codes.count(500)
    assert 0 < fired < 24
    assert pattern() == (codes, fired)


async def test_remove_and_clear_stop_the_faults(proxy: ApiFaultProxy, through_proxy: Kube, namespace: str) -> None:
    one = proxy.add(Fault("status", code=500, verb="list", resource="configmaps"))
    with pytest.raises(ApiException):
        await through_proxy.request("GET", path("configmaps", namespace))
    proxy.remove(one)
    await through_proxy.request("GET", path("configmaps", namespace))
    proxy.add(Fault("status", code=500, verb="list", resource="configmaps"))
    proxy.add(Fault("status", code=503, verb="list"))
    with pytest.raises(ApiException) as raised:
        await through_proxy.request("GET", path("configmaps", namespace))
    assert raised.value.status == 500  # the first rule added wins
    proxy.clear()
    assert proxy.faults == []
    await through_proxy.request("GET", path("configmaps", namespace))
    assert one.fired == 1


@pytest.mark.parametrize("reply", ["reset", "status"])
async def test_a_lost_reply_leaves_the_object_created(
    proxy: ApiFaultProxy, through_proxy: Kube, control_plane: Any, namespace: str, reply: str
) -> None:
    fault = proxy.add(Fault("lost_reply", verb="create", resource="configmaps", reply=reply))  # type: ignore[arg-type]
    with pytest.raises((ApiException, aiohttp.ClientError)) as raised:
        await through_proxy.request("POST", path("configmaps", namespace), configmap("applied"))
    assert transient(raised.value)  # what the operator's retry policy sees: try again
    if reply == "status":
        assert isinstance(raised.value, ApiException) and raised.value.status == 504
        assert json.loads(raised.value.body)["reason"] == "Timeout"
    else:
        assert isinstance(raised.value, aiohttp.ClientError)
    assert fault.fired == 1
    assert exists(control_plane, f"/api/v1/namespaces/{namespace}/configmaps/applied")
    assert proxy.count(verb="create", resource="configmaps", upstream=201, fault="lost_reply") == 1
    # Sent again (as a retry would), the create now meets the object it made: 409.
    proxy.remove(fault)
    with pytest.raises(ApiException) as again:
        await through_proxy.request("POST", path("configmaps", namespace), configmap("applied"))
    assert again.value.status == 409


async def test_a_reset_fails_the_request_before_it_reaches_the_server(
    proxy: ApiFaultProxy, through_proxy: Kube, control_plane: Any, namespace: str
) -> None:
    fault = proxy.add(Fault("reset", verb="create", resource="configmaps"))
    with pytest.raises(aiohttp.ClientError) as raised:
        await through_proxy.request("POST", path("configmaps", namespace), configmap("never"))
    assert transient(raised.value)
    assert fault.fired == 1
    assert not exists(control_plane, f"/api/v1/namespaces/{namespace}/configmaps/never")
    assert proxy.count(verb="create", resource="configmaps", fault="reset", forwarded=False) == 1
    # The client's next request (on a new connection) goes through.
    proxy.clear()
    await through_proxy.request("POST", path("configmaps", namespace), configmap("never"))
    assert exists(control_plane, f"/api/v1/namespaces/{namespace}/configmaps/never")


async def test_latency_delays_only_the_aimed_request(
    proxy: ApiFaultProxy, through_proxy: Kube, control_plane: Any, namespace: str
) -> None:
    for name in ("slow", "quick"):
        control_plane.api("POST", f"/api/v1/namespaces/{namespace}/configmaps", configmap(name))
    fault = proxy.add(Fault("latency", seconds=1.0, verb="get", resource="configmaps", name="slow"))
    t0 = time.monotonic()
    quick = await through_proxy.request("GET", path("configmaps", namespace, "quick"))
    quick_s = time.monotonic() - t0
    t0 = time.monotonic()
    slow = await through_proxy.request("GET", path("configmaps", namespace, "slow"))
    slow_s = time.monotonic() - t0
    assert (quick["metadata"]["name"], slow["metadata"]["name"]) == ("quick", "slow")
    assert slow_s >= 1.0
    assert quick_s < 1.0
    assert fault.fired == 1
    assert proxy.count(verb="get", name="slow", fault="latency", upstream=200) == 1


async def test_a_watch_streams_events_as_they_happen(
    proxy: ApiFaultProxy, through_proxy: Kube, control_plane: Any, namespace: str
) -> None:
    seen: list[tuple[str, str]] = []
    response = await through_proxy.stream(path("configmaps", namespace), {"watch": True, "timeoutSeconds": 60}, 90)
    try:
        async with asyncio.timeout(20):
            first = asyncio.ensure_future(response.content.readline())
            await asyncio.sleep(0.5)  # the watch is open (and empty) before the object exists
            control_plane.api("POST", f"/api/v1/namespaces/{namespace}/configmaps", configmap("watched"))
            line = await first
            while True:
                event = json.loads(line)
                seen.append((event["type"], event["object"]["metadata"]["name"]))
                if seen[-1] == ("ADDED", "watched"):
                    break
                line = await response.content.readline()
    finally:
        response.release()
    # The event came while the server still held the watch open: the reply was streamed, not buffered.
    assert ("ADDED", "watched") in seen
    assert proxy.count(verb="watch", resource="configmaps", namespace=namespace, status=200) == 1


async def test_cut_watch_breaks_the_stream_after_the_given_time(
    proxy: ApiFaultProxy, through_proxy: Kube, control_plane: Any, namespace: str
) -> None:
    control_plane.api("POST", f"/api/v1/namespaces/{namespace}/configmaps", configmap("old"))
    fault = proxy.add(Fault("cut_watch", seconds=1.0, resource="configmaps", namespace=namespace))
    await through_proxy.request("GET", path("configmaps", namespace))  # not a watch: not cut
    response = await through_proxy.stream(path("configmaps", namespace), {"watch": True, "timeoutSeconds": 60}, 90)
    t0 = time.monotonic()
    names: list[str] = []
    with pytest.raises(aiohttp.ClientPayloadError):
        async with asyncio.timeout(20):
            async for line in response.content:
                names.append(json.loads(line)["object"]["metadata"]["name"])
    elapsed = time.monotonic() - t0
    response.release()
    assert "old" in names  # it streamed before it was cut
    assert 1.0 <= elapsed < 15
    assert fault.fired == 1
    assert proxy.count(verb="watch", resource="configmaps", fault="cut_watch") == 1
    assert proxy.count(verb="list", resource="configmaps", fault=None) == 1


async def test_matching_aims_at_one_subresource_of_one_object(
    proxy: ApiFaultProxy, through_proxy: Kube, control_plane: Any, namespace: str
) -> None:
    for name in ("a", "b"):
        control_plane.api("POST", f"/api/v1/namespaces/{namespace}/pods", pod(name))
    patch = {"metadata": {"annotations": {"touched": "yes"}}}
    status_of_a = proxy.add(
        Fault("status", code=500, verb="patch", resource="pods", subresource="status", name="a", namespace=namespace)
    )
    other_ns = proxy.add(Fault("status", code=500, resource="pods", namespace="elsewhere"))

    await through_proxy.request(
        "PATCH", path("pods", namespace, "b", "status"), patch, content_type=MERGE
    )  # another object
    await through_proxy.request("PATCH", path("pods", namespace, "a"), patch, content_type=MERGE)  # the main resource
    await through_proxy.request("GET", path("pods", namespace, "a", "status"))  # another verb
    with pytest.raises(ApiException) as raised:
        await through_proxy.request("PATCH", path("pods", namespace, "a", "status"), patch, content_type=MERGE)
    assert raised.value.status == 500
    assert status_of_a.fired == 1
    assert other_ns.fired == 0
    assert proxy.count(verb="patch", resource="pods", subresource="status", name="a", status=500) == 1
    assert proxy.count(verb="patch", resource="pods", subresource="status", name="b", status=200) == 1

    # subresource="" aims at the main resource only.
    proxy.clear()
    main_only = proxy.add(Fault("status", code=409, verb="patch", resource="pods", subresource=""))
    await through_proxy.request("PATCH", path("pods", namespace, "a", "status"), patch, content_type=MERGE)
    with pytest.raises(ApiException) as conflict:
        await through_proxy.request("PATCH", path("pods", namespace, "a"), patch, content_type=MERGE)
    assert conflict.value.status == 409
    assert json.loads(conflict.value.body)["reason"] == "Conflict"
    assert main_only.fired == 1


async def test_aiohttp_clients_send_an_idempotent_request_again_once_after_a_reset(
    proxy: ApiFaultProxy, through_proxy: Kube, namespace: str
) -> None:
    """Why the README says times>=2 for GET/PUT/DELETE: aiohttp retries them once on a closed connection."""
    once = proxy.add(Fault("reset", verb="list", resource="configmaps", namespace=namespace, times=1))
    await through_proxy.request("GET", path("configmaps", namespace))  # the reset is invisible to the caller
    assert once.fired == 1
    assert proxy.count(verb="list", resource="configmaps", namespace=namespace) == 2
    twice = proxy.add(Fault("reset", verb="list", resource="configmaps", namespace=namespace, times=2))
    with pytest.raises(aiohttp.ClientError):
        await through_proxy.request("GET", path("configmaps", namespace))
    assert twice.fired == 2
