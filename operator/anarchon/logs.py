"""The operator's log output: plain text lines (the default), or one JSON object per line.

JSON is for log pipelines (Loki, Elasticsearch, Cloud Logging): each line parses alone, and
a line logged while an attempt runs carries ``job``, ``slot``, ``attempt`` and ``instance`` as
fields (:mod:`anarchon.engine.logcontext`), so "everything about this run" is a query, not a
regular expression over messages. The formatter is python-json-logger's, which also keeps
``extra=`` fields and formats exceptions; a hand-written one had neither.
"""

from __future__ import annotations

import logging

from pythonjsonlogger.json import JsonFormatter

from .engine.logcontext import RunFieldsFilter

PLAIN = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(fmt: str, level: str) -> None:
    """Log to stderr in ``fmt`` (``plain`` or ``json``) from ``level`` up."""
    if fmt == "json":
        handler = logging.StreamHandler()
        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            )
        )
        handler.addFilter(RunFieldsFilter())
        logging.basicConfig(level=level, handlers=[handler])
    else:
        logging.basicConfig(level=level, format=PLAIN)
    logging.getLogger("aiohttp").setLevel(logging.WARNING)
