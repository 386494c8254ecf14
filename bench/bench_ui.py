#!/usr/bin/env python3
"""``anarchon ui`` at scale: 1,000 AnarchonJobs and 10,000 kept AnarchonRuns in one namespace.

Run from the repository root, after ``bash tests/run.sh`` (or e2e/controlplane/build.sh) has
built the control plane once, with Debian's ``chromium`` and ``chromium-driver`` installed::

    PYTHONPATH=operator:. python3 bench/bench_ui.py

It starts the test control plane, creates the jobs and runs through the API (concurrent
requests; each status written through the status subresource, as the replicas write it: mixed
phases, takeovers, retries, missed windows, suspended jobs, runs still running), starts
``anarchon ui -n NS`` as its own process, and measures in headless chromium (Selenium):

- the time from navigation to each page usable: the jobs page (its table of 1,000 rows), the
  timeline of the job with 1,000 runs, the timeline of the namespace (every run); from before
  the navigation until the frame after the page loaded was painted, with the number of rows
  and runs drawn checked;
- the time from a change made through the API (a run created, a run's status patched) to the
  frame that shows it on an open page (the job's page, the jobs page), p50 and max;
- the ui process's peak RSS (VmHWM).

Beside them, the wall time of the same reads with ``kubectl get``. Targets (issue 27): usable
within 2 s, a change within 1 s, RSS under 200 MB. No replica runs: what is measured is the ui.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "operator", ROOT / "e2e" / "controlplane"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from controlplane import ControlPlane  # noqa: E402 - after the path set-up
from tests.harness.controlplane import fresh_namespace, wait_established  # noqa: E402
from tests.ui.fake import create_all, fake_run, mixed_phase  # noqa: E402
from tests.ui.uilib import UiServer, chromium  # noqa: E402

from anarchon.cli.records import job_record  # noqa: E402
from anarchon.kube.api.client import connect  # noqa: E402
from anarchon.kube.job.spec import parse_job, run_name, slot_time  # noqa: E402

BIG = "big"
#: Each job's schedule, by its number modulo 4: hourly, every 15 minutes in Paris, every 10
#: minutes, daily in New York (so the namespace's timeline spans days).
SCHEDULES: list[dict[str, str]] = [
    {"cron": "0 * * * *"},
    {"cron": "*/15 * * * *", "timeZone": "Europe/Paris"},
    {"every": "10m"},
    {"cron": "30 2 * * *", "timeZone": "America/New_York"},
]


def job_body(namespace: str, name: str, k: int, schedule: dict[str, str]) -> dict[str, Any]:
    """Job ``k``: one in 20 suspended with a reason."""
    suspended = k % 20 == 5
    annotations = {"anarchon.io/suspend-reason": "database upgrade"} if suspended else {}
    return {
        "apiVersion": "anarchon.io/v1alpha1",
        "kind": "AnarchonJob",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            **schedule,
            "suspend": suspended,
            "successfulRunsHistoryLimit": 1000,
            "failedRunsHistoryLimit": 1000,
            "template": {"spec": {"containers": [{"name": "main", "image": "busybox", "command": ["true"]}]}},
        },
    }


def slots_until(job: dict[str, Any], now: int, n: int) -> list[int]:
    """The job's last ``n`` slots at or before ``now``, oldest first."""
    schedule = parse_job(job).schedule
    first = schedule.next_after(now)
    t, slots = now - (schedule.next_after(first) - first) * (n + 2), []
    while (t := schedule.next_after(t)) <= now:
        slots.append(t)
    assert len(slots) >= n, (job["metadata"]["name"], n, len(slots))
    return slots[-n:]


