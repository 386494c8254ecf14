"""An HTTP fault proxy in front of the test API server: status codes, latency, reset, lost reply, cut watch.

The operator's failures that matter most happen between it and the API server: a 500 or a
429 on one write, a reply lost after the server applied a create, a watch stream that
breaks. :class:`ApiFaultProxy` listens on plain ``http://127.0.0.1:PORT``, forwards every
request to the real kube-apiserver (https, checked against the control plane's CA, the
client's ``Authorization`` header passed through unchanged) and streams each reply back
chunk by chunk, so watches stay live. Rules (:class:`Fault`) added at run time, from any
thread, aim at requests the way RBAC does: by verb, resource, subresource, name and
namespace, each derived from the request like the API server derives them.

It runs in its own thread with its own asyncio loop, so that both in-process async
clients (the operator's ``Kube``) and separate processes (operator replicas started with
``--kubeconfig proxy.kubeconfig``) can use it::

    with ApiFaultProxy(control_plane) as proxy:
        fault = proxy.add(Fault("status", code=503, verb="create", resource="pods", times=1))
        ...  # run the code under test with proxy.kubeconfig
        assert fault.fired == 1 and proxy.count(verb="create", resource="pods", forwarded=True) == 1

Not supported: connection upgrades (``kubectl exec``/``port-forward``/``attach``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import ssl
import struct
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, NoReturn, Protocol

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

__all__ = [
    "ACTIONS",
    "VERBS",
    "Action",
    "ApiFaultProxy",
    "ControlPlaneLike",
    "Fault",
    "Record",
    "RequestInfo",
    "parse_request",
    "status_body",
]

Action = Literal["status", "latency", "reset", "lost_reply", "cut_watch"]
ACTIONS: frozenset[str] = frozenset({"status", "latency", "reset", "lost_reply", "cut_watch"})

#: Verbs of resource requests, as the API server (and RBAC) names them.
VERBS: frozenset[str] = frozenset({"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"})

#: ``Status.reason`` for the codes a fault is likely to answer with (as the API server sets it).
REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    502: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

#: Headers that belong to one hop (RFC 9110 §7.6.1) and are never forwarded; Host and Content-Length are set anew.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_NOT_TO_UPSTREAM = _HOP_BY_HOP | {"host", "content-length"}

#: Subresources of a Namespace object (``/api/v1/namespaces/NS/status``), not namespaced resources.
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})

_SESSION = web.AppKey("session", aiohttp.ClientSession)


class ControlPlaneLike(Protocol):
    """What the proxy needs of ``e2e/controlplane/controlplane.py``'s ControlPlane."""

    server: str
    ca_file: Path
    admin_token: str
    run_dir: Path


# ---------------------------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class RequestInfo:
    """What the API server would make of one request (k8s.io/apiserver ``RequestInfoFactory``).

    ``resource`` is None for a non-resource request (``/version``, ``/healthz``, discovery);
    its ``verb`` is then the lower-cased HTTP method. ``subresource`` and ``name`` are "" when absent.
    """

    method: str
    path: str
    verb: str
    group: str = ""
    version: str = ""
    namespace: str = ""
    resource: str | None = None
    subresource: str = ""
    name: str = ""


_METHOD_VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _name_from_field_selector(selector: str) -> str:
    """The name an exact ``metadata.name=X`` term of a field selector asks for, or ""."""
    for term in selector.split(","):
        for op in ("==", "="):
            key, sep, value = term.partition(op)
            if sep and key.strip() == "metadata.name" and not key.endswith("!"):
                return value.strip()
    return ""


def parse_request(method: str, path: str, query: Mapping[str, str] | None = None) -> RequestInfo:
    """Verb, resource, subresource, name and namespace of a request, derived as the API server does.

    GET on a collection is ``list``, GET with ``watch=true`` (or under the legacy ``/watch/``
    prefix) is ``watch``, GET on a named object ``get``; POST ``create``, PUT ``update``,
    PATCH ``patch``, DELETE ``delete`` (``deletecollection`` on a collection). A list or
    watch narrowed by ``fieldSelector=metadata.name=X`` has name X, as for RBAC.
    """
    method = method.upper()
    query = query or {}
    nonresource = RequestInfo(method=method, path=path, verb=method.lower())
    parts = [p for p in path.strip("/").split("/") if p]
    if len(parts) < 2 or parts[0] not in ("api", "apis"):
        return nonresource
    if parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    else:
        if len(parts) < 3:
            return nonresource  # /apis/GROUP: discovery
        group, version, rest = parts[1], parts[2], parts[3:]
    if not rest or method not in _METHOD_VERBS:
        return nonresource  # /api/v1 or /apis/GROUP/VERSION: discovery
    verb = _METHOD_VERBS[method]
    if rest[0] == "watch" and verb == "get":
        verb, rest = "watch", rest[1:]
        if not rest:
            return nonresource
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if verb in ("get", "watch") and not name:
        if verb == "get":
            verb = "watch" if query.get("watch", "").lower() in ("true", "1") else "list"
        name = _name_from_field_selector(query.get("fieldSelector", ""))
    elif verb == "get" and query.get("watch", "").lower() in ("true", "1"):
        verb = "watch"  # a watch on one named object (deprecated, still served)
    if verb == "delete" and not name:
        verb = "deletecollection"
    return RequestInfo(method, path, verb, group, version, namespace, resource, subresource, name)


