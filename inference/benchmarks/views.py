"""Benchmark pages (their JSON API is inference/benchmarks/api.py). Thin: services.py does the work."""
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from django.views.decorators.http import require_GET, require_POST

from dashboard.api import MAX_INT
from dashboard.roles import operator_required
from inference.benchmarks import services as svc
from inference.models import BenchmarkRun


def _filters(request):
    return {k: request.GET.get(k, "").strip() for k in ("model", "engine", "gpu")}


def _parse_ids(text):
    try:
        ids = [int(x) for x in (text or "").replace(" ", "").split(",") if x]
    except ValueError:
        raise svc.BenchmarkInputError("ids: give run numbers separated by commas, e.g. ?ids=3,5.") from None
    if any(not 1 <= i <= MAX_INT for i in ids):
        raise svc.BenchmarkInputError("ids: run numbers are whole numbers from 1, e.g. ?ids=3,5.")
    return list(dict.fromkeys(ids))


def _bandwidth(request):
    text = request.GET.get("bandwidth", "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise svc.BenchmarkInputError(f"bandwidth: {text!r} is not a number of GB/s.") from None
    if not 0 < value < 100000:
        raise svc.BenchmarkInputError("bandwidth: give the memory bandwidth in GB/s, e.g. 900 for a V100.")
    return value


def _runs_for(ids):
    found = {r.pk: r for r in BenchmarkRun.objects.filter(pk__in=ids).select_related("deployment")}
    missing = [i for i in ids if i not in found]
    if missing:
        raise svc.BenchmarkInputError(_("No benchmark run #%(id)s.") % {"id": missing[0]}, code="not_found")
    return [found[i] for i in ids]


# ---------------------------------------------------------------- pages


@require_GET
def benchmarks(request):
    filters = _filters(request)
    runs = svc.runs_filtered(**filters)[:200]
    return render(request, "benchmarks/benchmarks.html", {
        "runs": runs, "filters": filters, "choices": svc.filter_choices(),
        "deployments": svc.ready_deployments(), "scenarios": svc.scenario_choices(),
    })


@require_GET
def benchmark_detail(request, run_id):
    run = get_object_or_404(BenchmarkRun.objects.select_related("deployment", "created_by"), pk=run_id)
    data = svc.run_as_dict(run, detailed=True)
    try:
        bandwidth = _bandwidth(request)
    except svc.BenchmarkInputError as exc:
        messages.error(request, str(exc))
        bandwidth = None
    return render(request, "benchmarks/benchmarks_detail.html", {
        "run": run, "steps": data["result"], "charts": svc.chart_data([run]), "roofline": svc.roofline(run, bandwidth),
        "metric_rows": [(name, [_fmt(s.get(name)) for s in data["result"]]) for name in _metric_names(data["result"])],
    })


def _fmt(value):
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 1e6 else f"{value:,.0f}"
    return str(value)


def _metric_names(steps):
    names = []
    for s in steps:
        for k, v in s.items():
            if k not in names and not isinstance(v, (dict, list)) and k not in ("source", "step", "label", "kiln"):
                names.append(k)
    return names


@require_GET
def benchmark_compare(request):
    context = {"ids": request.GET.get("ids", ""), "bandwidth": request.GET.get("bandwidth", "")}
    try:
        runs = _runs_for(_parse_ids(request.GET.get("ids")))
        baseline = int(request.GET["baseline"]) if request.GET.get("baseline", "").isdigit() else None
        data = svc.compare_runs(runs, baseline, _bandwidth(request))
    except svc.BenchmarkInputError as exc:
        context["error"] = str(exc)
        return render(request, "benchmarks/benchmarks_compare.html", context, status=400)
    table = data["table"]
    rows = [{"metric": row["metric"], "better": row["better"],
             "cells": list(zip(row["values"], row["ratios"], row["verdicts"]))} for row in table["rows"]]
    args = [{"flag": flag or "(program and model)", "values": values} for flag, values in table["launch_args"].items()]
    context.update({"runs": runs, "table": table, "rows": rows, "args": args, "data": data,
                    "roof_pairs": list(zip(runs, data["rooflines"])),
                    "baseline_id": runs[table["baseline"]].pk})
    return render(request, "benchmarks/benchmarks_compare.html", context)


@require_POST
@operator_required
def benchmark_import_page(request):
    upload = request.FILES.get("file")
    if upload is None:
        messages.error(request, _("Choose a result file to import (vllm bench --save-result JSON or a guidellm report)."))
        return redirect("benchmarks")
    try:
        run = svc.benchmark_import(data=upload.read(), file_name=upload.name, user=request.user,
                                   label=request.POST.get("label", ""))
    except svc.BenchmarkInputError as exc:
        messages.error(request, _("Not imported: %(reason)s") % {"reason": exc})
        return redirect("benchmarks")
    messages.success(request, ngettext("Imported %(file)s as run #%(id)s (%(count)s result).", "Imported %(file)s as run #%(id)s (%(count)s results).", len(run.result)) % {"file": upload.name, "id": run.pk, "count": len(run.result)})
    return redirect("benchmark_detail", run_id=run.pk)
