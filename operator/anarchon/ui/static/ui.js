// anarchon ui: the pages work without this; it keeps them live, and zooms and pans the timeline
// in place. The server pushes the topics that changed (server-sent events); when the page shows
// one of them, its <main> is fetched again; when only rows of it do (their data-topics), only
// those rows are. Ctrl + wheel, a drag, or + - ← → on the focused timeline ask the page of
// another range, as its links do, and show it in place.
(() => {
  "use strict";
  document.documentElement.classList.add("js");
  const topics = (document.body.dataset.topics || "").split(" ").filter(Boolean);
  const live = document.getElementById("live");
  let timer = null;
  let busy = false;
  let again = false;
  let whole = false;
  const rows = new Set();

  // Whether a change of `changed` is about `shown`: a topic of it, or one under a "prefix*" of it.
  const about = (shown, changed) =>
    shown.some((t) => (t.endsWith("*") ? changed.some((c) => c.startsWith(t.slice(0, -1))) : changed.includes(t)));

  // The focused link or button inside `element`, as its place among the focusable ones there.
  const focusables = (element) => Array.from(element.querySelectorAll("a, button, input"));

  async function refreshMain() {
    const reply = await fetch(window.location.href, { headers: { "X-Anarchon-Fragment": "main" } });
    const main = document.getElementById("main");
    if (reply.ok || reply.status === 404) {
      const focused = document.activeElement && document.activeElement.id;
      main.innerHTML = await reply.text();
      if (focused) {
        const element = document.getElementById(focused);
        if (element) element.focus();
      }
      document.body.dataset.refreshed = String(Date.now());
    }
  }

  async function refreshRows(ids) {
    const headers = { "X-Anarchon-Fragment": "rows", "X-Anarchon-Rows": ids.join(" ") };
    const reply = await fetch(window.location.href, { headers });
    if (!reply.ok) return;
    const fresh = document.createElement("template");
    fresh.innerHTML = await reply.text();
    for (const row of Array.from(fresh.content.children)) {
      const old = document.getElementById(row.id);
      if (!old) continue;
      const place = focusables(old).indexOf(document.activeElement);
      old.replaceWith(row);
      if (place >= 0 && focusables(row)[place]) focusables(row)[place].focus();
    }
  }

  async function refresh() {
    timer = null;
    if (busy) { again = true; return; }
    busy = true;
    const all = whole;
    const ids = Array.from(rows);
    whole = false;
    rows.clear();
    try {
      if (all) await refreshMain();
      else if (ids.length) await refreshRows(ids);
    } catch (e) {
      live.textContent = "not live: " + e.message;
    } finally {
      busy = false;
      if (again) { again = false; refresh(); }
    }
  }

  function soon() {
    if (!timer) timer = setTimeout(refresh, 50);
  }

  // -- the timeline: its range and plot are on the svg (data-from, data-to, data-plot) ----------

  const timelineOf = (target) => target instanceof Element && target.closest("#main svg.timeline");

  // The time (ms) at the screen's x in the timeline.
  function timeAt(svg, clientX) {
    const [x0, x1] = svg.dataset.plot.split(" ").map(Number);
    const from = Number(svg.dataset.from), to = Number(svg.dataset.to);
    const x = new DOMPoint(clientX, 0).matrixTransform(svg.getScreenCTM().inverse()).x;
    return from + ((x - x0) / (x1 - x0)) * (to - from);
  }

  // Show the range [from, to] (ms) in place: the page's URL says it, as the links' do.
  function show(from, to) {
    const url = new URL(window.location.href);
    url.searchParams.set("from", String(Math.round(from)));
    url.searchParams.set("to", String(Math.round(Math.max(to, from + 1000))));
    window.history.pushState(null, "", url);
    whole = true;
    soon();
  }

  // Zoom by `factor` (below 1: in) about the time `at`.
  function zoom(svg, factor, at) {
    const from = Number(svg.dataset.from), to = Number(svg.dataset.to);
    show(at - (at - from) * factor, at + (to - at) * factor);
  }

  function pan(svg, by) {
    show(Number(svg.dataset.from) + by, Number(svg.dataset.to) + by);
  }

  let wheel = null;
  document.addEventListener("wheel", (event) => {
    const svg = timelineOf(event.target);
    if (!svg || !event.ctrlKey) return;  // a plain wheel scrolls the page
    event.preventDefault();
    if (!wheel) {
      wheel = { factor: 1, at: timeAt(svg, event.clientX) };
      setTimeout(() => {
        const done = wheel;
        wheel = null;
        zoom(svg, done.factor, done.at);
      }, 150);  // a burst of wheel events is one zoom
    }
    wheel.factor *= Math.exp(event.deltaY * 0.002);
  }, { passive: false });

  let drag = null;
  let dragged = false;
  document.addEventListener("pointerdown", (event) => {
    const svg = timelineOf(event.target);
    if (!svg || event.button !== 0) return;
    event.preventDefault();  // no native drag of the run's link
    drag = { svg, x: event.clientX, at: timeAt(svg, event.clientX), moved: false };
    svg.setPointerCapture(event.pointerId);
  });
  document.addEventListener("pointermove", (event) => {
    if (!drag) return;
    const dx = event.clientX - drag.x;
    drag.moved = drag.moved || Math.abs(dx) > 4;
    if (drag.moved) {
      drag.svg.classList.add("dragged");
      drag.svg.style.transform = `translateX(${dx}px)`;
    }
  });
  document.addEventListener("pointerup", (event) => {
    if (!drag) return;
    const done = drag;
    drag = null;
    if (!done.moved) return;
    dragged = true;  // what follows is no click on the run under the pointer
    done.svg.style.transform = "";
    pan(done.svg, done.at - timeAt(done.svg, event.clientX));
  });
  document.addEventListener("click", (event) => {
    if (dragged) {
      dragged = false;
      event.preventDefault();
      event.stopPropagation();
    }
  }, true);
  document.addEventListener("keydown", (event) => {
    if (!(event.target instanceof Element) || event.target.id !== "timeline") return;
    const svg = event.target.querySelector("svg.timeline");
    const from = Number(svg.dataset.from), to = Number(svg.dataset.to), mid = (from + to) / 2;
    const moves = {
      "+": () => zoom(svg, 0.5, mid), "=": () => zoom(svg, 0.5, mid), "-": () => zoom(svg, 2, mid),
      ArrowLeft: () => pan(svg, -(to - from) / 2), ArrowRight: () => pan(svg, (to - from) / 2),
    };
    if (moves[event.key]) {
      event.preventDefault();
      moves[event.key]();
    }
  });
  window.addEventListener("popstate", () => { whole = true; soon(); });

  if (!topics.length || !window.EventSource) {
    live.textContent = "";
    return;
  }
  function changed(event) {
    const topicsChanged = event.data.split(" ");
    if (topicsChanged.includes("*") || about(topics, topicsChanged)) {
      whole = true;
    } else {
      for (const row of document.querySelectorAll("#main [data-topics]")) {
        if (about(row.dataset.topics.split(" "), topicsChanged)) rows.add(row.id);
      }
    }
    if (whole || rows.size) soon();
  }

  // The stream starts at the version the page was drawn at: what changed before it connected
  // comes first. The browser reconnects a broken stream itself; one it gave up on is started again.
  const since = "/events?since=" + encodeURIComponent(document.body.dataset.version || "");
  let stream = null;
  function listen() {
    stream = new EventSource(since);
    stream.addEventListener("hello", () => { live.textContent = "live"; });
    stream.addEventListener("change", changed);
    stream.onerror = () => {
      live.textContent = "reconnecting…";
      if (stream.readyState === EventSource.CLOSED) setTimeout(listen, 2000);
    };
  }
  listen();
  window.addEventListener("pagehide", () => stream.close());
})();
