"""POST /api/preflight: will this launch fit and start? Any signed-in user may ask: it changes nothing."""
from django.conf import settings

from dashboard.api import BAD_BODY_CODES, ApiError, ErrorOut, router
from inference.deployments import presets
from inference.models import EngineRuntime
from inference.preflight.forms import PreflightForm, form_errors
from inference.preflight.schemas import PreflightOut, PreflightRequest
from inference.preflight.services import (adhoc_runtime_info, gpus_for_host, planning_target, preflight_for,
                                         preset_model)

api = router("preflight")
BAD_BODY_CODES["api_preflight"] = "bad_request"  # its code before it moved onto the shared API


def run_preflight(data: dict) -> dict:
    """PreflightForm's cleaned values -> preflight_for(), with where it was checked."""
    preset = presets.get_preset(data["preset"]) if data.get("preset") else None
    runtime = data.get("runtime")
    if runtime is None:
        runtime = adhoc_runtime_info(engine=data.get("engine") or (preset.engine if preset else "vllm"),
                                     version=data.get("engine_version") or "",
                                     sm70_build=bool(data.get("sm70_build")))
    if data.get("target"):
        target = planning_target(data["target"])
        gpus, where = target.gpus(), str(target.label)
    else:
        host = runtime.host if isinstance(runtime, EngineRuntime) else settings.HOST_NAME
        gpus = gpus_for_host(host, data.get("gpus") or [])
        where = f"{host}: " + (f"GPU {','.join(str(i) for i in data['gpus'])}" if data.get("gpus") else "CPU")
    meta, weight = None, None
    if data.get("model") is None and preset is not None:
        pm = preset_model(preset.slug)
        meta, weight = pm["meta"], pm["weight_bytes"]
    result = preflight_for(profile_values=data, model=data.get("model"), runtime=runtime, gpus=gpus,
                           model_meta_override=meta, weight_bytes=weight)
    result["where"] = where
    return result


@api.post("preflight", response={200: PreflightOut, 400: ErrorOut}, url_name="api_preflight")
def preflight(request, body: PreflightRequest = None):
    """The launch form's fields in (JSON, or the form itself); findings with their fixes and the
    memory fit out. A field that cannot be checked is a 400 naming it."""
    form = PreflightForm((body or PreflightRequest()).form_data())
    if not form.is_valid():
        fields = form_errors(form)
        raise ApiError("invalid", "; ".join(f"{k}: {v}" for k, v in fields.items()), fields=fields)
    return run_preflight(form.cleaned_data)
