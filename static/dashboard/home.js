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

  // The demo engine's background build: its progress until it is done, then the page anew.
  const build = document.getElementById("demo-build");
  if (build) Kiln.follow({
    type: "job", id: Number(build.dataset.job), status: build.dataset.status,
    url: `/api/jobs/${build.dataset.job}`, pick: (data) => data.job, interval: 3000,
    isFinal: (status) => ["succeeded", "failed"].includes(status), reloadDelay: 500,
    onUpdate: (job) => {
      const result = job.result || {};
      if (result.percent !== undefined) document.getElementById("demo-build-progress").value = result.percent;
      if (result.step) document.getElementById("demo-build-step").textContent = result.step;
      if (job.status_label) document.getElementById("demo-build-status").textContent = job.status_label;
    },
  });
})();
