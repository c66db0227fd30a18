"""The "Plan a launch" page that shows the live preflight panel (its JSON route,
POST /api/preflight, is inference.preflight.api)."""
from django.conf import settings
from django.shortcuts import render
from django.views.decorators.http import require_GET

from inference.deployments import presets
from inference.models import EngineRuntime, ModelArtifact
from inference.preflight.forms import PreflightForm
from inference.preflight.services import PLANNING_TARGETS


@require_GET
def plan(request):
    """Plan a launch: any model (or a preset's), any runtime (or engine + version), any hardware."""
    # Opens on a plan that works (the NVFP4 preset on the V100 it names, with the
    # sm70 build it needs): a newcomer first sees an answer, not three red errors.
    try:
        preset = presets.get_preset(request.GET.get("preset") or presets.QWEN_NVFP4.slug)
    except KeyError:
        preset = presets.QWEN_NVFP4
    initial = {"preset": preset.slug, "target": preset.plan_target, "engine": preset.engine,
               "sm70_build": preset.needs_sm70_build}
    initial.update({k: v for k, v in request.GET.items()})
    preset_values = {p.slug: {"engine": p.engine, "target": p.plan_target, "sm70_build": p.needs_sm70_build,
                              **{k: v for k, v in p.spec_values.items()
                                                      if k in ("tensor_parallel_size", "dtype", "quantization",
                                                               "max_model_len", "gpu_memory_utilization",
                                                               "kv_cache_dtype", "attention_backend",
                                                               "max_num_seqs", "speculative_config")}}
                     for p in presets.PRESETS}
    return render(request, "preflight/plan.html", {
        "form": PreflightForm(initial=initial),
        "initial": initial,
        "runtimes": EngineRuntime.objects.all(),
        "models": ModelArtifact.objects.filter(status=ModelArtifact.Status.READY),
        "presets": presets.PRESETS,
        "targets": PLANNING_TARGETS,
        "preset_values": preset_values,
        "host_name": settings.HOST_NAME,
    })
