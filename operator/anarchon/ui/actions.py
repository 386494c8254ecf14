"""What the page may do, each with the user's own credentials: the API server decides, as for kubectl.

Trigger, suspend and resume go through the CLI's own functions (:func:`anarchon.cli.trigger.ask`,
:func:`anarchon.cli.suspend.patch_suspended`), so the page and ``anarchon trigger|suspend|resume``
write the same thing. Cancel sets the ``anarchon.io/cancel`` annotation on the run (what
``anarchon cancel`` sets), in :func:`cancel_run` alone. Each answer is one line: what was done,
or the API server's own message (a 403 says which permission is missing).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import aiohttp

from ..cli.common import Failure, api_failure
from ..kube.client import ApiException, call, path, request_timeout
from ..kube.constants import GROUP, MERGE, RUNS
from ..kube.runs import ended
from ..kube.spec import slot_time

if TYPE_CHECKING:
    from ..kube.client import Kube

#: On an AnarchonRun: stop it, the value says why (``anarchon cancel``; the operator acts on it).
ANNOTATION_CANCEL: Final = f"{GROUP}/cancel"


@dataclass(frozen=True)
class Result:
    ok: bool
    message: str


async def trigger_now(kube: Kube, namespace: str, job: str, now_ms: int) -> str:
    from ..cli.trigger import ask

    at = slot_time(now_ms)
    await ask(kube, namespace, job, at)
    return f"anarchonjob {namespace}/{job}: run of {at} requested"


async def suspend(kube: Kube, namespace: str, job: str, reason: str | None) -> str:
    from ..cli.suspend import patch_suspended

    return await patch_suspended(kube, namespace, job, True, reason)


async def resume(kube: Kube, namespace: str, job: str) -> str:
    from ..cli.suspend import patch_suspended

    return await patch_suspended(kube, namespace, job, False, None)


async def cancel_run(kube: Kube, namespace: str, run: str, reason: str) -> str:
    """Ask the replicas to stop ``run``: the annotation ``anarchon.io/cancel`` with the reason. A run
    that has ended is left as it is."""
    where = path(RUNS, namespace, run)
    try:
        obj = await call(f"reading run {run}", lambda: kube.request("GET", where))
    except ApiException as exc:
        if exc.status == 404:
            raise Failure(f"no AnarchonRun {run!r} in namespace {namespace!r} (HTTP 404)") from None
        raise
    status = obj.get("status") or {}
    if ended(status):
        raise Failure(f"anarchonrun {namespace}/{run} has ended {status.get('phase')}: nothing to cancel")
    patch = {"metadata": {"annotations": {ANNOTATION_CANCEL: reason}}}
    await call(f"annotating run {run}", lambda: kube.request("PATCH", where, patch, content_type=MERGE))
    return f"anarchonrun {namespace}/{run}: cancel requested" + (f": {reason}" if reason else "")


async def act(kube: Kube, work: Callable[[], Awaitable[str]], timeout_s: float | None) -> Result:
    """Do ``work``, giving up after ``timeout_s`` (``--request-timeout``: the page answers, it does
    not hang); its line, or why it failed in the words the CLI would print."""
    try:
        with request_timeout(timeout_s):
            return Result(True, await work())
    except Failure as failure:
        return Result(False, str(failure))
    except ApiException as exc:
        return Result(False, str(await api_failure(kube, exc)))
    except TimeoutError:
        within = f" within {timeout_s:g}s (--request-timeout)" if timeout_s else ""
        return Result(False, f"the API server at {kube.endpoint.server} did not answer{within}")
    except aiohttp.ClientError as exc:
        return Result(False, f"the API server at {kube.endpoint.server} could not be reached: {exc}")
