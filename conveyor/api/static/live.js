// Live pages of the conveyor dashboard (conveyor/api/dashboard.py).
//
// A page that is live has <body data-live-seconds="N"> and elements marked
// data-live with an id. Every N seconds this asks the page's own URL again
// with the X-Conveyor-Live header; the server answers JSON
// {"regions": {id: html}, "follow": bool} and each region whose HTML changed
// is swapped in. "follow": false (a job that has ended) stops the polling
// after that last update. Polling pauses while the tab is hidden, and a
// failed request only waits for the next turn. Loaded with <script src>: the
// dashboard's Content-Security-Policy allows no inline script.
(function () {
  "use strict";
  const body = document.body;
  const seconds = Number(body && body.dataset.liveSeconds);
  if (!seconds || !document.querySelector("[data-live]")) return;

  let timer = null;
  let busy = false;

  async function refresh() {
    timer = null;
    if (document.hidden) { schedule(); return; }
    if (busy) return;
    busy = true;
    let follow = true;
    try {
      const response = await fetch(window.location.href, {
        headers: {"X-Conveyor-Live": "1", "Accept": "application/json"},
        credentials: "same-origin",
        cache: "no-store",
      });
      if (response.ok && (response.headers.get("content-type") || "").includes("application/json")) {
        const data = await response.json();
        for (const [id, html] of Object.entries(data.regions || {})) {
          const region = document.getElementById(id);
          if (region && region.innerHTML !== html) region.innerHTML = html;
        }
        follow = data.follow !== false;
        body.dataset.liveUpdated = String(Date.now());
      } else if (response.status === 401 || response.status === 403) {
        follow = false;  // signed out: the next navigation shows the sign-in form
      }
    } catch (error) {
      // The API is away for a moment: try again next turn.
    } finally {
      busy = false;
    }
    if (follow) {
      schedule();
    } else {
      body.dataset.liveStopped = "1";
    }
  }

  function schedule() {
    if (timer === null) timer = window.setTimeout(refresh, seconds * 1000);
  }

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && timer === null && body.dataset.liveStopped !== "1") refresh();
  });
  schedule();
})();
