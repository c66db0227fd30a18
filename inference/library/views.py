"""Pages of the model library (its JSON API is api.py). Thin: the work is in services."""
from django.conf import settings
from django.shortcuts import render
from django.views.decorators.http import require_GET

from inference.library import selectors


# --------------------------------------------------------------------------- pages
@require_GET
def models_page(request):
    from inference.library.hubs.preference import HF_MIRROR, MODELSCOPE, hf_endpoint_for, preferred_hub

    # A preset's "Download the model" link fills in the form (?repo=&hub=&include=&endpoint=).
    q = request.GET
    preferred = preferred_hub()
    hub = q.get("hub") if q.get("hub") in ("hf", "modelscope") else ("modelscope" if preferred == MODELSCOPE else "hf")
    endpoint = q.get("endpoint", "")[:200]
    if not endpoint and hub == "hf" and preferred == HF_MIRROR and hf_endpoint_for(HF_MIRROR) != settings.HF_ENDPOINT:
        endpoint = hf_endpoint_for(HF_MIRROR)
    prefill = {"hub": hub, "repo_id": q.get("repo", "")[:200], "include": q.get("include", "")[:500],
               "revision": q.get("revision", "")[:100], "endpoint": endpoint}
    return render(request, "library/models.html", {
        "prefill": prefill,
        "models": [m.live_dict() for m in selectors.model_list()],
        "disk": selectors.models_disk(),
        "host_name": settings.HOST_NAME,
        "hf_endpoint": settings.HF_ENDPOINT,
        "ms_endpoint": settings.MODELSCOPE_ENDPOINT,
        "hf_token_set": bool(settings.HF_TOKEN),
        "ms_token_set": bool(settings.MODELSCOPE_TOKEN),
    })


@require_GET
def model_detail_page(request, artifact_id):
    artifact = selectors.model_get_or_404(artifact_id)
    hashes = artifact.recorded_hashes
    files = []
    for f in artifact.files:
        if isinstance(f, dict):
            files.append({**f, "recorded": hashes.get(f.get("path"), "")})
    return render(request, "library/model_detail.html", {
        "m": artifact, "model": artifact.as_dict(), "files": files,
        "meta_rows": sorted((k, v) for k, v in artifact.meta.items() if k not in ("tensor_types", "error")),
    })
