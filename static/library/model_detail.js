// One model's page: the operator's actions, and the live progress of a download
// or re-verify. A finished job changes hashes, metadata and the report, so the
// page is shown anew when the row leaves the working states.
(function () {
  const badge = document.getElementById("status-badge");
  const id = Number(badge.dataset.model);
  document.querySelectorAll("button[data-action]").forEach((b) => b.addEventListener("click", async () => {
    const action = b.dataset.action;
    if (b.dataset.question && !confirm(b.dataset.question)) return;
    const res = await Kiln.postJSON(`/api/models/${id}/${action}`, {});
    if (res.status >= 400) { const e = document.getElementById("action-error"); e.textContent = res.body.error.message; e.hidden = false; return; }
    location.href = action === "delete" ? "/models/" : location.href;
  }));
  const working = ["downloading", "verifying", "queued"];
  Kiln.follow({
    type: "download", id, status: badge.dataset.status,
    url: `/api/models/${id}`, pick: (data) => data.model, interval: 3000,
    isFinal: (status) => !working.includes(status),
    onUpdate: (m) => {
      if (m.deleted) { location.href = "/models/"; return; }
      document.getElementById("detail-bar").style.width = m.percent + "%";
      document.getElementById("detail-progress").textContent = `${m.percent}%`;
    },
  });
})();
