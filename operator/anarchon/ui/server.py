"""The web server of ``anarchon ui``: pages from the live model, changes pushed as server-sent events.

It listens on loopback and acts with the credentials of the user who started it, so it guards
what a browser would let another site do with it: a request whose ``Host`` is not this server's
own address is refused (DNS rebinding), and an action must be a POST from one of its own pages
(its ``Origin``, and a token each page of this process carries). Pages are served with a
Content-Security-Policy that allows the package's own files only.

``GET /events`` is the stream a page listens to: one ``change`` event per burst of changes, with
the topics changed (:mod:`.model`), the first for all that changed since the page was drawn
(``?since=`` its version, in the page); the page refreshes its ``main`` element when it shows one
of them, by asking its own URL again with ``X-Anarchon-Fragment: main``. The jobs page also
refreshes single rows: ``X-Anarchon-Fragment: rows`` with the rows' ids in ``X-Anarchon-Rows``
(``job:NS/NAME ...``) answers those rows alone, so that a change of one job costs one row, not
the whole table.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Final

from aiohttp import web

from ..kube.api.client import ApiException, path
from ..kube.job.triggers import parse_trigger
from . import actions, pages
from .model import Model
from .timeline import Row, span_of

if TYPE_CHECKING:
    from ..kube.api.client import Kube

log = logging.getLogger("anarchon.ui")

#: Changes that arrive within this of the first are sent to a page as one event.
SETTLE_S: Final = 0.05
#: A comment on an idle event stream this often, so that proxies and the browser keep it open.
KEEPALIVE_S: Final = 15.0
#: How long the Pod log request may take before the story says so instead.
LOG_TIMEOUT_S: Final = 5.0
FRAGMENT_HEADER: Final = "X-Anarchon-Fragment"
ROWS_HEADER: Final = "X-Anarchon-Rows"
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
STATIC_TYPES: Final = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class UI:
    """The routes, over one :class:`Model` and the user's API client."""

    def __init__(
        self, kube: Kube, model: Model, *, scope: str, all_namespaces: bool, action_timeout_s: float | None
    ) -> None:
        self.kube, self.model, self.action_timeout_s = kube, model, action_timeout_s
        self.scope, self.all_namespaces = scope, all_namespaces
        #: What every form of this process carries, and no other site can know.
        self.token = secrets.token_urlsafe(24)
        #: The port it listens on, set once it does (:func:`serve`).
        self.port = 0

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        app.router.add_get("/", self.jobs)
        app.router.add_get("/timeline", self.timeline)
        app.router.add_get("/jobs/{namespace}/{name}", self.job)
        app.router.add_get("/runs/{namespace}/{name}", self.run)
        app.router.add_get("/confirm/{action}", self.confirm)
        app.router.add_post("/act/{action}", self.act)
        app.router.add_get("/events", self.events)
        app.router.add_get("/static/{file}", self.static)
        app.router.add_get("/favicon.ico", self.icon)
        return app

    # -- guards ------------------------------------------------------------------------------------

    def _our_host(self, host: str) -> bool:
        """``Host`` is an address (or localhost) and our port: never a name another site's DNS
        could point here (DNS rebinding)."""
        name, _, port = host.rpartition(":")
        if port != str(self.port):
            return False
        if name == "localhost":
            return True
        try:
            ipaddress.ip_address(name.removeprefix("[").removesuffix("]"))
        except ValueError:
            return False
        return True

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self._our_host(request.host):
            return web.Response(status=421, text=f"refused: this server answers at port {self.port} of an address only")
        if request.method == "POST":
            origin = request.headers.get("Origin")
            if origin is not None and origin != f"http://{request.host}":
                return web.Response(status=403, text="refused: the request came from another site")
        response = await handler(request)
        if not response.prepared:  # a stream sent its headers already: its own
            response.headers.update(SECURITY_HEADERS)
        return response

    # -- pages -------------------------------------------------------------------------------------

    def _page(
        self,
        request: web.Request,
        title: str,
        topics: list[str],
        main: str,
        status: int = 200,
        version: int | None = None,
    ) -> web.Response:
        """``main`` alone (the script's refresh), or the page around it; ``version``: the model's
        when ``main`` was drawn from it, if not now."""
        if request.headers.get(FRAGMENT_HEADER) == "main":
            return web.Response(text=main, content_type="text/html", status=status)
        version = self.model.version if version is None else version
        html = pages.layout(title, topics, main, scope=self.scope, version=version)
        return web.Response(text=html, content_type="text/html", status=status)

    def _views(self, now: int) -> list[pages.JobView]:
        return [pages.job_view(f, self.model.runs_of(f.namespace, f.name), now) for f in self.model.job_list()]

    def _range(self, request: web.Request, views: list[pages.JobView], now: int) -> pages.Range:
        given = [request.query.get("from"), request.query.get("to")]
        if not any(given):
            start, end = span_of([Row("", "", "", v.runs, v.facts.missed) for v in views], now)
            return pages.Range(start, end, False)
        start_ms, end_ms = (parse_trigger(v) if v else None for v in given)
        if start_ms is None or end_ms is None or end_ms <= start_ms:
            raise web.HTTPBadRequest(
                text=f"from {given[0]!r} and to {given[1]!r}: expected two times (RFC3339 or ms), from before to"
            )
        return pages.Range(start_ms, end_ms, True)

    async def jobs(self, request: web.Request) -> web.Response:
        if request.headers.get(FRAGMENT_HEADER) == "rows":
            return self._job_rows(request.headers.get(ROWS_HEADER, "").split())
        main = pages.jobs_page(
            self._views(now_ms()), all_namespaces=self.all_namespaces, scope=self.scope, errors=self.model.errors
        )
        return self._page(request, "Jobs", ["jobs"], main)

    def _job_rows(self, ids: list[str]) -> web.Response:
        """The rows ``job:NS/NAME`` of the jobs page, of the jobs that still exist."""
        now, views = now_ms(), []
        for key in sorted(set(ids)):
            namespace, _, name = key.removeprefix("job:").partition("/")
            if (facts := self.model.job(namespace, name)) is not None:
                views.append(pages.job_view(facts, self.model.runs_of(namespace, name), now))
        return web.Response(text=pages.job_rows(views, all_namespaces=self.all_namespaces), content_type="text/html")

    async def timeline(self, request: web.Request) -> web.Response:
        now = now_ms()
        views = self._views(now)
        shown = self._range(request, views, now)
        main = pages.timeline_page(
            views, shown, now, all_namespaces=self.all_namespaces, scope=self.scope, errors=self.model.errors
        )
        return self._page(request, "Timeline", ["jobs", "job:*", "runs:*"], main)

    async def job(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        topics = [f"job:{namespace}/{name}", f"runs:{namespace}/{name}"]
        facts = self.model.job(namespace, name)
        if facts is None:
            text = pages.not_found(f"No AnarchonJob {name!r} in namespace {namespace!r} (or not yet listed).")
            return self._page(request, name, topics, pages.errors_html(self.model.errors) + text, 404)
        now = now_ms()
        view = pages.job_view(facts, self.model.runs_of(namespace, name), now)
        shown = self._range(request, [view], now)
        return self._page(request, name, topics, pages.job_page(view, shown, now, errors=self.model.errors))

    async def run(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        version = self.model.version  # the story is drawn from what is known now, the log read after
        run = self.model.run(namespace, name)
        if run is None:
            text = pages.not_found(f"No AnarchonRun {name!r} in namespace {namespace!r} (or not yet listed).")
            return self._page(request, name, [f"run:{namespace}/{name}"], text, 404)
        job = run["job"]
        pods = [str(t["pod"]) for t in run["tries"] if t["pod"]]
        events = self.model.events_of_run(namespace, job, name, pods)
        log_of = await self._log(namespace, str(run["podName"] or (pods[-1] if pods else "")))
        main = pages.run_page(run, namespace, events, log_of, errors=self.model.errors)
        topics = [f"run:{namespace}/{name}", f"events:{namespace}/{job}"]
        return self._page(request, name, topics, main, version=version)

    async def _log(self, namespace: str, pod: str) -> pages.Log | None:
        """The last lines of the Pod's log with the user's credentials, or the API server's reason why not."""
        if not pod:
            return None
        params = {"tailLines": pages.LOG_LINES}
        try:
            response = await self.kube.stream(path("pods", namespace, pod, "log"), params, LOG_TIMEOUT_S)
            try:
                text = (await response.read()).decode(errors="replace")
            finally:
                response.release()
        except ApiException as exc:
            return pages.Log(pod, None, f"{' '.join((exc.message or exc.reason).split())} (HTTP {exc.status})")
        except (TimeoutError, OSError) as exc:
            return pages.Log(pod, None, f"the log could not be read: {type(exc).__name__} {exc}")
        return pages.Log(pod, text)

    # -- actions -----------------------------------------------------------------------------------

    @staticmethod
    def _target(action: str, values: dict[str, str]) -> tuple[str, str, str]:
        """The namespace and name an action is about, and the page to go back to."""
        if action not in pages.QUESTIONS:
            raise web.HTTPNotFound(text=f"no action {action!r}")
        kind = "run" if action == "cancel" else "job"
        namespace, name = values.get("namespace") or "", values.get(kind) or ""
        if not namespace or not name:
            raise web.HTTPBadRequest(text=f"{action}: namespace and {kind} are required")
        back = (pages.run_href if kind == "run" else pages.job_href)(namespace, name)
        return namespace, name, back

    async def confirm(self, request: web.Request) -> web.Response:
        action = request.match_info["action"]
        namespace, name, back = self._target(action, dict(request.query))
        main = pages.confirm_page(action, namespace, name, self.token, back)
        return self._page(request, f"Confirm {action}", [], main)

    async def act(self, request: web.Request) -> web.Response:
        action = request.match_info["action"]
        form = {k: str(v) for k, v in (await request.post()).items()}
        if not hmac.compare_digest(form.get("token", ""), self.token):
            raise web.HTTPForbidden(text="refused: this form is not from this anarchon ui (reload the page)")
        namespace, name, back = self._target(action, form)
        reason = " ".join(form.get("reason", "").split())
        work: Callable[[], Awaitable[str]] = {
            "trigger": lambda: actions.trigger_now(self.kube, namespace, name, now_ms()),
            "suspend": lambda: actions.suspend(self.kube, namespace, name, reason or None),
            "resume": lambda: actions.resume(self.kube, namespace, name),
            "cancel": lambda: actions.cancel_run(self.kube, namespace, name, reason),
        }[action]
        result = await actions.act(self.kube, work, self.action_timeout_s)
        log.info("%s %s/%s: %s", action, namespace, name, result.message)
        return self._page(request, action, [], pages.result_page(action, result.ok, result.message, back))

    # -- the event stream and the files ------------------------------------------------------------

    async def events(self, request: web.Request) -> web.StreamResponse:
        since = request.query.get("since", "")
        if since and not (since.isascii() and since.isdigit()):
            raise web.HTTPBadRequest(text=f"since={since!r}: expected the page's version, a number")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **SECURITY_HEADERS})
        await response.prepare(request)
        sub = self.model.subscribe()
        missed = self.model.since(int(since)) if since else set()  # with the subscription: no gap
        try:
            await response.write(b"retry: 1000\nevent: hello\ndata: live\n\n")
            if missed:
                await response.write(f"event: change\ndata: {' '.join(sorted(missed))}\n\n".encode())
            while True:
                try:
                    topics = await asyncio.wait_for(sub.next(SETTLE_S), KEEPALIVE_S)
                except TimeoutError:
                    await response.write(b": idle\n\n")
                    continue
                await response.write(f"event: change\ndata: {' '.join(sorted(topics))}\n\n".encode())
        except ConnectionError:
            pass  # the page went away
        finally:
            self.model.unsubscribe(sub)
        return response

    async def icon(self, _: web.Request) -> web.Response:
        return self._static_file("icon.svg")

    async def static(self, request: web.Request) -> web.Response:
        return self._static_file(request.match_info["file"])

    @staticmethod
    def _static_file(name: str) -> web.Response:
        kind = STATIC_TYPES.get(name[name.rfind(".") :] if "." in name else "")
        item = resources.files("anarchon.ui").joinpath("static", name)
        if kind is None or "/" in name or not item.is_file():
            raise web.HTTPNotFound(text=f"no file {name!r}")
        return web.Response(body=item.read_bytes(), content_type=kind)


async def serve(
    kube: Kube,
    namespaces: list[str],
    *,
    address: str,
    port: int,
    scope: str,
    action_timeout_s: float | None,
    ready: Callable[[str], None],
) -> None:
    """Watch, serve until cancelled; ``ready`` is told the page's URL once it listens."""
    model = Model(kube, namespaces)
    ui = UI(kube, model, scope=scope, all_namespaces=not namespaces, action_timeout_s=action_timeout_s)
    model.start()
    await model.answered(action_timeout_s or 10.0)
    runner = web.AppRunner(ui.app(), shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, address, port)
        await site.start()
        ui.port = int(runner.addresses[0][1])
        host = f"[{address}]" if ":" in address else address
        ready(f"http://{host}:{ui.port}/")
        await asyncio.Event().wait()
    finally:
        with contextlib.suppress(Exception):
            await runner.cleanup()
        await model.stop()
