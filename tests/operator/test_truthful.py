"""The history tells the truth under harsh faults (issue 25), replicas as processes, real servers.

Each test puts the operator where the chaos soak's harsh profile found it lying: a long Pod
outliving several runners, a Pod past its timeout that its node does not stop, a store that
restarts without its data while a run is open. What is checked is what Kubernetes shows.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.faults.apiproxy import ApiFaultProxy, Fault
from tests.harness.cluster import Cluster, Replicas, job_manifest
from tests.harness.until import until
from tests.servers.redis import RedisServer
from tests.servers.redis import start_or_fail as start_redis_or_fail

RUN_SECONDS = "anarchon.test/run-seconds"


def _status(run: dict[str, Any]) -> dict[str, Any]:
    return dict(run.get("status") or {})


def _live(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and pod.get("status", {}).get("phase") in (
        None,
        "Pending",
        "Running",
    )


def _runner_of(cluster: Cluster, job: str, attempt: int) -> str:
    """The replica running attempt ``attempt`` (or later) of the job's one run, once it has started."""
    run = until(
        f"attempt {attempt} of {job}",
        lambda: [r for r in cluster.runs(job) if int(_status(r).get("attempt") or 0) >= attempt],
        timeout=60,
    )[0]
    return str(_status(run)["instance"])


def _first_running(cluster: Cluster, job: str) -> dict[str, Any]:
    """A run of ``job`` that is Running, within a minute."""
    running = until(
        "a running run",
        lambda: [r for r in cluster.runs(job) if _status(r).get("phase") == "Running"],
        timeout=60,
    )
    return dict(running[0])


def test_takeovers_that_adopt_the_live_pod_do_not_use_up_max_attempts(
    cluster: Cluster, replicas_factory, tmp_path
) -> None:
    """maxAttempts 1, and the runner of a 25 s Pod killed twice: both backups adopt the Pod, and
    the run ends Succeeded as its Pod did. Before, the first takeover gave the run up
    ("gave up after attempt 1 of 1") while its Pod ran on and then succeeded."""
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    for i in range(3):
        replicas.start(f"replica-{i}")
    cluster.apply(
        job_manifest(
            "longpod", every="1h", suspend=True, maxAttempts=1, annotations={"anarchon.test/run-seconds": "25"}
        )
    )
    run = cluster.trigger_running("longpod")
    name, pod = run["metadata"]["name"], run["status"]["podName"]
    for attempt in (1, 2):
        runner = _runner_of(cluster, "longpod", attempt)
        replicas.kill(runner, signal.SIGKILL)
        replicas.start(runner)
    _runner_of(cluster, "longpod", 3)
    final = until(
        "the run to end",
        lambda: [s for r in cluster.runs("longpod") if (s := _status(r)).get("finishTime")],
        timeout=90,
    )[0]
    assert final["phase"] == "Succeeded", final
    assert final["attempt"] >= 3 and final["takeovers"] >= 2, final
    assert [a.get("launched", False) for a in final["attempts"]].count(True) == 1, final["attempts"]
    pods = cluster.pods(f"anarchon.io/run={name}")
    assert [p["metadata"]["name"] for p in pods] == [pod], "the one Pod, adopted each time"
    assert pods[0]["status"]["phase"] == "Succeeded"


def test_a_pod_past_its_timeout_is_stopped_before_the_run_is_failed(
    cluster: Cluster, replicas_factory, tmp_path, control_plane
) -> None:
    """timeout 3s, a node that does not enforce activeDeadlineSeconds (KWOK), and the API server
    refusing every Pod deletion for the first 10 s: the run is Failed (DeadlineExceeded) only
    once its Pod is gone. Before, the engine's timer wrote Failed ("timed out after 3000 ms")
    after its grace while the Pod ran on, and the Pod then succeeded."""
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    with ApiFaultProxy(control_plane) as proxy:
        refuse = proxy.add(Fault("status", code=500, verb="delete", resource="pods"))
        for i in range(2):
            replicas.start(f"replica-{i}", "--kubeconfig", str(proxy.kubeconfig))
        cluster.apply(
            job_manifest(
                "slowpod", every="1h", suspend=True, timeout="3s", annotations={"anarchon.test/run-seconds": "15"}
            )
        )
        run = cluster.trigger_running("slowpod")
        name = run["metadata"]["name"]
        time.sleep(10)
        assert refuse.fired, "the runner must have tried to delete the Pod past its deadline"
        assert _status(cluster.runs("slowpod")[0])["phase"] == "Running", "not Failed while the Pod lives"
        assert [p for p in cluster.pods(f"anarchon.io/run={name}") if _live(p)], "the Pod lives on meanwhile"
        proxy.clear()
        final = until(
            "the run to end",
            lambda: [s for r in cluster.runs("slowpod") if (s := _status(r)).get("finishTime")],
            timeout=60,
        )[0]
        assert (final["phase"], final.get("reason")) == ("Failed", "DeadlineExceeded"), final
        assert "ran past timeout (3s)" in final["message"], final
        assert not cluster.pods(f"anarchon.io/run={name}"), "deleted before the run was written Failed"
        time.sleep(6)  # past the Pod's own 15 s: nothing of it succeeded after all
        assert _status(cluster.runs("slowpod")[0])["phase"] == "Failed"


