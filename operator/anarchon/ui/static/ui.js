// anarchon ui: the pages work without this; it only keeps them live. The server pushes the topics
// that changed (server-sent events); when the page shows one of them, its <main> is fetched again;
// when only rows of it do (their data-topics), only those rows are.
(() => {
  "use strict";
  const topics = (document.body.dataset.topics || "").split(" ").filter(Boolean);
  const live = document.getElementById("live");
  if (!topics.length || !window.EventSource) {
    live.textContent = "";
    return;
  }
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

  const stream = new EventSource("/events");
  stream.addEventListener("hello", () => { live.textContent = "live"; });
  stream.addEventListener("change", (event) => {
    const changed = event.data.split(" ");
    if (changed.includes("*") || about(topics, changed)) {
      whole = true;
    } else {
      for (const row of document.querySelectorAll("#main [data-topics]")) {
        if (about(row.dataset.topics.split(" "), changed)) rows.add(row.id);
      }
    }
    if ((whole || rows.size) && !timer) timer = setTimeout(refresh, 50);
  });
  stream.onerror = () => { live.textContent = "reconnecting…"; };
  window.addEventListener("pagehide", () => stream.close());
})();
