// The Runtimes page: an install (or uninstall) in progress updates in place from
// the "runtime" live messages, with a backup poll of /api/runtimes/<id>; when it
// ends the page reloads to show the detected version (or the row is gone).
(function () {
  const busy = ["queued", "installing", "uninstalling"];
  document.querySelectorAll("#runtimes tr[data-id]").forEach((row) => {
    const id = Number(row.dataset.id);
    const part = (role) => row.querySelector(`[data-role="${role}"]`);
    if (!part("status")) return;  // registered by hand: nothing to follow
    Kiln.follow({
      type: "runtime", id, status: row.dataset.status,
      url: `/api/runtimes/${id}`, pick: (data) => data.runtime, interval: 3000,
      pollWhile: (status) => busy.includes(status),
      isFinal: (status) => ["installed", "failed", "removed"].includes(status),
      reloadDelay: 300,
      onUpdate: (m) => {
        const status = m.status !== undefined ? m.status : m.install_status;
        if (status === undefined) return;
        m.status = status;
        if (m.status_label) { part("status").textContent = m.status_label; part("status").className = "badge " + m.colour; }
        else if (status === "installing") part("status").textContent = gettext("Installing");
        const bar = part("progress");
        if (bar && m.install_progress !== undefined) { bar.value = m.install_progress; bar.hidden = !busy.includes(status); }
        if (m.install_step !== undefined) {
          const n = m.step_index ? interpolate(gettext("step %s of %s: "), [m.step_index, m.steps]) : "";
          part("step").textContent = n + m.install_step;
        }
        const log = part("log");
        if (log && m.lines && m.lines.length) {
          const kept = (log.textContent + "\n" + m.lines.join("\n")).split("\n").slice(-40);
          log.textContent = kept.join("\n").trim();
          log.scrollTop = log.scrollHeight;
        } else if (log && m.install_log !== undefined) {
          log.textContent = m.install_log;
        }
        if (m.install_error) part("error").textContent = m.install_error;
      },
    });
  });
  // A link from preflight (?build=<key>) scrolls to and marks the build it names.
  const wanted = document.querySelector("#catalog tr.wanted");
  if (wanted) wanted.scrollIntoView({ block: "center" });
})();