@pytest.fixture
def forgetful_redis() -> Iterator[RedisServer]:
    """A Redis of the test's own, without persistence: a restart empties it."""
    server = start_redis_or_fail()
    try:
        yield server
    finally:
        server.stop()


def test_a_store_restarted_empty_neither_launches_beside_a_live_pod_nor_leaves_a_run_open(
    cluster: Cluster, replicas_factory, forgetful_redis: RedisServer
) -> None:
    """A Skip job's 30 s Pod runs at attempt 2 (its first runner was killed and the Pod adopted);
    then its runner is killed again and Redis restarts without its data. Nobody holds a lease
    of the run any more, and the store knows of no active run:

    * the next slots must not launch beside the live Pod (they are Skipped: Kubernetes says the
      earlier run is active);
    * the open run is claimed again and picked up as attempt 3, above its object's 2 (the store
      numbers it 1 again), and ends Succeeded as its Pod does.

    Before, the next slot launched its Pod beside the live one, and the run stayed Running for ever.
    """
    replicas: Replicas = replicas_factory(forgetful_redis.url)
    for i in range(3):
        replicas.start(f"replica-{i}")
    cluster.apply(
        job_manifest("forgotten", every="5s", overlap="Skip", annotations={"anarchon.test/run-seconds": "30"})
    )
    first = _first_running(cluster, "forgotten")
    name = first["metadata"]["name"]

    def attempt_of_first() -> int:
        return int(_status(cluster.get("anarchonrun", name)).get("attempt") or 0)

    replicas.kill(str(first["status"]["instance"]), signal.SIGKILL)
    replicas.start(str(first["status"]["instance"]))
    until("attempt 2 adopting the Pod", lambda: attempt_of_first() >= 2, timeout=30)
    runner = str(_status(cluster.get("anarchonrun", name))["instance"])
    replicas.kill(runner, signal.SIGKILL)
    forgetful_redis.restart()
    replicas.start(runner)
    deadline = time.monotonic() + 25
    while time.monotonic() < deadline:  # longer than a slot, a lease and a mend look
        live = [p["metadata"]["name"] for p in cluster.pods("anarchon.io/job=forgotten") if _live(p)]
        assert len(live) <= 1, f"a slot launched beside the live Pod: {live}"
        time.sleep(0.5)
    final = until(
        "the forgotten run to end",
        lambda: s if (s := _status(cluster.get("anarchonrun", name))).get("finishTime") else None,
        timeout=90,
    )
    assert final["phase"] == "Succeeded", final
    numbers = [a["attempt"] for a in final["attempts"]]
    assert numbers == sorted(set(numbers)) and numbers[-1] >= 3, f"attempts go on above 2: {numbers}"
    skipped = [_status(r) for r in cluster.runs("forgotten") if _status(r).get("phase") == "Skipped"]
    assert skipped, "the slots due meanwhile are Skipped"


def test_catch_up_after_a_store_restarted_empty_while_no_replica_ran(
    cluster: Cluster, replicas_factory, forgetful_redis: RedisServer
) -> None:
    """catchUp All: the only replica stops, Redis restarts without its data, slots are due
    meanwhile; the replica that comes back runs them, counting from the newest AnarchonRun.
    Before, the empty store read as "nothing ran": the slots were neither run nor reported."""
    replicas: Replicas = replicas_factory(forgetful_redis.url)
    replicas.start("replica-0")
    # Allow: under Skip a slot coming due while the catch-up runs goes first and the catch-up
    # slots behind it are Skipped, which would hide whether they were looked for at all. A long
    # history: the default keeps 3 Succeeded runs, and newer ones deleted the catch-up runs.
    cluster.apply(
        job_manifest(
            "forgetting", every="3s", overlap="Allow", catchUp={"policy": "All"}, successfulRunsHistoryLimit=100
        )
    )
    until(
        "a run that succeeded",
        lambda: [r for r in cluster.runs("forgetting") if _status(r).get("phase") == "Succeeded"],
        timeout=60,
    )
    replicas.kill("replica-0", signal.SIGTERM)
    newest = max(int(r["spec"]["slot"]) for r in cluster.runs("forgetting"))
    forgetful_redis.restart()
    time.sleep(8)  # two or three slots, due while no replica runs
    back = int(time.time() * 1000)
    replicas.start("replica-0")
    missed = list(range(newest + 3000, back - 3000 + 1, 3000))
    assert len(missed) >= 2, (newest, back)

    def caught_up() -> list[int]:
        ran = {int(r["spec"]["slot"]): r for r in cluster.runs("forgetting")}
        return [s for s in missed if s not in ran or not _status(ran[s]).get("finishTime")]

    until("the missed slots run", lambda: not caught_up(), timeout=60)
    by_slot = {int(r["spec"]["slot"]): r for r in cluster.runs("forgetting")}
    assert {by_slot[s]["spec"]["trigger"] for s in missed} == {"CatchUp"}
    assert {_status(by_slot[s])["phase"] for s in missed} == {"Succeeded"}


