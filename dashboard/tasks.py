"""Celery task of the dashboard: the worker check.

Tasks take a row id and call a service. Services import their tasks at module
level (to enqueue them), so a task imports its service when it runs: no cycle.
"""
import os
import platform
import socket

import celery
from celery import shared_task
from celery.signals import worker_ready


@shared_task(bind=True, name="dashboard.tasks.run_worker_check")
def run_worker_check(self, job_id):
    from dashboard import services

    worker = self.request.hostname or socket.gethostname()
    if not services.job_claim(job_id, worker):
        return
    services.job_succeed(
        job_id,
        {
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "queue": (self.request.delivery_info or {}).get("routing_key", ""),
            "python": platform.python_version(),
            "celery": celery.__version__,
        },
    )


@worker_ready.connect
def watch_redis_restarts(sender=None, **kwargs):
    """Sweep again from the rows when Redis restarts under a running worker (dashboard/recovery.py)."""
    from django.conf import settings

    from dashboard import recovery

    recovery.start_watch(settings.HOST_NAME)
