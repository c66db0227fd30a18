"""The model library's JSON API (/api/models/...). Thin: the work is in services."""
from django.utils.translation import gettext as _
from ninja import Status

from dashboard.api import ApiError, ErrorOut, RowId, operator, router
from inference.library import selectors, services
from inference.library.downloader import DownloadError, NotEnoughDiskSpace
from inference.library.hubs.base import HubError
from inference.library.schemas import (ActionRequest, Deleted, HubRequest, ImportRequest, ModelList, ModelOut,
                                       PreviewOut)

api = router("models")
REFUSED = {400: ErrorOut, 404: ErrorOut, 409: ErrorOut}


def refusal(exc) -> ApiError:
    """A refused request as the JSON error the form shows under itself."""
    if isinstance(exc, NotEnoughDiskSpace):
        c = exc.check
        return ApiError("not_enough_disk", str(exc), space={"total": c.total, "already_on_disk": c.already_on_disk,
                                                           "still_needed": c.still_needed, "free": c.free,
                                                           "reserve": c.reserve})
    if isinstance(exc, HubError):
        return ApiError(exc.code or "hub_error", exc.message, hub_status=exc.status)
    if isinstance(exc, services.LibraryError):
        return ApiError(exc.code, exc.message, 409 if exc.code in ("busy", "conflict", "duplicate") else 400)
    return ApiError("download_error", str(exc))


REFUSALS = (HubError, DownloadError, services.LibraryError)


def hub_args(body: HubRequest) -> dict:
    args = {
        "source": (body.hub or body.source or "hf").strip(),
        "repo_id": (body.repo_id or "").strip(),
        "revision": (body.revision or "").strip(),
        "include": services.patterns(body.include),
        "exclude": services.patterns(body.exclude),
        "endpoint": (body.endpoint or "").strip(),
        "token": (body.token or "").strip(),
    }
    if not args["repo_id"]:
        raise ApiError("repo_id_required", _("Paste a model id such as Qwen/Qwen3-8B."))
    return args


@api.get("models/", response=ModelList, url_name="api_models")
def model_list(request):
    return {"models": [m.live_dict() for m in selectors.model_list()], "disk": selectors.models_disk()}


@api.post("models/", response={202: ModelOut, **REFUSED}, auth=operator, url_name="api_models_start")
def model_download(request, body: HubRequest):
    """Start downloading a repository's files (sha256-verified, resumable)."""
    try:
        artifact = services.model_download_start(user=request.user, **hub_args(body))
    except REFUSALS as exc:
        raise refusal(exc) from exc
    return Status(202, {"model": artifact.as_dict()})


@api.post("models/preview", response={200: PreviewOut, **REFUSED}, auth=operator, url_name="api_model_preview")
def model_preview(request, body: HubRequest):
    """The files a download would fetch, their size and whether they fit on the disk."""
    try:
        preview = services.model_download_preview(**hub_args(body))
    except REFUSALS as exc:
        raise refusal(exc) from exc
    return {"preview": preview.as_dict()}


@api.post("models/import", response={202: ModelOut, **REFUSED}, auth=operator, url_name="api_model_import")
def model_import(request, body: ImportRequest):
    """Add a GGUF file or a model folder already on this host (hashed, never copied)."""
    try:
        artifact = services.model_import_local(user=request.user, path=body.path, name=body.name)
    except REFUSALS as exc:
        raise refusal(exc) from exc
    return Status(202, {"model": artifact.as_dict()})


@api.get("models/{artifact_id}", response={200: ModelOut, 404: ErrorOut}, url_name="api_model")
def model_detail(request, artifact_id: RowId):
    return {"model": selectors.model_get_or_404(artifact_id).as_dict()}


@api.delete("models/{artifact_id}", response={200: Deleted, **REFUSED}, auth=operator, url_name="api_model_delete")
def model_delete(request, artifact_id: RowId):
    """Remove the model; a download's files too (imported files are never touched)."""
    artifact = selectors.model_get_or_404(artifact_id)
    try:
        removed = services.model_delete(artifact=artifact)
    except REFUSALS as exc:
        raise refusal(exc) from exc
    return {"deleted": artifact_id, "files_removed": removed}


@api.post("models/{artifact_id}/delete", response={200: Deleted, **REFUSED}, auth=operator,
          url_name="api_model_delete_post")
def model_delete_post(request, artifact_id: RowId):
    """The same as DELETE, for a form."""
    return model_delete(request, artifact_id)


ACTIONS = {
    "cancel": lambda a, body: services.model_download_cancel(artifact=a),
    "resume": lambda a, body: services.model_download_resume(artifact=a, token=body.token),
    "reverify": lambda a, body: services.model_reverify(artifact=a),
}


def _action(name, summary):
    @api.post(f"models/{{artifact_id}}/{name}", response={202: ModelOut, **REFUSED}, auth=operator,
              url_name=f"api_model_{name}", summary=summary)
    def action(request, artifact_id: RowId, body: ActionRequest = None):
        artifact = selectors.model_get_or_404(artifact_id)
        try:
            artifact = ACTIONS[name](artifact, body or ActionRequest())
        except REFUSALS as exc:
            raise refusal(exc) from exc
        return Status(202, {"model": artifact.as_dict()})

    action.__name__ = f"model_{name}"
    return action


model_cancel = _action("cancel", "Cancel a download (a queued one at once, a running one at its next write)")
model_resume = _action("resume", "Resume a cancelled or failed download where its files stopped")
model_reverify = _action("reverify", "Hash the files again and report any that changed on disk")