def made_job(namespace: str, name: str, k: int, runs: int, now: int) -> tuple[Any, list[Any]]:
    """Job ``k`` with its status and its ``runs`` kept runs: the last one still running in one
    job of 10 (then the job's activeCount is 1); Cancelled and Interrupted here and there; a
    window of missed slots in one job of 25."""
    body = job_body(namespace, name, k, {"every": "1m"} if name == BIG else SCHEDULES[k % 4])
    slots = slots_until(body, now, runs)
    made = []
    for i, slot in enumerate(slots):
        phase = mixed_phase(i + k)
        if (i + k) % 23 == 0:
            phase = "Cancelled"
        elif (i + k) % 31 == 0:
            phase = "Interrupted"
        if i == len(slots) - 1 and k % 10 == 3:
            phase = "Running"
        made.append(fake_run(namespace, name, slot, i + k, phase))
    record = job_record(body, now)
    suspended = record["suspended"]
    ready = {
        "type": "Ready",
        "status": "False" if suspended else "True",
        "reason": "Suspended" if suspended else "Scheduled",
        "message": f"suspended ({record['schedule']})" if suspended else str(record["schedule"]),
        "observedGeneration": 1,
        "lastTransitionTime": slot_time(now - 86_400_000),
    }
    active = [{"name": b["metadata"]["name"], "slot": b["spec"]["slot"]} for b, s in made if s["phase"] == "Running"]
    succeeded = [b["spec"]["slot"] for b, s in made if s["phase"] == "Succeeded"]
    status: dict[str, Any] = {
        "observedGeneration": 1,
        "schedule": record["schedule"],
        "conditions": [ready],
        "active": active,
        "activeCount": len(active),
        "lastScheduleTime": slot_time(slots[-1]),
    }
    if succeeded:
        status["lastSuccessfulTime"] = slot_time(max(succeeded))
    if not suspended:
        next_slot = parse_job(body).schedule.next_after(now)
        status |= {"nextSlot": next_slot, "nextScheduleTime": slot_time(next_slot)}
    if k % 25 == 0 and len(slots) > 4:
        status["missed"] = [
            {
                "from": slot_time(slots[1] + 1000),
                "to": slot_time(slots[2] - 1000),
                "count": 2,
                "reason": "NoReplica",
                "message": "no replica ran",
            }
        ]
    return (body, status), made


def populate(cp: ControlPlane, namespace: str, jobs: int, runs: int, big_runs: int) -> float:
    """``jobs`` jobs (``big`` with ``big_runs`` runs, the others sharing the rest) and their runs,
    32 requests at a time; the seconds it took."""
    now = time.time_ns() // 1_000_000
    others, rest = divmod(runs - big_runs, jobs - 1)
    made = [made_job(namespace, BIG, 0, big_runs, now)]
    made += [made_job(namespace, f"j{k:03d}", k, others + (k <= rest), now) for k in range(1, jobs)]

    async def go() -> None:
        kube = await connect(str(cp.kubeconfig), api_concurrency=32)
        try:
            await create_all(kube, "anarchonjobs", [job for job, _ in made], 32)
            await create_all(kube, "anarchonruns", [r for _, rs in made for r in rs], 32)
        finally:
            await kube.close()

    t0 = time.monotonic()
    asyncio.run(go())
    return time.monotonic() - t0


# -- the browser -------------------------------------------------------------------------------------

#: Resolves, once the frame after the page loaded was painted, to what the page drew.
PAINTED = """const done = arguments[arguments.length - 1];
requestAnimationFrame(() => requestAnimationFrame(() => done({
    at: Date.now(),
    rows: document.querySelectorAll('main table.jobs tbody tr').length,
    runs: document.querySelectorAll('main svg.timeline a.run').length,
    nav: performance.getEntriesByType('navigation')[0].toJSON(),
})));"""

#: Watches ``main`` for a link to arguments[1] (within arguments[0]) in a table row whose text has
#: arguments[2]; notes when it appears and when the next frame is painted.
WATCH = """const [selector, href, want] = arguments;
window.benchSeen = null; window.benchPainted = null;
const check = () => {
  if (window.benchSeen) return;
  for (const a of document.querySelectorAll(selector)) {
    const row = a.getAttribute('href') === href && a.closest('tr');
    if (row && row.innerText.includes(want)) {
      window.benchSeen = Date.now();
      requestAnimationFrame(() => { window.benchPainted = Date.now(); });
      return;
    }
  }
};
if (window.benchObserver) window.benchObserver.disconnect();
window.benchObserver = new MutationObserver(check);
window.benchObserver.observe(document.getElementById('main'), {childList: true, subtree: true});
check();
return window.benchSeen;"""


