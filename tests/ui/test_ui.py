"""``anarchon ui`` in headless chromium against the real control plane, a replica running the jobs.

The jobs of the module: ``tick`` (every 2s, short runs: the live updates), ``nightly`` (a cron in
Europe/Paris: suspend and resume), ``manual`` (suspended, runs of a minute: a trigger, a
cancel) and ``big`` (1,000 ended runs written through the API: the timeline at scale).
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.actions.wheel_input import ScrollOrigin
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver

from anarchon.kube.job.spec import run_name, slot_time
from tests.harness.cluster import Cluster, Replicas, job_manifest
from tests.harness.until import until

from .fake import fake_run, write_runs
from .uilib import UiServer

BIG_RUNS = 1000
MINUTE_MS = 60_000
#: big's runs are one a minute but for a window of GAP missed slots before its run GAP_AT.
GAP_AT, GAP = 975, 3


@dataclass
class Site:
    cluster: Cluster
    ui: UiServer
    big_slots: list[int]

    @property
    def namespace(self) -> str:
        return self.cluster.namespace


@pytest.fixture(scope="module")
def site(control_plane: Any, ui_cluster: Cluster, ui_replicas: Replicas) -> Iterator[Site]:
    cluster = ui_cluster
    limits = {"successfulRunsHistoryLimit": 1000, "failedRunsHistoryLimit": 1000}
    jobs = [
        job_manifest("tick", every="2s"),
        job_manifest("nightly", cron="0 3 * * *", tz="Europe/Paris"),
        job_manifest("manual", cron="0 8 * * 1-5", suspend=True, annotations={"anarchon.test/run-seconds": "120"}),
        job_manifest("big", cron="0 0 1 1 *", suspend=True, **limits),
    ]
    cluster.apply({"apiVersion": "v1", "kind": "List", "items": jobs})
    ui_replicas.start("replica-a")
    now = time.time_ns() // 1_000_000
    slots = [(now // MINUTE_MS - BIG_RUNS - GAP + i + GAP * (i >= GAP_AT)) * MINUTE_MS for i in range(BIG_RUNS)]
    t0 = time.monotonic()
    runs = [
        fake_run(cluster.namespace, "big", slot, i, "Cancelled" if i % 100 == 55 else None)
        for i, slot in enumerate(slots)
    ]
    write_runs(control_plane.kubeconfig, runs)
    print(f"{BIG_RUNS} runs written in {time.monotonic() - t0:.1f}s")
    window = {"from": slot_time(slots[GAP_AT - 1] + MINUTE_MS), "to": slot_time(slots[GAP_AT] - MINUTE_MS)}
    missed = [window | {"count": GAP, "reason": "NoReplica", "message": "no replica ran"}]
    where = f"/apis/anarchon.io/v1alpha1/namespaces/{cluster.namespace}/anarchonjobs/big/status"
    control_plane.api("PATCH", where, {"status": {"missed": missed}})
    ui = UiServer(control_plane.kubeconfig, "-n", cluster.namespace)
    try:
        yield Site(cluster, ui, slots)
    finally:
        ui.stop()


def leave(browser: WebDriver, server: UiServer) -> None:
    """Stop a server the browser is on: its page first, or it logs its live stream's reconnections."""
    browser.get("about:blank")
    errors = server.stop()
    assert server.proc.returncode == 0 and "Traceback" not in errors, (server.proc.returncode, errors)
    browser.get_log("browser")  # read: what comes next starts clean


def console_errors(browser: WebDriver) -> list[dict[str, Any]]:
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


#: Each table row of the page as [its first link's text, its whole text], read in one go: the
#: page may be refreshed under the test at any moment (that is the point), never mid-read.
ROWS = """return Array.from(document.querySelectorAll(arguments[0])).map(
    r => [(r.querySelector('a') || {}).textContent || '', r.innerText])"""


def row_of(browser: WebDriver, text: str, selector: str = "main table tbody tr") -> str:
    """The text of the first table row whose first link is ``text`` ("" if none)."""
    return next((row for link, row in browser.execute_script(ROWS, selector) if link == text), "")


