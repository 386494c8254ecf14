"""What the scheduler refuses on claim-only stores, with the real stores behind the URLs."""

from __future__ import annotations

import pytest

from anarchon.engine import ConfigError, RunContext, Scheduler
from anarchon.engine.backends import from_url


async def _noop(ctx: RunContext) -> None:
    return None


@pytest.fixture(params=["redis+script", "redis+stream", "nats"])
def claim_only_url(request: pytest.FixtureRequest) -> str:
    if request.param == "nats":
        return str(request.getfixturevalue("nats_url"))
    redis = str(request.getfixturevalue("redis_url"))
    return redis.replace("redis://", f"{request.param}://", 1)


@pytest.mark.parametrize(
    ("options", "refused"),
    [
        ({"overlap": "Skip"}, "overlap=Skip"),
        ({"overlap": "Replace"}, "overlap=Replace"),
        ({"max_attempts": 3}, "maxAttempts=3"),
        ({"catch_up": "Latest"}, "catchUp=Latest"),
    ],
)
def test_lease_policies_are_refused_with_the_reason(claim_only_url: str, options: dict, refused: str) -> None:
    sched = Scheduler(from_url(claim_only_url), instance_id="x")
    with pytest.raises(ConfigError, match="claim-only") as err:
        sched.every("job", "10s", _noop, **options)
    assert refused in str(err.value)
    assert "lease store" in str(err.value)


def test_defaults_fit_a_claim_only_store(claim_only_url: str) -> None:
    sched = Scheduler(from_url(claim_only_url), instance_id="x")
    loop = sched.every("job", "10s", _noop)
    assert loop.options.overlap == "Allow" and loop.options.max_attempts == 1 and not loop.options.leases


@pytest.mark.parametrize("url_kind", ["redis+script", "nats"])
def test_a_claim_window_shorter_than_the_spread_of_contenders_is_refused(
    request: pytest.FixtureRequest, url_kind: str
) -> None:
    if url_kind == "nats":
        backend = from_url(str(request.getfixturevalue("nats_url")), duplicate_window_ms=10_000)
    else:
        backend = from_url(
            str(request.getfixturevalue("redis_url")).replace("redis://", "redis+script://"), ttl_ms=10_000
        )
    sched = Scheduler(backend, instance_id="x")
    with pytest.raises(ConfigError):
        sched.every("job", "1m", _noop, jitter="20s")  # 20 s jitter + 30 s of claim retries > 10 s window
    sched.every("job", "1m", _noop, jitter="0s", starting_deadline="1s")  # 0 + 1 + 5 s skew margin < 10 s
