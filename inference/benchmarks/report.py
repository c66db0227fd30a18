"""An experiment as one self-contained HTML file: the verdict, the tables,
the steps and the curves, with plotly.js and the data inlined, so it opens
anywhere without a network (and without the panel). The page's own body
template and chart script are reused, so the report says what the page says."""
from __future__ import annotations

import json
from pathlib import Path

from django.contrib.staticfiles import finders
from django.template.loader import render_to_string
from django.utils import timezone, translation
from django.utils.html import escape
from django.utils.translation import gettext as _

from inference.benchmarks import experiments

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#111827;max-width:1200px;margin:24px auto;padding:0 16px}
h1{font-size:22px}h2{font-size:17px;margin:0 0 8px}h3{font-size:15px;margin:12px 0 6px}
.card{border:1px solid #e5e7eb;border-radius:8px;padding:12px 16px;margin:0 0 16px;background:#fff}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #f3f4f6;padding:4px 8px;text-align:left;vertical-align:top}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}.hint{font-size:12px;color:#6b7280}.muted{color:#6b7280}
.better{color:#15803d;font-weight:600}.worse{color:#b91c1c;font-weight:600}.same{color:#6b7280}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;background:#e5e7eb;font-size:12px}
.badge.green{background:#dcfce7}.badge.red{background:#fee2e2}.badge.amber{background:#fef3c7}.badge.blue{background:#dbeafe}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(460px,1fr));gap:16px}.chart{width:100%;height:340px}
.scroll{overflow-x:auto}.scroll>table#steps{min-width:640px}.scroll>table.stats{min-width:520px}ul.sentences li{margin:4px 0}
"""


def _inline(static_path: str) -> str:
    found = finders.find(static_path)
    if not found:
        raise FileNotFoundError(static_path)
    # Nothing inlined may end the <script> element early.
    return Path(found).read_text(encoding="utf-8").replace("</script", "<\\/script")


def render(experiment) -> str:
    result = experiments.analysis(experiment)
    steps = [{"step": s, "label": experiment.labels[s.configuration] if s.configuration < len(experiment.labels)
              else "?", "where": experiments.verdict.point_label(s.concurrency, s.prompt_tokens)}
             for s in experiment.steps.select_related("run")]
    body = render_to_string("benchmarks/_experiment_body.html", {
        "experiment": experiment, "analysis": result, "steps": steps, "link_runs": False,
        "configurations": list(zip(experiment.labels, experiment.configurations)),
    })
    payload = {"workloads": [{"title": w["title"], "curves": w["curves"]} for w in result["workloads"]],
               "labels": result["labels"]}
    data = json.dumps(payload, allow_nan=False).replace("<", "\\u003c")
    title = _("Kiln experiment #%(id)s: %(name)s") % {"id": experiment.pk, "name": experiment.name}
    made = _("Exported %(when)s · host %(host)s · status %(status)s") % {
        "when": timezone.localtime().strftime("%Y-%m-%d %H:%M %Z"), "host": experiment.host,
        "status": experiment.get_status_display()}
    return "".join([
        f'<!doctype html><html lang="{escape(translation.get_language() or "en")}"><head><meta charset="utf-8">',
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{escape(title)}</title>',
        f"<style>{STYLE}</style></head><body>",
        f'<h1>{escape(title)}</h1><p class="hint">{escape(made)}</p>',
        body,
        f'<script type="application/json" id="experiment-data">{data}</script>',
        f"<script>{_inline('vendor/plotly.min.js')}</script>",
        f"<script>{_inline('benchmarks/experiment_charts.js')}</script>",
        '<script>KilnExperiment.draw(JSON.parse(document.getElementById("experiment-data").textContent));</script>',
        "</body></html>",
    ])
