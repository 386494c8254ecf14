"""``anarchon resume JOB``: scheduled runs again, and the suspension's reason removed (see :mod:`.suspend`)."""

from __future__ import annotations

import argparse

from .common import add_kube_args
from .suspend import set_suspended


def run(args: argparse.Namespace) -> int:
    return set_suspended("resume", args, False, None)


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rs = sub.add_parser("resume", help="run a suspended job on its schedule again")
    rs.add_argument("job")
    add_kube_args(rs)
    rs.set_defaults(func=run)
