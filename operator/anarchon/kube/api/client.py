"""The asyncio Kubernetes client the operator uses for everything it watches, reads and writes.

A thin one over aiohttp: paths, JSON bodies and the answers as dicts. The operator works on the
JSON the API server sends (a run, a Pod, an Event) and never on typed models, which a generated
client builds for every reply and imports all of at start (figures: bench/README.md).
Credentials are read by :mod:`.kubeconfig`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

import aiohttp
import orjson

from ...engine.clock import SystemClock
from ...engine.retry import retry
from ..constants import GROUP, JOBS, MERGE, RUNS, VERSION
from . import kubeconfig
from .reach import ApiReach

log = logging.getLogger("anarchon.kube.api.client")
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


class _Turns:
    """The API_CONCURRENCY turns of one event loop, handed to waiting requests in order, those
    made in :func:`background` only when no other request waits.

    Under overload a replica has far more to send than turns: the Pods and runs of the slots it
    won wait behind the records of skipped slots, Events and job statuses, which make no Pod and
    are then most of the requests; their backlog made the next slots' runs later, which made
    them skip too. Background work is late instead, not dropped.
    """

    def __init__(self, limit: int) -> None:
        self.free = limit
        #: Requests waiting for a turn: the urgent ones, then the background ones.
        self.waiting: tuple[collections.deque[asyncio.Future[None]], ...] = (collections.deque(), collections.deque())
        #: When each urgent request still waiting began to (event-loop time), oldest first.
        self._since: dict[asyncio.Future[None], float] = {}

    def backlog_s(self) -> float:
        """How long the oldest urgent request still waiting has waited for its turn."""
        for given in self.waiting[False]:
            if not given.done():
                return asyncio.get_running_loop().time() - self._since[given]
        return 0.0

    async def take(self, background: bool) -> None:
        if self.free and not any(self.waiting):
            self.free -= 1
            return
        queue = self.waiting[background]
        loop = asyncio.get_running_loop()
        given: asyncio.Future[None] = loop.create_future()
        queue.append(given)
        if not background:
            self._since[given] = loop.time()
            given.add_done_callback(self._since.pop)
        try:
            await given
        except asyncio.CancelledError:
            if given.done() and not given.cancelled():
                self.give()  # the turn came with the cancellation: it goes to the next in line
            elif given in queue:  # a give() since the cancellation dropped it already
                queue.remove(given)
            raise

    def give(self) -> None:
        for queue in self.waiting:
            while queue:
                given = queue.popleft()
                if not given.done():
                    given.set_result(None)
                    return
        self.free += 1


_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Turns] = weakref.WeakKeyDictionary()
#: Set inside a request's turn: a call made from within another (none today) takes no second turn,
#: which could otherwise wait for ever for turns held by calls waiting for it.
_in_turn: contextvars.ContextVar[bool] = contextvars.ContextVar("anarchon_api_turn", default=False)
#: Set by :func:`request_timeout` (the CLI's ``--request-timeout``).
_request_limit: contextvars.ContextVar[float | None] = contextvars.ContextVar("anarchon_request_limit", default=None)
#: Set by :func:`background`.
_background: contextvars.ContextVar[bool] = contextvars.ContextVar("anarchon_api_background", default=False)


@contextlib.contextmanager
def background() -> Iterator[None]:
    """The requests made within (and in tasks started within) are background work: records of
    what happened (skipped slots, Events, job statuses, history), which wait for their turn
    behind every request that moves a run on."""
    token = _background.set(True)
    try:
        yield
    finally:
        _background.reset(token)


@contextlib.contextmanager
def request_timeout(seconds: float | None) -> Iterator[None]:
    """Within, each :func:`call` gives up after ``seconds``, its retries included, and a server
    that refuses the connection is not tried again.

    For a command someone waits on (the CLI's ``--request-timeout``, as kubectl's): it says the
    API server is not there in that time, where a replica retries for RETRY_FOR_MS. None: the
    replica's policy.
    """
    token = _request_limit.set(seconds)
    try:
        yield
    finally:
        _request_limit.reset(token)


async def in_background(work: Awaitable[T]) -> T:
    """Await ``work`` as background work (see :func:`background`)."""
    with background():
        return await work


@contextlib.asynccontextmanager
async def turn() -> AsyncIterator[None]:
    """Wait for one of the API_CONCURRENCY turns of this event loop, and hold it. :func:`call`
    takes one for each try; code that sends with :meth:`Kube.request` itself (Events) takes one
    around its requests."""
    if _in_turn.get():
        yield
        return
    loop = asyncio.get_running_loop()
    turns = _turns.get(loop)
    if turns is None:
        turns = _turns[loop] = _Turns(API_CONCURRENCY)
    await turns.take(_background.get())
    token = _in_turn.set(True)
    try:
        yield
    finally:
        _in_turn.reset(token)
        turns.give()


def backlog_ms() -> float:
    """How long the oldest of this event loop's requests still waiting for a turn (background
    work aside) has waited: the engine leaves new slots to the other replicas while it is long
    (:meth:`anarchon.engine.lag.LoopLag.add_backlog`)."""
    turns = _turns.get(asyncio.get_running_loop())
    return 0.0 if turns is None else turns.backlog_s() * 1000


async def queue_passed() -> None:
    """Return once the requests this replica had queued for a turn have been sent.

    Under overload a request waits for its turn far longer than it takes: whoever waits for
    another replica's write (which queues alike) should look for it only after that wait. As
    background work, it passes after the requests queued before it and every urgent one.
    """
    with background():
        async with turn():
            pass


__all__ = [
    "ApiException",
    "CredentialsError",
    "Kube",
    "background",
    "backlog_ms",
    "call",
    "connect",
    "in_background",
    "path",
    "queue_passed",
    "request_timeout",
    "transient",
    "turn",
]


class ApiException(Exception):
    """The API server answered with an error status (``status``), or the request was refused
    before it was made (``status`` 0).

    ``reason`` is the HTTP reason phrase ("Not Found"), ``message`` the Status object's message
    when the server sent one, ``body`` and ``headers`` the reply as it came.
    """

    def __init__(
        self, status: int = 0, reason: str = "", body: bytes = b"", message: str = "", headers: Mapping[str, str] = {}
    ) -> None:
        self.status, self.reason, self.body, self.message, self.headers = status, reason, body, message, headers
        super().__init__(f"({status}) {reason}" + (f": {message}" if message else ""))

    @classmethod
    def of(cls, status: int, reason: str | None, body: bytes, headers: Mapping[str, str] = {}) -> ApiException:
        message = ""
        with contextlib.suppress(ValueError, AttributeError):
            message = str(orjson.loads(body).get("message") or "")
        return cls(status, reason or "", body, message, headers)


def path(resource: str, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
    """The URL path of a resource (AnarchonJobs, AnarchonRuns, or a core one: pods, events),
    of one namespace's (or all, if None), of one object, of its subresource."""
    base = f"/apis/{GROUP}/{VERSION}" if resource in (JOBS, RUNS) else "/api/v1"
    where = f"{base}/namespaces/{namespace}/{resource}" if namespace else f"{base}/{resource}"
    if name:
        where += f"/{name}"
        if sub:
            where += f"/{sub}"
    return where


