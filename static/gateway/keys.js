// The API keys page: token usage per minute, per key and per deployment, as
// stacked bars. (Revoking asks first through the form's data-confirm.)
(function () {
  const series = JSON.parse(document.getElementById("usage-series").textContent);
  function draw(id, traces) {
    const el = document.getElementById(id);
    if (!traces.length) {
      const p = document.createElement("p");
      p.className = "muted"; p.textContent = "No tokens to chart yet.";
      el.replaceChildren(p);
      return;
    }
    Plotly.newPlot(el, traces.map((t) => ({ type: "bar", name: t.name, x: t.x, y: t.y })), {
      barmode: "stack", height: 260, margin: { l: 50, r: 10, t: 10, b: 60 },
      xaxis: { type: "category" }, yaxis: { title: { text: "tokens / minute" } }, legend: { orientation: "h" },
    }, { displayModeBar: false, responsive: true });
  }
  draw("chart-keys", series.keys);
  draw("chart-deployments", series.deployments);
})();
