"""Lines for the end of a test run's report (control plane start time, image sizes...).

Under pytest-xdist a worker's terminal summary is never shown: each worker hands its lines to the
controller (``workeroutput``, see plugin.py) when it finishes, and the controller prints them.
"""

from __future__ import annotations

import os

lines: list[str] = []


def report(line: str) -> None:
    """Print ``line`` at the end of the run (prefixed with the xdist worker's name, if any)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    lines.append(f"[{worker}] {line}" if worker else line)
