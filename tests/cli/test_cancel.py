"""``anarchon cancel RUN`` (or ``--job JOB --slot T``): the request on the run, who asked and why;
a run that has ended is left as it is.

No replica runs here: the CLI's part is the request (what the replica then does is
tests/operator/test_cancelled_runs.py). The runs are written as a replica leaves them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

from anarchon.kube.job.spec import run_name
from tests.harness.cli import Cli, ok, one_line_error, run_cli
from tests.harness.cluster import Cluster
from tests.harness.controlplane import REPO
from tests.harness.until import until

SLOT = int(datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp() * 1000)


def _run(cluster: Cluster, status: dict[str, Any], slot: int = SLOT) -> str:
    """The AnarchonRun of job ``nightly`` at ``slot``, with ``status`` as a replica wrote it."""
    name = run_name("nightly", slot)
    body = {
        "apiVersion": "anarchon.io/v1alpha1",
        "kind": "AnarchonRun",
        "metadata": {"name": name, "labels": {"anarchon.io/job": "nightly"}},
        "spec": {"job": "nightly", "slot": slot},
    }
    cluster.apply(body)
    _write_status(cluster, name, status)
    return name


def _write_status(cluster: Cluster, name: str, status: dict[str, Any]) -> None:
    patch = json.dumps({"status": status})
    cluster.kubectl("patch", "anarchonrun", name, "--subresource=status", "--type=merge", "-p", patch)


def _meta(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict(cluster.get("anarchonrun", name)["metadata"])


RUNNING = {"phase": "Running", "attempt": 1, "instance": "r0", "podName": run_name("nightly", SLOT)}


def test_cancel_asks_for_the_stop_and_says_who_asked(cluster: Cluster, control_plane: Any, cli: Cli) -> None:
    name = _run(cluster, RUNNING)
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "run-canceller"},
        "rules": [{"apiGroups": ["anarchon.io"], "resources": ["anarchonruns"], "verbs": ["get", "patch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "alice-cancels"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "run-canceller"},
        "subjects": [{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}],
    }
    cluster.apply(role)
    cluster.apply(binding)
    alice = str(control_plane.user_kubeconfig("alice"))  # what the API server calls her is recorded

    ns = cluster.namespace
    out = ok(run_cli("cancel", name, "--reason", " wrong\n input ", "-n", ns, "--kubeconfig", alice))
    assert out.strip() == f"anarchonrun {ns}/{name}: cancel requested by alice: wrong input"
    meta = _meta(cluster, name)
    assert meta["annotations"]["anarchon.io/cancel"] == "wrong input"
    assert meta["annotations"]["anarchon.io/cancel-by"] == "alice"

    # Asked again, by job and slot this time: the first request stands, nothing is written.
    out = ok(cli("cancel", "--job", "nightly", "--slot", "2027-01-15T08:00:00Z", "--reason", "another"))
    assert out.strip() == f"anarchonrun {ns}/{name}: cancel already requested by alice: wrong input"
    assert _meta(cluster, name)["resourceVersion"] == meta["resourceVersion"]


def test_a_run_that_ended_is_left_as_it_is(cluster: Cluster, cli: Cli) -> None:
    name = _run(cluster, {**RUNNING, "phase": "Succeeded", "message": "the Pod succeeded"})
    before = _meta(cluster, name)
    line = one_line_error(cli("cancel", name, "--reason", "late"), 1)
    assert line == f"anarchon cancel: anarchonrun {cluster.namespace}/{name} has ended Succeeded: the Pod succeeded"
    after = _meta(cluster, name)
    assert after["resourceVersion"] == before["resourceVersion"]
    assert "anarchon.io/cancel" not in (after.get("annotations") or {})


def test_bad_usage_and_a_missing_run(cluster: Cluster, cli: Cli) -> None:
    both = "name the run, or give --job and --slot (not both)"
    one_line_error(cli("cancel"), 2, both)
    one_line_error(cli("cancel", "nightly-1", "--job", "nightly", "--slot", "1800000000000"), 2, both)
    one_line_error(cli("cancel", "--job", "nightly"), 2, both)
    one_line_error(cli("cancel", "--job", "nightly", "--slot", "soon"), 2, "--slot 'soon' is not a time")
    line = one_line_error(cli("cancel", "ghost"), 1, "HTTP 404")
    assert line.startswith(f"anarchon cancel: no AnarchonRun 'ghost' in namespace '{cluster.namespace}'"), line


def test_wait_follows_the_run_to_its_end_and_exits_0_only_if_it_was_cancelled(
    cluster: Cluster, control_plane: Any, cli: Cli
) -> None:
    """``cancel --wait``: the replica's end is awaited; a Pod that succeeded first is exit 1, said so."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "operator")}
    ns = cluster.namespace
    where = ["-n", ns, "--kubeconfig", str(control_plane.kubeconfig)]
    ends = {
        SLOT: ({"phase": "Cancelled", "message": "cancelled: stop"}, 0),
        SLOT + 60_000: ({"phase": "Succeeded", "message": "the Pod succeeded"}, 1),
    }
    for slot, (end, code) in ends.items():
        name = _run(cluster, RUNNING, slot)
        waiting = subprocess.Popen(
            [sys.executable, "-m", "anarchon", "cancel", name, "--reason", "stop", "--wait", "--timeout", "1m", *where],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        asked = lambda run=name: "anarchon.io/cancel" in (_meta(cluster, run).get("annotations") or {})  # noqa: E731
        until("the ask", asked, timeout=90)
        _write_status(cluster, name, {**RUNNING, **end})  # as the run's replica would end it
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == code, (out, err)
        lines = out.splitlines()
        assert lines[0] == f"anarchonrun {ns}/{name}: cancel requested by admin: stop"
        assert "waiting for a replica" not in out
        assert lines[-1].endswith(f"{end['phase']}, attempt 1 on r0: {end['message']}"), lines

    name = _run(cluster, RUNNING, SLOT + 120_000)  # no replica runs here: nobody ends it
    one_line_error(
        cli("cancel", name, "--wait", "--timeout", "2s"), 1, f"run {name} is not over after --timeout 2s: it is Running"
    )
