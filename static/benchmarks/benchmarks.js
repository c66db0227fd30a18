// The Benchmarks page: start a run, cancel one, pick runs to compare, and the
// live progress of the runs still going (a finished run's row is rendered anew).
(function () {
  const scenarios = JSON.parse(document.getElementById("scenarios-data").textContent);
  const select = document.getElementById("scenario-select");
  function describe() {
    if (!select) return;
    const s = scenarios.find((x) => x.name === select.value);
    document.getElementById("scenario-description").textContent = s ? `${s.description} (${s.num_prompts} prompts of ${s.prompt_tokens} tokens, ${s.output_tokens} out${s.sweep.length ? ", concurrency " + s.sweep.join("/") : ", concurrency " + s.concurrency})` : "";
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
      document.getElementById("start-error").textContent = (res.body.error && res.body.error.message) || `Not started (HTTP ${res.status}).`;
      return;
    }
    location.reload();
  });

  document.querySelectorAll("button.cancel").forEach((b) => b.addEventListener("click", async () => {
    b.disabled = true;
    const res = await Kiln.postJSON(`/api/benchmarks/${b.dataset.run}/cancel`);
    if (res.status !== 202) { alert((res.body.error && res.body.error.message) || "Not cancelled."); b.disabled = false; }
    else b.textContent = "Cancelling…";
  }));

  const picks = () => [...document.querySelectorAll("input.pick:checked")].map((c) => c.value);
  const compareButton = document.getElementById("compare-selected");
  document.querySelectorAll("input.pick").forEach((c) => c.addEventListener("change", () => { compareButton.disabled = picks().length < 2; }));
  compareButton.addEventListener("click", () => { location.href = `/benchmarks/compare?ids=${picks().map(Number).sort((a, b) => a - b).join(",")}`; });

  // Live progress: the worker publishes each run's row; a slow poll covers a dropped socket.
  const finished = ["succeeded", "failed", "cancelled"];
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
        badge.textContent = run.status.charAt(0).toUpperCase() + run.status.slice(1);
        const p = run.progress || {};
        bar.style.width = `${p.percent || 0}%`;
        if (text) text.textContent = p.total ? `${p.phase} ${p.completed + p.failed}/${p.total}` + (p.steps > 1 ? ` · step ${p.step + 1}/${p.steps} (c=${p.concurrency})` : "") : (p.phase || "");
      },
    });
  });
})();