def open_page(browser: Any, url: str) -> dict[str, Any]:
    """Navigate to ``url``; what the page drew, ``usable_s`` (from before the navigation to the
    painted frame) and ``server_s`` (request sent to the first byte of the page: the ui's work)."""
    t0 = time.time()
    browser.get(url)
    drawn = browser.execute_async_script(PAINTED)
    nav = drawn["nav"]
    return {
        "usable_s": drawn["at"] / 1000 - t0,
        "server_s": (nav["responseStart"] - nav["requestStart"]) / 1000,
        "load_s": nav["loadEventEnd"] / 1000,
        "kb": nav["encodedBodySize"] / 1024,
        "rows": drawn["rows"],
        "runs": drawn["runs"],
    }


def change_reaches(browser: Any, selector: str, href: str, want: str, change: Callable[[], None]) -> float:
    """Seconds from before ``change()`` to the painted frame whose page shows it."""
    assert browser.execute_script(WATCH, selector, href, want) is None, f"{href} {want!r} shown before the change"
    t0 = time.time()
    change()
    deadline = time.monotonic() + 30
    while (painted := browser.execute_script("return window.benchPainted")) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{href} {want!r} not shown within 30 s")
        time.sleep(0.01)
    return float(painted) / 1000 - t0


def changes(cp: ControlPlane, browser: Any, ui: UiServer, namespace: str, count: int) -> dict[str, list[float]]:
    """``count`` changes seen on the page of job j002 (a run created, then its status written,
    by turns) and ``count`` on the jobs page (a run of j004 ended: its last outcome)."""
    base = f"/apis/anarchon.io/v1alpha1/namespaces/{namespace}/anarchonruns"
    later = (time.time_ns() // 1_000_000 // 60_000 + 1) * 60_000  # slots newer than every kept run

    def create(job: str, slot: int) -> Callable[[], None]:
        body, _ = fake_run(namespace, job, slot, 0)
        return lambda: cp.api("POST", base, body)

    def end(job: str, slot: int) -> Callable[[], None]:
        _, status = fake_run(namespace, job, slot, 0, "Succeeded")
        return lambda: cp.api("PATCH", f"{base}/{run_name(job, slot)}/status", {"status": status})

    out: dict[str, list[float]] = {"job page": [], "jobs page": []}
    browser.get(f"{ui.url}/jobs/{namespace}/j002")
    for c in range(count):
        slot = later + (c // 2) * 60_000
        href = f"/runs/{namespace}/{run_name('j002', slot)}"
        change = create("j002", slot) if c % 2 == 0 else end("j002", slot)
        out["job page"].append(
            change_reaches(browser, "main table.runs a", href, "" if c % 2 == 0 else "Succeeded", change)
        )
        time.sleep(0.3)
    browser.get(f"{ui.url}/")
    slots = [later + c * 60_000 for c in range(count)]
    for slot in slots:  # created first, not timed: a run with no status yet changes nothing the jobs page shows
        create("j004", slot)()
    time.sleep(2)
    for slot in slots:
        href = f"/runs/{namespace}/{run_name('j004', slot)}"
        out["jobs page"].append(change_reaches(browser, "main table.jobs a", href, "Succeeded", end("j004", slot)))
        time.sleep(0.3)
    return out


# -- kubectl, the UI process -------------------------------------------------------------------------


def kubectl_s(cp: ControlPlane, *args: str, times: int = 3) -> float:
    """The median wall time of ``kubectl get ...`` (its table, as a user reads it)."""
    took = []
    for _ in range(times):
        t0 = time.monotonic()
        subprocess.run(["kubectl", "--kubeconfig", str(cp.kubeconfig), "get", *args], capture_output=True, check=True)
        took.append(time.monotonic() - t0)
    return statistics.median(took)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


def verdict(value: float, target: float) -> str:
    return "ok" if value <= target else "MISS"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=10_000, help="kept runs in all")
    parser.add_argument("--big-runs", type=int, default=1000, help="kept runs of the job 'big'")
    parser.add_argument("--changes", type=int, default=20, help="changes timed on each of two open pages")
    parser.add_argument("--loads", type=int, default=3, help="navigations to each page (the median is shown)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        cp = stack.enter_context(ControlPlane())
        cp.kubectl("apply", "-f", str(ROOT / "crds"))
        wait_established(cp, "anarchonjobs.anarchon.io", "anarchonruns.anarchon.io")
        namespace = stack.enter_context(fresh_namespace(cp, "bench-ui"))
        print(f"creating {args.jobs} jobs and {args.runs} runs in {namespace} ...", file=sys.stderr)
        setup_s = populate(cp, namespace, args.jobs, args.runs, args.big_runs)
        print(f"... in {setup_s:.1f} s", file=sys.stderr)
        t0 = time.monotonic()
        ui = UiServer(cp.kubeconfig, "-n", namespace)
        stack.callback(ui.stop)
        start_s = time.monotonic() - t0
        browser = chromium()
        stack.callback(browser.quit)
        took = (
            f"written in {setup_s:.1f} s; anarchon ui listening after {start_s:.1f} s,"
            f" its peak RSS then {peak_rss_mb(ui.proc.pid):.0f} MB"
        )
        run(args, cp, browser, ui, namespace, took)


def run(args: argparse.Namespace, cp: ControlPlane, browser: Any, ui: UiServer, namespace: str, took: str) -> None:
    pages = {
        f"jobs page ({args.jobs} rows)": ("/", ("anarchonjobs", "-n", namespace)),
        f"timeline of {BIG} ({args.big_runs} runs)": (
            f"/jobs/{namespace}/{BIG}",
            ("anarchonruns", "-n", namespace, "-l", f"anarchon.io/job={BIG}"),
        ),
        f"namespace timeline ({args.runs} runs)": ("/timeline", ("anarchonruns", "-n", namespace)),
    }
    print(f"{args.jobs} jobs, {args.runs} runs {took}")
    print(f"{'':<34} {'usable s':>9} {'max':>6} {'server s':>9} {'KB':>7} {'drawn':>6} {'kubectl s':>10}  target 2 s")
    for label, (where, kubectl_args) in pages.items():
        loads = [open_page(browser, ui.url + where) for _ in range(args.loads)]
        usable = statistics.median(x["usable_s"] for x in loads)
        drawn = loads[-1]["rows"] or loads[-1]["runs"]
        print(
            f"{label:<34} {usable:>9.2f} {max(x['usable_s'] for x in loads):>6.2f}"
            f" {statistics.median(x['server_s'] for x in loads):>9.2f} {loads[-1]['kb']:>7.0f} {drawn:>6}"
            f" {kubectl_s(cp, *kubectl_args):>10.2f}  {verdict(usable, 2.0)}",
            flush=True,
        )
    print(f"{'change to an open page':<34} {'p50 s':>9} {'max':>6}  target 1 s")
    for page, seconds in changes(cp, browser, ui, namespace, args.changes).items():
        p50, worst = statistics.median(seconds), max(seconds)
        print(f"{page + f' ({len(seconds)} changes)':<34} {p50:>9.2f} {worst:>6.2f}  {verdict(worst, 1.0)}")
    rss = peak_rss_mb(ui.proc.pid)
    print(f"{'anarchon ui peak RSS (VmHWM)':<34} {rss:>7.0f} MB  target 200 MB  {verdict(rss, 200)}", flush=True)


if __name__ == "__main__":
    main()
