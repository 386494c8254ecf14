"""``anarchon lint FILE|DIR|-…``: AnarchonJobs checked offline, before they are applied.

Two checks, both offline. The CRD's own schema (:mod:`.crdschema`, down into the Pod template):
what the API server would refuse, and the unknown fields it would drop without a word for a
client that does not ask for strict validation (``timezone:``, a container's ``resource:``),
each with the field meant. Then the operator's (:func:`anarchon.kube.job.spec.parse_job`, bounds from
:mod:`anarchon.engine.limits`), so lint passes what the operator runs and refuses what it
would mark ``Invalid``, including what the API server cannot check (an unknown time zone, a
cron expression that never matches); its message wins where both find fault with a field.

Every file is reported, one that cannot be read included; ``-`` is stdin, a directory is walked.
The exit code is 1 if any problem was found, 2 for bad usage only, so it fits a CI step.
"""

from __future__ import annotations

import argparse
from typing import Any

from .common import Failure, report
from .manifests import read_all
from .output import add_output_arg, dump


def _problems(body: dict[str, Any]) -> list[str]:
    """The operator's problems, then the schema's about fields the operator said nothing of."""
    from ..kube.job.spec import SpecError, parse_job
    from .crdschema import check_job

    try:
        parse_job(body)
        problems: list[str] = []
    except SpecError as exc:
        problems = list(exc.messages)
    said = {p.split(": ", 1)[0] for p in problems}
    return problems + [p for p in check_job(body) if p.split(": ", 1)[0] not in said]


def run(args: argparse.Namespace) -> int:
    from .crdschema import job_schema

    try:
        job_schema()
    except Failure as failure:
        return report("lint", failure)
    results: list[dict[str, Any]] = []
    manifests = read_all(args.files, args.namespace)
    for manifest in manifests:
        for problem in manifest.problems:
            results.append({"file": manifest.path, "job": None, "problems": [problem]})
        for label, body in manifest.jobs:
            results.append({"file": manifest.path, "job": label, "problems": _problems(body)})
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
    ln = sub.add_parser(
        "lint",
        help="check AnarchonJob files offline (the CRD's schema, the operator's checks); exit 1 on a problem",
    )
    ln.add_argument("files", nargs="+", metavar="FILE", help="a YAML or JSON file, a directory of them, or - for stdin")
    ln.add_argument("--namespace", "-n", default="default", help="for jobs without one (default: default)")
    add_output_arg(ln)
    ln.set_defaults(func=run)
