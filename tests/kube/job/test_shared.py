"""A job shared between clusters, without a cluster: its key, its fingerprint, and the words of a mismatch.

The end-to-end behaviour (two clusters on one store) is tests/operator/test_shared_jobs.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from anarchon.engine import ConfigError
from anarchon.engine.backends import from_url
from anarchon.engine.shared import SharedSide
from anarchon.kube.api.reach import UNREACHABLE_AFTER_S, ApiReach
from anarchon.kube.job.shared import SharedSpecs, fingerprint, verdict
from anarchon.kube.job.spec import SpecError, engine_key, parse_job, shared_name_of

BODY: dict[str, Any] = {
    "metadata": {"name": "report", "namespace": "billing", "uid": "0123456789abcdef"},
    "spec": {
        "every": "10s",
        "sharedName": "report.billing",
        "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
    },
}


def _body(**spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(BODY)
    body["spec"].update(spec)
    return body


def test_a_shared_job_key_is_its_shared_name_alone() -> None:
    spec = parse_job(BODY)
    assert spec.shared_name == "report.billing"
    assert spec.key == "shared/report.billing" == engine_key("other", "x", "ffff", shared_name_of(BODY))
    unshared = parse_job(_body(sharedName=None))
    assert unshared.shared_name is None and unshared.key == "billing/report#01234567"


@pytest.mark.parametrize("bad", ["Report", "-report", "report-", "a" * 64, "report_billing", 7])
def test_a_bad_shared_name_is_refused_with_its_field(bad: object) -> None:
    with pytest.raises(SpecError) as caught:
        parse_job(_body(sharedName=bad))
    assert any(m.startswith("spec.sharedName: ") for m in caught.value.messages), caught.value.messages


def test_the_fingerprint_holds_what_must_agree_and_not_the_rest() -> None:
    base = fingerprint(parse_job(BODY))
    assert base == (
        "schedule=every 10s; overlap=Skip; catchUp=None within 1h; startingDeadline=none; maxAttempts=3; lease=15s;"
        " crossCluster=Relaunch"
    )
    for change in ({"every": "20s"}, {"overlap": "Allow"}, {"catchUp": {"policy": "All"}}, {"lease": "30s"}):
        assert fingerprint(parse_job(_body(**change))) != base, change
    template = {"spec": {"containers": [{"name": "main", "image": "registry.eu/busybox"}]}}
    for change in ({"template": template}, {"suspend": True}, {"jitter": "5s"}, {"successfulRunsHistoryLimit": 9}):
        assert fingerprint(parse_job(_body(**change))) == base, change


def test_a_mismatch_names_the_fields_the_clusters_and_who_waits() -> None:
    east = fingerprint(parse_job(BODY))
    west = fingerprint(parse_job(_body(every="20s")))
    sides = [SharedSide("west", west, 2, 0), SharedSide("east", east, 1, 0)]
    at_west = verdict(sides, "west", west, "report.billing")
    at_east = verdict(sides, "east", east, "report.billing")
    assert at_west.waits and not at_east.waits
    assert at_west.mismatch is not None and at_east.mismatch is not None
    assert "schedule: east 'every 10s', west 'every 20s'" in at_west.mismatch
    assert "overlap" not in at_west.mismatch  # only what differs
    assert "this cluster (west) starts no run" in at_west.mismatch
    assert "the spec of east" in at_east.mismatch and "west start no run" in at_east.mismatch
    agreeing = verdict([SharedSide("east", east, 1, 0), SharedSide("west", east, 2, 0)], "west", east, "r")
    assert agreeing.mismatch is None and not agreeing.waits


def test_a_shared_job_needs_a_cluster_name_and_a_lease_store(tmp_path: Any) -> None:
    sqlite = from_url(f"sqlite://{tmp_path / 's.db'}")
    with pytest.raises(ConfigError, match="--cluster-name"):
        SharedSpecs(sqlite, None, lambda: 0, every_s=1).check_usable()
    SharedSpecs(sqlite, "east", lambda: 0, every_s=1).check_usable()
    claim_only = from_url("redis+script://127.0.0.1:1/0")
    with pytest.raises(ConfigError, match="needs a lease store"):
        SharedSpecs(claim_only, "east", lambda: 0, every_s=1).check_usable()


def test_the_api_server_is_out_of_reach_after_failures_only_for_a_while() -> None:
    now = [100.0]
    reach = ApiReach(lambda: now[0])
    assert reach.held() is None
    reach.failed()
    now[0] += UNREACHABLE_AFTER_S - 0.1
    reach.failed()
    assert reach.held() is None  # a blip
    now[0] += 0.2
    assert reach.held() == f"this replica's API server has not answered for {UNREACHABLE_AFTER_S:.0f}s"
    reach.answered()
    assert reach.held() is None
    reach.failed()
    now[0] += UNREACHABLE_AFTER_S - 0.1
    assert reach.held() is None  # counted again from the first failure after an answer
