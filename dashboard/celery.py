"""The Celery app. Tasks take ids and call services; rows are the record."""
import os

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

app = Celery("dashboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
# dashboard.tasks, then each inference area's tasks module.
app.autodiscover_tasks()
app.autodiscover_tasks(["inference.library", "inference.deployments", "inference.benchmarks", "monitoring.alerts",
                        "inference.batches"])


def host_queue(host_name):
    """The queue whose worker runs on that GPU host (launch, stop, downloads there)."""
    return f"host.{host_name}"


@worker_init.connect
def _refuse_unmigrated_database(**kwargs):
    """Before the pool starts and worker_ready resumes interrupted rows: a worker on
    an unmigrated database would fail every task on a missing table or column."""
    from dashboard.migrations_check import refuse_if_unmigrated

    refuse_if_unmigrated("the Celery worker")
