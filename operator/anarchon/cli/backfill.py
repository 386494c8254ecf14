"""``anarchon backfill JOB --from T --to T``: run every slot of a past range, once each.

Built on the manual-trigger path (:mod:`anarchon.kube.job.triggers`), nothing new in the replicas:
each slot in turn is a request in the job's trigger queue, as ``anarchon trigger`` adds, and
the next one is added only once the replicas have removed it (after the store decided the
slot), so a backfill holds one place of the queue at a time. So a slot is claimed in the store
like any other, by exactly one replica, and shows as a ``Manual`` run; the history limits keep
it by when it ran, not by its old slot.

Once each: a slot whose run is in the job's history is passed over, so running the same
backfill again (after a Ctrl-C, say) resumes it. A slot whose run has left the history
(history limits, a delete) is triggered again, and the store decides: it runs again if the
store has pruned its record too, else the claim is refused and the slot reported "not run
again" once its run has failed to appear for :data:`ABSENT_S`. ``--overlap`` says how slots follow
each other: ``Wait`` (default) triggers a slot when the previous run has ended, so every slot
runs, one at a time, whatever the job's overlap policy; ``Job`` triggers it as soon as the
previous request is handled and leaves the job's policy to decide (with ``Skip``, a slot that
meets an active run is recorded Skipped; with ``Allow``, runs go side by side).

The range must be bounded and in the past (a future slot triggered now would not run at its
time), and hold at most :data:`MAX_SLOTS` slots: a typo in ``--from`` must not start ten
thousand Pods.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from itertools import islice
from typing import TYPE_CHECKING, Final

from .common import Failure, add_kube_args, read_job, report, time_arg, with_kube
from .follow import follow
from .trigger import ask

if TYPE_CHECKING:
    from ..kube.api.client import Kube

#: Most slots one backfill runs. Each is a run and a Pod; a larger range is split by the user.
MAX_SLOTS: Final = 500
POLL_S: Final = 0.5
#: How long the run of a handled trigger may take to appear. The replicas create it right
#: after the store granted the claim; one that has not appeared by then will not (the claim
#: was refused: the store had decided the slot before).
ABSENT_S: Final = 30.0


async def _handled(kube: Kube, namespace: str, name: str, key: str) -> None:
    """Wait until the replicas have removed the request ``key``: the store decided its slot."""
    while True:
        job = await read_job(kube, namespace, name)
        if key not in (job["metadata"].get("annotations") or {}):
            return
        await asyncio.sleep(POLL_S)


def run(args: argparse.Namespace) -> int:
    from ..engine import RunState
    from ..engine.schedule import slots_between
    from ..kube.job.spec import SpecError, parse_job, run_name, slot_time
    from ..kube.run.record import list_runs

    try:
        start, end = time_arg("--from", args.start), time_arg("--to", args.end)
        if end < start:
            raise Failure(f"--to {args.end} is before --from {args.start}", 2)
        if end > time.time_ns() // 1_000_000:
            raise Failure(f"--to {args.end} is in the future: backfill runs past slots (future ones run on time)", 2)
    except Failure as failure:
        return report("backfill", failure)

    async def backfill(kube: Kube, namespace: str) -> int:
        job = await read_job(kube, namespace, args.job)
        try:
            spec = parse_job(job)
        except SpecError as exc:
            raise Failure(f"AnarchonJob {namespace}/{args.job} is invalid: {exc}") from None
        slots = list(islice(slots_between(spec.schedule, start - 1, end), MAX_SLOTS + 1))
        if len(slots) > MAX_SLOTS:
            raise Failure(
                f"more than {MAX_SLOTS} slots of {spec.schedule} from {slot_time(start)} to {slot_time(end)}:"
                f" backfill at most {MAX_SLOTS} at a time",
                2,
            )
        done = {int(r["spec"]["slot"]) for r in await list_runs(kube, namespace, args.job)}
        todo = [s for s in slots if s not in done]
        print(
            f"{len(slots)} slot(s) in the range: {len(slots) - len(todo)} already run, {len(todo)} to run", flush=True
        )
        outcomes: Counter[str] = Counter()
        for slot in todo:
            await _handled(kube, namespace, args.job, await ask(kube, namespace, args.job, slot_time(slot)))
            if args.overlap == "Wait":
                phase = await follow(kube, namespace, run_name(args.job, slot), None, absent_s=ABSENT_S)
                if phase is None:
                    print(f"slot {slot_time(slot)}: the store had decided it before, not run again", flush=True)
                outcomes[phase or "not run again"] += 1
            else:
                print(f"slot {slot_time(slot)}: decided by the replicas ({run_name(args.job, slot)})", flush=True)
        if args.overlap == "Wait":
            print("done: " + (", ".join(f"{n} {phase}" for phase, n in sorted(outcomes.items())) or "nothing to run"))
        return 0 if set(outcomes) <= {RunState.SUCCEEDED, "not run again"} else 1

    return with_kube("backfill", args, backfill)


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bf = sub.add_parser("backfill", help=f"run every past slot of a range, once each (at most {MAX_SLOTS})")
    bf.add_argument("job")
    bf.add_argument("--from", dest="start", required=True, help="first time of the range (RFC3339 or ms), included")
    bf.add_argument("--to", dest="end", required=True, help="last time of the range (RFC3339 or ms), included")
    bf.add_argument(
        "--overlap",
        choices=["Wait", "Job"],
        default="Wait",
        help="Wait: one slot after the other's run ended (default); Job: the job's overlap policy decides",
    )
    add_kube_args(bf)
    bf.set_defaults(func=run)
