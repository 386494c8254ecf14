"""The verbs with the API server failing under them (tests/faults/apiproxy.py in between).

A 503, a 429 or a write whose reply was lost must not fail a command that a second try would
carry out: the verbs use the operator's one retry policy (``kube.client.call``) and say on
stderr that they retry. An answer that is no passing failure (403) is one line, exit 1, at once.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.faults.apiproxy import ApiFaultProxy, Fault
from tests.harness.cli import ok, ok_json, one_line_error, run_cli
from tests.harness.cluster import Cluster, job_manifest

ProxiedCli = Callable[..., subprocess.CompletedProcess[str]]
JOBS = {"resource": "anarchonjobs"}


@pytest.fixture
def proxy(control_plane: Any) -> Iterator[ApiFaultProxy]:
    with ApiFaultProxy(control_plane) as p:
        yield p


@pytest.fixture
def via_proxy(cluster: Cluster, proxy: ApiFaultProxy) -> ProxiedCli:
    cluster.apply(job_manifest("shaky", every="1h", suspend=True))

    def run(verb: str, *args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(verb, *args, "--namespace", cluster.namespace, "--kubeconfig", str(proxy.kubeconfig))

    return run


@pytest.mark.parametrize(
    ("fault", "verb"),
    [
        (Fault("status", code=503, verb="list", times=2, **JOBS), ("list", "-o", "json")),
        (Fault("status", code=429, verb="get", times=2, **JOBS), ("get", "shaky", "-o", "json")),
        (Fault("status", code=500, verb="list", resource="anarchonruns", times=2), ("runs", "shaky", "-o", "json")),
    ],
    ids=["list-503", "get-429", "runs-500"],
)
def test_a_read_is_retried_past_passing_failures(
    via_proxy: ProxiedCli, proxy: ApiFaultProxy, fault: Fault, verb: tuple[str, ...]
) -> None:
    rule = proxy.add(fault)
    res = via_proxy(*verb)
    ok_json(res)
    assert rule.fired == 2, rule
    assert "retrying" in res.stderr, res.stderr
    if verb[0] != "runs":
        assert "shaky" in res.stdout


def test_a_write_whose_reply_was_lost_is_done_once(
    via_proxy: ProxiedCli, proxy: ApiFaultProxy, cluster: Cluster
) -> None:
    """The resume's patch reaches the server, its reply does not: the retry finds it done."""
    rule = proxy.add(Fault("lost_reply", verb="patch", times=1, **JOBS))
    started = time.monotonic()
    ok(via_proxy("resume", "shaky"))
    assert rule.fired == 1 and time.monotonic() - started < 60
    assert cluster.get("anarchonjob", "shaky")["spec"]["suspend"] is False


def test_a_refusal_is_one_line_at_once(via_proxy: ProxiedCli, proxy: ApiFaultProxy) -> None:
    rule = proxy.add(Fault("status", code=403, verb="patch", **JOBS))
    started = time.monotonic()
    res = via_proxy("suspend", "shaky", "--reason", "maintenance")
    one_line_error(res, 1, "403")
    assert rule.fired == 1 and time.monotonic() - started < 20, "a refusal is not retried"
