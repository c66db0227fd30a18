// The Benchmarks page: start a run, cancel one, pick runs to compare, and the
// live progress of the runs still going (a finished run's row is rendered anew).
(function () {
  const scenarios = JSON.parse(document.getElementById("scenarios-data").textContent);
  const select = document.getElementById("scenario-select");
  function describe() {
    if (!select) return;
    const s = scenarios.find((x) => x.name === select.value);
    document.getElementById("scenario-description").textContent = s ? `${s.description} (` + interpolate(gettext("%(prompts)s prompts of %(prompt_tokens)s tokens, %(output_tokens)s out, concurrency %(concurrency)s"),
      { prompts: s.num_prompts, prompt_tokens: s.prompt_tokens, output_tokens: s.output_tokens, concurrency: s.sweep.length ? s.sweep.join("/") : s.concurrency }, true) + ")" : "";
  }
  if (select) { select.addEventListener("change", describe); describe(); }

  const form = document.getElementById("new-run-form");
  if (form) form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const body = {};
    new FormData(form).forEach((v, k) => { if (v !== "") body[k] = v; });
    document.getElementById("start-error").textContent = "";
    const res = await Kiln.postJSON("/api/benchmarks/", body);
    if (res.status !== 202) {
      document.getElementById("start-error").textContent = (res.body.error && res.body.error.message) || interpolate(gettext("Not started (HTTP %(status)s)."), { status: res.status }, true);
      return;
    }
    location.reload();
  });

  document.querySelectorAll("button.cancel").forEach((b) => b.addEventListener("click", async () => {
    b.disabled = true;
    const res = await Kiln.postJSON(`/api/benchmarks/${b.dataset.run}/cancel`);
    if (res.status !== 202) { alert((res.body.error && res.body.error.message) || gettext("Not cancelled.")); b.disabled = false; }
    else b.textContent = gettext("Cancelling…");
  }));

  const picks = () => [...document.querySelectorAll("input.pick:checked")].map((c) => c.value);
  const compareButton = document.getElementById("compare-selected");
  document.querySelectorAll("input.pick").forEach((c) => c.addEventListener("change", () => { compareButton.disabled = picks().length < 2; }));
  compareButton.addEventListener("click", () => { location.href = `/benchmarks/compare?ids=${picks().map(Number).sort((a, b) => a - b).join(",")}`; });

  // Live progress: the worker publishes each run's row; a slow poll covers a dropped socket.
  const finished = ["succeeded", "failed", "cancelled"];
  const STATUS = { queued: gettext("Queued"), running: gettext("Running"), succeeded: gettext("Succeeded"),
                   failed: gettext("Failed"), cancelled: gettext("Cancelled") };
  document.querySelectorAll("tr[data-run]").forEach((row) => {
    const bar = row.querySelector(".progress > div");
    if (!bar) return;   // finished when the page was rendered
    const text = row.querySelector(".progress-text");
    const badge = row.querySelector(".badge");
    Kiln.follow({
      type: "benchmark", id: Number(row.dataset.run), status: row.dataset.status,
      url: `/api/benchmarks/${row.dataset.run}`, pick: (data) => data.run, interval: 2000,
      isFinal: (status) => finished.includes(status), reloadDelay: 300,
      onUpdate: (run) => {
        badge.className = `badge ${run.colour}`;
        badge.textContent = STATUS[run.status] || run.status;
        const p = run.progress || {};
        bar.style.width = `${p.percent || 0}%`;
        if (text) text.textContent = p.total ? `${p.phase} ${p.completed + p.failed}/${p.total}` + (p.steps > 1 ? " · " + interpolate(gettext("step %(step)s/%(steps)s (c=%(concurrency)s)"), { step: p.step + 1, steps: p.steps, concurrency: p.concurrency }, true) : "") : (p.phase || "");
      },
    });
  });
})();
