// Live preflight: post a form's fields to /api/preflight on every change (debounced)
// and render the findings, the per-GPU memory bar and the fit's answers.
//
//   KilnPreflight.attach(formElement, {panel: "preflight-panel", delay: 300})
//
// Returns {refresh(), last()}; last() is the latest result (or null).
window.KilnPreflight = (function () {
  const GiB = 1024 ** 3;
  const gib = (b) => (b / GiB).toFixed(1) + " GiB";
  const num = (n) => Number(n).toLocaleString("en-US");

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
      el("span", { class: "badge " + (f.level === "error" ? "red" : "amber") }, f.level), " ", f.message,
      el("span", { class: "fix" }, "Fix: ", ...fixNode(f.fix)))));
    const errors = result.findings.filter((f) => f.level === "error").length;
    const warnings = result.findings.length - errors;
    const state = panel.querySelector('[data-pf="state"]');
    if (errors) { state.textContent = `${errors} error${errors > 1 ? "s" : ""}` + (warnings ? `, ${warnings} warning${warnings > 1 ? "s" : ""}` : ""); state.className = "pf-state bad"; }
    else if (warnings) { state.textContent = `ready, ${warnings} warning${warnings > 1 ? "s" : ""}`; state.className = "pf-state warn"; }
    else { state.textContent = "no problems found"; state.className = "pf-state ok"; }
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
      return el("div", { class: "pf-gpu", "data-gpu": g.name },
        el("div", { class: "pf-gpu-name" }, el("strong", {}, cpu ? `RAM — ${g.name}` : g.name),
          el("span", { class: over ? "error" : "muted" },
            over ? `over by ${gib(over)}` : `${gib(used)} of ${gib(g.total_bytes)}`)),
        el("div", { class: "pf-bar", role: "img",
          "aria-label": `weights ${gib(g.weights_bytes)}, KV cache ${gib(kv)}, overhead ${gib(g.overhead_bytes)}, free ${gib(free)}` },
          seg("weights", g.weights_bytes, "weights"), seg("kv", kv, "KV cache"),
          seg("overhead", g.overhead_bytes, "overhead"), seg("free", free, "free"), seg("over", over, "over")));
    });
    const legend = el("div", { class: "pf-legend" },
      ...[["weights", "weights"], ["kv", "KV cache"], ["overhead", "overhead (activations, CUDA graphs)"], ["free", cpu ? "free RAM" : "free (outside the engine's budget)"]]
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
      row("Fits", fit.fits ? "yes" : "no", "fits"),
      row(`Largest context at ${fit.max_num_seqs} concurrent request${fit.max_num_seqs > 1 ? "s" : ""}`,
        `${num(fit.max_context_at_concurrency)} tokens`, "max_context"),
      row(`Largest concurrency at ${num(fit.max_model_len)} tokens`, `${num(fit.max_concurrency_at_context)} requests`, "max_concurrency"),
      fit.engine === "llamacpp"
        ? row("KV cache", `${gib(fit.gpus[0].kv_cache_bytes)} for ${fit.max_num_seqs} × ${num(fit.max_model_len)} tokens (llama.cpp allocates what it is given)`, "kv_tokens")
        : row("KV cache", `${num(fit.kv_cache_tokens)} tokens · ${(fit.kv_bytes_per_token / 1024).toFixed(0)} KiB per token`, "kv_tokens"),
      row("Weights", `${gib(fit.weights_bytes)} (${fit.weights_source === "estimate" ? "estimated from config" : "from the files"})`, "weights"));
    sugg.replaceChildren(...(fit.suggestions.length ? [el("p", { class: "muted" }, "What to change:"),
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
        if (mine === seq) renderProblems(panel, { message: "preflight did not answer: " + e });
        return;
      } finally { if (mine === seq) panel.classList.remove("pf-busy"); }
      if (mine !== seq) return;   // a newer request is on its way
      if (!res.ok) {
        latest = null;
        renderProblems(panel, data.error || { message: `HTTP ${res.status}` });
        panel.querySelector('[data-pf="state"]').textContent = "fix the form";
        panel.querySelector('[data-pf="state"]').className = "pf-state bad";
        return;
      }
      latest = data;
      form.dataset.preflightErrors = data.has_errors ? "1" : "0";
      renderProblems(panel, null);
      panel.querySelector('[data-pf="where"]').textContent = data.where ? `Checked against ${data.where} · ${data.runtime.name || data.runtime.engine}` : "";
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
