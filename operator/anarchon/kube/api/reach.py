"""Whether this replica's API server answers it: a cluster out of its own API server's reach holds its shared jobs back.

Every request of the replica (the watches retry all the time) tells :class:`ApiReach` whether
the server answered (any HTTP status is an answer) or could not be reached (connection
refused or reset, no answer within the request's time). Once nothing but failures came for
UNREACHABLE_AFTER_S, the replica's jobs shared with other clusters are held back
(:attr:`anarchon.engine.Job.held`): it claims none of their slots, takes none of their runs
over, and lets the leases of the runs it has run out, so that a cluster that can launch Pods
takes them (docs/multicluster.md). A job of this cluster alone is not held: no one else could
run it, and its runs wait for the API server as before. The first answer ends the hold.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

#: How long only failures must come before the shared jobs are held back: longer than a blip
#: (an API server restarting behind a load balancer), shorter than a lease.
UNREACHABLE_AFTER_S: Final = 3.0


class ApiReach:
    """The API server's answers and failures, as this replica's requests met them."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.monotonic = monotonic
        self._failing_since: float | None = None

    def answered(self) -> None:
        self._failing_since = None

    def failed(self) -> None:
        if self._failing_since is None:
            self._failing_since = self.monotonic()

    def held(self) -> str | None:
        """Why the shared jobs are held back (the API server has not answered for a while), else None."""
        since = self._failing_since
        if since is None or (out := self.monotonic() - since) < UNREACHABLE_AFTER_S:
            return None
        return f"this replica's API server has not answered for {out:.0f}s"
