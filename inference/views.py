"""Pages and JSON API of the model library. Thin: the work is in services."""
import shutil

from django.conf import settings
from django.http import Http404, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods, require_POST

from dashboard.api import json_body, json_error
from dashboard.roles import operator_required
from inference import selectors, services
from inference.downloader import DownloadError, NotEnoughDiskSpace
from inference.hubs.base import HubError


def _refusal(exc):
    """A refused request as the JSON error the form shows under itself."""
    if isinstance(exc, NotEnoughDiskSpace):
        c = exc.check
        return json_error("not_enough_disk", str(exc), space={"total": c.total, "already_on_disk": c.already_on_disk,
                                                          "still_needed": c.still_needed, "free": c.free,
                                                          "reserve": c.reserve})
    if isinstance(exc, HubError):
        return json_error(exc.code or "hub_error", exc.message, hub_status=exc.status)
    if isinstance(exc, services.LibraryError):
        return json_error(exc.code, exc.message, status=409 if exc.code in ("busy", "conflict", "duplicate") else 400)
    return json_error("download_error", str(exc))


REFUSALS = (HubError, DownloadError, services.LibraryError)


def _hub_args(data):
    return {
        "source": (data.get("hub") or data.get("source") or "hf").strip(),
        "repo_id": (data.get("repo_id") or "").strip(),
        "revision": (data.get("revision") or "").strip(),
        "include": services.patterns(data.get("include")),
        "exclude": services.patterns(data.get("exclude")),
        "endpoint": (data.get("endpoint") or "").strip(),
        "token": (data.get("token") or "").strip(),
    }


def _get(artifact_id):
    artifact = selectors.model_get(artifact_id)
    if artifact is None:
        raise Http404(f"No model #{artifact_id}.")
    return artifact


def _disk():
    usage = shutil.disk_usage(settings.MODELS_DIR)
    return {"folder": str(settings.MODELS_DIR), "free": usage.free, "total": usage.total}


# --------------------------------------------------------------------------- pages
def models_page(request):
    return render(request, "inference/models.html", {
        "models": [m.live_dict() for m in selectors.model_list()],
        "disk": _disk(),
        "host_name": settings.HOST_NAME,
        "hf_endpoint": settings.HF_ENDPOINT,
        "ms_endpoint": settings.MODELSCOPE_ENDPOINT,
        "hf_token_set": bool(settings.HF_TOKEN),
        "ms_token_set": bool(settings.MODELSCOPE_TOKEN),
    })


def model_detail_page(request, artifact_id):
    artifact = _get(artifact_id)
    hashes = artifact.recorded_hashes
    files = []
    for f in artifact.files:
        if isinstance(f, dict):
            files.append({**f, "recorded": hashes.get(f.get("path"), "")})
    return render(request, "inference/model_detail.html", {
        "m": artifact, "model": artifact.as_dict(), "files": files,
        "meta_rows": sorted((k, v) for k, v in artifact.meta.items() if k not in ("tensor_types", "error")),
    })


# --------------------------------------------------------------------------- API
@require_http_methods(["GET", "POST"])
def api_models(request):
    if request.method == "GET":
        return JsonResponse({"models": [m.live_dict() for m in selectors.model_list()], "disk": _disk()})
    return _start(request)


@operator_required
def _start(request):
    data = json_body(request)
    if data is None:
        return json_error("bad_json", "Send a JSON object with hub, repo_id, revision, include, exclude.")
    args = _hub_args(data)
    if not args["repo_id"]:
        return json_error("repo_id_required", "Paste a model id such as Qwen/Qwen3-8B.")
    try:
        artifact = services.model_download_start(user=request.user, **args)
    except REFUSALS as exc:
        return _refusal(exc)
    return JsonResponse({"model": artifact.as_dict()}, status=202)


@require_POST
@operator_required
def api_model_preview(request):
    data = json_body(request)
    if data is None:
        return json_error("bad_json", "Send a JSON object with hub, repo_id, revision, include, exclude.")
    args = _hub_args(data)
    if not args["repo_id"]:
        return json_error("repo_id_required", "Paste a model id such as Qwen/Qwen3-8B.")
    try:
        preview = services.model_download_preview(**args)
    except REFUSALS as exc:
        return _refusal(exc)
    return JsonResponse({"preview": preview.as_dict()})


@require_POST
@operator_required
def api_model_import(request):
    data = json_body(request)
    if data is None:
        return json_error("bad_json", "Send a JSON object with path (and optionally name).")
    try:
        artifact = services.model_import_local(user=request.user, path=data.get("path", ""), name=data.get("name", ""))
    except REFUSALS as exc:
        return _refusal(exc)
    return JsonResponse({"model": artifact.as_dict()}, status=202)


@require_http_methods(["GET", "DELETE"])
def api_model(request, artifact_id):
    if request.method == "DELETE":
        return _delete(request, artifact_id)
    return JsonResponse({"model": _get(artifact_id).as_dict()})


@operator_required
def _delete(request, artifact_id):
    artifact = _get(artifact_id)
    try:
        removed = services.model_delete(artifact=artifact)
    except REFUSALS as exc:
        return _refusal(exc)
    return JsonResponse({"deleted": artifact_id, "files_removed": removed})


ACTIONS = {
    "cancel": lambda a, data: services.model_download_cancel(artifact=a),
    "resume": lambda a, data: services.model_download_resume(artifact=a, token=(data or {}).get("token", "")),
    "reverify": lambda a, data: services.model_reverify(artifact=a),
}


@require_POST
@operator_required
def api_model_action(request, artifact_id, action):
    if action == "delete":
        return _delete(request, artifact_id)
    if action not in ACTIONS:
        return json_error("not_found", f"No action {action!r}: use cancel, resume, reverify or delete.", status=404)
    artifact = _get(artifact_id)
    try:
        artifact = ACTIONS[action](artifact, json_body(request))
    except REFUSALS as exc:
        return _refusal(exc)
    return JsonResponse({"model": artifact.as_dict()}, status=202)


