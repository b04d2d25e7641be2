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
