"""Host-side work for deployments, run by the worker on queue host.<name>.

Tasks take ids and call inference.deployments.services; the rows are the record.
The services import this module to enqueue, so a task imports the services when
it runs (no import cycle).
"""
import logging

from celery import shared_task
from celery.signals import worker_ready

logger = logging.getLogger(__name__)


@shared_task(name="inference.deployment_tasks.detect_runtime")
def detect_runtime(runtime_id):
    from inference.deployments import services as deployments

    deployments.runtime_detect(runtime_id=runtime_id)


@shared_task(name="inference.deployment_tasks.launch_deployment")
def launch_deployment(deployment_id):
    from inference.deployments import services as deployments

    deployments.deployment_start_process(deployment_id=deployment_id)


@shared_task(name="inference.deployment_tasks.stop_deployment")
def stop_deployment(deployment_id):
    from inference.deployments import services as deployments

    deployments.deployment_stop_process(deployment_id=deployment_id)


@shared_task(name="inference.deployment_tasks.install_runtime")
def install_runtime(runtime_id):
    from inference.deployments import installs

    installs.runtime_install_run(runtime_id=runtime_id)


@shared_task(name="inference.deployment_tasks.uninstall_runtime")
def uninstall_runtime(runtime_id):
    from inference.deployments import installs

    installs.runtime_uninstall_run(runtime_id=runtime_id)


@worker_ready.connect
def resume_interrupted_deployments(sender=None, **kwargs):
    """A worker starting on a host queues again the launches and stops its rows still wait for."""
    from django.conf import settings

    from inference.deployments import services as deployments

    try:
        counts = deployments.deployments_resume_interrupted(host=settings.HOST_NAME)
    except Exception:  # never stop a worker from starting over this
        logger.exception("could not look for interrupted launches and stops")
        return
    if any(counts.values()):
        logger.info("deployments of host %s: %s", settings.HOST_NAME, counts)
