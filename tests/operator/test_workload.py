"""The workload knows its run: the Pod's environment and labels, and a fencing token that grows
when a lost Pod is launched again; a replica against the real API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.harness.cluster import Cluster, Replicas, job_manifest
from tests.harness.until import until

SLOT = 1_800_000_000_000  # 2027-01-15T08:00:00Z


def env_of(pod: dict[str, Any], container: str) -> dict[str, str]:
    spec = pod["spec"]
    found = next(c for c in [*spec.get("initContainers", []), *spec["containers"]] if c["name"] == container)
    return {e["name"]: e["value"] for e in found.get("env", [])}


def test_the_pod_knows_its_run_and_a_relaunched_pod_has_a_greater_token(
    cluster: Cluster, replicas_factory, tmp_path: Path
) -> None:
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    replicas.start("replica-0")
    job = job_manifest("knows", every="1h", suspend=True, annotations={"anarchon.test/run-seconds": "-1"})
    pod_spec = job["spec"]["template"]["spec"]
    pod_spec["initContainers"] = [{"name": "init", "image": "busybox", "command": ["true"]}]
    # The template's own value of a name the operator sets is replaced, never passed on.
    main = pod_spec["containers"][0]
    main["env"] = [{"name": "KEEP", "value": "1"}, {"name": "ANARCHON_FENCING_TOKEN", "value": "9"}]
    cluster.apply(job)
    run = cluster.trigger_running("knows", SLOT)
    name = run["metadata"]["name"]
    first = cluster.get("pod", run["status"]["podName"])

    env = env_of(first, "main")
    token = int(env.pop("ANARCHON_FENCING_TOKEN"))
    assert env == {
        "KEEP": "1",
        "ANARCHON_JOB": "knows",
        "ANARCHON_RUN": name,
        "ANARCHON_SLOT": "2027-01-15T08:00:00Z",
        "ANARCHON_SLOT_MS": str(SLOT),
        "ANARCHON_ATTEMPT": "1",
        "ANARCHON_TRY": "1",
    }
    assert token == SLOT * 10_000 + 1
    assert env_of(first, "init")["ANARCHON_RUN"] == name
    labels = first["metadata"]["labels"]
    assert {k: labels[k] for k in labels if k.startswith("anarchon.io/")} == {
        "anarchon.io/job": "knows",
        "anarchon.io/run": name,
        "anarchon.io/slot": str(SLOT),
        "anarchon.io/attempt": "1",
        "anarchon.io/try": "1",
        "anarchon.io/follower": "replica-0",  # the one replica, whose Pod watch selects by it
    }

    # The Pod is lost: the next attempt launches it again, under the same name, with a greater token.
    cluster.kubectl("delete", "pod", first["metadata"]["name"], "--wait=false")

    def relaunched() -> dict[str, Any] | None:
        pod = cluster.get("pod", name)
        return pod if pod and pod["metadata"]["uid"] != first["metadata"]["uid"] else None

    second = until("the Pod launched again", relaunched, timeout=60)
    again = env_of(second, "main")
    assert again["ANARCHON_ATTEMPT"] == "2" and second["metadata"]["labels"]["anarchon.io/attempt"] == "2"
    assert int(again["ANARCHON_FENCING_TOKEN"]) > token
    assert again["ANARCHON_SLOT_MS"] == str(SLOT) and again["ANARCHON_RUN"] == name
