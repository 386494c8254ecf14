"""``anarchon runs JOB``: a job's history, oldest first: each run's attempts, their instances, its outcome."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .common import add_kube_args, read_job, with_kube
from .output import add_output_arg, dump, table

if TYPE_CHECKING:
    from ..kube.api.client import Kube


def run(args: argparse.Namespace) -> int:
    from ..kube.run.record import list_runs
    from .records import run_record, run_rows

    async def show(kube: Kube, namespace: str) -> int:
        await read_job(kube, namespace, args.job)  # no such job: say so, rather than "no runs"
        records = [run_record(r) for r in await list_runs(kube, namespace, args.job)]
        if args.output != "table":
            print(dump(records, args.output))
        elif not records:
            print(f"no runs of {namespace}/{args.job}")
        else:
            print(table(*run_rows(records)))
        return 0

    return with_kube("runs", args, show)


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rn = sub.add_parser("runs", help="a job's runs: attempts, instances, outcome")
    rn.add_argument("job")
    add_kube_args(rn)
    add_output_arg(rn)
    rn.set_defaults(func=run)
