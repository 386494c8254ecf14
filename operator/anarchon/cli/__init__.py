"""``anarchon`` (also ``kubectl anarchon``): the operator process and the commands around it, one module per verb."""

from __future__ import annotations

import argparse
import sys

from . import operator, trigger


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="anarchon", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for verb in (operator, trigger):
        verb.add(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
