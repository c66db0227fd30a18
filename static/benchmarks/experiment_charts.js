// Curves of an experiment, one set per workload: throughput and per-stream
// decode speed vs concurrency (mean with its 95% interval, one line per
// configuration, the saturation point and the SLO marked), TTFT vs prompt
// length, and the latency–throughput Pareto front. The server computes every
// number (inference/benchmarks/verdict.py: curves); this file only draws.
// The exported HTML report inlines this same file.
window.KilnExperiment = (function () {
  const config = { displaylogo: false, responsive: true };
  // The exported report has no JavaScript catalogue: English then.
  const T = (text) => (window.gettext ? window.gettext(text) : text);
  const fill = (text, values) => (window.interpolate ? window.interpolate(text, values, true)
    : text.replace(/%\((\w+)\)s/g, (_, k) => values[k]));
  if (!window.gettext) window.gettext = (text) => text;

  function axis(title, values) {
    // Ticks only where something was measured: never "0.5 concurrency".
    const xs = [...new Set(values.filter((v) => v !== null && v !== undefined))].sort((a, b) => a - b);
    const spread = xs.length > 2 && xs[0] > 0 && xs[xs.length - 1] / xs[0] >= 8;
    return { title: { text: title }, type: spread ? "log" : "linear", tickvals: xs, ticktext: xs.map(String),
             rangemode: spread ? undefined : "tozero" };
  }

  function layout(xaxis, ytitle, extra) {
    return Object.assign({ margin: { l: 64, r: 16, t: 10, b: 50 }, xaxis, yaxis: { title: { text: ytitle }, rangemode: "tozero" },
      legend: { orientation: "h", y: -0.3 }, font: { size: 12 }, hovermode: "closest" }, extra || {});
  }

  const mean = (p, key) => (p[key] ? p[key].mean : null);
  const err = (p, key) => (p[key] && p[key].low !== null ? p[key].high - p[key].mean : null);
  const runs = (p) => (p.run_ids || []).filter(Boolean).map((id) => "#" + id).join(", ");

  function lines(series, xKey, yKey, keep) {
    return series.map((s) => {
      const pts = s.points.filter((p) => p[xKey] !== null && p[xKey] !== undefined && mean(p, yKey) !== null && keep(p));
      return {
        name: s.label, type: "scatter", mode: "lines+markers", x: pts.map((p) => p[xKey]), y: pts.map((p) => mean(p, yKey)),
        error_y: { type: "data", array: pts.map((p) => err(p, yKey)), visible: true },
        customdata: pts.map((p) => [runs(p), err(p, yKey) === null ? "–" : err(p, yKey).toFixed(1)]),
        hovertemplate: `${T(xKey === "concurrency" ? "concurrency" : "prompt tokens")} %{x}<br>%{y:.1f} ± %{customdata[1]} (95% CI)<br>`
          + `${gettext("runs")} %{customdata[0]}<extra>%{fullData.name}</extra>`,
      };
    });
  }

  const firstPrompt = (series) => {
    const lengths = series.flatMap((s) => s.points.map((p) => p.prompt_tokens)).filter((v) => v);
    return lengths.length ? Math.min(...lengths) : null;
  };

  function marks(series, key, label) {
    const shapes = [], notes = [];
    series.forEach((s) => {
      if (s[key] === null || s[key] === undefined) return;
      shapes.push({ type: "line", xref: "x", yref: "paper", x0: s[key], x1: s[key], y0: 0, y1: 1,
                    line: { dash: "dot", width: 1.5, color: "#6b7280" } });
      notes.push({ xref: "x", yref: "paper", x: s[key], y: 1, yanchor: "bottom", showarrow: false,
                   text: fill(label, { name: s.label, c: s[key] }), font: { size: 11 } });
    });
    return { shapes, annotations: notes };
  }

  function drawWorkload(index, workload) {
    const series = workload.curves.series || [];
    const slo = workload.curves.slo_decode_tok_s;
    const p0 = firstPrompt(series);
    const atFirstPrompt = (p) => p.prompt_tokens === null || p.prompt_tokens === p0;
    const concurrency = series.flatMap((s) => s.points.map((p) => p.concurrency));
    const prompts = series.flatMap((s) => s.points.map((p) => p.prompt_tokens));
    const el = (name) => document.getElementById(`exp-chart-${index}-${name}`);
    if (el("throughput")) {
      Plotly.newPlot(el("throughput"), lines(series, "concurrency", "output_throughput", atFirstPrompt),
        layout(axis(gettext("concurrency"), concurrency), gettext("output tokens/s"),
               marks(series, "saturation_concurrency", gettext("%(name)s stops growing at %(c)s"))), config);
    }
    if (el("decode")) {
      const traces = lines(series, "concurrency", "median_decode_tokens_per_s_per_stream", atFirstPrompt);
      const extra = marks(series, "slo_concurrency", gettext("%(name)s meets the SLO up to %(c)s"));
      if (slo) extra.shapes.push({ type: "line", xref: "paper", x0: 0, x1: 1, y0: slo, y1: slo, line: { dash: "dash", color: "#b91c1c" } });
      Plotly.newPlot(el("decode"), traces, layout(axis(gettext("concurrency"), concurrency), gettext("per-stream decode tokens/s"), extra), config);
    }
    if (el("ttft")) {
      const sweptPrompts = new Set(prompts.filter((v) => v)).size > 1;
      if (!sweptPrompts) el("ttft").closest(".card").hidden = true;
      else Plotly.newPlot(el("ttft"), lines(series, "prompt_tokens", "mean_ttft_ms", () => true),
                          layout(axis(gettext("prompt tokens"), prompts), gettext("TTFT ms")), config);
    }
    if (el("pareto")) {
      const traces = [];
      series.forEach((s) => {
        const pts = s.points.filter((p) => mean(p, "output_throughput") !== null && mean(p, "mean_e2el_ms") !== null);
        traces.push({ name: s.label, type: "scatter", mode: "markers", marker: { size: 9 },
          x: pts.map((p) => mean(p, "output_throughput")), y: pts.map((p) => mean(p, "mean_e2el_ms")),
          customdata: pts.map((p) => [p.concurrency, runs(p)]),
          hovertemplate: `${gettext("concurrency")} %{customdata[0]}<br>%{x:.1f} tok/s, %{y:.0f} ms<br>${gettext("runs")} %{customdata[1]}<extra>%{fullData.name}</extra>` });
        if (s.pareto && s.pareto.length > 1) traces.push({ name: fill(gettext("%(name)s: Pareto front"), { name: s.label }), type: "scatter", mode: "lines",
          line: { dash: "dot" }, x: s.pareto.map((p) => p.throughput), y: s.pareto.map((p) => p.latency_ms), hoverinfo: "skip" });
      });
      Plotly.newPlot(el("pareto"), traces, layout({ title: { text: gettext("output tokens/s") }, rangemode: "tozero" }, gettext("mean end-to-end latency ms")), config);
    }
  }

  function draw(payload) {
    (payload.workloads || []).forEach((w, i) => drawWorkload(i, w));
  }
  return { draw };
})();
