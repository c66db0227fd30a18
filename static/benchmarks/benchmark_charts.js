// Plotly charts of benchmark runs. The server sends plain series
// (inference.benchmarks.services.chart_data); this file only draws them.
window.KilnBench = (function () {
  const layout = (x, y, extra) => Object.assign({
    margin: { l: 60, r: 16, t: 10, b: 50 }, xaxis: { title: { text: x } }, yaxis: { title: { text: y } },
    legend: { orientation: "h", y: -0.25 }, font: { size: 12 },
  }, extra || {});
  const config = { displaylogo: false, responsive: true };

  function throughput(series) {
    const traces = series.map((s) => ({
      name: s.name, mode: "lines+markers", type: "scatter",
      x: s.concurrency.map((c, i) => (c == null ? i + 1 : c)), y: s.output_throughput,
    }));
    // Ticks only at the measured levels (a single run at concurrency 1 must not show 0.5 and 1.5).
    const levels = [...new Set(traces.flatMap((t) => t.x))].sort((a, b) => a - b);
    const wide = levels.length > 2 && levels[0] > 0 && levels[levels.length - 1] / levels[0] >= 8;
    const axis = { title: { text: gettext("concurrency") }, tickvals: levels, ticktext: levels.map(String),
                   type: wide ? "log" : "linear", range: wide ? undefined : [0, Math.max(...levels) * 1.15] };
    const ymax = Math.max(0, ...traces.flatMap((t) => t.y.filter((v) => v !== null && v !== undefined)));
    Plotly.newPlot("chart-throughput", traces, layout(gettext("concurrency"), gettext("output tokens/s"),
      { xaxis: axis, yaxis: { title: { text: gettext("output tokens/s") }, range: [0, ymax * 1.15 || 1] } }), config);
  }

  function ttft(series) {
    const traces = [];
    series.forEach((s) => {
      if (s.request_points.length) traces.push({
        name: interpolate(gettext("%(name)s (requests)"), { name: s.name }, true), mode: "markers", type: "scatter", opacity: 0.5, marker: { size: 6 },
        x: s.request_points.map((p) => p[0]), y: s.request_points.map((p) => p[1]),
      });
      traces.push({ name: interpolate(gettext("%(name)s (mean)"), { name: s.name }, true), mode: "markers", type: "scatter", marker: { size: 12, symbol: "diamond" },
        x: s.prompt_len, y: s.mean_ttft_ms });
    });
    Plotly.newPlot("chart-ttft", traces, layout(gettext("prompt tokens"), gettext("TTFT ms")), config);
  }

  function percentiles(series) {
    const labels = [], keys = [];
    ["ttft", "tpot", "itl", "e2el"].forEach((m) => ["p50", "p90", "p99"].forEach((p) => { labels.push(`${m.toUpperCase()} ${p}`); keys.push([m, p]); }));
    const traces = series.map((s) => ({ name: s.name, type: "bar", x: labels, y: keys.map(([m, p]) => s.percentiles[m][p]) }));
    const logMs = gettext("ms (log)");
    Plotly.newPlot("chart-percentiles", traces, layout("", logMs, { barmode: "group", yaxis: { type: "log", title: { text: logMs } } }), config);
  }

  function roofline(series, rooflines) {
    const names = series.map((s) => s.name);
    const traces = [
      { name: gettext("measured decode tok/s at batch 1"), type: "bar", x: names, y: rooflines.map((r) => r.measured) },
      { name: gettext("memory-bandwidth limit (weight bytes ÷ bandwidth)"), type: "scatter", mode: "lines+markers",
        line: { dash: "dash", color: "#b91c1c" }, x: names, y: rooflines.map((r) => r.limit) },
    ];
    Plotly.newPlot("chart-roofline", traces, layout("", gettext("tokens/s")), config);
  }

  function draw(data, rooflines) {
    const series = data.series || [];
    if (document.getElementById("chart-throughput")) throughput(series);
    if (document.getElementById("chart-ttft")) ttft(series);
    if (document.getElementById("chart-percentiles")) percentiles(series);
    if (rooflines && document.getElementById("chart-roofline")) roofline(series, rooflines);
  }
  return { draw };
})();
