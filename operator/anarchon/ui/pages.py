"""The pages as HTML, drawn on the server from the live model and the CLI's records.

The tables are plain HTML, readable without JavaScript and with the keyboard (links and buttons
only); the script (static/ui.js) only refreshes the ``main`` element when a change the page
shows arrives. The words are the CLI's: :func:`anarchon.cli.records.job_record` and
:func:`~anarchon.cli.records.run_record` give the fields (kept by :mod:`.model`), ``anarchon get``'s suspended text,
the engine's schedule the next times. Nothing inline (no style or script attribute): the
Content-Security-Policy allows the package's own files only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import urlencode

from ..cli.output import relative
from ..cli.records import suspended_text
from ..cli.times import upcoming
from ..engine import RunState
from ..kube.job.spec import slot_time
from ..kube.run.workload import fencing_token
from . import timeline
from .model import JobFacts

#: Runs listed under a job's timeline at most (newest first); the timeline draws them all.
RUNS_LISTED = 100
#: Lines of a Pod's log shown in its run's story.
LOG_LINES = 40


def esc(value: Any) -> str:
    return escape("" if value is None else str(value))


def _at(rfc3339: str | None) -> str:
    if not rfc3339:
        return "-"
    return f'<time datetime="{esc(rfc3339)}" title="{esc(rfc3339)}">{esc(relative(rfc3339))}</time>'


def _row(cells: Sequence[str], attributes: str = "") -> str:
    """A table row of cells already in HTML."""
    return f"<tr{attributes}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _table(caption: str, headers: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """A table of cells already in HTML."""
    return _table_of(caption, headers, "".join(map(_row, rows)), cls)


def _table_of(caption: str, headers: Sequence[str], body: str, cls: str) -> str:
    """A table of rows already in HTML."""
    head = "".join(f'<th scope="col">{esc(h)}</th>' for h in headers)
    return (
        f'<table class="{cls}"><caption>{caption}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    )


def _phase(phase: str | None) -> str:
    return f'<span class="phase ph-{esc(phase or "None")}">{esc(phase or "-")}</span>'


def _button(action: str, label: str, **target: str) -> str:
    """A link to the confirmation page of ``action``: nothing is done before the user confirms there."""
    return f'<a class="button" href="/confirm/{action}?{esc(urlencode(target))}">{esc(label)}</a>'


def job_href(namespace: str, name: str) -> str:
    return f"/jobs/{namespace}/{name}"


def run_href(namespace: str, name: str) -> str:
    return f"/runs/{namespace}/{name}"


def layout(title: str, topics: Sequence[str], main: str, *, scope: str, version: int) -> str:
    """The whole page: ``main`` in the element the script refreshes when one of ``topics`` changes;
    ``version``, the model's when the page was drawn (the script's event stream starts there)."""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · anarchon</title>"
        '<link rel="icon" href="/static/icon.svg" type="image/svg+xml">'
        '<link rel="stylesheet" href="/static/ui.css"><script src="/static/ui.js" defer></script></head>'
        f'<body data-topics="{esc(" ".join(topics))}" data-version="{version}">'
        '<header><nav aria-label="pages"><a href="/">Jobs</a> <a href="/timeline">Timeline</a></nav>'
        f'<span class="scope">{esc(scope)}</span>'
        '<span id="live" class="live" aria-live="polite">not live (no script)</span></header>'
        f'<main id="main">{main}</main></body></html>'
    )


def errors_html(errors: Sequence[str]) -> str:
    """Why part of what the page should show could not be read: the API server's own words."""
    if not errors:
        return ""
    items = "".join(f"<li>{esc(e)}</li>" for e in errors)
    return f'<div class="errors" role="alert"><p>Cannot read everything:</p><ul>{items}</ul></div>'


# -- a job, as the jobs page and its own page show it ----------------------------------------------


