// Runs side by side: the charts, drawn from the series the server sends.
KilnBench.draw(JSON.parse(document.getElementById("chart-data").textContent),
               JSON.parse(document.getElementById("roofline-data").textContent));