def row_of_prefix(browser: WebDriver, prefix: str) -> str:
    return next(
        (row for link, row in browser.execute_script(ROWS, "main table.runs tbody tr") if link.startswith(prefix)), ""
    )


def text_of(browser: WebDriver, selector: str = "main") -> str:
    """The text of the first element ``selector`` finds ("" if none), read in one go."""
    return str(
        browser.execute_script("const e = document.querySelector(arguments[0]); return e ? e.innerText : ''", selector)
    )


def click(browser: WebDriver, by: str, value: str) -> None:
    """Click an element, found again if a refresh of the page replaced it meanwhile."""
    for _ in range(20):
        try:
            browser.find_element(by, value).click()
            return
        except StaleElementReferenceException:
            time.sleep(0.05)
    raise AssertionError(f"{value} kept being replaced")


def shot(browser: WebDriver, shots: Path, name: str) -> None:
    path = shots / f"{name}.png"
    browser.save_screenshot(str(path))
    print(f"screenshot: {path}")


def confirm(browser: WebDriver, button: str, reason: str | None = None) -> str:
    """Click ``button`` (a link to the confirmation page), confirm there; the result line."""
    click(browser, By.LINK_TEXT, button)
    until("the confirmation page", lambda: browser.find_elements(By.ID, "confirm"))
    # By keyboard: the confirm button has the focus; Enter in the reason's field submits too.
    if reason is not None:
        browser.find_element(By.ID, "reason").send_keys(reason + Keys.ENTER)
    else:
        assert browser.switch_to.active_element.get_attribute("id") == "confirm"
        browser.switch_to.active_element.send_keys(Keys.ENTER)
    try:
        return text_of(browser, "#result") or until("the result", lambda: text_of(browser, "#result"))
    except AssertionError:
        raise AssertionError(f"no result: {browser.page_source}") from None


def test_jobs_page_shows_each_column_without_console_errors(site: Site, browser: WebDriver, shots: Path) -> None:
    browser.get(site.ui.url + "/")
    until("the four jobs", lambda: all(row_of(browser, j) for j in ("tick", "nightly", "manual", "big")))
    nightly = until("nightly Ready", lambda: "Ready" in (r := row_of(browser, "nightly")) and r)
    assert "at 03:00, every day" in nightly and "0 3 * * * Europe/Paris" in nightly, nightly
    assert len(re.findall(r"\d{4}-\d\d-\d\d 03:00 CES?T", nightly)) == 3, nightly  # the next three, on Paris's clock
    tick = row_of(browser, "tick")
    assert "every 2 seconds" in tick and "UTC" in tick, tick
    big = row_of(browser, "big")
    assert "790/900 (87%)" in big and "none while suspended" in big and "Failed" in big, big
    # No JavaScript needed for the table: the same rows are in the HTML the server sends.
    assert "every 2 seconds" in browser.execute_script("return fetch('/', {headers: {}}).then(r => r.text())")
    until("the page to be live", lambda: browser.find_element(By.ID, "live").text == "live")
    shot(browser, shots, "jobs")
    assert console_errors(browser) == []


def test_a_run_that_ends_shows_within_2s_without_reload(site: Site, browser: WebDriver, shots: Path) -> None:
    browser.get(site.ui.url + f"/jobs/{site.namespace}/tick")
    until("the page to be live", lambda: browser.find_element(By.ID, "live").text == "live")
    browser.execute_script("window.notReloaded = true")
    base = f"/apis/anarchon.io/v1alpha1/namespaces/{site.namespace}/anarchonruns?labelSelector=anarchon.io/job=tick"

    def ended_now() -> set[str]:
        items = site.cluster.cp.api("GET", base)["items"]
        return {r["metadata"]["name"] for r in items if (r.get("status") or {}).get("phase") == "Succeeded"}

    before = ended_now()
    fresh = until("a run of tick to end", lambda: ended_now() - before, timeout=60)
    seen_at = time.monotonic()
    name = sorted(fresh)[-1]
    until(f"{name} Succeeded on the page", lambda: "Succeeded" in row_of(browser, name), timeout=10)
    late = time.monotonic() - seen_at
    assert late < 2.0, f"{name} showed {late:.2f}s after it ended"
    assert browser.execute_script("return window.notReloaded") is True
    assert browser.find_elements(By.CSS_SELECTOR, "svg.timeline a.run"), "no run drawn"
    shot(browser, shots, "job-tick")
    assert console_errors(browser) == []