# ---------------------------------------------------------------------------------------------- faults


@dataclass(eq=False)
class Fault:
    """One rule: which requests it aims at, what it does to them, how often.

    Matching (None = any): ``verb`` (get/list/watch/create/update/patch/delete/deletecollection),
    ``resource`` ("pods", "anarchonruns"), ``subresource`` ("status"; "" = only the main
    resource, never a subresource), ``name``, ``namespace``. ``cut_watch`` only ever matches
    watches.

    Firing: at most ``times`` times (None = unlimited), each matching request with
    probability ``rate`` (drawn from the proxy's seeded random generator). ``fired`` counts
    the requests it hit.

    Actions:

    - ``status``: answer ``code`` (default 500) with a Kubernetes Status body, not forwarded;
      ``Retry-After: retry_after`` on 429 and 503.
    - ``latency``: wait ``seconds``, then forward.
    - ``reset``: close the client's connection (TCP RST), no reply, not forwarded.
    - ``lost_reply``: forward (the server applies it), then drop the reply: reset the
      connection (``reply="reset"``) or answer ``code`` (default 504) with a Status body
      (``reply="status"``).
    - ``cut_watch``: forward a watch, stream it for ``seconds``, then reset the connection.
    """

    action: Action
    _: KW_ONLY
    verb: str | None = None
    resource: str | None = None
    subresource: str | None = None
    name: str | None = None
    namespace: str | None = None
    times: int | None = None
    rate: float = 1.0
    code: int | None = None
    seconds: float = 0.0
    reply: Literal["reset", "status"] = "reset"
    message: str | None = None
    retry_after: int = 1
    fired: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown action {self.action!r}; one of {sorted(ACTIONS)}")
        if self.verb is not None and self.verb not in VERBS:
            raise ValueError(f"unknown verb {self.verb!r}; one of {sorted(VERBS)}")
        if self.action == "cut_watch" and self.verb not in (None, "watch"):
            raise ValueError("cut_watch only applies to watches")
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"rate must be within [0, 1], not {self.rate}")
        if self.times is not None and self.times < 0:
            raise ValueError(f"times must be >= 0, not {self.times}")
        if self.seconds < 0:
            raise ValueError(f"seconds must be >= 0, not {self.seconds}")
        if self.reply not in ("reset", "status"):
            raise ValueError(f"reply must be 'reset' or 'status', not {self.reply!r}")
        if self.code is not None and not 100 <= self.code <= 599:
            raise ValueError(f"not an HTTP status code: {self.code}")

    @property
    def status_code(self) -> int:
        """The code a ``status`` fault (default 500) or a ``lost_reply`` with ``reply="status"`` (504) answers."""
        if self.code is not None:
            return self.code
        return 504 if self.action == "lost_reply" else 500

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.fired >= self.times

    def matches(self, info: RequestInfo) -> bool:
        """Whether the request is one this rule aims at (ignoring ``times`` and ``rate``)."""
        if self.action == "cut_watch" and info.verb != "watch":
            return False
        return (
            (self.verb is None or self.verb == info.verb)
            and (self.resource is None or self.resource == info.resource)
            and (self.subresource is None or self.subresource == info.subresource)
            and (self.name is None or self.name == info.name)
            and (self.namespace is None or self.namespace == info.namespace)
        )


def status_body(code: int, message: str, info: RequestInfo | None = None, retry_after: int | None = None) -> bytes:
    """A ``Status`` (kind Status, apiVersion v1, status Failure) as the API server would send it."""
    details: dict[str, Any] = {}
    if info is not None and info.resource:
        details["kind"] = info.resource
        if info.group:
            details["group"] = info.group
        if info.name:
            details["name"] = info.name
    if retry_after is not None:
        details["retryAfterSeconds"] = retry_after
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": REASONS.get(code, "InternalError" if code >= 500 else "BadRequest"),
        "code": code,
    }
    if details:
        body["details"] = details
    return json.dumps(body).encode()


