"""``anarchon lint FILE…``: the operator's own checks of AnarchonJobs, offline, before they are applied.

The checks are the operator's (:func:`anarchon.kube.spec.parse_job`, bounds from
:mod:`anarchon.engine.limits`), so lint passes what the operator runs and refuses what it
would mark ``Invalid``, including what the API server cannot check (an unknown time zone, a
cron expression that never matches). Every problem is listed with its field path; the exit
code is 1 if there is any, so it fits a CI step.
"""

from __future__ import annotations

import argparse
from typing import Any

from .common import Failure, report
from .manifests import read
from .output import add_output_arg, dump


def run(args: argparse.Namespace) -> int:
    from ..kube.spec import SpecError, parse_job

    results: list[dict[str, Any]] = []
    try:
        manifests = [read(path, args.namespace) for path in args.files]
    except Failure as failure:
        return report("lint", failure)
    for manifest in manifests:
        for problem in manifest.problems:
            results.append({"file": manifest.path, "job": None, "problems": [problem]})
        for label, body in manifest.jobs:
            try:
                parse_job(body)
                problems: list[str] = []
            except SpecError as exc:
                problems = exc.messages
            results.append({"file": manifest.path, "job": label, "problems": problems})
    count = sum(len(r["problems"]) for r in results)
    if args.output != "table":
        print(dump(results, args.output))
    else:
        for r in results:
            where = f"{r['file']}: {r['job']}" if r["job"] else r["file"]
            for problem in r["problems"]:
                print(f"{where}: {problem}")
        jobs = sum(1 for r in results if r["job"])
        print(f"{jobs} job(s) in {len(manifests)} file(s): " + (f"{count} problem(s)" if count else "no problems"))
    return 1 if count else 0


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ln = sub.add_parser("lint", help="check AnarchonJob files offline, as the operator would; exit 1 on any problem")
    ln.add_argument("files", nargs="+", metavar="FILE")
    ln.add_argument("--namespace", default="default", help="for jobs without one (default: default)")
    add_output_arg(ln)
    ln.set_defaults(func=run)
