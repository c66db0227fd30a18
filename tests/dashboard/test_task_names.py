"""Celery task names are part of the message format: a task queued before an
upgrade carries its name, and the worker after the upgrade must still know it.
The names are pinned with name=, so moving a module never renames a task."""
from dashboard.celery import app
from dashboard.models import Job
from tests.helpers import wait_until

# Every name a released Kiln has put on the queue. Never remove one: add new names.
PINNED = {
    "dashboard.tasks.run_worker_check",
    "inference.tasks.download_model",
    "inference.tasks.reverify_model",
    "inference.tasks.import_local_model",
    "inference.deployment_tasks.detect_runtime",
    "inference.deployment_tasks.launch_deployment",
    "inference.deployment_tasks.stop_deployment",
    "inference.deployment_tasks.install_runtime",
    "inference.deployment_tasks.uninstall_runtime",
    "inference.benchmark_run",
    "monitoring.alerts.deliver",
    "inference.tasks.run_batch",
    "inference.experiment_run",
}


def test_every_released_task_name_is_still_registered():
    app.loader.import_default_modules()
    registered = {name for name in app.tasks if not name.startswith("celery.")}
    assert PINNED <= registered, f"missing: {sorted(PINNED - registered)}"


def test_messages_sent_with_the_old_names_still_run(celery_worker, tmp_path):
    """Enqueue by name only (as a message queued by the old code would arrive)."""
    from django.conf import settings

    from inference.models import EngineRuntime

    job = Job.objects.create(kind=Job.Kind.WORKER_CHECK)
    app.send_task("dashboard.tasks.run_worker_check", args=[job.pk], queue="default")

    runtime = EngineRuntime.objects.create(host=settings.HOST_NAME, name="missing", engine="llamacpp",
                                           kind="executable", path=str(tmp_path / "no-such-llama-server"))
    app.send_task("inference.deployment_tasks.detect_runtime", args=[runtime.pk], queue=f"host.{settings.HOST_NAME}")

    done = wait_until(lambda: Job.objects.get(pk=job.pk).status == Job.Status.SUCCEEDED, 30, "the worker check to run")
    assert done
    runtime = wait_until(lambda: EngineRuntime.objects.filter(pk=runtime.pk).exclude(detected_at=None).first(), 30,
                         "the runtime detection to run")
    assert runtime.detect_status == EngineRuntime.DetectStatus.FAILED
