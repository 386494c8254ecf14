"""How the verbs print what they read: a table for people, or the same records as JSON or YAML for scripts.

Each verb builds plain records (dicts of str, int, bool, None and lists) once; the table is
one view of them, ``-o json|yaml`` the whole of them, so the two never disagree.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

FORMATS = ("table", "json", "yaml")


def add_output_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", "-o", choices=FORMATS, default="table", help="table (default), json or yaml")


def dump(data: Any, fmt: str) -> str:
    """``data`` as JSON or YAML text (``fmt`` is not ``table``)."""
    if fmt == "json":
        return json.dumps(data, indent=2)
    import yaml

    return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True)).rstrip("\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns as ``kubectl get`` aligns them: left-aligned, three spaces apart."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = [headers, *rows]
    return "\n".join("   ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def fields(pairs: Mapping[str, str]) -> str:
    """``kubectl describe``-style ``Name:  value`` lines."""
    width = max(len(k) for k in pairs) + 2
    return "\n".join(f"{k + ':':<{width}}{v}" for k, v in pairs.items())


def relative(rfc3339: str | None, now: datetime | None = None) -> str:
    """``12s ago`` or ``in 3m`` (the largest unit only, as kubectl's AGE); ``-`` for no time."""
    if not rfc3339:
        return "-"
    then = datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))
    seconds = int(((now or datetime.now(UTC)) - then).total_seconds())
    ahead, seconds = seconds < 0, abs(seconds)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= 2 * size:
            text = f"{seconds // size}{unit}"
            break
    else:
        text = f"{seconds}s"
    return f"in {text}" if ahead else f"{text} ago"
