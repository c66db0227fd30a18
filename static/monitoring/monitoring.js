// The live monitoring page: listens to the "monitor" messages the monitor
// process publishes once per sample, builds one card per GPU on first sight,
// and extends its Plotly charts in place (a bounded window of points).
(function () {
  const WINDOW = 300;  // points kept per chart: 5 minutes at 1 Hz
  const GiB = 1024 ** 3;
  const cards = {};  // key -> {el, load, power}
  const engineTraces = {};  // deployment id -> trace index in the engines chart
  const xidSeen = {};  // "host/index" -> [descriptions]
  const CHART_CONFIG = { displayModeBar: false, responsive: true };
  const resizer = new ResizeObserver((entries) => entries.forEach((e) => { if (e.target.data) Plotly.Plots.resize(e.target); }));

  const na = (v) => v === null || v === undefined || Number.isNaN(v);
  const NA = gettext("n/a");
  // Numbers in the page's language (grouping and decimal sign), a fixed number of digits.
  const fmt = (v, digits) => Number(v).toLocaleString(document.documentElement.lang, { minimumFractionDigits: digits, maximumFractionDigits: digits });
  const num = (v, digits = 0, unit = "") => na(v) ? NA : `${fmt(v, digits)}${unit}`;
  const fill = (format, values) => interpolate(format, values, true);
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  const safeId = (s) => String(s).replace(/[^a-zA-Z0-9_-]/g, "_");

  function layout(extra) {
    return Object.assign({
      margin: { l: 40, r: 44, t: 6, b: 26 }, showlegend: true,
      legend: { orientation: "h", y: 1.18, x: 0, font: { size: 11 } },
      xaxis: { type: "date", tickfont: { size: 10 }, nticks: 5 }, yaxis: { tickfont: { size: 10 } },
      font: { family: "system-ui, sans-serif", size: 11 }, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    }, extra);
  }

  // Xid rows rendered by the server (last 24 h) mark their GPU card too.
  document.querySelectorAll("#xid-table tr.xid-row").forEach((row) => {
    if (Date.now() / 1000 - Number(row.dataset.time) > 86400) return;
    const key = `${row.dataset.host}/${row.dataset.gpu}`;
    (xidSeen[key] = xidSeen[key] || []).push(row.cells[3].textContent);
  });

  function card(host, gpu) {
    const key = `${host}/${gpu.index}`;
    if (cards[key]) return cards[key];
    const id = safeId(`gpu-${host}-${gpu.index}`);
    const el = document.createElement("section");
    el.className = "card gpu-card";
    el.id = id;
    el.dataset.key = key;
    el.innerHTML = `<h2>GPU ${gpu.index} · ${esc(gpu.name || gettext("unknown GPU"))} <span class="muted">${esc(host)} · ${esc(gpu.uuid || "")}</span></h2>
      <div class="badges"></div><dl class="facts"></dl><div class="procs"></div>
      <div class="chart" id="${id}-load"></div><div class="chart" id="${id}-power"></div>`;
    document.getElementById("gpus").appendChild(el);
    const load = document.getElementById(`${id}-load`), power = document.getElementById(`${id}-power`);
    Plotly.newPlot(load, [
      { x: [], y: [], name: gettext("GPU util %"), mode: "lines", line: { color: "#c2410c" } },
      { x: [], y: [], name: gettext("memory used %"), mode: "lines", line: { color: "#1d4ed8" } },
      { x: [], y: [], name: gettext("temperature °C"), mode: "lines", line: { color: "#b91c1c", dash: "dot" } },
    ], layout({ yaxis: { range: [0, 105], tickfont: { size: 10 } } }), CHART_CONFIG);
    Plotly.newPlot(power, [
      { x: [], y: [], name: gettext("power W"), mode: "lines", line: { color: "#15803d" } },
      { x: [], y: [], name: gettext("tokens/s (deployments on this GPU)"), mode: "lines", yaxis: "y2", line: { color: "#7c3aed" } },
    ], layout({ yaxis: { rangemode: "tozero", tickfont: { size: 10 } },
                yaxis2: { overlaying: "y", side: "right", rangemode: "tozero", tickfont: { size: 10 }, showgrid: false } }),
    CHART_CONFIG);
    // A new card narrows the others in the grid: Plotly only follows window
    // resizes by itself, so follow each chart's own box.
    [load, power].forEach((div) => resizer.observe(div));
    return (cards[key] = { el, load, power, key });
  }

  function badges(g, key) {
    const out = [];
    if (g.slowed_down) out.push(["amber", fill(gettext("Throttled: %(reasons)s"), { reasons: (g.clocks_event_reasons || []).filter((r) => r !== "idle").join(", ") })]);
    if (g.pcie_downgraded) out.push(["red", fill(gettext("PCIe downgraded: %(now)s of %(max)s"), {
      now: `Gen${num(g.pcie_gen)} x${num(g.pcie_width)}`, max: `Gen${num(g.pcie_gen_max)} x${num(g.pcie_width_max)}` })]);
    const eccBad = (g.ecc_uncorrected_volatile > 0) || (g.retired_pages_dbe > 0) || g.retired_pages_pending ||
      g.remapped_rows_pending || g.remapped_rows_failure || (g.remapped_rows_uncorrectable > 0);
    if (eccBad) out.push(["red", fill(gettext("ECC: %(count)s uncorrected"), { count: num(g.ecc_uncorrected_volatile) }) +
      (g.retired_pages_pending || g.remapped_rows_pending ? gettext(", retirement pending (reset the GPU)") : "") +
      (g.remapped_rows_failure ? gettext(", row remapping FAILED") : "")]);
    else if (g.ecc_corrected_volatile > 0) out.push(["amber", fill(gettext("ECC: %(count)s corrected"), { count: num(g.ecc_corrected_volatile) })]);
    (xidSeen[key] || []).slice(-3).forEach((d) => out.push(["red", d]));
    if (!out.length) out.push(["green", gettext("healthy")]);
    return out.map(([c, t]) => `<span class="badge ${c}" title="${esc(t)}">${esc(t)}</span>`).join("");
  }

  // The facts' labels in the page's language; the English key stays in data-field.
  const LABELS = {
    "Utilization": gettext("Utilization"), "Memory": gettext("Memory"), "Temperature": gettext("Temperature"),
    "Power": gettext("Power"), "Energy": gettext("Energy"), "P-state": gettext("P-state"), "SM clock": gettext("SM clock"),
    "Mem clock": gettext("Mem clock"), "Fan": gettext("Fan"), "PCIe link": gettext("PCIe link"),
    "PCIe TX/RX": gettext("PCIe TX/RX"), "Clocks events": gettext("Clocks events"), "ECC (volatile)": gettext("ECC (volatile)"),
    "Retired pages": gettext("Retired pages"), "Remapped rows": gettext("Remapped rows"),
  };

  function facts(g) {
    const memPct = na(g.memory_used_bytes) || !g.memory_total_bytes ? null : 100 * g.memory_used_bytes / g.memory_total_bytes;
    // [key (data-field, stable for tests and scripts), label shown, value]
    const rows = [
      ["Utilization", `${num(g.gpu_util_pct, 0, " %")} · ${gettext("mem bus")} ${num(g.mem_util_pct, 0, " %")}`],
      ["Memory", `${num(g.memory_used_bytes / GiB, 1)} / ${num(g.memory_total_bytes / GiB, 1)} GiB (${num(memPct, 0, " %")})`],
      ["Temperature", num(g.temperature_c, 0, " °C")],
      ["Power", `${num(g.power_w, 0)} / ${num(g.power_limit_w, 0)} W`],
      ["Energy", na(g.energy_j) ? NA : g.energy_j >= 3.6e6 ? `${(g.energy_j / 3.6e6).toFixed(2)} kWh` : `${(g.energy_j / 3600).toFixed(1)} Wh`],
      ["P-state", na(g.performance_state) ? NA : `P${g.performance_state}`],
      ["SM clock", `${num(g.sm_clock_mhz)} / ${num(g.sm_clock_max_mhz)} MHz`],
      ["Mem clock", `${num(g.mem_clock_mhz)} / ${num(g.mem_clock_max_mhz)} MHz`],
      ["Fan", num(g.fan_pct, 0, " %")],
      ["PCIe link", `Gen${num(g.pcie_gen)} x${num(g.pcie_width)} / Gen${num(g.pcie_gen_max)} x${num(g.pcie_width_max)}`],
      ["PCIe TX/RX", `${num(g.pcie_tx_bytes_per_s / 1e6, 1)} / ${num(g.pcie_rx_bytes_per_s / 1e6, 1)} MB/s`],
      ["Clocks events", na(g.clocks_event_reasons) ? NA : (g.clocks_event_reasons.join(", ") || gettext("none"))],
      ["ECC (volatile)", fill(gettext("%(corrected)s corr. / %(uncorrected)s uncorr."), { corrected: num(g.ecc_corrected_volatile), uncorrected: num(g.ecc_uncorrected_volatile) })],
      ["Retired pages", `${num(g.retired_pages_sbe)} SBE / ${num(g.retired_pages_dbe)} DBE` + (g.retired_pages_pending ? gettext(" (pending)") : "")],
      ["Remapped rows", fill(gettext("%(corrected)s corr. / %(uncorrected)s uncorr."), { corrected: num(g.remapped_rows_correctable), uncorrected: num(g.remapped_rows_uncorrectable) })],
    ];
    return rows.map(([k, v]) => `<div><dt>${esc(LABELS[k] || k)}</dt><dd data-field="${k}">${esc(v)}</dd></div>`).join("");
  }

  function processes(g) {
    if (g.processes === null || g.processes === undefined) return esc(fill(gettext("Processes: %(list)s"), { list: NA }));
    if (!g.processes.length) return esc(gettext("No compute processes."));
    return esc(gettext("Processes: ")) + g.processes.map((p) => `PID ${p.pid} (${num(p.used_memory_bytes / GiB, 1)} GiB)` +
      (p.deployment ? ` → ${esc(p.deployment.name)}` : "")).join(", ");
  }

  function gpuTokens(g, tokensByDeployment) {
    let total = null;
    (g.processes || []).forEach((p) => {
      const v = p.deployment ? tokensByDeployment[p.deployment.id] : undefined;
      if (!na(v)) total = (total || 0) + v;
    });
    return total;
  }

  // llama.cpp counts a request's tokens when it ends: its rate is averaged over a window.
  const averaged = (e) => interpolate(gettext("averaged over %(s)s s"), { s: e.rate_window_s }, true);

  function updateEngines(msg, when) {
    const engines = msg.engines || [];
    const table = document.getElementById("engines-table");
    document.getElementById("engines-empty").hidden = engines.length > 0;
    table.hidden = engines.length === 0;
    const pct = (v) => na(v) ? NA : `${fmt(100 * v, 1)} %`;
    table.querySelector("tbody").innerHTML = engines.map((e) => `<tr data-deployment="${e.deployment_id}">
      <td>${esc(e.name || e.deployment_id)}</td>
      <td>${esc(e.engine || "?")}${e.problem ? ` <span class="error">${esc(e.problem)}</span>` : ""}</td>
      <td class="gen-tps"${e.rate_window_s ? ` title="${esc(averaged(e))}"` : ""}>${num(e.generation_tokens_per_s, 1)}${e.rate_window_s ? ` <span class="muted small">${esc(interpolate(gettext("(%(s)s s avg)"), { s: e.rate_window_s }, true))}</span>` : ""}</td><td>${num(e.prompt_tokens_per_s, 1)}</td>
      <td>${num(e.requests_running)}</td><td>${num(e.requests_waiting)}</td><td>${pct(e.kv_cache_usage)}</td>
      <td>${pct(e.prefix_cache_hit_rate)}</td><td>${num(e.preemptions_total)}</td><td>${pct(e.spec_decode_acceptance_rate)}</td></tr>`).join("");
    const chart = document.getElementById("engines-chart");
    chart.hidden = engines.length === 0;
    if (!engines.length) return;
    if (!chart.data) {
      Plotly.newPlot(chart, [], layout({ yaxis: { rangemode: "tozero", title: { text: gettext("generation tok/s") } } }), CHART_CONFIG);
      resizer.observe(chart);
    }
    const fresh = engines.filter((e) => engineTraces[e.deployment_id] === undefined);
    if (fresh.length) {
      fresh.forEach((e, i) => { engineTraces[e.deployment_id] = chart.data.length + i; });
      Plotly.addTraces(chart, fresh.map((e) => ({ x: [], y: [], mode: "lines",
        name: `${e.name || e.deployment_id} (${e.engine || "?"})` + (e.rate_window_s ? " · " + averaged(e) : "") })));
    }
    Plotly.extendTraces(chart, { x: engines.map(() => [when]), y: engines.map((e) => [na(e.generation_tokens_per_s) ? null : e.generation_tokens_per_s]) },
      engines.map((e) => engineTraces[e.deployment_id]), WINDOW);
  }

  function addXids(msg) {
    if (msg.xid_problem) { const p = document.getElementById("xid-problem"); p.textContent = msg.xid_problem; p.hidden = false; }
    if (!msg.xids || !msg.xids.length) return;
    const body = document.querySelector("#xid-table tbody");
    msg.xids.forEach((x) => {
      const key = `${msg.host}/${x.gpu_index}`;
      (xidSeen[key] = xidSeen[key] || []).push(x.description);
      const tr = document.createElement("tr");
      tr.className = "xid-row";
      tr.innerHTML = `<td>${new Date(x.time * 1000).toLocaleString(document.documentElement.lang)}</td><td>${esc(msg.host)}</td><td>${na(x.gpu_index) ? "?" : x.gpu_index}</td><td>${esc(x.description)}</td>`;
      body.prepend(tr);
    });
    document.getElementById("xid-table").hidden = false;
    document.getElementById("xid-none").hidden = true;
  }

  Kiln.live.on("monitor", (msg) => {
    const when = new Date(msg.time * 1000);
    document.getElementById("monitor-line").textContent =
      fill(gettext("Monitor on %(host)s: sample %(seq)s, every %(interval)s s"), { host: msg.host, seq: msg.seq, interval: msg.interval }) + ` · ${msg.nvml.message}`;
    const noGpu = document.getElementById("no-gpu");
    if (!msg.nvml.ok) {
      noGpu.hidden = false;
      document.getElementById("no-gpu-reason").textContent = `${msg.host}: ${msg.nvml.message}`;
    } else {
      noGpu.hidden = true;
    }
    addXids(msg);
    const tokens = {};
    (msg.engines || []).forEach((e) => { tokens[e.deployment_id] = e.generation_tokens_per_s; });
    (msg.gpus || []).forEach((g) => {
      const c = card(msg.host, g);
      c.el.querySelector(".badges").innerHTML = badges(g, c.key);
      c.el.querySelector(".facts").innerHTML = facts(g);
      c.el.querySelector(".procs").innerHTML = processes(g);
      const memPct = na(g.memory_used_bytes) || !g.memory_total_bytes ? null : 100 * g.memory_used_bytes / g.memory_total_bytes;
      Plotly.extendTraces(c.load, { x: [[when], [when], [when]], y: [[g.gpu_util_pct], [memPct], [g.temperature_c]] }, [0, 1, 2], WINDOW);
      Plotly.extendTraces(c.power, { x: [[when], [when]], y: [[g.power_w], [gpuTokens(g, tokens)]] }, [0, 1], WINDOW);
    });
    updateEngines(msg, when);
  });
})();