#: The element of each id in arguments, and the jobs table, kept in the page to compare later.
MARK = """window.marked = Array.from(arguments).map(id => document.getElementById(id));
window.marked.push(document.querySelector('main table.jobs'));"""
#: Which of them are still the same elements in the page.
STILL = "return window.marked.map(e => e !== null && document.contains(e))"
#: The run a row's Last outcome links to ("" if none).
LAST_RUN = """const link = document.querySelector(`[id="${arguments[0]}"] a[href^="/runs/"]`);
return link ? link.href : ''"""
#: The rows the server answers for the ids in arguments[0].
ROWS_OF = """return fetch('/', {headers: {'X-Anarchon-Fragment': 'rows', 'X-Anarchon-Rows': arguments[0]}})
.then(r => r.text())"""


def test_a_change_refreshes_only_its_row_of_the_jobs_page(site: Site, browser: WebDriver) -> None:
    """A run of tick ends: tick's row alone is fetched again, the other rows and the table stay
    (a table of 1,000 jobs is not sent again for each change); a job that comes or goes
    refreshes the whole table."""
    ns = site.namespace
    tick, nightly = f"job:{ns}/tick", f"job:{ns}/nightly"
    browser.get(site.ui.url + "/")
    until("the page to be live", lambda: browser.find_element(By.ID, "live").text == "live")
    assert browser.find_elements(By.ID, tick) and browser.find_elements(By.ID, nightly), "rows named by their job"
    browser.execute_script(MARK, tick, nightly)
    last = browser.execute_script(LAST_RUN, tick)
    until("a newer run of tick on its row", lambda: browser.execute_script(LAST_RUN, tick) not in ("", last))
    assert browser.execute_script(STILL) == [False, True, True]  # tick's row replaced, nothing else
    assert browser.execute_script("return document.body.dataset.refreshed") is None
    answer = browser.execute_script(ROWS_OF, f"{tick} job:{ns}/gone job:nonsense")
    assert answer.startswith(f'<tr id="{tick}"') and answer.count("<tr") == 1, answer[:300]
    site.cluster.apply(job_manifest("late", cron="0 8 * * *", suspend=True))
    until("the new job on the page", lambda: row_of(browser, "late"))
    site.cluster.kubectl("delete", "anarchonjob", "late", "--wait=false")
    until("the job gone from the page", lambda: not row_of(browser, "late"))
    assert console_errors(browser) == []


def test_a_page_catches_up_with_a_change_made_before_it_listened(site: Site, browser: WebDriver) -> None:
    """A change between the page drawn and its event stream connected (here: the stream held
    off) still shows: the stream tells the page what changed since the page was drawn."""
    name = run_name("big", site.big_slots[-2])
    page = site.ui.url + f"/runs/{site.namespace}/{name}"
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/events*"]})
    try:
        browser.get(page)
        browser.execute_script("window.notReloaded = true")
        assert "caught up" not in text_of(browser, "dl.facts")
        where = f"/apis/anarchon.io/v1alpha1/namespaces/{site.namespace}/anarchonruns/{name}/status"
        site.cluster.cp.api("PATCH", where, {"status": {"message": "caught up"}})
        fresh = "return fetch(location.href, {headers: {'X-Anarchon-Fragment': 'main'}}).then(r => r.text())"
        until("the change in the ui's memory", lambda: "caught up" in browser.execute_script(fresh))
        assert "caught up" not in text_of(browser, "dl.facts")  # drawn before it, not listening yet
    finally:
        browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
    until("the change on the page", lambda: "caught up" in text_of(browser, "dl.facts"), timeout=15)
    assert browser.execute_script("return window.notReloaded") is True
    browser.get_log("browser")  # the blocked stream's errors: read, so that the next test starts clean


