// A batch's page: the progress card follows the batch live (websocket, with a
// backup poll of /batches/<id>/progress) and reloads once it ends or pauses.
(function () {
  const card = document.getElementById("batch-progress");
  if (!card) return;
  const bar = document.getElementById("batch-bar");
  const set = (id, text) => { const el = document.getElementById(id); if (el) el.textContent = text; };
  // Counts in the page's language (12,345), as the server-rendered page writes them.
  const num = (n, digits = 0) => Number(n).toLocaleString(document.documentElement.lang, { maximumFractionDigits: digits });
  const STATUS = {
    validating: gettext("validating"), in_progress: gettext("in progress"), paused: gettext("paused"),
    finalizing: gettext("finalizing"), completed: gettext("completed"), failed: gettext("failed"),
    expired: gettext("expired"), cancelling: gettext("cancelling"), cancelled: gettext("cancelled"),
  };
  bar.style.width = bar.dataset.percent + "%";
  const final = (s) => ["completed", "failed", "expired", "cancelled"].includes(s);
  let status = card.dataset.status;
  function update(p) {
      bar.style.width = p.percent + "%";
      set("batch-status", STATUS[p.status] || p.status);
      set("batch-done", num(p.completed));
      set("batch-failed", num(p.failed));
      set("batch-remaining", num(p.remaining));
      set("batch-tokens", num(p.prompt_tokens) + " + " + num(p.completion_tokens));
      set("batch-rate", p.rate ? interpolate(gettext("%s/s"), [num(p.rate, 2)]) : "—");
      set("batch-eta", p.eta_s !== null && p.eta_s !== undefined ? interpolate(gettext("%s s"), [num(p.eta_s)]) : "—");
      const reason = document.getElementById("batch-reason");
      reason.textContent = p.reason || "";
      reason.hidden = !p.reason;
  }
  // Batch ids are strings ("batch_..."), so the websocket messages are matched here
  // and Kiln.follow keeps the backup poll (it ends the page with a reload when the batch ends).
  Kiln.live.on("batch", (msg) => {
    if (msg.id !== card.dataset.id) return;
    update(msg);
    if (msg.status !== status && final(msg.status)) setTimeout(() => location.reload(), 500);
    status = msg.status;
  });
  Kiln.follow({
    type: "batch-poll", url: card.dataset.url, id: 0, status: status, interval: 2000, reloadDelay: 500,
    isFinal: final, pick: (data) => Object.assign({}, data, { id: 0 }), onUpdate: update,
  });
})();