@dataclass
class JobView:
    """One job, its kept runs (:func:`.model.run_view`, by slot) and its next times."""

    facts: JobFacts
    runs: list[dict[str, Any]]
    next_times: list[dict[str, Any]]

    @property
    def record(self) -> dict[str, Any]:
        return self.facts.record

    @property
    def namespace(self) -> str:
        return self.facts.namespace

    @property
    def name(self) -> str:
        return self.facts.name

    def last_outcome(self) -> dict[str, Any] | None:
        return next((r for r in reversed(self.runs) if r["outcome"] is not None), None)

    def success(self) -> str:
        """Succeeded among the kept runs that ended (Skipped aside: they never ran)."""
        ran = [r for r in self.runs if r["outcome"] not in (None, RunState.SKIPPED)]
        if not ran:
            return "-"
        good = sum(r["outcome"] == RunState.SUCCEEDED for r in ran)
        return f"{good}/{len(ran)} ({100 * good // len(ran)}%)"


def job_view(facts: JobFacts, runs: list[dict[str, Any]], now_ms: int, next_count: int = 3) -> JobView:
    times = []
    if facts.schedule is not None and not facts.record["suspended"]:
        times = upcoming(facts.schedule, now_ms, next_count)
    return JobView(facts, runs, times)


def _schedule_cell(v: JobView) -> str:
    if v.facts.words is None:
        return '<span class="bad">invalid</span>'
    return f"{esc(v.facts.words)}<br><code>{esc(v.record['schedule'])}</code>"


def _next_cell(v: JobView) -> str:
    """The next times on the job's clock (``2027-01-15 08:00 CET``), to the second if one needs it."""
    if not v.next_times:
        return "none while suspended" if v.record["suspended"] else "-"
    width = 16 if all(t["slot"] % 60_000 == 0 for t in v.next_times) else 19
    return "<br>".join(
        f'<time datetime="{esc(t["time"])}" title="{esc(t["time"])}">'
        f"{esc(t['local'][:width].replace('T', ' '))} {esc(t['zone'])}</time>"
        for t in v.next_times
    )


def _last_cell(v: JobView) -> str:
    last = v.last_outcome()
    if last is None:
        return "-"
    href = run_href(v.namespace, last["name"])
    return f'<a href="{esc(href)}">{_phase(last["outcome"])}</a> {_at(last["finishTime"] or last["slotTime"])}'


def _ready_cell(v: JobView) -> str:
    ready = v.facts.ready
    cls = "ok" if ready == "Ready" else "bad" if ready.startswith("Invalid") else "warn"
    return f'<span class="{cls}">{esc(ready)}</span>'


def _job_actions(v: JobView) -> str:
    target = {"namespace": v.namespace, "job": v.name}
    toggle = _button("resume", "Resume", **target) if v.record["suspended"] else _button("suspend", "Suspend", **target)
    return _button("trigger", "Trigger now", **target) + " " + toggle


def job_rows(views: Sequence[JobView], *, all_namespaces: bool) -> str:
    """The rows of the jobs page. Each is named by its job (``id``) and says what changes it
    (``data-topics``): the script fetches only the rows a change is about."""
    rows = []
    for v in views:
        name = f"{v.namespace}/{v.name}" if all_namespaces else v.name
        key = f"{v.namespace}/{v.name}"
        cells = [
            f'<a href="{esc(job_href(v.namespace, v.name))}">{esc(name)}</a>',
            _schedule_cell(v),
            esc(v.record["timeZone"] or "-"),
            esc(suspended_text(v.record)),
            _ready_cell(v),
            esc(v.record["active"]),
            _last_cell(v),
            esc(v.success()),
            _next_cell(v),
            _job_actions(v),
        ]
        rows.append(_row(cells, f' id="job:{esc(key)}" data-topics="job:{esc(key)} runs:{esc(key)}"'))
    return "".join(rows)


def jobs_page(views: Sequence[JobView], *, all_namespaces: bool, scope: str, errors: Sequence[str]) -> str:
    if not views:
        return errors_html(errors) + f"<h1>Jobs</h1><p>No AnarchonJobs in {esc(scope)}.</p>"
    headers = ["Job", "Schedule", "Time zone", "Suspended", "Ready", "Active", "Last outcome", "Success", "Next 3"]
    body = job_rows(views, all_namespaces=all_namespaces)
    table = _table_of(f"{len(views)} jobs in {esc(scope)}", [*headers, "Actions"], body, "jobs")
    return errors_html(errors) + f"<h1>Jobs</h1>{table}"


