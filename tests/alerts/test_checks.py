"""Host checks (disk, worker for the host queue, silent monitors), the watch-loop and library hooks."""
import json
import time
from types import SimpleNamespace

import pytest
import redis as redis_lib
from django.conf import settings

from dashboard.services import MONITOR_HEARTBEAT_KEY
from monitoring.alerts import checks, events, hooks
from monitoring.alerts.models import AlertEvent

pytestmark = pytest.mark.django_db(transaction=True)


def kinds():
    return list(AlertEvent.objects.order_by("pk").values_list("kind", "resolved"))


def test_disk_low_opens_and_clears(tmp_path):
    checks.check_disk("gpu1", {"models": tmp_path}, free_gb=10**9)  # more than any disk has
    e = AlertEvent.objects.get()
    assert e.kind == "disk_low" and e.is_open and str(tmp_path) in e.subject and e.link == "/models/"
    checks.check_disk("gpu1", {"models": tmp_path}, free_gb=10**9)
    assert AlertEvent.objects.count() == 1  # one incident
    checks.check_disk("gpu1", {"models": tmp_path}, free_gb=0)
    assert kinds() == [("disk_low", False), ("disk_low", True)]


def test_the_disk_low_alert_counts_free_space_in_gib_and_says_so(tmp_path, monkeypatch):
    """free / 1024**3 is GiB: the subject says GiB (it said GB), opening and clearing."""
    free = 5 * 1024**3 + 512 * 1024**2  # 5.5 GiB (5.9 GB)
    monkeypatch.setattr(checks.shutil, "disk_usage", lambda folder: SimpleNamespace(total=free * 2, used=free, free=free))
    checks.check_disk("gpu1", {"models": tmp_path}, free_gb=10)
    opened = AlertEvent.objects.get()
    assert "Only 5.5 GiB free in the models folder on gpu1" in opened.subject, opened.subject
    assert " GB" not in opened.subject and opened.details["free_gb"] == 5.5
    checks.check_disk("gpu1", {"models": tmp_path}, free_gb=1)
    cleared = AlertEvent.objects.filter(resolved=True).get()
    assert cleared.subject.endswith("is back to 5.5 GiB") and " GB" not in cleared.subject, cleared.subject


def test_no_worker_for_the_host_queue_then_one(redis_clean):
    checks.check_worker("gpu9", workers_fn=lambda q: [])
    e = AlertEvent.objects.get()
    assert e.kind == "no_worker" and "host.gpu9" in e.subject and e.severity == 30
    checks.check_worker("gpu9", workers_fn=lambda q: None)  # broker unreachable: no verdict
    checks.check_worker("gpu9", workers_fn=lambda q: ["w@gpu9"])
    assert kinds() == [("no_worker", False), ("no_worker", True)]


def test_workers_for_queue_asks_the_real_worker(celery_worker):
    host_queue = f"host.{settings.HOST_NAME}"
    found = checks.workers_for_queue(host_queue, timeout=5)
    assert found == [f"test@{settings.HOST_NAME}"]
    assert checks.workers_for_queue("host.nowhere", timeout=2) == []


def test_a_silent_monitor_is_a_host_offline_alert_and_clears_when_it_beats(redis_clean):
    client = redis_lib.Redis.from_url(redis_clean)
    beat = {"host": "gpu2", "time": time.time()}
    client.set(MONITOR_HEARTBEAT_KEY.format(host="gpu2"), json.dumps(beat), ex=5)
    checks.check_monitors(client, silent_s=30)
    assert kinds() == []  # beating
    client.delete(MONITOR_HEARTBEAT_KEY.format(host="gpu2"))
    client.hset(checks.KNOWN_HOSTS_KEY, "gpu2", time.time() - 60)  # last seen a minute ago
    checks.check_monitors(client, silent_s=30)
    e = AlertEvent.objects.get()
    assert e.kind == "host_offline" and e.host == "gpu2" and "silent" in e.subject
    client.set(MONITOR_HEARTBEAT_KEY.format(host="gpu2"), json.dumps({**beat, "time": time.time()}), ex=5)
    checks.check_monitors(client, silent_s=30)
    assert kinds() == [("host_offline", False), ("host_offline", True)]


def state(status, unhealthy=0):
    return SimpleNamespace(status=status, unhealthy_ticks=unhealthy)


def action(kind, **kw):
    return SimpleNamespace(kind=kind, reason=kw.get("reason", ""), hint=kw.get("hint", ""), delay_s=2.0)


def test_watch_hook_crash_failed_unhealthy_and_ready(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(hooks.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(hooks.conf, "UNHEALTHY_S", 20.0)
    dep = SimpleNamespace(pk=5, name="qwen", host="gpu1", status="restarting", failure="", hint="")
    hooks.deployment_actions(dep, [action("crashed", reason="exited", hint="oom?")])
    hooks.deployment_watched(dep, state("restarting"), [action("crashed", reason="exited", hint="oom?")])
    events.drain()
    crash = AlertEvent.objects.get()
    assert crash.kind == "engine_crashed" and crash.details["hint"] == "oom?" and crash.link == "/deployments/5/"
    dep.status = "ready"
    clock[0] += 5
    hooks.deployment_actions(dep, [action("ready")])
    hooks.deployment_watched(dep, state("ready"), [action("ready")])
    events.drain()
    assert kinds() == [("engine_crashed", False), ("engine_crashed", True)]
    # Failing health checks for longer than UNHEALTHY_S.
    for _ in range(25):
        clock[0] += 1
        hooks.deployment_watched(dep, state("ready", unhealthy=1), [])
    events.drain()
    assert kinds()[-1] == ("deployment_unhealthy", False)
    hooks.deployment_watched(dep, state("ready", unhealthy=0), [])
    events.drain()
    assert kinds()[-1] == ("deployment_unhealthy", True)
    # A restart that could not start the engine.
    dep.status, dep.failure = "failed", "Could not restart the engine: port 8003 is already in use"
    hooks.deployment_watched(dep, state("failed"), [])
    events.drain()
    last = AlertEvent.objects.order_by("pk").last()
    assert last.kind == "engine_failed" and "8003" in last.subject


def test_reverify_that_finds_a_changed_file_raises_verify_failed(tmp_path):
    from inference.library import services
    from inference.models import ModelArtifact

    (tmp_path / "model.gguf").write_bytes(b"not what was downloaded")
    artifact = ModelArtifact.objects.create(
        name="tiny", source="local", host=settings.HOST_NAME, path=str(tmp_path / "model.gguf"),
        folder=str(tmp_path), status="queued", job="verify", files=[{"path": "model.gguf", "size": 23}],
        recorded_hashes={"model.gguf": "0" * 64})
    services.model_reverify_run(artifact_id=artifact.pk, worker="test")
    artifact.refresh_from_db()
    assert artifact.status == "failed"
    e = AlertEvent.objects.get()
    assert e.kind == "verify_failed" and "tiny" in e.subject and e.link == f"/models/{artifact.pk}/"
    assert e.details["artifact_id"] == artifact.pk
