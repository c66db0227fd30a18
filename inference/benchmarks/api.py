"""The benchmarks' JSON API (/api/benchmarks/...). Thin: inference/benchmarks/services.py does the work."""
import json
from typing import Any, Union

from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse
from django.utils.translation import gettext as _
from ninja import File, Form, Query, Status, UploadedFile

from dashboard.api import BAD_BODY_CODES, ApiError, ErrorOut, RowId, Text, operator, router
from inference.benchmarks import services
from inference.benchmarks.schemas import (Bandwidth, Baseline, Comparison, RunDetailOut, RunIds, RunList, RunOut,
                                          RunStart)
from inference.models import BenchmarkRun, Deployment

api = router("benchmarks")
REFUSED = {400: ErrorOut, 404: ErrorOut, 409: ErrorOut}
# A start whose body is not JSON answered "invalid" before this moved onto `api`
# (the POST shares its URL pattern, so the name is the list's).
BAD_BODY_CODES["api_benchmarks"] = "invalid"


def refusal(exc: services.BenchmarkInputError, status: int = 400) -> ApiError:
    """The service's refusal as the JSON error the page shows; an unknown run is a 404."""
    return ApiError(exc.code, str(exc), 404 if exc.code == "not_found" else status)


def run_or_404(run_id: int) -> BenchmarkRun:
    run = BenchmarkRun.objects.filter(pk=run_id).first()
    if run is None:
        raise ApiError("not_found", _("No benchmark run #%(id)s.") % {"id": run_id}, 404)
    return run


@api.get("benchmarks/", response=RunList, exclude_unset=True, url_name="api_benchmarks")
def benchmark_list(request, model: Text = Query(""), engine: Text = Query(""), gpu: Text = Query("")):
    """The newest 500 runs, filtered by model, engine and GPU name (exact matches)."""
    runs = services.runs_filtered(model=model.strip(), engine=engine.strip(), gpu=gpu.strip())[:500]
    return {"runs": [services.run_as_dict(r) for r in runs]}


@api.post("benchmarks/", response={202: RunOut, **REFUSED}, exclude_unset=True, auth=operator,
          url_name="api_benchmarks_start")
def benchmark_start(request, body: RunStart):
    """Queue a run of a preset scenario against a ready deployment on its host's worker."""
    deployment = Deployment.objects.select_related("profile__runtime", "model").filter(pk=body.deployment).first()
    if deployment is None:
        raise ApiError("not_found", _("No deployment #%(id)s.") % {"id": body.deployment}, 404)
    overrides = body.model_dump(include={*services.OVERRIDE_LIMITS, "sweep"}, exclude_none=True)
    try:
        run = services.benchmark_start(deployment=deployment, scenario=body.scenario, user=request.user,
                                       label=body.label, overrides=overrides, goodput=body.goodput)
    except services.BenchmarkInputError as exc:
        raise refusal(exc, 409 if exc.code == "not_ready" else 400) from exc
    return Status(202, {"run": services.run_as_dict(run)})


@api.get("benchmarks/compare", response={200: Comparison, 400: ErrorOut, 404: ErrorOut},
         url_name="api_benchmarks_compare")
def benchmark_compare(request, ids: RunIds = Query([], description="Run ids separated by commas, e.g. 3,5"),
                      baseline: Baseline = Query(None, description="The run the others are compared to"),
                      bandwidth: Bandwidth = Query(None, description="Memory bandwidth in GB/s for the roofline")):
    """Two or more runs side by side: ratios to the baseline, launch arguments that differ, rooflines."""
    ids = list(dict.fromkeys(ids))
    found = {r.pk: r for r in BenchmarkRun.objects.filter(pk__in=ids).select_related("deployment")}
    missing = [i for i in ids if i not in found]
    if missing:
        raise ApiError("not_found", _("No benchmark run #%(id)s.") % {"id": missing[0]}, 404)
    try:
        return services.compare_runs([found[i] for i in ids], baseline, bandwidth)
    except services.BenchmarkInputError as exc:
        raise refusal(exc) from exc


@api.post("benchmarks/import", response={201: RunDetailOut, 400: ErrorOut}, auth=operator,
          url_name="api_benchmark_import",
          description="Send the file as the multipart field `file` (with an optional `label`), or as the body "
                      "itself with its name in `?name=`.")
def benchmark_import(request, file: UploadedFile = File(None), label: Text = Form(""), name: Text = Query("")):
    """Import a `vllm bench serve --save-result` file (JSON or JSONL) or a guidellm report as a finished run."""
    if file is not None:
        if "\x00" in (file.name or ""):
            raise ApiError("invalid", _("file: the file name must not contain a NUL character (\\x00)."),
                           fields={"file": _("must not contain a NUL character (\\x00)")})
        data, name = file.read(), file.name
    elif request.content_type == "multipart/form-data":
        raise ApiError("invalid", _("file: choose a result file to import."), fields={"file": _("Field required")})
    else:
        try:
            data = request.body
        except RequestDataTooBig:  # over settings.DATA_UPLOAD_MAX_MEMORY_SIZE; an upload streams instead
            message = _("The body is too large to read in one piece: send a large result as the multipart field "
                        "`file`.")
            raise ApiError("too_large", message, fields={"file": _("too large for a request body")}) from None
    try:
        run = services.benchmark_import(data=data, file_name=name, user=request.user, label=label)
    except services.BenchmarkInputError as exc:
        raise refusal(exc) from exc
    return Status(201, {"run": services.run_as_dict(run, detailed=True)})


@api.get("benchmarks/{run_id}", response={200: RunDetailOut, 404: ErrorOut}, exclude_unset=True,
         url_name="api_benchmark")
def benchmark_detail(request, run_id: RowId):
    return {"run": services.run_as_dict(run_or_404(run_id), detailed=True)}


@api.post("benchmarks/{run_id}/cancel", response={202: RunOut, **REFUSED}, exclude_unset=True, auth=operator,
          url_name="api_benchmark_cancel")
def benchmark_cancel(request, run_id: RowId):
    """A queued run stops at once, a running one at its next progress check (what finished is kept)."""
    try:
        run = services.benchmark_cancel(run=run_or_404(run_id), user=request.user)
    except services.BenchmarkInputError as exc:
        raise refusal(exc, 409) from exc
    return Status(202, {"run": services.run_as_dict(run)})


@api.get("benchmarks/{run_id}/export", response={200: Union[dict[str, Any], list[dict[str, Any]]], 404: ErrorOut,
                                                 409: ErrorOut}, url_name="api_benchmark_export")
def benchmark_export(request, run_id: RowId):
    """The run as `vllm bench serve --save-result` JSON (a list for a sweep), as a file to save."""
    run = run_or_404(run_id)
    if not run.result:
        raise ApiError("no_result", _("Run #%(id)s is %(status)s and has no result to export yet.")
                       % {"id": run_id, "status": run.get_status_display()}, 409)
    response = HttpResponse(json.dumps(services.benchmark_export(run), indent=2, default=str),
                            content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="kiln-benchmark-{run.pk}.json"'
    return response
