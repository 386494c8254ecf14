"""What a run's Pod is told about its run: environment variables, and the fencing token among them.

The workload needs them to label its output (which slot is this?) and to protect what it
writes from a Pod of the same run that was given up for lost but still runs (its node was cut
off, then the Pod was deleted from the API and launched again elsewhere). docs/workload.md is
the user's side of this.

The values are fixed when the Pod is created. A later attempt that adopts a live Pod cannot
change its environment, so ``ANARCHON_ATTEMPT`` and the token say which attempt *launched* the
Pod, not which attempt follows it now; that is exactly what a fence needs, since adoption
starts no second writer.
"""

from __future__ import annotations

from typing import Any, Final

from ..job.spec import slot_time

ENV_JOB: Final = "ANARCHON_JOB"
ENV_RUN: Final = "ANARCHON_RUN"
#: The slot as RFC3339 UTC (``2026-12-02T14:08:00Z``, milliseconds only when it has some).
ENV_SLOT: Final = "ANARCHON_SLOT"
#: The slot in milliseconds since 1970-01-01T00:00:00Z, for arithmetic and for keys.
ENV_SLOT_MS: Final = "ANARCHON_SLOT_MS"
#: The attempt that launched this Pod (1 for the first Pod of a run).
ENV_ATTEMPT: Final = "ANARCHON_ATTEMPT"
#: The try this Pod is (1, then 2, 3, ... for retries after a failed Pod: ``spec.retries``).
ENV_TRY: Final = "ANARCHON_TRY"
ENV_FENCING_TOKEN: Final = "ANARCHON_FENCING_TOKEN"

#: The token is ``slot_ms * ATTEMPT_SPAN + attempt``. With the largest slot (the end of year
#: 9999, about 2.5e14 ms) that is about 2.5e18: a signed 64-bit integer (PostgreSQL ``bigint``,
#: Go ``int64``) holds every token. Attempts past the first 9,999 of one run (hand-overs do not
#: count against maxAttempts, so the number is not bounded by it) still order the run's own
#: Pods; only the order against a run of a slot 1 ms later would no longer hold.
ATTEMPT_SPAN: Final = 10_000


def fencing_token(slot_ms: int, attempt: int) -> int:
    """The fencing token of the Pod that ``attempt`` launches for the run of ``slot_ms``.

    Why it can fence: an attempt launches a Pod only after its status write on the
    AnarchonRun, which is refused once a later attempt wrote (:func:`.run.record.update_status`),
    and each attempt launches at most one Pod. So a Pod launched after another Pod of the
    same run carries a greater attempt, hence a greater token, unless its launcher was
    already fenced off, in which case its token is the smaller one and its writes are the
    ones refused. Slots come first, so the token also grows from one run of a job to the next.
    The tries of one attempt (``spec.retries``) share its token: a try's Pod is launched only
    once the failed try's Pod has ended, its containers exited, so two tries never write at once.
    The secret attempt token of the store (:func:`anarchon.engine.model.new_token`) is random
    and never leaves the operator; this one is an ordering, not a secret.
    """
    return slot_ms * ATTEMPT_SPAN + attempt


def run_env(*, job: str, run: str, slot_ms: int, attempt: int, try_number: int) -> list[dict[str, str]]:
    """The environment variables every container of the Pod gets."""
    values = {
        ENV_JOB: job,
        ENV_RUN: run,
        ENV_SLOT: slot_time(slot_ms),
        ENV_SLOT_MS: str(slot_ms),
        ENV_ATTEMPT: str(attempt),
        ENV_TRY: str(try_number),
        ENV_FENCING_TOKEN: str(fencing_token(slot_ms, attempt)),
    }
    return [{"name": name, "value": value} for name, value in values.items()]


def with_run_env(container: dict[str, Any], env: list[dict[str, str]]) -> dict[str, Any]:
    """The container with ``env`` added; a template's own value of one of these names is replaced.

    Replaced, not kept: a workload that fences its writes must never read a token of the
    template's making.
    """
    ours = {e["name"] for e in env}
    kept = [e for e in container.get("env") or [] if not (isinstance(e, dict) and e.get("name") in ours)]
    return {**container, "env": [*kept, *env]}
