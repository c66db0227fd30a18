"""Celery tasks of the model library: they take a row id and call a service.

Downloads, re-verify and imports run on the queue of the host that holds the
files (host.<name>). When a worker starts, it queues again whatever its host
was doing when the previous worker died (killed, host rebooted, panel restart
with the embedded Redis losing its queue): downloads resume with Range.

The services import this module to enqueue; a task imports the services when it
runs, so there is no import cycle.
"""
import logging
import socket

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings

logger = logging.getLogger(__name__)


def _worker(task):
    return task.request.hostname or socket.gethostname()


@shared_task(bind=True, name="inference.tasks.download_model")
def download_model(self, artifact_id):
    from inference.library import services

    services.model_download_run(artifact_id=artifact_id, worker=_worker(self))


@shared_task(bind=True, name="inference.tasks.reverify_model")
def reverify_model(self, artifact_id):
    from inference.library import services

    services.model_reverify_run(artifact_id=artifact_id, worker=_worker(self))


@shared_task(bind=True, name="inference.tasks.import_local_model")
def import_local_model(self, artifact_id):
    from inference.library import services

    services.model_import_run(artifact_id=artifact_id, worker=_worker(self))


@worker_ready.connect
def resume_interrupted_downloads(sender=None, **kwargs):
    from inference.library import services

    try:
        count = services.model_resume_interrupted(host=settings.HOST_NAME)
    except Exception:  # never stop a worker from starting over this
        logger.exception("could not look for interrupted downloads")
        return
    if count:
        logger.info("queued %d interrupted model job(s) of host %s again", count, settings.HOST_NAME)
