"""The Celery app. Tasks take ids and call services; rows are the record."""
import os

from celery import Celery

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