def test_trigger_shows_the_run_and_its_story_and_cancel_ends_it(site: Site, browser: WebDriver, shots: Path) -> None:
    browser.get(site.ui.url + f"/jobs/{site.namespace}/manual")
    line = confirm(browser, "Trigger now")
    assert f"anarchonjob {site.namespace}/manual: run of " in line and "requested" in line, line
    click(browser, By.ID, "back")
    row = until("the triggered run Running", lambda: "Running" in (r := row_of_prefix(browser, "manual-")) and r)
    assert "Manual" in row and "replica-a" in row, row
    click(browser, By.PARTIAL_LINK_TEXT, "manual-")
    attempts = until("the attempts table", lambda: text_of(browser, "main table"))
    assert "replica-a" in attempts and "launched the Pod" in attempts, attempts
    run = text_of(browser, "h1").removeprefix("Run ")
    slot = int(site.cluster.get("anarchonrun", run)["spec"]["slot"])
    assert str(slot * 10_000 + 1) in attempts, attempts  # the fencing token the Pod got
    page = text_of(browser)
    # The lines, or the API server's reason: KWOK runs no kubelet, the API server says it cannot reach one.
    log = page[page.index("Log of Pod") :]
    assert browser.find_elements(By.CSS_SELECTOR, "pre.log") or "(HTTP 500)" in log, log
    until("the replica's Event", lambda: "Launched" in text_of(browser), timeout=10)
    shot(browser, shots, "run-story")
    line = confirm(browser, "Cancel run", reason="wrong input")
    assert line.startswith(f"anarchonrun {site.namespace}/{run}: cancel requested by "), line
    assert line.endswith(": wrong input"), line
    annotations = site.cluster.get("anarchonrun", run)["metadata"]["annotations"]
    assert annotations.get("anarchon.io/cancel") == "wrong input", annotations
    click(browser, By.ID, "back")
    until("the run Cancelled on its page", lambda: "Cancelled" in text_of(browser, "dl.facts"), timeout=30)
    assert not browser.find_elements(By.LINK_TEXT, "Cancel run")  # an ended run has no such button
    assert console_errors(browser) == []


def test_suspend_with_a_reason_then_resume(site: Site, browser: WebDriver) -> None:
    browser.get(site.ui.url + f"/jobs/{site.namespace}/nightly")
    line = confirm(browser, "Suspend", reason="database   upgrade")
    assert line == f"anarchonjob {site.namespace}/nightly suspended: database upgrade", line
    job = site.cluster.get("anarchonjob", "nightly")
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["annotations"]["anarchon.io/suspend-reason"] == "database upgrade"
    click(browser, By.ID, "back")
    until("suspended on the page", lambda: "yes (database upgrade)" in text_of(browser))
    line = confirm(browser, "Resume")
    assert line == f"anarchonjob {site.namespace}/nightly resumed", line
    job = site.cluster.get("anarchonjob", "nightly")
    assert job["spec"]["suspend"] is False and "anarchon.io/suspend-reason" not in job["metadata"]["annotations"]
    assert console_errors(browser) == []


