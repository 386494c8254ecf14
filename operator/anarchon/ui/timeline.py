"""The runs of one job (or of every job shown) over time, drawn in SVG on the server.

One bar per run, coloured by its phase, from its Pod's start to its end (or now); a thin line
leads to it from the slot's time, so a late start shows as a long lead. Later tries are ticks
on the bar, takeovers (an attempt that adopted the live Pod) triangles, relaunches (an attempt
that launched the Pod again) circles; a Skipped run is a diamond at its slot, a window of
missed slots (``status.missed``) a grey band. Runs that overlap (``overlap: Allow``) go on lanes
below each other. Each run is a link to its story, with its facts as the link's tooltip.

It is drawn for a time range (zoom and pan are links to other ranges; the range and where the
plot lies are on the ``svg`` element for static/ui.js's wheel, drag and keys), and only the runs
in the range are drawn: a few thousand elements at most for 1,000 runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape
from typing import Any

from ..engine import RunState
from ..kube.job.spec import ms_of

WIDTH = 1200
LABEL_W = 170
#: The plot ends this far from the right edge.
PLOT_END = 10
LANE_H = 14
LANE_GAP = 4
AXIS_H = 24
MAX_LANES = 6
#: Tick spacings, in ms: the first that gives at most 10 ticks over the range.
_STEPS = [
    s * 1000
    for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800)
]


def utc_text(ms: int, step_ms: int = 1000) -> str:
    """A time in UTC, to the precision a tick spacing of ``step_ms`` needs."""
    t = datetime.fromtimestamp(ms / 1000, UTC)
    if step_ms >= 86_400_000:
        return t.strftime("%m-%d")
    return t.strftime("%H:%M" if step_ms >= 60_000 else "%H:%M:%S")


@dataclass
class Row:
    """One job's runs (``records``: :func:`anarchon.cli.records.run_record`) and missed windows;
    each run links to ``run_prefix`` and its name."""

    label: str
    href: str
    run_prefix: str
    records: list[dict[str, Any]]
    missed: list[dict[str, Any]] = field(default_factory=list)


def span_of(rows: list[Row], now_ms: int) -> tuple[int, int]:
    """The range that holds every kept run and missed window, with a margin: what "all" shows."""
    times = [r["slot"] for row in rows for r in row.records]
    times += [t for row in rows for w in row.missed for t in (ms_of(w.get("from")), ms_of(w.get("to"))) if t]
    times += [t for row in rows for r in row.records if (t := ms_of(r["finishTime"]))]
    if not times:
        return now_ms - 3_600_000, now_ms + 60_000
    first, last = min(times), max(max(times), min(now_ms, max(times) + 60_000))
    margin = max((last - first) // 50, 1000)
    return first - margin, last + margin


class _Scale:
    def __init__(self, start_ms: int, end_ms: int) -> None:
        self.start, self.end = start_ms, max(end_ms, start_ms + 1)

    def x(self, ms: int) -> float:
        frac = (ms - self.start) / (self.end - self.start)
        return round(LABEL_W + min(max(frac, -0.01), 1.01) * (WIDTH - LABEL_W - PLOT_END), 1)


def _bar_span(r: dict[str, Any], now_ms: int) -> tuple[int, int]:
    tries = r["tries"]
    start = ms_of(tries[0]["startTime"]) if tries and tries[0]["startTime"] else ms_of(r["startTime"])
    begin = start if start is not None else r["slot"]
    end = ms_of(r["finishTime"]) or (now_ms if r["outcome"] is None else begin)
    return begin, max(end, begin)


def _tooltip(r: dict[str, Any], begin: int) -> str:
    lead = (begin - r["slot"]) / 1000
    lines = [
        f"{r['name']}: {r['phase'] or 'no status yet'}",
        f"slot {r['slotTime']} ({r['trigger'] or 'Schedule'})",
        f"Pod started {lead:+.1f}s after the slot" if r["tries"] else "no Pod launched",
        f"attempts {len(r['attempts'])}, takeovers {r['takeovers']}, tries {r['try']}",
    ]
    if r["message"]:
        lines.append(" ".join(r["message"].split())[:200])
    return "\n".join(lines)


def _lanes(spans: list[tuple[int, int]]) -> list[int]:
    """A lane for each span of time (by order of start): the first whose last run ended before
    it began. Runs that follow each other share a lane however close they are drawn."""
    ends: list[int] = []
    out = []
    for begin, end in spans:
        lane = next((i for i, last in enumerate(ends) if last <= begin), None)
        if lane is None:
            lane = min(len(ends), MAX_LANES - 1)
            if lane == len(ends):
                ends.append(end)
        ends[lane] = max(ends[lane], end)
        out.append(lane)
    return out


def _run(r: dict[str, Any], scale: _Scale, y: float, now_ms: int, href: str) -> str:
    begin, end = _bar_span(r, now_ms)
    title = f"<title>{escape(_tooltip(r, begin))}</title>"
    phase = escape(r["phase"] or "None")
    slot_x, mid = scale.x(r["slot"]), y + LANE_H / 2
    if r["phase"] == RunState.SKIPPED:
        d = LANE_H / 2
        points = f"{slot_x},{y} {slot_x + d},{mid} {slot_x},{y + LANE_H} {slot_x - d},{mid}"
        return f'<a href="{escape(href)}" class="run">{title}<polygon class="ph-{phase}" points="{points}"/></a>'
    x0, x1 = scale.x(begin), scale.x(end)
    parts = [f'<a href="{escape(href)}" class="run">{title}']
    parts.append(f'<line class="lead" x1="{slot_x}" y1="{mid}" x2="{x0}" y2="{mid}"/>')
    parts.append(f'<line class="slot" x1="{slot_x}" y1="{y}" x2="{slot_x}" y2="{y + LANE_H}"/>')
    parts.append(
        f'<rect class="bar ph-{phase}" x="{x0}" y="{y + 2}" width="{max(round(x1 - x0, 1), 2)}" height="{LANE_H - 4}"/>'
    )
    for t in r["tries"][1:]:
        if (at := ms_of(t["startTime"])) is not None:
            tx = scale.x(at)
            parts.append(f'<line class="try" x1="{tx}" y1="{y}" x2="{tx}" y2="{y + 5}"/>')
    for a in r["attempts"][1:]:
        if (at := ms_of(a["startTime"])) is None:
            continue
        ax = scale.x(at)
        if a.get("adopted"):
            parts.append(f'<polygon class="takeover" points="{ax - 4},{y} {ax + 4},{y} {ax},{y + 6}"/>')
        elif a.get("launched"):
            parts.append(f'<circle class="relaunch" cx="{ax}" cy="{y + 3}" r="3"/>')
    parts.append("</a>")
    return "".join(parts)


def _missed(w: dict[str, Any], scale: _Scale, y: float, height: float) -> str:
    first, last = ms_of(w.get("from")), ms_of(w.get("to"))
    if first is None or last is None:
        return ""
    x0, x1 = scale.x(first), scale.x(last)
    text = f"missed {w.get('count')} slot(s) {w.get('from')} to {w.get('to')}: {w.get('reason')}"
    return (
        f'<rect class="missed" x="{x0 - 1}" y="{y}" width="{round(max(x1 - x0, 0) + 2, 1)}" height="{height}">'
        f"<title>{escape(text)}</title></rect>"
    )


def _axis(scale: _Scale, height: float) -> str:
    span = scale.end - scale.start
    step = next((s for s in _STEPS if span / s <= 10), _STEPS[-1] * max(1, span // (_STEPS[-1] * 10)))
    first = (scale.start // step + 1) * step
    out = []
    for t in range(first, scale.end, step):
        x = scale.x(t)
        out.append(f'<line class="tick" x1="{x}" y1="{AXIS_H - 6}" x2="{x}" y2="{height}"/>')
        out.append(f'<text class="tick" x="{x}" y="{AXIS_H - 9}">{utc_text(t, step)}</text>')
    return "".join(out)


def svg(rows: list[Row], start_ms: int, end_ms: int, now_ms: int) -> str:
    """The timeline of ``rows`` over ``start_ms``..``end_ms``."""
    scale = _Scale(start_ms, end_ms)
    body: list[str] = []
    y = float(AXIS_H)
    for row in rows:
        shown = []
        for r in row.records:
            begin, end = _bar_span(r, now_ms)
            if end >= start_ms and min(begin, r["slot"]) <= end_ms:
                shown.append((min(begin, r["slot"]), end, r))
        shown.sort(key=lambda s: s[0])
        lanes = _lanes([(t0, t1) for t0, t1, _ in shown])
        count = max(lanes, default=0) + 1
        height = count * (LANE_H + LANE_GAP)
        body.append(f'<a href="{escape(row.href)}" class="row-label"><text x="4" y="{y + LANE_H - 2}">')
        body.append(f"{escape(row.label[:24])}</text></a>")
        body.append(f'<line class="row" x1="0" y1="{y + height - 1}" x2="{WIDTH}" y2="{y + height - 1}"/>')
        body.extend(_missed(w, scale, y, height - LANE_GAP) for w in row.missed)
        for (_, _, r), lane in zip(shown, lanes, strict=True):
            body.append(_run(r, scale, y + lane * (LANE_H + LANE_GAP), now_ms, row.run_prefix + r["name"]))
        y += height
    total = y + 4
    if scale.start <= now_ms <= scale.end:
        body.append(f'<line class="now" x1="{scale.x(now_ms)}" y1="{AXIS_H - 6}" x2="{scale.x(now_ms)}" y2="{y}"/>')
    runs = sum(len(row.records) for row in rows)
    return (
        f'<svg class="timeline" viewBox="0 0 {WIDTH} {total}" width="{WIDTH}" height="{total}" role="img" '
        f'aria-label="timeline of {runs} runs" xmlns="http://www.w3.org/2000/svg" '
        f'data-from="{scale.start}" data-to="{scale.end}" data-plot="{LABEL_W} {WIDTH - PLOT_END}">'
        + _axis(scale, y)
        + "".join(body)
        + "</svg>"
    )
