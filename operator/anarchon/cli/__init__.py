"""``anarchon`` (also ``kubectl anarchon``): the operator process and the commands around it, one module per verb."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from . import backfill, cancel, get, lint, operator, resume, runs, suspend, trigger, ui, why
from . import list as list_
from . import next as next_


class _Parser(argparse.ArgumentParser):
    """Bad usage is one line and exit 2, as every other error of the CLI, not the usage block first."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


#: What ``anarchon --help`` says first: plain text (the module's docstring is for the code's readers).
DESCRIPTION = (
    "Anarchon: scheduled jobs on Kubernetes (also run as `kubectl anarchon`). "
    "The operator process, and the commands to look at and act on AnarchonJobs and their runs."
)


def main(argv: list[str] | None = None) -> int:
    from .. import __version__

    parser = _Parser(prog="anarchon", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"anarchon {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for verb in (operator, list_, get, runs, why, next_, lint, suspend, resume, trigger, backfill, cancel, ui):
        verb.add(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
