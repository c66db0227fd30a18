// The overview page: service health (Redis, workers, monitor heartbeat) and the
// operator's "run a worker check" button.
(function () {
  const set = (id, text, colour) => { const el = document.getElementById(id); el.textContent = text; el.className = "badge " + colour; };
  async function refresh() {
    try {
      const data = await Kiln.getJSON("/api/status?workers=1");
      const err = document.getElementById("svc-error");
      if (!data.redis.ok) { set("svc-redis", gettext("unreachable"), "red"); err.textContent = data.redis.error; err.hidden = false; return; }
      err.hidden = true;
      set("svc-redis", gettext("up"), "green");
      const workers = data.workers || [];
      set("svc-workers", workers.length ? workers.join(", ") : gettext("no worker answered"), workers.length ? "green" : "red");
      if (!data.monitors.length) set("svc-monitor", gettext("no heartbeat"), "red");
    } catch (e) { set("svc-redis", gettext("panel unreachable"), "red"); }
  }
  refresh(); setInterval(refresh, 10000);
  Kiln.live.on("heartbeat", (beat) => set("svc-monitor", interpolate(gettext("up on %(host)s · sample %(samples)s"), beat, true), "green"));
  const button = document.getElementById("worker-check");
  if (button) button.addEventListener("click", async () => {
    const out = document.getElementById("worker-check-result");
    out.textContent = gettext("queued…");
    const res = await Kiln.postJSON("/api/jobs/worker-check", {});
    let job = res.body.job;
    for (let i = 0; i < 40 && job && (job.status === "pending" || job.status === "running"); i++) {
      await new Promise(r => setTimeout(r, 250));
      job = (await Kiln.getJSON(`/api/jobs/${job.id}`)).job;
    }
    out.textContent = job.status === "succeeded" ? interpolate(gettext("job #%(id)s ran on %(worker)s"), job, true)
                                              : interpolate(gettext("job #%(id)s: %(status)s %(error)s"), { ...job, error: job.error || "" }, true);
  });

  // The demo engine's background build (a managed runtime install): its progress until it is done, then the page anew.
  const build = document.getElementById("demo-build");
  if (build) Kiln.follow({
    type: "runtime", id: Number(build.dataset.runtime), status: build.dataset.status,
    url: `/api/runtimes/${build.dataset.runtime}`, pick: (data) => data.runtime, interval: 3000,
    isFinal: (status) => ["installed", "failed"].includes(status), reloadDelay: 500,
    onUpdate: (m) => {
      if (m.status === undefined && m.install_status !== undefined) m.status = m.install_status;
      if (m.install_progress !== undefined) document.getElementById("demo-build-progress").value = m.install_progress;
      if (m.install_step) {
        const n = m.step_index ? interpolate(gettext("step %s of %s: "), [m.step_index, m.steps]) : "";
        document.getElementById("demo-build-step").textContent = n + m.install_step;
      }
      if (m.status_label) document.getElementById("demo-build-status").textContent = m.status_label;
    },
  });
})();
