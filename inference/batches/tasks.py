"""Celery tasks of batch jobs: they take a batch id and call a service.

A batch runs on the queue of its deployment's host (host.<name>). When a
worker starts, batches of its host whose runner died (SIGKILL, reboot, a
panel restart that lost the embedded Redis's queue) are queued again; the
new run sends only the lines without a recorded result.
"""
import asyncio
import logging
import socket

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings

logger = logging.getLogger(__name__)


@shared_task(bind=True, name="inference.tasks.run_batch")
def run_batch(self, batch_id):
    from inference.batches import services
    from inference.batches.runner import Runner
    from inference.models import Batch

    claim = services.claim_batch(batch_id, self.request.hostname or socket.gethostname())
    if claim is None:
        logger.info("batch %s: finished or run elsewhere; nothing to do", batch_id)
        return
    try:
        batch = Batch.objects.select_related("input_file", "output_file", "error_file").get(pk=batch_id)
        stop = services.owner_stop_reason(batch.user_id, batch.key_id)
        if stop:  # its key was revoked or its user disabled while it waited
            services.stop_for_owner(batch_id, stop)
            return
        if batch.status == Batch.Status.VALIDATING and not batch.cancel_requested:
            services.prepare_lines(batch)
            batch = Batch.objects.select_related("input_file", "output_file", "error_file").get(pk=batch_id)
        if batch.status == Batch.Status.VALIDATING or batch.cancel_requested:
            services.finish_cancelled(batch_id)
            return
        services.recover(batch)
        from django.utils import timezone

        Batch.objects.filter(pk=batch_id, claim=claim).update(run_started=timezone.now(),
                                                              run_base=batch.completed + batch.failed)
        runner = Runner(batch)
        asyncio.run(runner.run())
        if runner.stop_reason and not runner.lost:
            services.stop_for_owner(batch_id, runner.stop_reason)
        elif not runner.lost:
            services.finish(batch_id)
    except Exception as exc:
        logger.exception("batch %s failed", batch_id)
        services.fail(batch_id, f"The batch runner stopped: {exc!r}. Resume it to send the remaining lines.")


@worker_ready.connect
def resume_interrupted_batches(sender=None, **kwargs):
    from inference.batches import services

    try:
        count = services.resume_interrupted(host=settings.HOST_NAME)
    except Exception:  # never stop a worker from starting over this
        logger.exception("could not look for interrupted batches")
        return
    if count:
        logger.info("queued %d interrupted batch(es) of host %s again", count, settings.HOST_NAME)
