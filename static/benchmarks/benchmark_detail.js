// One benchmark run: its charts, the operator's Cancel, and while it runs, its
// live progress (finished, the page is shown anew with the results).
(function () {
  const data = JSON.parse(document.getElementById("chart-data").textContent);
  if (document.getElementById("chart-throughput")) KilnBench.draw(data, null);
  const badge = document.getElementById("run-status");
  const runId = Number(badge.dataset.run);
  const cancel = document.getElementById("cancel");
  if (cancel) cancel.addEventListener("click", async () => {
    cancel.disabled = true;
    const res = await Kiln.postJSON(`/api/benchmarks/${runId}/cancel`);
    cancel.textContent = res.status === 202 ? gettext("Cancelling…") : ((res.body.error && res.body.error.message) || gettext("Not cancelled"));
  });
  const bar = document.getElementById("bar");
  if (!bar) return;   // finished when the page was rendered
  Kiln.follow({
    type: "benchmark", id: runId, status: badge.dataset.status,
    url: `/api/benchmarks/${runId}`, pick: (data) => data.run, interval: 2000,
    isFinal: (status) => ["succeeded", "failed", "cancelled"].includes(status), reloadDelay: 300,
    onUpdate: (run) => {
      const p = run.progress || {};
      bar.style.width = `${p.percent || 0}%`;
      document.getElementById("progress-text").textContent = p.total ? `${p.phase} ${p.completed + p.failed}/${p.total}` : (p.phase || "");
    },
  });
})();