def _query(params: Mapping[str, Any] | None) -> dict[str, str]:
    """Query parameters as the API server spells them (aiohttp refuses booleans)."""
    given = (params or {}).items()
    return {k: ("true" if v else "false") if isinstance(v, bool) else str(v) for k, v in given if v is not None}


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
    limit = _request_limit.get()
    retry_ms = RETRY_FOR_MS if retry_for_ms is None else retry_for_ms
    deadline = clock.now_ms() + (retry_ms if limit is None else min(retry_ms, int(limit * 1000)))

    async def bounded() -> T:
        async with turn():
            return await asyncio.wait_for(op(), REQUEST_TIMEOUT_S if limit is None else max(0.0, deadline_s()))

    def deadline_s() -> float:
        return (deadline - clock.now_ms()) / 1000

    def failed(exc: BaseException, _wait_ms: int | None) -> None:
        if also is not None and isinstance(exc, also):
            log.debug("%s: %s; trying again", what, exc)
            return
        reason = f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else f"{type(exc).__name__}: {exc}"
        log.warning("%s failed (%s); retrying", what, reason)

    def retried(exc: BaseException) -> bool:
        if limit is not None and isinstance(exc, aiohttp.ClientConnectorError | TimeoutError):
            return False  # no server there, or the time is up: said at once, in one line
        return transient(exc) or (also is not None and isinstance(exc, also))

    if limit is None:
        return await retry(bounded, clock=clock, transient=retried, deadline_ms=lambda: deadline, on_error=failed)
    async with asyncio.timeout(limit):  # the backoff between tries too
        return await retry(bounded, clock=clock, transient=retried, deadline_ms=lambda: deadline, on_error=failed)


