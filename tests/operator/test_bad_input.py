"""Bad input in front of a running operator: a clear refusal, once, and everything else goes on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness.cluster import Cluster, Replicas, job_manifest
from tests.harness.until import until


def _schedule(cluster: Cluster, job: str) -> tuple[Any, Any]:
    status = (cluster.get("anarchonjob", job) or {}).get("status") or {}
    return status.get("schedule"), status.get("observedGeneration")


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_bad_trigger_values_are_refused_once_and_the_job_still_follows_edits(
    cluster: Cluster, replicas_factory, tmp_path: Path, request: pytest.FixtureRequest, store_kind: str
) -> None:
    """On main, 10**20 blocked the job's handler for ever on PostgreSQL (bigint out of range, retried
    inside apply()) and raised OverflowError on SQLite at every event; "²" passed isdigit() and
    raised ValueError. Neither was ever marked handled, so no later trigger could run either.
    """
    store = f"sqlite://{tmp_path / 'store.db'}" if store_kind == "sqlite" else request.getfixturevalue("postgres_url")
    replicas: Replicas = replicas_factory(store)
    replicas.start("replica-0")
    cluster.apply(job_manifest("trig", every="1h", suspend=True))
    until("the job to be scheduled", lambda: _schedule(cluster, "trig")[0] == "every 1h", timeout=60)

    for generation, (bad, every) in enumerate((("99999999999999999999", "2h"), ("²", "3h")), start=2):
        cluster.kubectl("annotate", "--overwrite", "anarchonjob", "trig", f"anarchon.io/trigger={bad}")

        def refused(bad: str = bad) -> bool:
            job = cluster.get("anarchonjob", "trig")
            handled = job["metadata"].get("annotations", {}).get("anarchon.io/trigger-handled")
            events = [e for e in cluster.events("BadTrigger") if repr(bad) in e["message"]]
            return handled == bad and bool(events)

        until(f"trigger {bad!r} refused with a BadTrigger Event and marked handled", refused, timeout=60)
        # The job's handler is free: an edit right after is taken up.
        cluster.apply(job_manifest("trig", every=every, suspend=True))
        until(
            f"the edit to every {every} to be taken up",
            lambda every=every, generation=generation: _schedule(cluster, "trig") == (f"every {every}", generation),
            timeout=60,
        )

    # A good trigger after the bad ones still runs.
    run = cluster.trigger_running("trig")
    assert run["spec"]["slot"] == 1_800_000_000_000
    assert replicas.procs["replica-0"].poll() is None
    assert "Traceback" not in replicas.log("replica-0")
