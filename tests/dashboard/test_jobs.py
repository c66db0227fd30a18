"""A job goes from the web through real Redis to a real Celery worker and back into its row."""
from django.test import override_settings

from dashboard.models import Job
from tests.conftest import wait_until


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
