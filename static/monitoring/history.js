// Monitoring history: one chart per GPU and one of the deployments' tokens/s over
// the chosen range, from the series the server sends.
(function () {
  const config = { displayModeBar: false, responsive: true };
  const base = (extra) => Object.assign({ margin: { l: 44, r: 48, t: 6, b: 30 }, legend: { orientation: "h", y: 1.15 },
    xaxis: { type: "date" }, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)" }, extra);
  JSON.parse(document.getElementById("gpu-series").textContent).forEach((g) => {
    const memPct = g.memory_used_bytes.map((v) => v === null || !g.memory_total_bytes ? null : 100 * v / g.memory_total_bytes);
    Plotly.newPlot(`hist-gpu-${g.id}`, [
      { x: g.time, y: g.gpu_util_pct, name: gettext("GPU util %"), mode: "lines" },
      { x: g.time, y: memPct, name: gettext("memory used %"), mode: "lines" },
      { x: g.time, y: g.temperature_c, name: gettext("temperature °C"), mode: "lines" },
      { x: g.time, y: g.power_w, name: gettext("power W"), mode: "lines", yaxis: "y2" },
      { x: g.time, y: g.power_max_w, name: gettext("power peak W"), mode: "lines", yaxis: "y2", line: { dash: "dot" } },
    ], base({ yaxis: { range: [0, 105], title: { text: "%, °C" } },
              yaxis2: { overlaying: "y", side: "right", rangemode: "tozero", title: { text: "W" }, showgrid: false } }), config);
  });
  const engines = JSON.parse(document.getElementById("engine-series").textContent);
  if (engines.length) Plotly.newPlot("hist-engines", engines.map((e) => ({ x: e.time, y: e.generation_tokens_per_s, mode: "lines",
    name: `${e.name} (${e.engine})` })), base({ yaxis: { rangemode: "tozero", title: { text: "tok/s" } } }), config);
  // A preset range clears the custom dates, so the choice made last wins.
  document.getElementById("range").addEventListener("change", () => {
    document.getElementById("start").value = ""; document.getElementById("end").value = "";
    document.getElementById("range-form").submit();
  });
})();