def test_timeline_draws_1000_runs(site: Site, browser: WebDriver, shots: Path) -> None:
    t0 = time.monotonic()
    browser.get(site.ui.url + f"/jobs/{site.namespace}/big")
    drawn = len(browser.find_elements(By.CSS_SELECTOR, "svg.timeline a.run"))
    took = time.monotonic() - t0
    assert drawn == BIG_RUNS, drawn
    assert took < 10, f"the page of 1,000 runs took {took:.1f}s"
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg.timeline polygon.takeover")) == BIG_RUNS // 50
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg.timeline polygon.ph-Skipped")) == BIG_RUNS // 10
    print(f"timeline of {BIG_RUNS} runs: {took:.2f}s")
    # The last hour: 57 runs and the window of 3 missed slots, a band with its facts.
    last = site.big_slots[-1]
    browser.get(site.ui.url + f"/jobs/{site.namespace}/big?from={last - 59 * MINUTE_MS}&to={last + 30_000}")
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg.timeline a.run")) == 60 - GAP
    bands = browser.execute_script(
        "return Array.from(document.querySelectorAll('svg rect.missed'), r => r.textContent)"
    )
    assert len(bands) == 1 and bands[0].startswith(f"missed {GAP} slot(s) ") and "NoReplica" in bands[0], bands
    assert browser.find_elements(By.CSS_SELECTOR, "svg.timeline rect.bar.ph-Cancelled")
    shot(browser, shots, "timeline-big-last-hour")
    browser.get(site.ui.url + "/timeline")
    assert browser.find_elements(By.CSS_SELECTOR, "svg.timeline a.row-label")
    shot(browser, shots, "timeline-namespace")
    assert console_errors(browser) == []


#: The range the timeline shows, as its svg says it: [from, to] in ms.
SHOWN = "const s = document.querySelector('svg.timeline'); return s ? [+s.dataset.from, +s.dataset.to] : null"


