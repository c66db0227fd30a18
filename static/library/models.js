// The Models page: the library's rows, live download progress, and the operator's
// "download from a hub" (preview first) and "import a local folder" forms.
(function () {
  const OPERATOR = document.getElementById("models").dataset.operator === "true";
  const rows = new Map();
  const tbody = document.querySelector("#models tbody");
  const lang = document.documentElement.lang;
  const fixed = (n, digits) => n.toLocaleString(lang, { minimumFractionDigits: digits, maximumFractionDigits: digits });
  // Binary units in both languages (12.5 GiB), the number in the page's language.
  const fmtBytes = (n) => {
    if (n == null) return "";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i ? fixed(n, n < 10 ? 2 : 1) : fixed(n, 0)) + " " + u[i];
  };
  const fill = (format, values) => interpolate(format, values, true);
  const fmtSecs = (s) => s == null ? "" : s < 90 ? fill(gettext("%(n)s s"), { n: Math.round(s) })
    : s < 5400 ? fill(gettext("%(n)s min"), { n: Math.round(s / 60) }) : fill(gettext("%(n)s h"), { n: fixed(s / 3600, 1) });
  const el = (tag, attrs, ...kids) => { const e = document.createElement(tag); Object.assign(e, attrs || {}); kids.forEach(k => e.append(k)); return e; };

  function statusLine(m) {
    if (m.stale) return gettext("the worker stopped answering; resume it");
    if (m.status === "downloading" || m.status === "verifying") {
      const sizes = { done: fmtBytes(m.bytes_done), total: fmtBytes(m.bytes_total) };
      let s = m.status === "verifying" ? fill(gettext("%(done)s of %(total)s hashed"), sizes) : fill(gettext("%(done)s of %(total)s"), sizes);
      if (m.speed) s += ` · ${fmtBytes(m.speed)}/s`;
      if (m.eta_seconds != null) s += " · " + fill(gettext("%(time)s left"), { time: fmtSecs(m.eta_seconds) });
      if (m.cancel_requested) s += " · " + gettext("cancelling…");
      return s;
    }
    if (m.status === "queued") return fill(gettext("waiting for the worker on %(host)s"), { host: m.host });
    if (m.status === "ready") return m.verified_at ? fill(gettext("verified %(when)s"), { when: m.verified_at.replace("T", " ").slice(0, 19) }) : "";
    if (m.status === "cancelled") return fill(gettext("%(done)s of %(total)s kept for a resume"), { done: fmtBytes(m.bytes_done), total: fmtBytes(m.bytes_total) });
    return "";
  }

  function render(m) {
    let tr = rows.get(m.id);
    if (!tr) {
      tr = el("tr", { id: "model-" + m.id });
      tr.dataset.id = m.id;
      rows.set(m.id, tr);
      tbody.prepend(tr);
    }
    tr.dataset.status = m.status;
    tr.replaceChildren();
    const name = el("td", {}, el("a", { href: `/models/${m.id}/`, textContent: m.name }));
    name.append(el("div", { className: "muted small", textContent: [m.source_label, m.revision, m.path].filter(Boolean).join(" · ") }));
    tr.append(name, el("td", { textContent: m.format || "" }), el("td", { textContent: fmtBytes(m.bytes_total) }));
    const colour = m.stale ? "amber" : m.colour;
    const bar = el("div", { className: "bar " + (m.status === "ready" ? "green" : colour === "red" ? "red" : colour === "amber" ? "amber" : "") }, el("span"));
    bar.firstChild.style.width = m.percent + "%";
    bar.setAttribute("role", "progressbar"); bar.setAttribute("aria-valuenow", m.percent);
    const st = el("td", {}, el("span", { className: "badge " + colour, textContent: m.stale ? gettext("Stalled") : m.status_label }),
      el("span", { className: "muted small pct", textContent: " " + m.percent + "%" }), bar,
      el("div", { className: "muted small", textContent: statusLine(m) }));
    if (m.error) st.append(el("div", { className: "error small", textContent: m.error }));
    tr.append(st);
    if (OPERATOR) {
      const td = el("td", { className: "actions" });
      const add = (action, label) => {
        const b = el("button", { textContent: label });
        b.dataset.action = action;
        b.addEventListener("click", () => act(m, action));
        td.append(b, " ");
      };
      if (m.actions.cancel) add("cancel", gettext("Cancel"));
      if (m.actions.resume) add("resume", gettext("Resume"));
      if (m.actions.reverify) add("reverify", gettext("Re-verify"));
      if (m.actions.delete) add("delete", gettext("Delete"));
      tr.append(td);
    }
    document.getElementById("models-empty").hidden = rows.size > 0;
  }

  function remove(id) {
    const tr = rows.get(id);
    if (tr) { tr.remove(); rows.delete(id); }
    document.getElementById("models-empty").hidden = rows.size > 0;
  }

  async function act(m, action) {
    const err = document.getElementById("action-error");
    err.hidden = true;
    if (action === "delete" && !confirm(fill(m.source === "local" ? gettext("Remove %(name)s from the library? Its files stay where they are.") : gettext("Delete %(name)s and its downloaded files?"), { name: m.name }))) return;
    const res = await Kiln.postJSON(`/api/models/${m.id}/${action}`, {});
    if (res.status >= 400) { err.textContent = res.body.error ? res.body.error.message : `HTTP ${res.status}`; err.hidden = false; return; }
    if (action === "delete") remove(m.id); else render(res.body.model);
  }

  const initial = JSON.parse(document.getElementById("models-data").textContent);
  initial.slice().reverse().forEach(render);
  document.getElementById("models-empty").hidden = rows.size > 0;
  // The websocket carries every change; the poll only repairs a tab that missed some.
  Kiln.follow({
    type: "download", url: "/api/models/", interval: 15000, pick: (data) => data.models,
    onUpdate: (m) => { if (m.deleted) remove(m.id); else render(m); },
    onPoll: (data) => { const ids = new Set(data.models.map(m => m.id)); [...rows.keys()].filter(id => !ids.has(id)).forEach(remove); },
  });

  if (!OPERATOR) return;
  const form = document.getElementById("add-form");
  const addError = document.getElementById("add-error");
  const preview = document.getElementById("preview");
  const formData = () => Object.fromEntries(new FormData(form).entries());
  const hubHints = () => {
    const hub = form.hub.value;
    form.endpoint.placeholder = form.endpoint.dataset[hub];
    form.token.placeholder = form.token.dataset[hub];
    form.revision.placeholder = hub === "hf" ? "main" : "master";
  };
  // An endpoint filled in for one hub (the HF mirror) is wrong for the other.
  form.hub.addEventListener("change", () => { form.endpoint.value = ""; hubHints(); });
  hubHints();  // the page may open on ModelScope (preferred hub, or a preset's link)
  const showError = (node, res) => { node.textContent = res.body.error ? res.body.error.message : `HTTP ${res.status}`; node.hidden = false; };
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    addError.hidden = true; preview.hidden = true;
    const button = document.getElementById("preview-button");
    button.disabled = true; button.textContent = gettext("Listing files…");
    try {
      const res = await Kiln.postJSON("/api/models/preview", formData());
      if (res.status >= 400) return showError(addError, res);
      const p = res.body.preview;
      const body = document.querySelector("#preview-files tbody");
      body.replaceChildren(...p.files.map(f => el("tr", {}, el("td", { textContent: f.path }), el("td", { textContent: fmtBytes(f.size) }),
        el("td", {}, el("code", { className: "hash", textContent: f.sha256 ? "sha256 " + f.sha256.slice(0, 16) + "…" : f.git_sha1 ? "git " + f.git_sha1.slice(0, 12) + "…" : gettext("size only") })))));
      const s = p.space;
      document.getElementById("preview-summary").replaceChildren(
        el("strong", { textContent: fill(ngettext("%(count)s file, %(size)s", "%(count)s files, %(size)s", p.files.length), { count: p.files.length, size: fmtBytes(p.total_size) }) }),
        " " + fill(gettext("of %(repo)s at %(revision)s into %(folder)s."), { repo: p.repo_id, revision: p.revision, folder: p.folder }) + " ",
        fill(gettext("%(on_disk)s already on disk, %(needed)s to fetch, %(free)s free"), { on_disk: fmtBytes(s.already_on_disk), needed: fmtBytes(s.still_needed), free: fmtBytes(s.free) }),
        s.reserve ? " " + fill(gettext("(keeping %(reserve)s in reserve)."), { reserve: fmtBytes(s.reserve) }) + " " : gettext(".") + " ",
        el("span", { id: "preview-fits", className: "badge " + (p.fits ? "green" : "red"), textContent: p.fits ? gettext("fits") : gettext("does not fit") }),
        p.fits ? "" : el("p", { className: "error", textContent: p.message }));
      const confirmButton = document.getElementById("confirm-download");
      confirmButton.disabled = !p.fits;
      confirmButton.textContent = fill(ngettext("Download %(count)s file (%(size)s)", "Download %(count)s files (%(size)s)", p.files.length), { count: p.files.length, size: fmtBytes(p.total_size) });
      preview.hidden = false;
    } finally { button.disabled = false; button.textContent = gettext("Preview files"); }
  });
  document.getElementById("preview-cancel").addEventListener("click", () => { preview.hidden = true; });
  document.getElementById("confirm-download").addEventListener("click", async () => {
    addError.hidden = true;
    const res = await Kiln.postJSON("/api/models/", formData());
    if (res.status >= 400) return showError(addError, res);
    preview.hidden = true;
    form.token.value = "";
    render(res.body.model);
  });
  const importForm = document.getElementById("import-form");
  importForm.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const err = document.getElementById("import-error");
    err.hidden = true;
    const res = await Kiln.postJSON("/api/models/import", Object.fromEntries(new FormData(importForm).entries()));
    if (res.status >= 400) return showError(err, res);
    importForm.reset();
    render(res.body.model);
  });
})();
