// Live preflight: post a form's fields to /api/preflight on every change (debounced)
// and render the findings, the per-GPU memory bar and the fit's answers.
//
//   KilnPreflight.attach(formElement, {panel: "preflight-panel", delay: 300})
//
// Returns {refresh(), last()}; last() is the latest result (or null).
window.KilnPreflight = (function () {
  const GiB = 1024 ** 3;
  const lang = document.documentElement.lang || "en";
  // Numbers in the page's language; sizes always in GiB (12.5 GiB) as the engines print them.
  const num = (n) => Number(n).toLocaleString(lang);
  const gib = (b) => (b / GiB).toLocaleString(lang, { minimumFractionDigits: 1, maximumFractionDigits: 1 }) + " GiB";
  const fill = (format, values) => interpolate(format, values, true);
  const LEVEL = { error: gettext("error"), warning: gettext("warning") };

  function csrf() {
    if (window.Kiln && Kiln.csrfToken) return Kiln.csrfToken();
    const m = document.cookie.match(/(?:^|; )csrftoken=([^;]+)/);
    return m ? decodeURIComponent(m[1]) : "";
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => {
      if (k === "class") node.className = v; else if (k === "style") node.style.cssText = v; else node.setAttribute(k, v);
    });
    children.flat().forEach((c) => { if (c != null) node.append(c instanceof Node ? c : document.createTextNode(String(c))); });
    return node;
  }

  function fixNode(fix) {
    // "--dtype half" style fixes read best as code
    if (/^--|^use --/.test(fix)) {
      const m = fix.match(/^(use )?(--.*)$/);
      return [m[1] || "", el("code", {}, m[2])];
    }
    return [fix];
  }

  function renderFindings(panel, result) {
    const list = panel.querySelector('[data-pf="findings"]');
    list.replaceChildren(...result.findings.map((f) => el("li", { class: f.level, "data-code": f.code },
      el("span", { class: "badge " + (f.level === "error" ? "red" : "amber") }, LEVEL[f.level] || f.level), " ", f.message,
      el("span", { class: "fix" }, gettext("Fix: "), ...fixNode(f.fix)),
      f.install_url ? el("a", { class: "button", href: f.install_url, "data-role": "install" }, gettext("Install it")) : null,
      f.notes_url ? el("a", { class: "button", href: f.notes_url, "data-role": "build-notes" }, gettext("How to build it")) : null)));
    const errors = result.findings.filter((f) => f.level === "error").length;
    const warnings = result.findings.length - errors;
    const state = panel.querySelector('[data-pf="state"]');
const nErrors = fill(ngettext("%(count)s error", "%(count)s errors", errors), { count: errors });
    const nWarnings = fill(ngettext("%(count)s warning", "%(count)s warnings", warnings), { count: warnings });
    if (errors) { state.textContent = nErrors + (warnings ? gettext(", ") + nWarnings : ""); state.className = "pf-state bad"; }
    else if (warnings) { state.textContent = fill(gettext("ready, %(warnings)s"), { warnings: nWarnings }); state.className = "pf-state warn"; }
    else { state.textContent = gettext("no problems found"); state.className = "pf-state ok"; }
    const box = panel.querySelector('[data-pf="override-box"]');
    if (box) {
      box.hidden = !errors;
      if (!errors) box.querySelector("input").checked = false;
    }
  }

  function renderMemory(panel, result) {
    const box = panel.querySelector('[data-pf="memory"]');
    const fit = result.fit;
    if (!fit) { box.replaceChildren(); return; }
    const cpu = result.cpu_only;
    const rows = fit.gpus.map((g) => {
      const kv = Math.max(0, g.kv_cache_bytes);
      const used = g.weights_bytes + g.overhead_bytes + kv;
      const over = Math.max(0, used - g.total_bytes);
      const free = Math.max(0, g.total_bytes - used);
      const scale = Math.max(g.total_bytes, used);
      const seg = (cls, bytes, label) => bytes > 0
        ? el("span", { class: "pf-seg-" + cls, style: `width:${(100 * bytes / scale).toFixed(2)}%`,
          title: `${label}: ${gib(bytes)}`, "data-seg": cls }, 100 * bytes / scale >= 10 ? `${label} ${gib(bytes)}`
            : (100 * bytes / scale >= 4 ? gib(bytes).replace(" GiB", "") : "")) : null;
      const WEIGHTS = gettext("weights"), KV = gettext("KV cache"), OVERHEAD = gettext("overhead"), FREE = gettext("free");
      return el("div", { class: "pf-gpu", "data-gpu": g.name },
        el("div", { class: "pf-gpu-name" }, el("strong", {}, cpu ? fill(gettext("RAM — %(name)s"), { name: g.name }) : g.name),
          el("span", { class: over ? "error" : "muted" },
            over ? fill(gettext("over by %(size)s"), { size: gib(over) }) : fill(gettext("%(used)s of %(total)s"), { used: gib(used), total: gib(g.total_bytes) }))),
        el("div", { class: "pf-bar", role: "img",
          "aria-label": fill(gettext("weights %(weights)s, KV cache %(kv)s, overhead %(overhead)s, free %(free)s"), { weights: gib(g.weights_bytes), kv: gib(kv), overhead: gib(g.overhead_bytes), free: gib(free) }) },
          seg("weights", g.weights_bytes, WEIGHTS), seg("kv", kv, KV),
          seg("overhead", g.overhead_bytes, OVERHEAD), seg("free", free, FREE), seg("over", over, gettext("over"))));
    });
    const legend = el("div", { class: "pf-legend" },
      ...[["weights", gettext("weights")], ["kv", gettext("KV cache")], ["overhead", gettext("overhead (activations, CUDA graphs)")], ["free", cpu ? gettext("free RAM") : gettext("free (outside the engine’s budget)")]]
        .map(([c, t]) => el("span", {}, el("i", { class: "pf-seg-" + c }), t)));
    box.replaceChildren(...rows, legend);
  }

  function renderAnswers(panel, result) {
    const table = panel.querySelector('[data-pf="answers"]');
    const sugg = panel.querySelector('[data-pf="suggestions"]');
    const notes = panel.querySelector('[data-pf="notes"]');
    const fit = result.fit;
    if (!fit) { table.replaceChildren(); sugg.replaceChildren(); notes.replaceChildren(); return; }
    const row = (k, v, key) => el("tr", { "data-answer": key }, el("th", {}, k), el("td", {}, v));
    table.replaceChildren(
      row(gettext("Fits"), fit.fits ? gettext("yes") : gettext("no"), "fits"),
      row(fill(ngettext("Largest context at %(count)s concurrent request", "Largest context at %(count)s concurrent requests", fit.max_num_seqs), { count: fit.max_num_seqs }),
        fill(gettext("%(count)s tokens"), { count: num(fit.max_context_at_concurrency) }), "max_context"),
      row(fill(gettext("Largest concurrency at %(count)s tokens"), { count: num(fit.max_model_len) }),
        fill(ngettext("%(count)s request", "%(count)s requests", fit.max_concurrency_at_context), { count: num(fit.max_concurrency_at_context) }), "max_concurrency"),
      fit.engine === "llamacpp"
        ? row(gettext("KV cache"), fill(gettext("%(size)s for %(seqs)s × %(tokens)s tokens (llama.cpp allocates what it is given)"), { size: gib(fit.gpus[0].kv_cache_bytes), seqs: fit.max_num_seqs, tokens: num(fit.max_model_len) }), "kv_tokens")
        : row(gettext("KV cache"), fill(gettext("%(tokens)s tokens · %(kib)s KiB per token"), { tokens: num(fit.kv_cache_tokens), kib: num(Math.round(fit.kv_bytes_per_token / 1024)) }), "kv_tokens"),
      row(gettext("Weights"), `${gib(fit.weights_bytes)} (${fit.weights_source === "estimate" ? gettext("estimated from config") : gettext("from the files")})`, "weights"));
    sugg.replaceChildren(...(fit.suggestions.length ? [el("p", { class: "muted" }, gettext("What to change:")),
      el("ul", { class: "pf-suggestions" }, ...fit.suggestions.map((s) => el("li", {}, ...fixNode(s))))] : []));
    notes.replaceChildren(...fit.notes.map((n) => el("li", { class: "muted" }, n)));
  }

  function renderProblems(panel, error) {
    const box = panel.querySelector('[data-pf="problems"]');
    if (!error) { box.replaceChildren(); return; }
    const fields = error.fields || {};
    const lines = Object.keys(fields).length ? Object.entries(fields).map(([k, v]) => el("p", { class: "error", "data-field": k }, `${k.replace(/_/g, " ")}: ${v}`))
      : [el("p", { class: "error" }, error.message)];
    box.replaceChildren(...lines);
  }

  function attach(form, options) {
    options = options || {};
    const panel = typeof options.panel === "string" ? document.getElementById(options.panel)
      : (options.panel || document.querySelector(".preflight-panel"));
    const url = panel.dataset.url;
    const delay = options.delay ?? 300;
    if (!form.id) form.id = "pf-form-" + Math.random().toString(36).slice(2);
    const override = panel.querySelector('[data-pf="override"]');
    if (override) override.setAttribute("form", form.id);
    let timer = null, seq = 0, latest = null;

    async function refresh() {
      const mine = ++seq;
      const body = new URLSearchParams(new FormData(form));
      body.delete("csrfmiddlewaretoken");
      body.delete("preflight_override");
      panel.classList.add("pf-busy");
      let res, data = {};
      try {
        res = await fetch(url, { method: "POST", credentials: "same-origin", body,
          headers: { "X-CSRFToken": csrf(), Accept: "application/json" } });
        data = await res.json();
      } catch (e) {
        if (mine === seq) renderProblems(panel, { message: gettext("preflight did not answer: ") + e });
        return;
      } finally { if (mine === seq) panel.classList.remove("pf-busy"); }
      if (mine !== seq) return;   // a newer request is on its way
      if (!res.ok) {
        latest = null;
        renderProblems(panel, data.error || { message: `HTTP ${res.status}` });
        panel.querySelector('[data-pf="state"]').textContent = gettext("fix the form");
        panel.querySelector('[data-pf="state"]').className = "pf-state bad";
        return;
      }
      latest = data;
      form.dataset.preflightErrors = data.has_errors ? "1" : "0";
      renderProblems(panel, null);
      panel.querySelector('[data-pf="where"]').textContent = data.where ? fill(gettext("Checked against %(where)s · %(runtime)s"), { where: data.where, runtime: data.runtime.name || data.runtime.engine }) : "";
      renderFindings(panel, data);
      renderMemory(panel, data);
      renderAnswers(panel, data);
      panel.dispatchEvent(new CustomEvent("preflight", { detail: data }));
    }
    function schedule() { clearTimeout(timer); timer = setTimeout(refresh, delay); }
    form.addEventListener("input", schedule);
    form.addEventListener("change", schedule);
    form.addEventListener("submit", (ev) => {
      // Saving a profile with errors is fine; launching it needs the override.
      if (ev.submitter && ev.submitter.name && ev.submitter.name !== "launch") return;
      const box = panel.querySelector('[data-pf="override"]');
      if (latest && latest.has_errors && box && !box.checked) {
        ev.preventDefault();
        panel.scrollIntoView({ behavior: "smooth" });
        box.parentElement.classList.add("error");
      }
    });
    refresh();
    return { refresh, last: () => latest, panel };
  }
  return { attach };
})();
