// One deployment's page: the live log tail, state, timeline and failure hint,
// the copy buttons. Stopped or failed, the page is shown anew (Launch again).
(function () {
  const badge = document.getElementById("status-badge");
  const id = Number(badge.dataset.deployment);
  const log = document.getElementById("log");
  // What the page already shows of the log (byte offsets), so live lines are not shown twice.
  let logOffset = Number(log.dataset.offset);
  const logEnds = JSON.parse(document.getElementById("log-ends").textContent);
  const count = () => { document.getElementById("log-count").textContent = log.textContent.split("\n").filter(Boolean).length + " " + gettext("lines"); };
  count(); log.scrollTop = log.scrollHeight;
  document.querySelectorAll("button[data-copy]").forEach((b) => b.addEventListener("click", async () => {
    const text = document.getElementById(b.dataset.copy).textContent;
    try { await navigator.clipboard.writeText(text); b.textContent = gettext("Copied"); }
    catch (e) { const r = document.createRange(); r.selectNodeContents(document.getElementById(b.dataset.copy));
                const s = getSelection(); s.removeAllRanges(); s.addRange(r); b.textContent = gettext("Selected: Ctrl-C"); }
    setTimeout(() => { b.textContent = gettext("Copy"); }, 1500);
  }));

  function appendLog(m) {   // only websocket messages carry log lines
    let lines = m.lines || [];
    if (m.log_to && m.log_to <= logOffset) lines = [];
    else if (m.log_from < logOffset) lines = lines.slice(logEnds.filter((e) => e > m.log_from).length);
    if (m.log_to > logOffset) logOffset = m.log_to;
    if (!lines.length) return;
    const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 20;
    log.textContent += lines.join("\n") + "\n";
    const all = log.textContent.split("\n"); if (all.length > 2000) log.textContent = all.slice(-2000).join("\n");
    if (atEnd) log.scrollTop = log.scrollHeight;
    count();
  }

  function apply(m) {
    appendLog(m);
    badge.textContent = m.status_label; badge.className = "badge " + m.colour; badge.dataset.status = m.status;
    document.getElementById("host-offline").hidden = m.status !== "unreachable";  // the host is back: its monitor speaks
    document.getElementById("phase").textContent = m.phase_label || m.phase || "";
    if (m.base_url) {
      const code = document.createElement("code");
      code.textContent = m.base_url + "/v1";
      document.getElementById("endpoint").replaceChildren(code);
    }
    const tl = document.getElementById("timeline");
    tl.replaceChildren(...(m.phases || []).map((p) => { const li = document.createElement("li"); li.className = p.phase; li.textContent = p.label || p.phase; return li; }));
    document.getElementById("failure").hidden = !(m.failure || m.hint);
    document.getElementById("failure-reason").textContent = m.failure || "";
    document.getElementById("failure-hint").textContent = m.hint || "";
    if (m.restarts !== undefined) document.getElementById("restarts").textContent = m.restarts;
    if (m.pid !== undefined) document.getElementById("pid").textContent = m.pid || "—";
    if (m.command) document.getElementById("command").textContent = m.command;
    if (m.started) document.getElementById("started").textContent = when(m.started);
    if (m.ready_at) document.getElementById("ready-at").textContent = when(m.ready_at);
    if (m.base_url) fillSnippets(m.base_url + "/v1");
  }

  // "2026-12-03T10:39:16.5+00:00" -> "2026-12-03 10:39:16", as the server renders it (UTC).
  const when = (iso) => iso.slice(0, 19).replace("T", " ");

  // Rendered before the engine had a port, the snippets say PORT: swap in the endpoint.
  function fillSnippets(endpoint) {
    document.querySelectorAll("pre.snippet[data-placeholder]").forEach((pre) => {
      const placeholder = pre.dataset.placeholder;
      if (!placeholder) return;
      pre.textContent = pre.textContent.split(placeholder).join(endpoint);
      pre.dataset.placeholder = "";
    });
  }

  // Status changes made by the launch/stop tasks (not the monitor) show up on the short poll.
  const followed = Kiln.follow({
    type: "deployment", id, status: badge.dataset.status,
    url: `/api/deployments/${id}`, pick: (data) => data.deployment, interval: 2000,
    pollWhile: (status) => ["pending", "starting", "stopping", "unreachable"].includes(status),
    isFinal: (status) => ["stopped", "failed"].includes(status), reloadDelay: 300,
    onUpdate: apply,
  });
  Kiln.onHostSilent(badge.dataset.host, followed.refresh);  // its host cut off: shown unreachable without a reload
})();
