"""Benchmark pages (their JSON API is inference/benchmarks/api.py). Thin: services.py does the work."""
import json

from django.contrib import messages
from django.http import HttpResponse, HttpResponseForbidden, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from dashboard.api import MAX_INT
from dashboard.roles import is_operator, operator_required
from inference.benchmarks import experiments, report, services as svc, verdict
from inference.benchmarks.forms import ExperimentForm, PresetForm, parse_configuration
from inference.models import BenchmarkRun, Experiment, LaunchProfile


def _filters(request):
    return {k: request.GET.get(k, "").strip() for k in ("model", "engine", "gpu")}


def _parse_ids(text):
    try:
        ids = [int(x) for x in (text or "").replace(" ", "").split(",") if x]
    except ValueError:
        raise svc.BenchmarkInputError(_("ids: give run numbers separated by commas, e.g. ?ids=3,5.")) from None
    if any(not 1 <= i <= MAX_INT for i in ids):
        raise svc.BenchmarkInputError(_("ids: run numbers are whole numbers from 1, e.g. ?ids=3,5."))
    return list(dict.fromkeys(ids))


def _bandwidth(request):
    text = request.GET.get("bandwidth", "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise svc.BenchmarkInputError(_("bandwidth: %(value)r is not a number of GB/s.") % {"value": text}) from None
    if not 0 < value < 100000:
        raise svc.BenchmarkInputError(_("bandwidth: give the memory bandwidth in GB/s, e.g. 900 for a V100."))
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
        "goodput": verdict.goodput_definition((run.config or {}).get("goodput_slos")),
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
    key_rows = sorted((r for r in rows if r["metric"] in svc.KEY_METRICS), key=lambda r: svc.KEY_METRICS.index(r["metric"]))
    other_rows = [r for r in rows if r["metric"] not in svc.KEY_METRICS]
    args = [{"flag": flag or _("(program and model)"), "values": values}
            for flag, values in table["launch_args"].items()]
    context.update({"runs": runs, "table": table, "key_rows": key_rows, "other_rows": other_rows, "args": args,
                    "data": data, "verdict": data["verdict"], "differences": data["differences"],
                    "argv_recorded": all(data["argv_recorded"]),
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


# ---------------------------------------------------------------- experiments


def _experiment_or_404(experiment_id):
    return get_object_or_404(Experiment.objects.select_related("created_by"), pk=experiment_id)


@require_http_methods(["GET", "POST"])
def experiments_page(request):
    """The list, the presets and the "new experiment" form (POST: operators create)."""
    form = ExperimentForm(request.POST or None, initial={"repetitions": 3, "scenario": "decode-single-stream"})
    status = 200
    if request.method == "POST":
        if not is_operator(request.user):
            return HttpResponseForbidden(_("Only operators start experiments."))
        if form.is_valid():
            data = form.cleaned_data
            try:
                experiment = experiments.experiment_create(
                    name=data["name"], configurations=form.configurations(), scenario=data["scenario"],
                    overrides=form.overrides(), concurrency_levels=data["concurrency_levels"],
                    prompt_lengths=data["prompt_lengths"], repetitions=data["repetitions"], order=data["order"],
                    slo_decode_tok_s=data["slo_decode_tok_s"], goodput=data["goodput"], user=request.user)
            except experiments.ExperimentInputError as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(request, _("Experiment #%(id)s queued.") % {"id": experiment.pk})
                return redirect("experiment_detail", experiment_id=experiment.pk)
        status = 400
    return render(request, "benchmarks/experiments.html", {
        "form": form, "experiments": Experiment.objects.select_related("created_by")[:100],
        "presets": experiments.PRESETS, "preset_form": PresetForm(),
        "draft_profiles": [p for p in LaunchProfile.objects.order_by("name") if experiments.has_draft(p)],
    }, status=status)


@require_POST
@operator_required
def experiment_preset(request):
    form = PresetForm(request.POST)
    if not form.is_valid():
        messages.error(request, _("Choose a preset and a configuration."))
        return redirect("experiments")
    data = form.cleaned_data
    config = parse_configuration(data["configuration"])
    try:
        if data["preset"] == "speculative":
            profile = LaunchProfile.objects.filter(pk=(config or {}).get("profile")).first()
            if profile is None:
                raise experiments.ExperimentInputError(_("Choose a launch profile with a draft model."))
            experiment = experiments.preset_speculative(profile=profile, user=request.user)
        else:
            experiment = experiments.preset_sweet_spot(configuration=config or {}, user=request.user,
                                                       slo_decode_tok_s=data["slo_decode_tok_s"],
                                                       goodput=data["goodput"])
    except experiments.ExperimentInputError as exc:
        messages.error(request, _("Not started: %(reason)s") % {"reason": exc})
        return redirect("experiments")
    messages.success(request, _("Experiment #%(id)s queued.") % {"id": experiment.pk})
    return redirect("experiment_detail", experiment_id=experiment.pk)


def _steps(experiment):
    labels = experiment.labels
    rows = []
    for step in experiment.steps.select_related("run"):
        rows.append({"step": step, "label": labels[step.configuration] if step.configuration < len(labels) else "?",
                     "where": verdict.point_label(step.concurrency, step.prompt_tokens)})
    return rows


def experiment_state(experiment) -> dict:
    return {"id": experiment.pk, "status": experiment.status, "status_label": experiment.get_status_display(),
            "colour": experiment.colour, "progress": experiment.progress, "error": experiment.error,
            "steps": [{"id": s.pk, "status": s.status, "status_label": s.get_status_display(), "colour": s.colour,
                       "note": s.note, "run": s.run_id} for s in experiment.steps.all()]}


@require_GET
def experiment_detail(request, experiment_id):
    experiment = _experiment_or_404(experiment_id)
    result = experiments.analysis(experiment)
    return render(request, "benchmarks/experiment_detail.html", {
        "experiment": experiment, "analysis": result, "steps": _steps(experiment),
        "configurations": list(zip(experiment.labels, experiment.configurations)),
        "chart_payload": {"workloads": [{"title": w["title"], "curves": w["curves"]} for w in result["workloads"]],
                          "labels": result["labels"]},
    })


@require_GET
def experiment_progress(request, experiment_id):
    return JsonResponse(experiment_state(_experiment_or_404(experiment_id)))


@require_POST
@operator_required
def experiment_cancel(request, experiment_id):
    try:
        experiments.experiment_cancel(experiment=_experiment_or_404(experiment_id), user=request.user)
        messages.success(request, _("Cancelling: the current measurement stops, then what was launched is stopped."))
    except experiments.ExperimentInputError as exc:
        messages.error(request, str(exc))
    return redirect("experiment_detail", experiment_id=experiment_id)


@require_POST
@operator_required
def experiment_resume(request, experiment_id):
    try:
        experiments.experiment_resume(experiment=_experiment_or_404(experiment_id), user=request.user)
        messages.success(request, _("Queued again: steps already done are kept."))
    except experiments.ExperimentInputError as exc:
        messages.error(request, str(exc))
    return redirect("experiment_detail", experiment_id=experiment_id)


@require_GET
def experiment_report(request, experiment_id):
    """One self-contained HTML file: verdict, tables, charts (plotly.js inlined), no network needed."""
    experiment = _experiment_or_404(experiment_id)
    response = HttpResponse(report.render(experiment), content_type="text/html; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="kiln-experiment-{experiment.pk}.html"'
    return response


@require_GET
def experiment_results(request, experiment_id):
    """Every measurement as `vllm bench serve --append-result` JSON lines (Kiln's own import reads them)."""
    experiment = _experiment_or_404(experiment_id)
    lines = []
    for step in experiment.steps.filter(kind="measure").select_related("run").exclude(run=None):
        exported = svc.benchmark_export(step.run)
        for item in exported if isinstance(exported, list) else [exported]:
            item["kiln"] = {**item.get("kiln", {}), "experiment": experiment.pk, "step": step.index,
                            "configuration": experiment.labels[step.configuration], "repetition": step.repetition,
                            "step_status": step.status}
            lines.append(json.dumps(item, allow_nan=False, default=str))
    response = HttpResponse("\n".join(lines) + ("\n" if lines else ""), content_type="application/x-ndjson")
    response["Content-Disposition"] = f'attachment; filename="kiln-experiment-{experiment.pk}.jsonl"'
    return response
