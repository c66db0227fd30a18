// The launch profile form: the command it runs, previewed as the fields change,
// field errors named in place, and the live preflight panel beside it.
(function () {
  const form = document.getElementById("profile-form");
  const out = document.getElementById("preview"), note = document.getElementById("preview-note");
  let timer = null;
  async function refresh() {
    // URL-encoded: the form has no file to upload.
    const res = await fetch("/api/launch-profiles/preview", { method: "POST", body: new URLSearchParams(new FormData(form)),
      headers: { Accept: "application/json", "X-CSRFToken": Kiln.csrfToken() }, credentials: "same-origin" });
    const data = await res.json();
    document.querySelectorAll("[data-errors]").forEach((el) => { el.textContent = ""; });
    Object.entries(data.errors || {}).forEach(([k, v]) => {
      const el = document.querySelector(`[data-errors="${k}"]`);
      if (el) el.textContent = v.join(" ");
    });
    out.textContent = data.command || gettext("Fix the fields marked in red to see the command.");
    note.textContent = data.note || "";
  }
  form.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(refresh, 300); });
  form.addEventListener("change", () => { clearTimeout(timer); timer = setTimeout(refresh, 100); });
  document.querySelector("button[data-copy]").addEventListener("click", (ev) => {
    navigator.clipboard.writeText(out.textContent).catch(() => {}); ev.target.textContent = gettext("Copied");
    setTimeout(() => { ev.target.textContent = gettext("Copy"); }, 1500);
  });
  refresh();
  KilnPreflight.attach(form);
})();
