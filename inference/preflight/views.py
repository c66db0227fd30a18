"""Preflight pages: POST /api/preflight (any signed-in user: it changes nothing) and
the "Plan a launch" page that shows the live panel."""
import json
import shlex

from django.conf import settings
from django.http import JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from inference.deployments import presets
from inference.models import EngineRuntime, ModelArtifact
from inference.preflight.forms import PreflightForm, form_errors
from inference.preflight.services import (PLANNING_TARGETS, adhoc_runtime_info, gpus_for_host, planning_target,
                                         preflight_for, preset_model)


def _request_data(request):
    if request.content_type == "application/json":
        try:
            data = json.loads(request.body or b"{}")
        except ValueError as exc:
            return None, f"the body is not valid JSON ({exc})"
        if not isinstance(data, dict):
            return None, "the body must be a JSON object of the launch form's fields"
        out = {}
        for key, value in data.items():
            if key == "gpus" and isinstance(value, list):
                value = ",".join(str(v) for v in value)
            elif key == "extra_args" and isinstance(value, list):
                value = shlex.join(str(v) for v in value)
            elif isinstance(value, (dict, list)):
                value = json.dumps(value)
            elif value is None:
                value = ""
            out[key] = value
        return out, None
    return request.POST, None


def run_preflight(form: PreflightForm) -> dict:
    """The form's cleaned values -> preflight_for(); the view and the plan page share it."""
    data = form.cleaned_data
    preset = presets.get_preset(data["preset"]) if data.get("preset") else None
    runtime = data.get("runtime")
    if runtime is None:
        runtime = adhoc_runtime_info(engine=data.get("engine") or (preset.engine if preset else "vllm"),
                                     version=data.get("engine_version") or "",
                                     sm70_build=bool(data.get("sm70_build")))
    if data.get("target"):
        target = planning_target(data["target"])
        gpus, where = target.gpus(), target.label
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


@require_POST
def api_preflight(request):
    data, problem = _request_data(request)
    if problem:
        return JsonResponse({"error": {"code": "bad_request", "message": problem}}, status=400)
    form = PreflightForm(data)
    if not form.is_valid():
        fields = form_errors(form)
        message = "; ".join(f"{k}: {v}" for k, v in fields.items())
        return JsonResponse({"error": {"code": "invalid", "message": message, "fields": fields}}, status=400)
    return JsonResponse(run_preflight(form))


@require_GET
def plan(request):
    """Plan a launch: any model (or a preset's), any runtime (or engine + version), any hardware."""
    initial = {"preset": presets.QWEN_NVFP4.slug, "target": "v100-32gb-x1", "engine": "vllm",
               "engine_version": "0.33.0"}
    initial.update({k: v for k, v in request.GET.items()})
    preset_values = {p.slug: {"engine": p.engine, **{k: v for k, v in p.spec_values.items()
                                                      if k in ("tensor_parallel_size", "dtype", "quantization",
                                                               "max_model_len", "gpu_memory_utilization",
                                                               "kv_cache_dtype", "attention_backend",
                                                               "max_num_seqs", "speculative_config")}}
                     for p in presets.PRESETS}
    return render(request, "inference/plan.html", {
        "form": PreflightForm(initial=initial),
        "initial": initial,
        "runtimes": EngineRuntime.objects.all(),
        "models": ModelArtifact.objects.filter(status=ModelArtifact.Status.READY),
        "presets": presets.PRESETS,
        "targets": PLANNING_TARGETS,
        "preset_values": preset_values,
        "host_name": settings.HOST_NAME,
    })
