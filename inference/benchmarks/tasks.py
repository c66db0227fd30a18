"""Celery task of benchmark runs: takes the row's id, the service does the work.

Routed to the deployment's host queue (benchmark_runs._enqueue) so the load
generator runs next to the engine, as users would measure it.
"""
from celery import shared_task

from inference.benchmarks import services as benchmark_runs


@shared_task(bind=True, name="inference.benchmark_run", acks_late=False)
def benchmark_run(self, run_id):
    try:
        benchmark_runs.benchmark_execute(run_id, worker=self.request.hostname or "")
    except Exception as exc:
        benchmark_runs.benchmark_fail_unexpected(run_id, exc)
        raise
