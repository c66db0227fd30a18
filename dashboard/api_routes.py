"""The overview's JSON API: service status and background jobs (/api/status, /api/jobs/...).

Kept apart from dashboard/api.py, which is the core every area's routes import:
the core stays free of the dashboard's models and services, so importing it
never pulls in an area's code, and this router is registered in dashboard/urls.py
like any other area's.
"""
from django.conf import settings
from django.utils.translation import gettext as _
from ninja import Query, Status

from dashboard import services
from dashboard.celery import app as celery_app
from dashboard.api import ApiError, ErrorOut, RowId, operator, router
from dashboard.models import Job
from dashboard.schemas import JobOut, StatusOut
from monitoring.liveness import offline_hosts

api = router("status and jobs")


@api.get("status", response=StatusOut, exclude_unset=True, url_name="api_status")
def status(request, workers: bool = Query(False)):
    """Redis, the monitor processes and (with ?workers=1) the Celery workers that answer a ping."""
    out = {"host": settings.HOST_NAME, "redis": {"ok": True, "error": None}, "monitors": [], "offline_hosts": [],
           "workers": None}
    error = services.redis_check()
    if error:
        out["redis"] = {"ok": False, "error": error}
        return out
    out["monitors"] = services.monitor_heartbeats()
    out["offline_hosts"] = sorted(offline_hosts())
    if workers:
        replies = celery_app.control.ping(timeout=1.0) or []
        out["workers"] = sorted(name for reply in replies for name in reply)
    return out


@api.post("jobs/worker-check", response={202: JobOut, 503: JobOut}, auth=operator, url_name="api_worker_check")
def worker_check(request):
    """Ask a worker to prove it runs tasks; 503 with the failed job when the broker does not answer."""
    job = services.job_enqueue_worker_check(user=request.user)
    return Status(503 if job.status == Job.Status.FAILED else 202, {"job": job.as_dict()})


@api.get("jobs/{job_id}", response={200: JobOut, 404: ErrorOut}, url_name="api_job")
def job_detail(request, job_id: RowId):
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        raise ApiError("not_found", _("No job #%(id)s.") % {"id": job_id}, 404)
    return {"job": job.as_dict()}
