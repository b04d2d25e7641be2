// The dashboard's script, a static file so the Content-Security-Policy can say
// script-src 'self' and forbid inline scripts and handlers.
// Buttons with data-action call the admin API; the session cookie proves the
// sign-in, the header proves the request comes from this page.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-action]");
  if (!button) return;
  if (button.dataset.confirm && !window.confirm(button.dataset.confirm)) return;
  button.disabled = true;
  const flash = document.getElementById("flash");
  try {
    const response = await fetch(button.dataset.action, {
      method: button.dataset.method || "POST",
      headers: {[document.body.dataset.csrfHeader]: document.body.dataset.csrfValue},
      credentials: "same-origin",
    });
    if (!response.ok) {
      let detail = response.statusText;
      try { detail = (await response.json()).detail || detail; } catch (e) {}
      throw new Error(detail);
    }
    if (button.dataset.next) { window.location.href = button.dataset.next; } else { window.location.reload(); }
  } catch (error) {
    flash.textContent = error.message;
    flash.style.display = "block";
    button.disabled = false;
  }
});

// A job-type filter applies as soon as it is chosen (the Filter button stays for pages without script).
document.addEventListener("change", (event) => {
  const select = event.target.closest("select[data-autosubmit]");
  if (select && select.form) select.form.submit();
});

// Bulk actions on a queue's list (#bulk): every job of the tab's state, job type and chosen age.
// The click first asks the server how many jobs the filter matches (a dry run) and shows
// "Retry 42 failed jobs of queue X?"; only "Yes" acts, in chunks of data-chunk ids, with progress.
(function () {
  "use strict";
  const bulk = document.getElementById("bulk");
  if (!bulk) return;
  const $ = (id) => document.getElementById(id);
  const VERBS = {
    retry: ["Retry", "Retrying", "Retried"],
    promote: ["Promote", "Promoting", "Promoted"],
    delete: ["Delete", "Deleting", "Deleted"],
    purge: ["Purge", "Purging", "Purged"],
    cancel: ["Cancel", "Cancelling", "Cancelled"],
  };
  let pending = null;

  function filter() {
    const body = {queue: bulk.dataset.queue, state: bulk.dataset.state};
    if (bulk.dataset.job) body.job = bulk.dataset.job;
    const age = $("bulk-age").value;
    if (age) body.olderThan = Number(age);
    return body;
  }

  async function call(action, body) {
    const response = await fetch(`/api/admin/bulk/${action}`, {
      method: "POST",
      headers: {
        [document.body.dataset.csrfHeader]: document.body.dataset.csrfValue,
        "Content-Type": "application/json",
      },
      credentials: "same-origin",
      body: JSON.stringify(body),
    });
    if (!response.ok) {
      let detail = response.statusText;
      try { detail = (await response.json()).detail || detail; } catch (e) {}
      throw new Error(typeof detail === "string" ? detail : "the request was refused");
    }
    return response.json();
  }

  function fail(error) {
    const flash = $("flash");
    flash.textContent = error.message;
    flash.style.display = "block";
  }

  function describe(count, body) {
    const age = $("bulk-age");
    let text = `${count} ${body.state} job${count === 1 ? "" : "s"} of queue ${body.queue}`;
    if (body.job) text += ` of type ${body.job}`;
    if (body.olderThan) text += ` ${age.options[age.selectedIndex].text}`;
    return text;
  }

  function busy(on) {
    for (const b of bulk.querySelectorAll("button[data-bulk]")) b.disabled = on;
    $("bulk-age").disabled = on;
  }

  bulk.addEventListener("click", async (event) => {
    const button = event.target.closest("button");
    if (!button) return;
    if (button.dataset.bulk) {
      const action = button.dataset.bulk;
      const body = filter();
      busy(true);
      $("bulk-progress").hidden = true;
      try {
        const found = await call(action, Object.assign({dryRun: true}, body));
        if (!found.count) {
          $("bulk-progress").hidden = false;
          $("bulk-status").textContent = `Nothing to ${action}: no ${describe(0, body).slice(2)}.`;
          busy(false);
          return;
        }
        pending = {action, body, ids: found.ids};
        $("bulk-question").textContent = `${VERBS[action][0]} ${describe(found.count, body)}?`;
        $("bulk-confirm").hidden = false;
      } catch (error) {
        fail(error);
        busy(false);
      }
    } else if (button.id === "bulk-cancel") {
      pending = null;
      $("bulk-confirm").hidden = true;
      busy(false);
    } else if (button.id === "bulk-go" && pending) {
      const {action, body, ids} = pending;
      pending = null;
      $("bulk-confirm").hidden = true;
      $("bulk-progress").hidden = false;
      const bar = $("bulk-bar");
      const status = $("bulk-status");
      const chunk = Number(bulk.dataset.chunk) || 100;
      bar.max = ids.length;
      bar.value = 0;
      let done = 0;
      let skipped = 0;
      try {
        for (let i = 0; i < ids.length; i += chunk) {
          status.textContent = `${VERBS[action][1]}: ${i} of ${ids.length}…`;
          const result = await call(action, Object.assign({ids: ids.slice(i, i + chunk)}, body));
          done += result.done;
          skipped += result.skipped;
          bar.value = Math.min(ids.length, i + chunk);
        }
        status.textContent = `${VERBS[action][2]} ${done} of ${ids.length}` +
          (skipped ? ` (${skipped} had moved on and were left alone).` : ".");
        status.dataset.done = String(done);
      } catch (error) {
        status.textContent = `${VERBS[action][2]} ${done} of ${ids.length}, then stopped.`;
        fail(error);
      }
      busy(false);
    }
  });
})();