def test_a_takeover_after_the_store_forgot_the_run_is_numbered_after_the_runs_object(
    cluster: Cluster, replicas_factory, forgetful_redis: RedisServer
) -> None:
    """Redis restarts empty under a running run, which is claimed again (the store counts 1,
    the object 2); then its runner is killed and a backup takes it over (the store counts 2).
    The TakeOver Event names the attempt the run's object records (3). Before, it named the
    store's number, below the object's."""
    replicas: Replicas = replicas_factory(forgetful_redis.url)
    for i in range(2):  # a suspended job's open runs are mended at each resync: make it short
        replicas.start(f"replica-{i}", "--resync", "2s")
    cluster.apply(job_manifest("renumbered", every="1h", suspend=True, annotations={RUN_SECONDS: "40"}))
    run = cluster.trigger_running("renumbered")
    name = run["metadata"]["name"]
    runner = _runner_of(cluster, "renumbered", 1)
    replicas.kill(runner, signal.SIGKILL)
    forgetful_redis.restart()
    replicas.start(runner, "--resync", "2s")
    runner = _runner_of(cluster, "renumbered", 2)
    replicas.kill(runner, signal.SIGKILL)
    replicas.start(runner, "--resync", "2s")
    _runner_of(cluster, "renumbered", 3)
    messages = until(
        "the TakeOver Event",
        lambda: [e["message"] for e in cluster.events("TakeOver") if name in e["message"]],
        timeout=30,
    )
    assert any(f"run {name}: attempt 3 taken over by" in m for m in messages), messages
    assert not any("attempt 1 " in m or "attempt 2 " in m for m in messages), messages


def test_an_open_run_whose_runner_died_as_the_store_forgot_it_is_picked_up_within_a_lease(
    cluster: Cluster, replicas_factory, forgetful_redis: RedisServer
) -> None:
    """The runner of a 40 s Pod is killed and Redis restarts empty before its lease ran out. The
    replica left started after the run was claimed: only the run's object remembers the run.
    It meets the loss at its next claim and picks the run up a lease later (attempt 2, adopting
    the live Pod). Before, that waited for mending: two resyncs a lease apart (the harsh soak's
    slowest hand-overs, 60-115 s); the resync here is 2 minutes, so a lucky pass cannot hide it."""
    replicas: Replicas = replicas_factory(forgetful_redis.url)
    replicas.start("replica-0", "--resync", "120s")
    cluster.apply(job_manifest("orphaned", every="5s", overlap="Skip", annotations={RUN_SECONDS: "40"}))
    first = _first_running(cluster, "orphaned")
    name = first["metadata"]["name"]
    replicas.start("replica-1", "--resync", "120s")
    until(
        "a slot that replica-1 claimed (and so knows the store's epoch)",
        lambda: [r for r in cluster.runs("orphaned") if _status(r).get("instance") == "replica-1"],
        timeout=60,
    )
    replicas.kill("replica-0", signal.SIGKILL)
    forgetful_redis.restart()
    forgot = time.monotonic()
    # A slot (5 s) to meet the loss, a lease (4 s) and a beat, then the takeover's API writes.
    until("attempt 2", lambda: int(_status(cluster.get("anarchonrun", name)).get("attempt") or 0) >= 2, timeout=40)
    took = time.monotonic() - forgot
    status = _status(cluster.get("anarchonrun", name))
    assert status["instance"] == "replica-1", status
    live = [p["metadata"]["name"] for p in cluster.pods("anarchon.io/job=orphaned") if _live(p)]
    assert len(live) == 1, f"the live Pod was adopted, not launched again: {live}"
    assert took < 30, took
