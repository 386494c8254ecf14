"""What the page may do, each with the user's own credentials: the API server decides, as for kubectl.

Each goes through the CLI's own function (:func:`anarchon.cli.trigger.ask`,
:func:`anarchon.cli.suspend.patch_suspended`, :func:`anarchon.cli.cancel.request_cancel`), so the
page and ``anarchon trigger|suspend|resume|cancel`` write the same thing. Each answer is one line:
what was done, or the API server's own message (a 403 says which permission is missing).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp

from ..cli.common import Failure, api_failure
from ..kube.api.client import ApiException, request_timeout
from ..kube.job.spec import slot_time

if TYPE_CHECKING:
    from ..kube.api.client import Kube


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
    from ..cli.cancel import request_cancel

    return await request_cancel(kube, namespace, run, reason)


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
