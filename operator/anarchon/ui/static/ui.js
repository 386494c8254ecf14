// anarchon ui: the pages work without this; it only keeps them live. The server pushes the topics
// that changed (server-sent events); when the page shows one of them, its <main> is fetched again.
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

  async function refresh() {
    timer = null;
    if (busy) { again = true; return; }
    busy = true;
    try {
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
    if (changed.includes("*") || changed.some((t) => topics.includes(t))) {
      if (!timer) timer = setTimeout(refresh, 50);
    }
  });
  stream.onerror = () => { live.textContent = "reconnecting…"; };
  window.addEventListener("pagehide", () => stream.close());
})();