class Kube:
    """Requests to one API server, over one connection pool.

    The session is made at the first request (it belongs to the event loop that sends), with
    ``trust_env=False``: the operator never goes through the environment's proxies, and aiohttp
    would otherwise read the proxy variables and look ``~/.netrc`` up in a worker thread on
    every request (``bench/bench_client.py``).
    """

    def __init__(self, endpoint: kubeconfig.Endpoint) -> None:
        self.endpoint = endpoint
        self._session: aiohttp.ClientSession | None = None
        #: Whether the API server answers (:mod:`.reach`).
        self.reach = ApiReach()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Lines of a watch may be one whole object: 2 MB, as client-go allows.
            self._session = aiohttp.ClientSession(trust_env=False, read_bufsize=2**21)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _send(
        self, method: str, where: str, body: Any, params: Mapping[str, Any] | None, content_type: str, timeout_s: float
    ) -> aiohttp.ClientResponse:
        """The response, open; an error status raises :class:`ApiException` (the response released)."""
        headers = {"Accept": "application/json"}
        if self.endpoint.authorization is not None:
            header = await self.endpoint.authorization()
            if header:
                headers["Authorization"] = header
        data = None
        if body is not None:
            data = orjson.dumps(body)
            headers["Content-Type"] = content_type
        try:
            response = await self.session.request(
                method,
                self.endpoint.server + where,
                params=_query(params),
                data=data,
                headers=headers,
                ssl=self.endpoint.ssl or True,  # True: aiohttp's default (plain HTTP has none)
                server_hostname=self.endpoint.server_hostname,
                proxy=self.endpoint.proxy,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            )
        except (aiohttp.ClientConnectionError, TimeoutError, OSError):
            self.reach.failed()
            raise
        self.reach.answered()
        if not 200 <= response.status <= 299:
            try:
                data = await response.read()
            finally:
                response.release()
            raise ApiException.of(response.status, response.reason, data, response.headers)
        return response

    async def request(
        self,
        method: str,
        where: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> Any:
        """One request; the reply's JSON. An error status raises :class:`ApiException`."""
        async with await self._send(method, where, body, params, content_type, timeout_s) as response:
            data = await response.read()
        return orjson.loads(data) if data else None

    async def stream(self, where: str, params: Mapping[str, Any], timeout_s: float) -> aiohttp.ClientResponse:
        """A request whose reply is read as it comes (a watch): the open response, for the caller
        to read and release. An error status raises :class:`ApiException`."""
        return await self._send("GET", where, None, params, "application/json", timeout_s)

    async def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(
            await call(f"reading job {namespace}/{name}", lambda: self.request("GET", path(JOBS, namespace, name)))
        )

    async def list_jobs(self, namespace: str | None) -> list[dict[str, Any]]:
        """The AnarchonJobs of ``namespace`` (every namespace if None), by namespace and name."""
        where = path(JOBS, namespace)
        listing = await call(f"listing jobs of {namespace or 'every namespace'}", lambda: self.request("GET", where))
        items = list(listing.get("items") or [])
        items.sort(key=lambda j: (j["metadata"]["namespace"], j["metadata"]["name"]))
        return items

    async def patch_job(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """A JSON merge patch of the job (spec and metadata; its status has :meth:`patch_job_status`)."""
        await call(
            f"patching job {namespace}/{name}",
            lambda: self.request("PATCH", path(JOBS, namespace, name), patch, content_type=MERGE),
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
                lambda: self.request("PATCH", path(JOBS, namespace, name, "status"), body, content_type=MERGE),
            )
        except ApiException as exc:
            if if_version and exc.status == 409:
                return False
            raise
        return True


class CredentialsError(Exception):
    """No usable Kubernetes credentials: no kubeconfig, an unreadable one, no service account."""


async def connect(config_file: str | None = None, *, api_concurrency: int | None = None) -> Kube:
    """Connect with the given kubeconfig, ``$KUBECONFIG``, or the in-cluster service account.

    ``api_concurrency`` sets the turns of this event loop's requests (default API_CONCURRENCY).

    Raises :class:`CredentialsError`, in one line that says where it looked and what to do,
    when none of them gives credentials.
    """
    advice = "pass --kubeconfig FILE, set KUBECONFIG, or run in a Pod with a service account"
    try:
        endpoint = await kubeconfig.load(config_file)
    except kubeconfig.ConfigError as exc:
        if exc.missing:
            raise CredentialsError(f"no Kubernetes credentials: {exc.where} {exc.reason}; {advice}") from None
        raise CredentialsError(f"no usable Kubernetes credentials in {exc.where} ({exc.reason}); {advice}") from None
    if api_concurrency is not None:
        _turns[asyncio.get_running_loop()] = _Turns(api_concurrency)
    return Kube(endpoint)