@dataclass(frozen=True)
class Record:
    """One request that went through the proxy and what became of it.

    ``status`` is what the client got (None: the connection was closed with no reply);
    ``upstream`` what the API server answered (None: the request was not forwarded).
    ``fault`` is the action of the rule that hit it, if any.
    """

    method: str
    path: str
    verb: str
    namespace: str
    resource: str | None
    subresource: str
    name: str
    status: int | None
    upstream: int | None
    fault: Action | None

    @property
    def forwarded(self) -> bool:
        return self.upstream is not None


# ---------------------------------------------------------------------------------------------- the proxy


def _abort_connection(request: web.BaseRequest) -> None:
    """Close the connection a request came on with a TCP RST (SO_LINGER 0), dropping anything unsent."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class _Reset(Exception):
    """The connection was reset on purpose; the handler is being cancelled."""


class ApiFaultProxy:
    """A fault-injecting HTTP proxy to one API server, on its own thread and asyncio loop.

    Give it the control plane (or ``server``, ``ca_file`` and ``token``). :meth:`start` and
    :meth:`stop` are idempotent; a stopped proxy can start again on the same port (the API
    is unreachable in between). ``kubeconfig`` points at the proxy with the admin token.

    A client's ``Authorization`` header is forwarded unchanged. client-go (kubectl) sends no
    credentials at all to an ``http://`` server, so a request without one gets the proxy's
    ``token`` (admin) added, unless ``inject_token=False`` (then it reaches the API server
    anonymously).
    """

    def __init__(
        self,
        control_plane: ControlPlaneLike | None = None,
        *,
        server: str | None = None,
        ca_file: Path | str | None = None,
        token: str | None = None,
        run_dir: Path | str | None = None,
        port: int = 0,
        seed: int = 0,
        inject_token: bool = True,
    ) -> None:
        if control_plane is not None:
            server = server or control_plane.server
            ca_file = ca_file or control_plane.ca_file
            token = token or control_plane.admin_token
            run_dir = run_dir or control_plane.run_dir
        if not server:
            raise ValueError("ApiFaultProxy needs a control plane or the upstream server URL")
        self.upstream = server.rstrip("/")
        self.ca_file = Path(ca_file) if ca_file is not None else None
        self.token = token
        self.inject_token = inject_token
        self._run_dir = Path(run_dir) if run_dir is not None else None
        self._port = port
        self._lock = threading.Lock()  # rules, records, random generator
        self._random = random.Random(seed)
        self._faults: list[Fault] = []
        self._records: list[Record] = []
        self._lifecycle = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._kubeconfig: Path | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self._active: dict[int, web.BaseRequest] = {}  # by id(): requests are unhashable; proxy loop only
        #: The most requests the proxy held at once (watches included) since the last reset.
        self.max_in_flight = 0

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> ApiFaultProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> ApiFaultProxy:
        """Listen (in a new thread) and write the kubeconfig; a no-op if running."""
        with self._lifecycle:
            if self._thread is not None:
                return self
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", self._port))
                sock.listen(128)
                sock.setblocking(False)
            except BaseException:
                sock.close()
                raise
            self._port = int(sock.getsockname()[1])
            ready = threading.Event()
            failure: list[BaseException] = []
            thread = threading.Thread(
                target=self._run, args=(sock, ready, failure), name=f"api-fault-proxy-{self._port}", daemon=True
            )
            thread.start()
            ready.wait()
            if failure:
                thread.join()
                sock.close()
                raise RuntimeError(f"the API fault proxy did not start: {failure[0]!r}") from failure[0]
            self._thread = thread
            if self._kubeconfig is None:
                self._kubeconfig = self.token_kubeconfig("admin", self.token or "")
            return self

    def stop(self) -> None:
        """Close the listener and every open connection (open watches end abruptly); a no-op if stopped."""
        with self._lifecycle:
            thread, loop, stop_event = self._thread, self._loop, self._stop_event
            if thread is None:
                return
            if loop is not None and stop_event is not None:
                with contextlib.suppress(RuntimeError):  # the loop is already closed
                    loop.call_soon_threadsafe(stop_event.set)
            thread.join(timeout=30)
            if thread.is_alive():
                raise RuntimeError("the API fault proxy's thread did not stop within 30s")
            self._thread = self._loop = self._stop_event = None

    def close(self) -> None:
        """Stop, and remove the temporary directory of the kubeconfig if the proxy made one."""
        self.stop()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = self._run_dir = self._kubeconfig = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError("the proxy has no port before start()")
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``, where clients connect."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        """A kubeconfig (admin token) whose server is the proxy; written by :meth:`start`."""
        if self._kubeconfig is None:
            raise RuntimeError("the proxy's kubeconfig is written by start()")
        return self._kubeconfig

    def token_kubeconfig(self, user: str, token: str) -> Path:
        """Write a kubeconfig to the proxy authenticating with ``token`` (e.g. a ServiceAccount's); returns it."""
        if self._run_dir is None:
            if self._tmpdir is None:
                self._tmpdir = tempfile.TemporaryDirectory(prefix="api-fault-proxy-")
            self._run_dir = Path(self._tmpdir.name)
        cluster = "api-fault-proxy"
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": cluster, "cluster": {"server": self.url}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": f"{user}@{cluster}", "context": {"cluster": cluster, "user": user}}],
            "current-context": f"{user}@{cluster}",
        }
        path = self._run_dir / f"kubeconfig-fault-proxy-{self.port}-{user}"
        path.write_text(json.dumps(cfg, indent=2) + "\n")
        path.chmod(0o600)
        return path

    # ------------------------------------------------------------------ rules and records (any thread)

    def add(self, fault: Fault) -> Fault:
        """Add a rule (after the existing ones: the first rule that fires on a request wins); returns it."""
        with self._lock:
            self._faults.append(fault)
        return fault

    def remove(self, fault: Fault) -> None:
        """Remove a rule (no error if it is not there)."""
        with self._lock:
            self._faults = [f for f in self._faults if f is not fault]

    def clear(self) -> None:
        """Remove every rule (the records stay)."""
        with self._lock:
            self._faults = []

    @property
    def faults(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)

    @property
    def requests(self) -> list[Record]:
        """Every request so far, in the order their outcome was known."""
        with self._lock:
            return list(self._records)

    def clear_requests(self) -> None:
        with self._lock:
            self._records = []

    def count(
        self,
        *,
        verb: str | None = None,
        resource: str | None = None,
        subresource: str | None = None,
        name: str | None = None,
        namespace: str | None = None,
        status: int | None = None,
        upstream: int | None = None,
        fault: Action | None = None,
        forwarded: bool | None = None,
    ) -> int:
        """How many recorded requests match every filter given (None = any)."""
        return sum(
            1
            for r in self.requests
            if (verb is None or r.verb == verb)
            and (resource is None or r.resource == resource)
            and (subresource is None or r.subresource == subresource)
            and (name is None or r.name == name)
            and (namespace is None or r.namespace == namespace)
            and (status is None or r.status == status)
            and (upstream is None or r.upstream == upstream)
            and (fault is None or r.fault == fault)
            and (forwarded is None or r.forwarded == forwarded)
        )

    def _pick(self, info: RequestInfo) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.exhausted or not fault.matches(info):
                    continue
                if fault.rate < 1.0 and self._random.random() >= fault.rate:
                    continue
                fault.fired += 1
                return fault
        return None

    def _record(self, info: RequestInfo, status: int | None, upstream: int | None, fault: Fault | None) -> None:
        rec = Record(
            method=info.method,
            path=info.path,
            verb=info.verb,
            namespace=info.namespace,
            resource=info.resource,
            subresource=info.subresource,
            name=info.name,
            status=status,
            upstream=upstream,
            fault=fault.action if fault is not None else None,
        )
        with self._lock:
            self._records.append(rec)

    # ------------------------------------------------------------------ the proxy's thread

    def _run(self, sock: socket.socket, ready: threading.Event, failure: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve(sock, ready, failure))
        except BaseException as e:  # reported to start() if it happened before ready
            if not ready.is_set():
                failure.append(e)
                ready.set()
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            asyncio.set_event_loop(None)

    async def _serve(self, sock: socket.socket, ready: threading.Event, failure: list[BaseException]) -> None:
        ssl_ctx: ssl.SSLContext | bool = True
        if self.upstream.startswith("https://"):
            ssl_ctx = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl_ctx, limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,  # bytes pass through as they are, Content-Encoding and all
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app[_SESSION] = session
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a client that goes away cancels its handler (and the upstream request).
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.5)
        try:
            await runner.setup()
            site = web.SockSite(runner, sock)
            await site.start()
            self._loop = asyncio.get_running_loop()
            self._stop_event = asyncio.Event()
        except BaseException as e:
            failure.append(e)
            ready.set()
            await runner.cleanup()
            await session.close()
            return
        ready.set()
        try:
            await self._stop_event.wait()
        finally:
            await site.stop()
            for request in list(self._active.values()):  # open watches and requests in flight end abruptly
                _abort_connection(request)
            await asyncio.sleep(0)  # their handlers are cancelled
            await runner.cleanup()
            await session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self._active[id(request)] = request
        self.max_in_flight = max(self.max_in_flight, len(self._active))
        try:
            return await self._handle_one(request)
        finally:
            self._active.pop(id(request), None)

    async def _handle_one(self, request: web.Request) -> web.StreamResponse:
        info = parse_request(request.method, request.path, request.query)
        fault = self._pick(info)
        session = request.app[_SESSION]
        if fault is None:
            return await self._forward(session, request, info, None)
        match fault.action:
            case "status":
                code = fault.status_code
                message = fault.message or f"injected by the API fault proxy: {code} on {info.verb} {info.path}"
                self._record(info, code, None, fault)
                return self._status_response(code, message, info, fault.retry_after)
            case "latency":
                await asyncio.sleep(fault.seconds)
                return await self._forward(session, request, info, fault)
            case "reset":
                self._record(info, None, None, fault)
                await self._reset(request)
            case "lost_reply":
                return await self._lose_reply(session, request, info, fault)
            case "cut_watch":
                return await self._forward(session, request, info, fault, cut_after=fault.seconds)

    @staticmethod
    def _status_response(code: int, message: str, info: RequestInfo, retry_after: int) -> web.Response:
        headers = {"Retry-After": str(retry_after)} if code in (429, 503) else {}
        after = retry_after if code in (429, 503) else None
        return web.Response(
            status=code,
            body=status_body(code, message, info, after),
            content_type="application/json",
            headers=headers,
        )

    @staticmethod
    async def _reset(request: web.BaseRequest) -> NoReturn:
        """Close the client's connection with a TCP RST, no reply; the handler is then cancelled."""
        _abort_connection(request)
        # connection_lost() cancels this handler (handler_cancellation=True) within a loop turn.
        await asyncio.sleep(30)
        raise _Reset("connection reset by the API fault proxy")

    async def _send_upstream(
        self, session: aiohttp.ClientSession, request: web.Request, info: RequestInfo, fault: Fault | None
    ) -> aiohttp.ClientResponse | web.Response:
        """The upstream response (to be closed by the caller), or a 502 Status if the server could not be reached."""
        headers: CIMultiDict[str] = CIMultiDict()
        for key, value in request.headers.items():
            if key.lower() not in _NOT_TO_UPSTREAM:
                headers.add(key, value)
        if self.inject_token and self.token and "Authorization" not in headers:
            headers["Authorization"] = f"Bearer {self.token}"
        body = await request.read() if request.body_exists else None
        try:
            return await session.request(
                request.method,
                URL(self.upstream + request.raw_path, encoded=True),
                headers=headers,
                data=body,
                allow_redirects=False,
                skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
            )
        except (aiohttp.ClientError, OSError) as e:
            self._record(info, 502, None, fault)
            return self._status_response(502, f"API fault proxy: upstream unreachable: {e}", info, 1)

    async def _forward(
        self,
        session: aiohttp.ClientSession,
        request: web.Request,
        info: RequestInfo,
        fault: Fault | None,
        *,
        cut_after: float | None = None,
    ) -> web.StreamResponse:
        upstream = await self._send_upstream(session, request, info, fault)
        if isinstance(upstream, web.Response):
            return upstream
        async with upstream:
            resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in _HOP_BY_HOP:
                    resp.headers.add(key, value)
            self._record(info, upstream.status, upstream.status, fault)
            await resp.prepare(request)
            try:
                async with asyncio.timeout(cut_after):
                    async for chunk in upstream.content.iter_any():
                        await resp.write(chunk)
            except TimeoutError:
                await self._reset(request)
            except aiohttp.ClientError:
                await self._reset(request)  # the upstream stream broke: so does the client's
            await resp.write_eof()
            return resp

    async def _lose_reply(
        self, session: aiohttp.ClientSession, request: web.Request, info: RequestInfo, fault: Fault
    ) -> web.StreamResponse:
        upstream = await self._send_upstream(session, request, info, fault)
        if isinstance(upstream, web.Response):
            return upstream
        async with upstream:
            with contextlib.suppress(aiohttp.ClientError):
                await upstream.read()  # the server has acted; the reply goes nowhere
            status = upstream.status
        if fault.reply == "status":
            code = fault.status_code
            self._record(info, code, status, fault)
            message = fault.message or f"injected by the API fault proxy: the reply ({status}) to {info.verb} was lost"
            return self._status_response(code, message, info, fault.retry_after)
        self._record(info, None, status, fault)
        await self._reset(request)
