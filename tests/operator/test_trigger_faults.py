"""Trigger requests with the API server failing under the replicas: each runs once, then goes.

A replica claims a request's slot in the store, then removes the request (onto the version of
the job it read). Whatever fails between the two must neither lose the request nor run it
twice: the replicas talk to the API server through tests/faults/apiproxy.py, which fails
exactly those removals.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from anarchon.kube.job.triggers import pending_requests
from tests.faults.apiproxy import ApiFaultProxy, Fault
from tests.harness.cluster import Cluster, Replicas, job_manifest
from tests.harness.until import until

SLOT = 1_800_000_000_000
#: The replicas' writes of trigger requests: patches of the job itself (its status is a subresource).
REMOVAL = {"verb": "patch", "resource": "anarchonjobs", "subresource": ""}


def test_a_request_runs_once_whatever_fails_between_its_claim_and_its_removal(
    cluster: Cluster, replicas_factory: Any, control_plane: Any, tmp_path: Path
) -> None:
    """The first replica claims and runs a request but cannot remove it (503s), and dies; the
    next one finds the slot taken and removes it (and claims a second request), its removal
    applied with the reply lost: the retry meets a newer version (409), a read says they are gone."""
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 's.db'}")
    cluster.apply(job_manifest("faulty", every="1h", suspend=True, overlap="Allow"))

    def requests() -> dict[str, str]:
        return pending_requests(cluster.get("anarchonjob", "faulty")["metadata"].get("annotations") or {})

    def phases() -> dict[int, Any]:
        return {int(r["spec"]["slot"]): (r.get("status") or {}).get("phase") for r in cluster.runs("faulty")}

    with ApiFaultProxy(control_plane) as proxy:
        through = ("--kubeconfig", str(proxy.kubeconfig))
        refused = proxy.add(Fault("status", code=503, **REMOVAL))
        replicas.start("replica-0", *through)
        cluster.kubectl("annotate", "anarchonjob", "faulty", f"anarchon.io/trigger.first={SLOT}")
        until("the first request's run", lambda: phases() == {SLOT: "Succeeded"}, timeout=60)
        assert refused.fired >= 1 and requests() == {"anarchon.io/trigger.first": str(SLOT)}
        replicas.kill("replica-0")  # claimed and ran it, never removed it

        proxy.clear()
        lost = proxy.add(Fault("lost_reply", times=1, **REMOVAL))
        cluster.kubectl("annotate", "anarchonjob", "faulty", f"anarchon.io/trigger.second={SLOT + 1_000}")
        replicas.start("replica-1", *through)
        until("both requests removed", lambda: requests() == {}, timeout=60)
        until("the second run", lambda: phases() == {SLOT: "Succeeded", SLOT + 1_000: "Succeeded"}, timeout=60)
        assert lost.fired == 1
    time.sleep(1)  # nothing more comes
    runs = cluster.runs("faulty")
    assert [(r["status"]["instance"], r["status"]["attempt"]) for r in runs] == [("replica-0", 1), ("replica-1", 1)]
    assert len(cluster.pods("anarchon.io/job=faulty")) == 2
    assert "Traceback" not in replicas.log("replica-1")
