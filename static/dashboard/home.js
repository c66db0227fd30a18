// The overview page: service health (Redis, workers, monitor heartbeat) and the
// operator's "run a worker check" button.
(function () {
  const set = (id, text, colour) => { const el = document.getElementById(id); el.textContent = text; el.className = "badge " + colour; };
  async function refresh() {
    try {
      const data = await Kiln.getJSON("/api/status?workers=1");
      const err = document.getElementById("svc-error");
      if (!data.redis.ok) { set("svc-redis", "unreachable", "red"); err.textContent = data.redis.error; err.hidden = false; return; }
      err.hidden = true;
      set("svc-redis", "up", "green");
      const workers = data.workers || [];
      set("svc-workers", workers.length ? workers.join(", ") : "no worker answered", workers.length ? "green" : "red");
      if (!data.monitors.length) set("svc-monitor", "no heartbeat", "red");
    } catch (e) { set("svc-redis", "panel unreachable", "red"); }
  }
  refresh(); setInterval(refresh, 10000);
  Kiln.live.on("heartbeat", (beat) => set("svc-monitor", `up on ${beat.host} · sample ${beat.samples}`, "green"));
  const button = document.getElementById("worker-check");
  if (button) button.addEventListener("click", async () => {
    const out = document.getElementById("worker-check-result");
    out.textContent = "queued…";
    const res = await Kiln.postJSON("/api/jobs/worker-check", {});
    let job = res.body.job;
    for (let i = 0; i < 40 && job && (job.status === "pending" || job.status === "running"); i++) {
      await new Promise(r => setTimeout(r, 250));
      job = (await Kiln.getJSON(`/api/jobs/${job.id}`)).job;
    }
    out.textContent = job.status === "succeeded" ? `job #${job.id} ran on ${job.worker}` : `job #${job.id}: ${job.status} ${job.error || ""}`;
  });
})();
