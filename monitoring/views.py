from django.http import JsonResponse, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET

from monitoring import history, selectors
from monitoring.liveness import offline_hosts


@require_GET
def monitoring(request):
    monitors, redis_problem = selectors.monitor_states()
    no_gpu = [m for m in monitors if not (m.get("nvml") or {}).get("ok", True)]
    return render(request, "monitoring/monitoring.html", {
        "monitors": monitors,
        "offline_hosts": [] if redis_problem else sorted(offline_hosts()),
        "redis_problem": redis_problem,
        "no_gpu": no_gpu,
        "gpus": selectors.known_gpus(),
        "xid_events": selectors.recent_xid_events(),
    })


@require_GET
def monitoring_history(request):
    context = {"ranges": history.RANGES, "error": None, "window": None}
    try:
        window = selectors.history_window(request.GET)
    except selectors.BadRange as exc:
        context["error"] = str(exc)
        return render(request, "monitoring/history.html", context, status=400)
    context.update(
        window=window,
        gpu_series=history.gpu_series(window["start"], window["end"], window["tier"]),
        engine_series=history.engine_series(window["start"], window["end"], window["tier"]),
        query=request.GET.urlencode(),
    )
    return render(request, "monitoring/history.html", context)


@require_GET
def monitoring_history_csv(request):
    """GPU (kind=gpu, default) or deployment (kind=engine) history as CSV, same range rules as the page."""
    kind = request.GET.get("kind", "gpu")
    if kind not in ("gpu", "engine"):
        message = _("kind=%(kind)r is not known: use kind=gpu or kind=engine.") % {"kind": kind}
        return JsonResponse({"error": {"code": "bad_kind", "message": message}}, status=400)
    try:
        window = selectors.history_window(request.GET)
    except selectors.BadRange as exc:
        return JsonResponse({"error": {"code": "bad_range", "message": str(exc)}}, status=400)
    lines = (history.gpu_csv_lines if kind == "gpu" else history.engine_csv_lines)(
        window["start"], window["end"], window["tier"])
    response = StreamingHttpResponse(lines, content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%d-%H%M")
    response["Content-Disposition"] = f'attachment; filename="kiln-{kind}-history-{window["range"]}-{stamp}.csv"'
    return response