# -- the timeline ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Range:
    """The time range a timeline shows; ``fixed`` if the user chose it (else it follows the runs)."""

    start_ms: int
    end_ms: int
    fixed: bool


def range_links(base: str, shown: Range, now_ms: int) -> str:
    """Zoom and pan as links to other ranges, and a form for any range (RFC3339 or ms)."""
    span = shown.end_ms - shown.start_ms
    mid = (shown.start_ms + shown.end_ms) // 2

    def link(label: str, start: int, end: int) -> str:
        return f'<a class="button" href="{esc(base)}?{urlencode({"from": start, "to": end})}">{esc(label)}</a>'

    links = [
        f'<a class="button" href="{esc(base)}">All</a>',
        link("Last 5 min", now_ms - 300_000, now_ms + 15_000),
        link("Last hour", now_ms - 3_600_000, now_ms + 60_000),
        link("Last day", now_ms - 86_400_000, now_ms + 600_000),
        link("Zoom in", mid - span // 4, mid + span // 4),
        link("Zoom out", mid - span, mid + span),
        link("← Earlier", shown.start_ms - span // 2, shown.end_ms - span // 2),
        link("Later →", shown.start_ms + span // 2, shown.end_ms + span // 2),
    ]
    form = (
        f'<form class="range" method="get" action="{esc(base)}">'
        f'<label>From <input name="from" value="{esc(slot_time(shown.start_ms))}" size="24"></label> '
        f'<label>To <input name="to" value="{esc(slot_time(shown.end_ms))}" size="24"></label> '
        '<button type="submit">Show</button></form>'
    )
    return f'<nav class="zoom" aria-label="time range">{" ".join(links)}</nav>{form}'


#: How to zoom and pan other than by the links: static/ui.js does it (and shows this, hidden without it).
HINT = (
    "Ctrl + wheel (or a pinch) zooms about the pointer, a drag pans; "
    "on the focused timeline, + and - zoom, ← and → pan."
)
LEGEND = (
    '<ul class="legend" aria-label="legend">'
    + "".join(f'<li><span class="swatch ph-{p}"></span>{p}</li>' for p in RunState)
    + '<li><span class="swatch missed"></span>missed slots</li>'
    "<li>thin line: from the slot to the Pod's start</li><li>tick: a later try</li>"
    "<li>triangle: a takeover (the live Pod adopted)</li><li>circle: the Pod launched again</li></ul>"
)


def timeline_html(views: Sequence[JobView], shown: Range, now_ms: int, *, base: str, all_namespaces: bool) -> str:
    rows = [
        timeline.Row(
            label=f"{v.namespace}/{v.name}" if all_namespaces else v.name,
            href=job_href(v.namespace, v.name),
            run_prefix=run_href(v.namespace, ""),
            records=v.runs,
            missed=v.facts.missed,
        )
        for v in views
    ]
    caption = (
        f'<p class="range-caption">{esc(slot_time(shown.start_ms))} to {esc(slot_time(shown.end_ms))} (UTC)'
        + ("" if shown.fixed else ", all kept runs")
        + "</p>"
    )
    svg = timeline.svg(rows, shown.start_ms, shown.end_ms, now_ms)
    box = (
        '<div class="timeline-box" id="timeline" tabindex="0" '
        'aria-label="timeline: + and - zoom, the arrows move earlier and later">'
    )
    return range_links(base, shown, now_ms) + caption + f'{box}{svg}</div><p class="hint">{HINT}</p>' + LEGEND


def timeline_page(
    views: Sequence[JobView], shown: Range, now_ms: int, *, all_namespaces: bool, scope: str, errors: Sequence[str]
) -> str:
    body = timeline_html(views, shown, now_ms, base="/timeline", all_namespaces=all_namespaces)
    return errors_html(errors) + f"<h1>Timeline of {esc(scope)}</h1>" + body


def _runs_table(v: JobView, shown: Range) -> str:
    inside = [r for r in v.runs if shown.start_ms <= r["slot"] <= shown.end_ms]
    listed = list(reversed(inside))[:RUNS_LISTED]
    rows = [
        [
            f'<a href="{esc(run_href(v.namespace, r["name"]))}">{esc(r["name"])}</a>',
            esc(r["slotTime"]),
            esc(r["trigger"] or "-"),
            _phase(r["phase"]),
            esc(len(r["attempts"])),
            esc(r["takeovers"]),
            esc(",".join(a["instance"] or "?" for a in r["attempts"]) or "-"),
            esc(r["try"]),
            _at(r["finishTime"]),
            esc(" ".join(r["message"].split())[:120]),
        ]
        for r in listed
    ]
    caption = f"Runs in the range, newest first ({len(listed)} of {len(inside)})"
    headers = ["Run", "Slot", "Trigger", "Phase", "Attempts", "Takeovers", "Instances", "Tries", "Ended", "Message"]
    return _table(caption, headers, rows, "runs")


def job_page(v: JobView, shown: Range, now_ms: int, *, errors: Sequence[str]) -> str:
    facts = {
        "Schedule": _schedule_cell(v),
        "Time zone": esc(v.record["timeZone"] or "-"),
        "Suspended": esc(suspended_text(v.record)),
        "Ready": _ready_cell(v),
        "Active runs": esc(v.record["active"]),
        "Last outcome": _last_cell(v),
        "Success (kept runs)": esc(v.success()),
        "Next 3": _next_cell(v),
    }
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{val}</dd>" for k, val in facts.items())
    base = job_href(v.namespace, v.name)
    return (
        errors_html(errors)
        + f"<h1>Job {esc(v.namespace)}/{esc(v.name)}</h1>"
        + f'<div class="actions">{_job_actions(v)}</div><dl class="facts">{dl}</dl>'
        + f"<h2>Timeline</h2>{timeline_html([v], shown, now_ms, base=base, all_namespaces=False)}"
        + _runs_table(v, shown)
    )


# -- a run's story -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Log:
    """The last lines of a Pod's log, or why they cannot be read (the API server's message)."""

    pod: str
    text: str | None
    problem: str | None = None


def _tokens(r: dict[str, Any]) -> list[str]:
    """The fencing token of the Pod each attempt followed: its own launch's, or the one it adopted."""
    out, current = [], None
    for a in r["attempts"]:
        if a.get("launched"):
            current = fencing_token(r["slot"], a["attempt"])
        out.append("-" if current is None else str(current))
    return out


def _event_time(event: dict[str, Any]) -> str | None:
    """When an Event was last seen: ``lastTimestamp``, or ``eventTime`` for the newer API's Events (the scheduler's)."""
    return event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp")


def _event_source(event: dict[str, Any]) -> str:
    """Who posted an Event: the replica (its host), the component, or the newer API's controller."""
    source = event.get("source") or {}
    return str(source.get("host") or source.get("component") or event.get("reportingController") or "-")


def run_page(
    r: dict[str, Any], namespace: str, events: Sequence[dict[str, Any]], log: Log | None, *, errors: Sequence[str]
) -> str:
    """The story of run ``r`` (:func:`.model.run_view`)."""
    job = r["job"]
    facts = {
        "Job": f'<a href="{esc(job_href(namespace, job))}">{esc(namespace)}/{esc(job)}</a>',
        "Slot": esc(r["slotTime"]),
        "Trigger": esc(r["trigger"] or "-"),
        "Phase": _phase(r["phase"]),
        "Outcome": esc(r["outcome"] or "not over"),
        "Started": _at(r["startTime"]),
        "Ended": _at(r["finishTime"]),
        "Takeovers": esc(r["takeovers"]),
        "Reason": esc(r["reason"] or "-"),
        "Message": esc(r["message"] or "-"),
    }
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{val}</dd>" for k, val in facts.items())
    actions = ""
    if r["outcome"] is None:
        actions = f'<div class="actions">{_button("cancel", "Cancel run", namespace=namespace, run=r["name"])}</div>'
    attempts = _table(
        "Attempts (a replica's turn at the run)",
        ["#", "Instance", "How", "Fencing token", "Pod", "Started", "Ended", "Outcome", "Message"],
        [
            [
                esc(a["attempt"]),
                esc(a["instance"] or "?"),
                "adopted the live Pod" if a.get("adopted") else "launched the Pod" if a.get("launched") else "-",
                esc(token),
                esc(a["pod"] or "-"),
                _at(a["startTime"]),
                _at(a["finishTime"]),
                _phase(a["outcome"]),
                esc(a["message"]),
            ]
            for a, token in zip(r["attempts"], _tokens(r), strict=True)
        ],
    )
    tries = _table(
        "Tries (one Pod each)",
        ["#", "Pod", "Started", "Ended", "Outcome", "Message"],
        [
            [
                esc(t["try"]),
                esc(t["pod"] or "-"),
                _at(t["startTime"]),
                _at(t["finishTime"]),
                _phase(t["outcome"]),
                esc(t["message"]),
            ]
            for t in r["tries"]
        ],
    )
    event_rows = [
        [
            _at(_event_time(e)),
            esc(e.get("type")),
            esc(e.get("reason")),
            esc(e.get("count") or 1),
            esc(f"{(e.get('involvedObject') or {}).get('kind')} {(e.get('involvedObject') or {}).get('name')}"),
            esc(_event_source(e)),
            esc(e.get("message")),
        ]
        for e in events
    ]
    events_table = _table(
        f"Events ({len(event_rows)})", ["Last seen", "Type", "Reason", "Count", "On", "From", "Message"], event_rows
    )
    if log is None:
        log_html = "<p>No Pod launched yet.</p>"
    elif log.text is not None:
        log_html = f'<pre class="log">{esc(log.text) or "(empty)"}</pre>'
    else:
        log_html = f'<p class="bad" role="status">{esc(log.problem)}</p>'
    log_title = f"Log of Pod {esc(log.pod)} (last {LOG_LINES} lines)" if log else "Log"
    return (
        errors_html(errors)
        + f'<h1>Run {esc(r["name"])}</h1>{actions}<dl class="facts">{dl}</dl>'
        + attempts
        + tries
        + events_table
        + f"<h2>{log_title}</h2>{log_html}"
    )


# -- actions -------------------------------------------------------------------------------------------

#: What each action asks before it is done, and whether it takes a reason.
QUESTIONS = {
    "trigger": ("Run job {target} now, outside its schedule?", False),
    "suspend": ("Suspend job {target}? No scheduled run until it is resumed (a trigger still runs).", True),
    "resume": ("Resume job {target} on its schedule?", False),
    "cancel": ("Cancel run {target}? Its Pod is deleted and nothing more is launched for it.", True),
}


def confirm_page(action: str, namespace: str, name: str, token: str, back: str) -> str:
    question, reason = QUESTIONS[action]
    kind = "run" if action == "cancel" else "job"
    field = (
        '<p><label for="reason">Reason (shown with it)</label><br>'
        '<input id="reason" name="reason" size="60" maxlength="500"></p>'
        if reason
        else ""
    )
    return (
        f"<h1>Confirm: {esc(action)}</h1>"
        f'<form method="post" action="/act/{esc(action)}" class="confirm">'
        f"<p>{esc(question.format(target=f'{namespace}/{name}'))}</p>{field}"
        f'<input type="hidden" name="namespace" value="{esc(namespace)}">'
        f'<input type="hidden" name="{kind}" value="{esc(name)}">'
        f'<input type="hidden" name="token" value="{esc(token)}">'
        f'<button type="submit" id="confirm" autofocus>Confirm {esc(action)}</button> '
        f'<a href="{esc(back)}">Back</a></form>'
    )


def result_page(action: str, ok: bool, message: str, back: str) -> str:
    role, cls, title = ("status", "ok", "Done") if ok else ("alert", "bad", "Refused")
    return (
        f"<h1>{title}: {esc(action)}</h1>"
        f'<p id="result" role="{role}" class="result {cls}">{esc(message)}</p>'
        f'<p><a href="{esc(back)}" id="back">Back</a></p>'
    )


def not_found(what: str) -> str:
    return f'<h1>Not found</h1><p>{esc(what)}</p><p><a href="/">All jobs</a></p>'
