"""The asyncio Kubernetes client the operator uses for everything it watches, reads and writes.

Everything goes through kubernetes_asyncio, so the event loop is never blocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import orjson
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.client.rest import RESTResponse

from ..engine.clock import SystemClock
from ..engine.retry import retry
from .constants import GROUP, JOBS, MERGE, VERSION

log = logging.getLogger("anarchon.kube.client")
T = TypeVar("T")

#: How long one API request may take before it counts as lost (then it is retried).
REQUEST_TIMEOUT_S = 30.0
#: How long a request that fails transiently is tried again before its caller gives up.
RETRY_FOR_MS = 60_000
#: Answers that say "not now" rather than "no": the same request may well succeed later.
TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
#: Requests one replica has in flight toward the API server at most (watches aside); the rest
#: wait their turn, and the wait does not count against REQUEST_TIMEOUT_S. Under overload a run
#: then starts late, as CronJob's do behind client-go's rate limiter, instead of 100 requests at
#: once (the client's pool) making the API server answer 429 and 500 and time out.
API_CONCURRENCY = 16

_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()
#: Set inside a request's turn: a call made from within another (none today) takes no second turn,
#: which could otherwise wait for ever for turns held by calls waiting for it.
_in_turn: contextvars.ContextVar[bool] = contextvars.ContextVar("anarchon_api_turn", default=False)


@contextlib.asynccontextmanager
async def _turn() -> AsyncIterator[None]:
    """Wait for one of the API_CONCURRENCY turns of this event loop, and hold it."""
    if _in_turn.get():
        yield
        return
    loop = asyncio.get_running_loop()
    turns = _turns.get(loop)
    if turns is None:
        turns = _turns[loop] = asyncio.Semaphore(API_CONCURRENCY)
    async with turns:
        token = _in_turn.set(True)
        try:
            yield
        finally:
            _in_turn.reset(token)


__all__ = [
    "ApiException",
    "CredentialsError",
    "Kube",
    "call",
    "connect",
    "transient",
]


def transient(exc: BaseException) -> bool:
    """An error after which the same request may succeed: overload, a server error, a lost connection.

    A 409 Conflict or a 404 is an answer, not a failure, and is left to the caller.
    """
    if isinstance(exc, ApiException):
        return not exc.status or exc.status in TRANSIENT_STATUS
    return isinstance(exc, aiohttp.ClientError | TimeoutError | ConnectionError)


async def call(
    what: str,
    op: Callable[[], Awaitable[T]],
    *,
    retry_for_ms: int | None = None,
    also: type[BaseException] | None = None,
) -> T:
    """One API request under the code base's retry policy, each try bounded by REQUEST_TIMEOUT_S.

    Only for requests that are safe to send again: reads, deletes, creates whose 409 the
    caller treats as "it exists already", and writes guarded by resourceVersion. A reply that
    was lost after the server acted is then recognised on the retry. ``also`` names one
    more error the caller wants retried the same way (a write conflict).
    """
    clock = SystemClock()
    deadline = clock.now_ms() + (RETRY_FOR_MS if retry_for_ms is None else retry_for_ms)

    async def bounded() -> T:
        async with _turn():
            return await asyncio.wait_for(op(), REQUEST_TIMEOUT_S)

    def failed(exc: BaseException) -> None:
        if also is not None and isinstance(exc, also):
            log.debug("%s: %s; trying again", what, exc)
            return
        reason = f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else f"{type(exc).__name__}: {exc}"
        log.warning("%s failed (%s); retrying", what, reason)

    def retried(exc: BaseException) -> bool:
        return transient(exc) or (also is not None and isinstance(exc, also))

    return await retry(bounded, clock=clock, transient=retried, deadline_ms=lambda: deadline, on_error=failed)


async def json_of(request: Awaitable[Any]) -> Any:
    """The reply to a request sent with ``_preload_content=False``: the JSON the server sent.

    The client would otherwise build its models from the reply (a V1Pod takes ~0.4 ms, and
    turning it back into the dict the operator uses as much again, against ~0.01 ms for the
    JSON itself), for every Pod and Event of every run. An error status raises the
    ApiException the client would have raised.
    """
    response = await request
    try:
        data = await response.read()
    finally:
        response.release()
    if not 200 <= response.status <= 299:
        raise ApiException(http_resp=RESTResponse(response, data))  # type: ignore[arg-type] # as the client does
    return orjson.loads(data) if data else None


@dataclass
class Kube:
    """The API groups the operator needs, sharing one connection pool."""

    api: client.ApiClient
    core: client.CoreV1Api
    custom: client.CustomObjectsApi
    #: The client's own session, which owns the connection pool; closed last (see _no_environment).
    pool_owner: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        await self.api.close()
        if self.pool_owner is not None:
            await self.pool_owner.close()

    async def annotate_job(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        await call(
            f"annotating job {namespace}/{name}",
            lambda: self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, JOBS, name, {"metadata": {"annotations": annotations}}, _content_type=MERGE
            ),  # type: ignore[call-arg]
        )

    async def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(
            await call(
                f"reading job {namespace}/{name}",
                lambda: self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, JOBS, name),
            )
        )

    async def list_jobs(self, namespace: str | None) -> list[dict[str, Any]]:
        """The AnarchonJobs of ``namespace`` (every namespace if None), by namespace and name."""
        if namespace is None:
            listing = await call("listing jobs", lambda: self.custom.list_cluster_custom_object(GROUP, VERSION, JOBS))
        else:
            listing = await call(
                f"listing jobs of {namespace}",
                lambda: self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, JOBS),
            )
        items = list(listing.get("items") or [])
        items.sort(key=lambda j: (j["metadata"]["namespace"], j["metadata"]["name"]))
        return items

    async def patch_job(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """A JSON merge patch of the job (spec and metadata; its status has :meth:`patch_job_status`)."""
        await call(
            f"patching job {namespace}/{name}",
            lambda: self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, JOBS, name, patch, _content_type=MERGE
            ),  # type: ignore[call-arg]
        )

    async def patch_job_status(
        self, namespace: str, name: str, status: dict[str, Any], *, if_version: str | None = None
    ) -> bool:
        """A JSON merge patch of the job's status; False if ``if_version`` was given and is not the job's.

        With ``if_version`` the patch applies only onto that resourceVersion of the job. Every
        replica that read the same version and would write the same thing sends it; one
        writes, the others get 409 and write nothing (they see the write as a new version).
        A reply lost after the write also comes back as 409 on the retry: written, all the same.
        """
        body: dict[str, Any] = {"status": status}
        if if_version:
            body["metadata"] = {"resourceVersion": if_version}
        try:
            await call(
                f"status of job {namespace}/{name}",
                lambda: self.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, JOBS, name, body, _content_type=MERGE
                ),  # type: ignore[call-arg]
            )
        except ApiException as exc:
            if if_version and exc.status == 409:
                return False
            raise
        return True


class CredentialsError(Exception):
    """No usable Kubernetes credentials: no kubeconfig, an unreadable one, no service account."""


async def connect(kubeconfig: str | None = None, *, api_concurrency: int | None = None) -> Kube:
    """Connect with the given kubeconfig, ``$KUBECONFIG``, or the in-cluster service account.

    ``api_concurrency`` sets the turns of this event loop's requests (default API_CONCURRENCY).

    Raises :class:`CredentialsError`, in one line that says where it looked, when none of them
    gives credentials (the client's own message alone, "Invalid kube-config file. Expected key
    current-context", does not say what to do).
    """
    cfg = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    in_cluster = not path and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    where = "the Pod's service account" if in_cluster else f"kubeconfig {path or '~/.kube/config'}"
    advice = "pass --kubeconfig FILE, set KUBECONFIG, or run in a Pod with a service account"
    # Looked for here, as the client would only log a warning and then fail on an empty config.
    file = path or "~/.kube/config"
    if not in_cluster and not await asyncio.to_thread(lambda: os.path.isfile(os.path.expanduser(file))):
        raise CredentialsError(f"no Kubernetes credentials: {where} does not exist; {advice}")
    try:
        if in_cluster:
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            await config.load_kube_config(config_file=path, client_configuration=cfg)
    except Exception as exc:  # a malformed file raises anything from ConfigException to TypeError
        reason = " ".join(str(exc).split()) if isinstance(exc, config.ConfigException) else "not a kubeconfig"
        raise CredentialsError(f"no usable Kubernetes credentials in {where} ({reason}); {advice}") from None
    api = client.ApiClient(configuration=cfg)
    if api_concurrency is not None:
        _turns[asyncio.get_running_loop()] = asyncio.Semaphore(api_concurrency)
    return Kube(
        api=api, core=client.CoreV1Api(api), custom=client.CustomObjectsApi(api), pool_owner=_no_environment(api)
    )


def _no_environment(api: client.ApiClient) -> aiohttp.ClientSession:
    """Send the client's requests through a session that ignores proxy variables and ``.netrc``.

    kubernetes_asyncio makes its session with ``trust_env=True``: aiohttp then reads the proxy
    variables and looks ``~/.netrc`` up in a worker thread on every request, about a fifth of
    a replica's CPU at 1,000 jobs. The new session shares the old one's connection pool, so
    the old one stays open (it owns the pool) until :meth:`Kube.close`.
    """
    owner: aiohttp.ClientSession = api.rest_client.pool_manager
    api.rest_client.pool_manager = aiohttp.ClientSession(
        connector=owner.connector, connector_owner=False, trust_env=False, read_bufsize=2**21
    )
    return owner


def is_status(exc: BaseException, *codes: int) -> bool:
    return isinstance(exc, ApiException) and exc.status in codes
