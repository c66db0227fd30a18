"""A job goes from the web through real Redis to a real Celery worker and back into its row."""
import logging
import threading
import time

import pytest
import redis
from django.conf import settings
from django.test import override_settings
from kombu.exceptions import OperationalError as BrokerError

from dashboard.models import Job
from tests.helpers import wait_until


def test_worker_check_runs_on_a_real_worker(client, operator, celery_worker):
    client.post("/login/", {"username": operator.username, "password": operator.plain_password})
    response = client.post("/api/jobs/worker-check")
    assert response.status_code == 202
    job_id = response.json()["job"]["id"]

    def finished():
        job = Job.objects.get(pk=job_id)
        return job if job.status in (Job.Status.SUCCEEDED, Job.Status.FAILED) else None

    job = wait_until(finished, 30, "the worker to run the job")
    assert job.status == Job.Status.SUCCEEDED, job.error
    assert job.worker == "test@testhost"
    assert job.result["pid"] == celery_worker.pid
    assert job.started and job.finished and job.started <= job.finished
    assert client.get(f"/api/jobs/{job_id}").json()["job"]["status"] == "succeeded"


def test_status_lists_the_live_worker(client, operator, celery_worker):
    client.post("/login/", {"username": operator.username, "password": operator.plain_password})
    status = client.get("/api/status?workers=1").json()
    assert status["redis"]["ok"] is True
    assert "test@testhost" in status["workers"]


def test_a_job_is_claimed_once(db):
    from dashboard import services

    job = Job.objects.create(kind=Job.Kind.WORKER_CHECK)
    assert services.job_claim(job.pk, "a") is True
    assert services.job_claim(job.pk, "b") is False
    assert Job.objects.get(pk=job.pk).worker == "a"


def test_redis_down_fails_the_job_with_a_message(client, operator, redis_server):
    client.post("/login/", {"username": operator.username, "password": operator.plain_password})
    dead = "redis://127.0.0.1:1/0"
    status = None
    with override_settings(REDIS_URL=dead):
        status = client.get("/api/status").json()
    assert status["redis"]["ok"] is False
    assert "redis://127.0.0.1:1/0 is not reachable" in status["redis"]["error"]


def test_enqueue_with_redis_down_records_a_failed_job_and_says_why(tmp_path):
    """Run in a fresh process so its Celery app knows only the dead broker."""
    from tests.dashboard.test_env import run_manage

    assert run_manage("migrate", "-v0", DATA_DIR=str(tmp_path)).returncode == 0
    script = (
        "from dashboard import services; from django.contrib.auth.models import User;"
        "u = User.objects.create(username='x');"
        "job = services.job_enqueue_worker_check(user=u);"
        "print(job.status); print(job.error)"
    )
    result = run_manage("shell", "-v", "0", "-c", script, DATA_DIR=str(tmp_path), REDIS_URL="redis://127.0.0.1:1/0")
    assert result.returncode == 0, result.stderr
    status, error = result.stdout.strip().splitlines()[:2]
    assert status == "failed"
    assert "Redis at redis://127.0.0.1:1/0 did not answer" in error


# --------------------------------------------------------------------------- the shared job runner (dashboard/jobs.py)
class RefusingTask:
    """A task whose broker does not answer, as Celery's apply_async raises it."""

    name = "tests.refusing"

    def __init__(self, error):
        self.error = error
        self.sent = 0

    def apply_async(self, args, queue):
        self.sent += 1
        raise self.error


class RecordingTask:
    name = "tests.recording"

    def __init__(self):
        self.sent = []

    def apply_async(self, args, queue):
        self.sent.append((args, queue))


@pytest.mark.parametrize("error", [
    BrokerError("[Errno 111] Connection refused"),
    redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused."),
    ConnectionRefusedError(111, "Connection refused"),
], ids=["kombu", "redis", "oserror"])
def test_broker_down_fails_the_row_with_the_reason_and_raises_nothing(db, error, django_capture_on_commit_callbacks):
    from dashboard import jobs, services

    job = Job.objects.create(kind=Job.Kind.WORKER_CHECK)
    task = RefusingTask(error)
    with django_capture_on_commit_callbacks(execute=True):
        jobs.enqueue(task, job.pk, queue="default", on_refused=services.job_fail)
    job.refresh_from_db()
    assert task.sent == 1
    assert job.status == Job.Status.FAILED and job.finished is not None
    assert job.error.startswith(f"Could not queue the job: Redis at {settings.REDIS_URL} did not answer (")
    assert "Connection refused" in job.error


def test_enqueue_sends_only_after_the_transaction_commits(db, django_capture_on_commit_callbacks):
    from dashboard import jobs, services

    job = Job.objects.create(kind=Job.Kind.WORKER_CHECK)
    task = RecordingTask()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        jobs.enqueue(task, job.pk, queue="host.testhost", on_refused=services.job_fail)
    assert task.sent == []  # a worker must never look for a row it cannot see yet
    for callback in callbacks:
        callback()
    assert task.sent == [((job.pk,), "host.testhost")]
    assert Job.objects.get(pk=job.pk).status == Job.Status.PENDING


def test_claim_is_exclusive(db):
    from dashboard import jobs

    job = Job.objects.create(kind=Job.Kind.WORKER_CHECK)
    pending = Job.objects.filter(pk=job.pk, status=Job.Status.PENDING)
    assert jobs.claim(pending, status=Job.Status.RUNNING, worker="a") is True
    assert jobs.claim(pending, status=Job.Status.RUNNING, worker="b") is False
    assert jobs.claim(Job.objects.filter(pk=job.pk + 1000, status=Job.Status.PENDING), worker="c") is False
    job.refresh_from_db()
    assert job.status == Job.Status.RUNNING and job.worker == "a"


def test_publish_reaches_the_live_group(redis_clean):
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from dashboard import jobs
    from monitoring.consumers import LIVE_GROUP

    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(LIVE_GROUP, channel)
    jobs.publish({"type": "download", "id": 7, "percent": 50})
    message = async_to_sync(layer.receive)(channel)
    assert message == {"type": "live.message", "payload": {"type": "download", "id": 7, "percent": 50}}


def test_publish_with_the_channel_layer_down_logs_and_does_not_raise(caplog):
    from dashboard import jobs

    dead = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                        "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]}}}
    with override_settings(CHANNEL_LAYERS=dead), caplog.at_level(logging.WARNING, logger="dashboard.jobs"):
        started = time.monotonic()
        jobs.publish({"type": "benchmark", "id": 3})
    assert time.monotonic() - started < 10
    assert "live benchmark message not sent" in caplog.text


def test_run_with_progress_pushes_while_the_work_runs_and_returns_its_value():
    from dashboard import jobs

    cancel = threading.Event()
    pushes = []

    def work():
        assert cancel.wait(10), "push never set the cancel event"
        return "stopped"

    def push():  # what a row's cancel flag does: set the Event the work polls
        pushes.append(threading.current_thread())
        if len(pushes) == 3:
            cancel.set()

    assert jobs.run_with_progress(work, push=push, every=0.01, name="test-work") == "stopped"
    assert len(pushes) >= 3 and set(pushes) == {threading.current_thread()}


def test_run_with_progress_raises_what_the_work_raised():
    from dashboard import jobs

    def work():
        raise ValueError("disk full")

    with pytest.raises(ValueError, match="disk full"):
        jobs.run_with_progress(work, push=lambda: None, every=0.01, name="test-work")
