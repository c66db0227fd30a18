"""Celery task of benchmark runs: takes the row's id, the service does the work.

Routed to the deployment's host queue (services.benchmark_start) so the load
generator runs next to the engine, as users would measure it. The services
import this module to enqueue, so the task imports the services when it runs
(no import cycle).
"""
import logging

from celery import shared_task
from celery.signals import worker_ready

logger = logging.getLogger(__name__)


@shared_task(bind=True, name="inference.benchmark_run", acks_late=False)
def benchmark_run(self, run_id):
    from inference.benchmarks import services as benchmark_runs

    try:
        benchmark_runs.benchmark_execute(run_id, worker=self.request.hostname or "")
    except Exception as exc:
        benchmark_runs.benchmark_fail_unexpected(run_id, exc)
        raise


@shared_task(bind=True, name="inference.experiment_run", acks_late=False)
def experiment_run(self, experiment_id):
    """Runs an experiment's unfinished steps on its host's worker (launch, measure, stop)."""
    from inference.benchmarks import experiments

    try:
        experiments.experiment_execute(experiment_id, worker=self.request.hostname or "")
    except Exception as exc:
        experiments.experiment_fail_unexpected(experiment_id, exc)
        raise


@worker_ready.connect
def resume_interrupted_experiments(sender=None, **kwargs):
    """A worker starting on a host picks up that host's experiments whose runner died."""
    from django.conf import settings

    from inference.benchmarks import experiments

    try:
        count = experiments.resume_interrupted(host=settings.HOST_NAME)
    except Exception:  # never stop a worker from starting over this
        logger.exception("could not look for interrupted experiments")
        return
    if count:
        logger.info("queued %d interrupted experiment(s) of host %s again", count, settings.HOST_NAME)


@worker_ready.connect
def sweep_interrupted_benchmarks(sender=None, **kwargs):
    """A worker starting on a host: runs whose worker died are marked interrupted, queued ones queued again."""
    from django.conf import settings

    from inference.benchmarks import services as benchmark_runs

    try:
        interrupted, requeued = benchmark_runs.runs_interrupted_sweep(host=settings.HOST_NAME)
    except Exception:  # never stop a worker from starting over this
        logger.exception("could not look for interrupted benchmark runs")
        return
    if interrupted or requeued:
        logger.info("benchmark runs of host %s: %d marked interrupted, %d queued again", settings.HOST_NAME,
                    interrupted, requeued)
