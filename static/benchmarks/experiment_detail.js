// One experiment: its curves, and while it runs, its progress and each step's
// status in place (websocket, backup poll); finished, the page is shown anew
// with the verdict.
(function () {
  KilnExperiment.draw(JSON.parse(document.getElementById("experiment-data").textContent));
  const badge = document.getElementById("experiment-status");
  const bar = document.getElementById("bar");
  if (!bar) return;  // finished when the page was rendered
  const id = Number(badge.dataset.experiment);
  const steps = (rows) => (rows || []).forEach((s) => {
    const row = document.querySelector(`tr[data-step="${s.id}"]`);
    if (!row) return;
    const status = row.querySelector(".step-status");
    status.textContent = s.status_label;
    status.className = `badge ${s.colour} step-status`;
    row.querySelector(".step-note").textContent = s.note || "";
  });
  Kiln.follow({
    type: "experiment", id, status: badge.dataset.status, url: `/benchmarks/experiments/${id}/progress`,
    interval: 3000, isFinal: (status) => ["succeeded", "failed", "cancelled"].includes(status), reloadDelay: 300,
    onUpdate: (row) => {
      const p = row.progress || {};
      bar.style.width = `${p.percent || 0}%`;
      document.getElementById("progress-text").textContent = `${p.current || ""} · ${p.done || 0}/${p.total || 0}`;
      if (row.status_label) badge.textContent = row.status_label;
      if (row.steps) steps(row.steps);
    },
  });
})();