def test_timeline_zooms_by_wheel_and_keys_and_pans_by_drag(site: Site, browser: WebDriver) -> None:
    """Ctrl + wheel zooms about the pointer, a drag pans (and follows no run's link), + and the
    arrows on the focused timeline do what the links do; each shows the range in place, its URL
    the links' own."""
    last = site.big_slots[-1]
    start, end = last - 59 * MINUTE_MS, last + 60_000
    page = site.ui.url + f"/jobs/{site.namespace}/big"
    browser.get(page + f"?from={start}&to={end}")
    browser.execute_script("window.notReloaded = true")
    svg = browser.find_element(By.CSS_SELECTOR, "svg.timeline")
    assert browser.execute_script(SHOWN) == [start, end]
    plot_x = browser.execute_script(
        "const s = arguments[0], [x0, x1] = s.dataset.plot.split(' ').map(Number), box = s.getBoundingClientRect();"
        "return [box.left, box.width / s.viewBox.baseVal.width, x0, x1]",
        svg,
    )
    _, scale, x0, x1 = plot_x

    def moved_from(was: list[int]) -> list[int]:
        return list(until("the new range shown", lambda: (r := browser.execute_script(SHOWN)) != was and r))

    # Ctrl + wheel up over the middle of the svg: the time under the pointer stays where it was.
    middle = start + (svg.size["width"] / 2 / scale - x0) / (x1 - x0) * (end - start)
    ActionChains(browser).key_down(Keys.CONTROL).scroll_from_origin(ScrollOrigin.from_element(svg), 0, -200).key_up(
        Keys.CONTROL
    ).perform()
    a, b = moved_from([start, end])
    assert b - a < (end - start) * 0.9, (a, b)
    assert abs((middle - a) / (b - a) - (middle - start) / (end - start)) < 0.02, (middle, a, b)
    assert f"from={a}&to={b}" in browser.current_url
    # A drag 200 px to the left, from a run's bar: later by 200 px' worth, and no run's page.
    bar = browser.find_elements(By.CSS_SELECTOR, "svg.timeline rect.bar")[3]
    ActionChains(browser).click_and_hold(bar).move_by_offset(-100, 0).move_by_offset(-100, 0).release().perform()
    c, d = moved_from([a, b])
    ms_per_px = (b - a) / ((x1 - x0) * scale)
    assert abs((c - a) - 200 * ms_per_px) < 10 * ms_per_px and d - c == b - a, (a, b, c, d)
    assert "/jobs/" in browser.current_url
    # By keyboard: + halves the range about its middle, ← moves it earlier by half.
    box = browser.find_element(By.ID, "timeline")
    box.send_keys("+")
    e, f = moved_from([c, d])
    assert (e, f) == (c + (d - c) // 4, d - (d - c) // 4) or abs((f - e) - (d - c) / 2) <= 1, (c, d, e, f)
    browser.find_element(By.ID, "timeline").send_keys(Keys.ARROW_LEFT)
    g, h = moved_from([e, f])
    assert abs((e - g) - (f - e) / 2) <= 1 and h - g == f - e, (e, f, g, h)
    assert browser.switch_to.active_element.get_attribute("id") == "timeline"  # the focus stays
    assert browser.execute_script("return window.notReloaded") is True  # all in place
    browser.back()
    assert moved_from([g, h]) == [e, f]
    assert console_errors(browser) == []


def test_a_forbidden_action_shows_the_servers_message(site: Site, browser: WebDriver, control_plane: Any) -> None:
    """bob may read the jobs and runs, not the Events, and change nothing: the page says so, in
    the API server's words."""
    ns = site.namespace
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "ui-reader", "namespace": ns},
        "rules": [
            {
                "apiGroups": ["anarchon.io"],
                "resources": ["anarchonjobs", "anarchonruns"],
                "verbs": ["get", "list", "watch"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "ui-reader", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "ui-reader"},
        "subjects": [{"kind": "User", "name": "bob", "apiGroup": "rbac.authorization.k8s.io"}],
    }
    site.cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": [role, binding]}))
    bob = UiServer(control_plane.user_kubeconfig("bob"), "-n", ns)
    try:
        browser.get(bob.url + f"/jobs/{ns}/tick")
        until("the job for bob", lambda: browser.find_elements(By.LINK_TEXT, "Trigger now"), timeout=20)
        line = confirm(browser, "Trigger now")
        assert 'User "bob" cannot patch resource "anarchonjobs"' in line and "(HTTP 403)" in line, line
        assert "Refused" in text_of(browser, "h1")
        browser.get(bob.url + "/")
        text = until("the Events refusal", lambda: text_of(browser, ".errors"))
        assert 'User "bob" cannot list resource "events"' in text, text
        assert console_errors(browser) == []
    finally:
        leave(browser, bob)
    everywhere = UiServer(control_plane.user_kubeconfig("bob"), "-A")  # bob may list nothing cluster-wide
    try:
        browser.get(everywhere.url + "/")
        text = until("the refusal", lambda: "every namespace" in (t := text_of(browser, ".errors")) and t)
        assert 'User "bob" cannot list resource "anarchonjobs" in API group "anarchon.io" at the cluster scope' in text
    finally:
        leave(browser, everywhere)


def test_every_namespace(site: Site, browser: WebDriver, control_plane: Any) -> None:
    everywhere = UiServer(control_plane.kubeconfig, "-A")
    try:
        browser.get(everywhere.url + "/")
        assert "every namespace" in text_of(browser, "header")
        until("the jobs as NAMESPACE/NAME", lambda: row_of(browser, f"{site.namespace}/tick"))
        assert console_errors(browser) == []
    finally:
        leave(browser, everywhere)


def test_the_server_refuses_other_sites(site: Site) -> None:
    """It acts with the user's credentials: no page for a name another site's DNS points here,
    no action from another site's form or without this process's token."""
    port = site.ui.url.rsplit(":", 1)[1]

    def status(path: str, data: bytes | None = None, **headers: str) -> int:
        request = urllib.request.Request(site.ui.url + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return int(reply.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    assert status("/") == 200
    assert status("/", Host=f"rebound.example:{port}") == 421
    assert status("/events?since=yesterday") == 400
    form = urllib.parse.urlencode({"namespace": site.namespace, "job": "tick", "token": "guessed"}).encode()
    assert status("/act/trigger", form, Origin="http://evil.example") == 403
    assert status("/act/trigger", form, Origin=site.ui.url) == 403  # the token is not this process's
    annotations = site.cluster.get("anarchonjob", "tick")["metadata"].get("annotations") or {}
    assert not [k for k in annotations if k.startswith("anarchon.io/trigger")], annotations
