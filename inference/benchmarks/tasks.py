"""Celery task of benchmark runs: takes the row's id, the service does the work.

Routed to the deployment's host queue (services.benchmark_start) so the load
generator runs next to the engine, as users would measure it. The services
import this module to enqueue, so the task imports the services when it runs
(no import cycle).
"""
from celery import shared_task


@shared_task(bind=True, name="inference.benchmark_run", acks_late=False)
def benchmark_run(self, run_id):
    from inference.benchmarks import services as benchmark_runs

    try:
        benchmark_runs.benchmark_execute(run_id, worker=self.request.hostname or "")
    except Exception as exc:
        benchmark_runs.benchmark_fail_unexpected(run_id, exc)
        raise
