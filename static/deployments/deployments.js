// The Deployments page: each row's status and phase follow the live messages;
// a row still on its way (pending, starting, stopping) is also polled, in case a
// message went by before this tab's websocket connected.
(function () {
  document.querySelectorAll("#deployments tr[data-id]").forEach((row) => {
    const id = Number(row.dataset.id);
    const badge = row.querySelector('[data-role="status"]');
    const followed = Kiln.follow({
      type: "deployment", id, status: row.dataset.status,
      url: `/api/deployments/${id}`, pick: (data) => data.deployment, interval: 5000,
      pollWhile: (status) => ["pending", "starting", "stopping", "unreachable"].includes(status),
      onUpdate: (m) => {
        badge.textContent = m.status_label; badge.className = "badge " + m.colour;
        row.querySelector('[data-role="phase"]').textContent = m.phase_label || m.phase;
      },
    });
    Kiln.onHostSilent(row.dataset.host, followed.refresh);  // shown unreachable without a reload
  });
})();
