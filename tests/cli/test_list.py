"""``anarchon list`` on the real API server: each column, for a running, a suspended and an invalid job."""

from __future__ import annotations

import time
from typing import Any

import yaml

from anarchon.engine.schedule import every
from anarchon.kube.job.spec import slot_time
from tests.harness.cli import Cli, ok, ok_json
from tests.harness.cluster import Cluster, job_manifest
from tests.harness.until import until


def by_name(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in records}


def test_list_shows_schedule_suspension_active_last_and_next(cluster: Cluster, replicas_factory, cli: Cli, tmp_path):
    cluster.apply(job_manifest("hourly", every="1h", annotations={"anarchon.test/run-seconds": "60"}))
    cluster.apply(job_manifest("paris", cron="0 8 * * *", tz="Europe/Paris", suspend=True))
    # A zone the CRD cannot check (only the operator can): listed, with the problem, no next time.
    cluster.apply(job_manifest("mars", cron="0 8 * * *", tz="Mars/Olympus_Mons"))
    replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    replicas.start("replica-a")
    cluster.trigger_running("hourly")  # slot 2027-01-15T08:00:00Z, running for a minute

    def listed() -> dict[str, dict[str, Any]]:
        return by_name(ok_json(cli("list", "-o", "json")))

    before = time.time_ns() // 1_000_000
    jobs = until("hourly active", lambda: (j := listed())["hourly"]["active"] == 1 and j, timeout=60)
    after = time.time_ns() // 1_000_000
    hourly = jobs["hourly"]
    assert hourly["schedule"] == "every 1h" and hourly["timeZone"] == "UTC"
    assert hourly["suspended"] is False and hourly["problems"] == []
    assert hourly["lastScheduleTime"] == "2027-01-15T08:00:00Z"
    # The engine's next slot, whichever side of an hour the call fell on.
    assert hourly["nextScheduleTime"] in {slot_time(every("1h").next_after(t)) for t in (before, after)}
    paris = jobs["paris"]
    assert paris["schedule"] == "0 8 * * * Europe/Paris" and paris["timeZone"] == "Europe/Paris"
    assert paris["suspended"] is True and paris["nextScheduleTime"] is None and paris["active"] == 0
    mars = jobs["mars"]
    assert mars["schedule"] is None and mars["nextScheduleTime"] is None
    assert any(p.startswith("spec.timeZone: ") and "Mars/Olympus_Mons" in p for p in mars["problems"]), mars

    header, *rows = ok(cli("list")).splitlines()
    assert header.split() == ["NAME", "SCHEDULE", "SUSPENDED", "ACTIVE", "LAST", "NEXT"]
    table = {row.split()[0]: row for row in rows}
    assert set(table) == {"hourly", "mars", "paris"}
    assert table["hourly"].split()[1:6] == ["every", "1h", "no", "1", "in"]  # LAST: the trigger's slot, in 2027
    assert table["paris"].split()[-4:] == ["yes", "0", "-", "-"]  # suspended: no next time
    assert "<invalid: spec.timeZone: " in table["mars"]

    everywhere = yaml.safe_load(ok(cli("list", "-A", "-o", "yaml")))
    assert {(j["namespace"], j["name"]) for j in everywhere} >= {(cluster.namespace, n) for n in table}
    wide_header = ok(cli("list", "-A")).splitlines()[0]
    assert wide_header.split()[:2] == ["NAMESPACE", "NAME"]


def test_list_of_an_empty_namespace_says_so(cluster: Cluster, cli: Cli) -> None:
    assert ok(cli("list")).strip() == f"no AnarchonJobs in namespace {cluster.namespace}"
    assert ok_json(cli("list", "-o", "json")) == []
