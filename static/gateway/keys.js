// The API keys page: token usage per minute, per key and per deployment, as
// stacked bars. (Revoking asks first through the form's data-confirm.)
(function () {
  const series = JSON.parse(document.getElementById("usage-series").textContent);
  function draw(id, traces) {
    const el = document.getElementById(id);
    if (!traces.length) {
      const p = document.createElement("p");
      p.className = "muted"; p.textContent = gettext("No tokens to chart yet.");
      el.replaceChildren(p);
      return;
    }
    Plotly.newPlot(el, traces.map((t) => ({ type: "bar", name: t.name, x: t.x, y: t.y })), {
      barmode: "stack", height: 260, margin: { l: 50, r: 10, t: 10, b: 60 },
      // Each trace has only its own minutes: without an order, the axis would follow the
      // first trace's minutes and then append the others', out of time order.
      xaxis: { type: "category", categoryorder: "category ascending" },
      yaxis: { title: { text: gettext("tokens / minute") }, tickformat: ",d" }, legend: { orientation: "h" },
    }, { displayModeBar: false, responsive: true });
  }
  // "Copy" beside a new key's secret (shown only once).
  const copy = document.getElementById("copy-new-key");
  if (copy) copy.addEventListener("click", async () => {
    const secret = document.getElementById("new-key-secret");
    try { await navigator.clipboard.writeText(secret.textContent.trim()); copy.textContent = gettext("Copied"); }
    catch (e) {
      const range = document.createRange(); range.selectNodeContents(secret);
      const sel = getSelection(); sel.removeAllRanges(); sel.addRange(range);
      copy.textContent = gettext("Selected: press Ctrl-C");
    }
    setTimeout(() => { copy.textContent = gettext("Copy"); }, 2000);
  });
  draw("chart-keys", series.keys);
  draw("chart-deployments", series.deployments);
})();
