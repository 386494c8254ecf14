"""Which run a log line is about: job, slot, attempt and instance on every record logged while an
attempt runs, whichever module logs it.

A context variable rather than arguments: the lines that matter in an incident come from
everywhere an attempt reaches (the lease logic, the handler, an API client it calls), and most
of those have no run in hand. Set by the job loop around each attempt; tasks the attempt starts
inherit it (asyncio copies the context into a new task), and nothing outside the attempt sees it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class RunFields:
    """The fields a record gets.

    ``job`` is the job's name in the engine and the store, as in the plain log lines: in the
    operator ``namespace/name#uid-prefix`` (:func:`anarchon.kube.job.spec.engine_key`).
    """

    job: str
    slot: int  # ms since 1970-01-01T00:00:00Z
    attempt: int
    instance: str


_current: ContextVar[RunFields | None] = ContextVar("anarchon_run", default=None)


@contextlib.contextmanager
def attempt_running(fields: RunFields) -> Iterator[None]:
    """Every record logged in this context (and in tasks started from it) is about ``fields``."""
    token = _current.set(fields)
    try:
        yield
    finally:
        _current.reset(token)


class RunFieldsFilter(logging.Filter):
    """Adds ``job``, ``slot``, ``attempt`` and ``instance`` to records logged while an attempt runs.

    For a handler (a logger's filters do not see records its children pass up). A structured
    formatter shows them as fields; records logged outside an attempt pass unchanged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _current.get()
        if fields is not None:
            for name, value in asdict(fields).items():
                setattr(record, name, value)
        return True
