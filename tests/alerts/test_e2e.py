"""End to end, with real processes: the `monitor` command on the fake NVML and a
crashing engine, through a real Celery worker, to a loopback webhook receiver;
and a receiver that is down or slow does not delay the sampling loop."""
import hashlib
import hmac
import json
import os
import queue
import signal
import subprocess
import sys
import time

import pytest
from django.conf import settings

from inference.deployments import services as svc
from inference.models import Deployment
from monitoring.alerts.models import AlertChannel, AlertDelivery, AlertEvent, AlertRule, Severity
from tests.deployments.helpers import fake_server, make_deployment, make_profile
from tests.helpers import REPO, child_env, stop_group, wait_until

pytestmark = [pytest.mark.timeout(180), pytest.mark.django_db(transaction=True)]
SECRET = "e2e-webhook-secret"


def webhook_to(receiver):
    channel = AlertChannel(name="hook", kind="webhook")
    channel.url, channel.secret = receiver.url + "/kiln", SECRET
    channel.save()
    rule = AlertRule.objects.create(name="everything", min_severity=Severity.INFO, cooldown_s=0)
    rule.channels.set([channel])
    return channel


def next_of(receiver, kind, resolved=False, timeout=40):
    """The next signed webhook of that kind (others are skipped), its signature checked."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {kind} (resolved={resolved}) webhook within {timeout} s; "
                                 f"events: {list(AlertEvent.objects.values_list('kind', 'subject'))}")
        try:
            got = receiver.get(timeout=left)
        except queue.Empty:
            continue
        ts = got.headers["x-kiln-timestamp"]
        expected = "sha256=" + hmac.new(SECRET.encode(), f"{ts}.".encode() + got.body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(got.headers["x-kiln-signature"], expected)
        body = got.json()
        if body["kind"] == kind and body["resolved"] == resolved:
            return body


def start_monitor(tmp_path, control, interval="1", **env):
    log = tmp_path / "monitor.log"
    process = subprocess.Popen(
        [sys.executable, "manage.py", "monitor", "--interval", interval, "--no-history"], cwd=REPO,
        env=child_env(KILN_NVML_LIB="tests.fakenvml:controlled", KILN_FAKE_NVML_CONTROL=str(control),
                      ALERT_SLOWDOWN_SECONDS="2", ALERT_PCIE_SECONDS="1", ALERT_DISK_FREE_GB="0",
                      ALERT_HOST_CHECK_SECONDS="3600", **env),
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    wait_until(lambda: b"sampling every" in log.read_bytes() or process.poll() is not None, 60, "monitor start")
    assert process.poll() is None, log.read_text()
    return process, log


def steer(control, **state):
    tmp = control.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, control)


def test_gpu_faults_from_the_monitor_reach_the_webhook(tmp_path, celery_worker, receiver):
    webhook_to(receiver)
    control = tmp_path / "nvml.json"
    steer(control)
    monitor, log = start_monitor(tmp_path, control)
    try:
        steer(control, xids=[[1, 79]])
        xid = next_of(receiver, "gpu_xid")
        assert xid["severity"] == "critical" and "fallen off the bus" in xid["subject"]
        assert xid["details"]["uuid"] == "GPU-ctl-v100-1" and xid["link"] == "/monitoring/"

        steer(control, xids=[[1, 79]], gpus={"0": {"clocks_event_bits": 0x40}})
        slow = next_of(receiver, "gpu_slowdown")
        assert "thermal (hardware)" in slow["subject"] and slow["details"]["lasting_s"] >= 2

        steer(control, xids=[[1, 79]], gpus={"0": {"clocks_event_bits": 0x1}, "1": {"pcie_width": 4}})
        assert next_of(receiver, "gpu_slowdown", resolved=True)["details"]["uuid"] == "GPU-ctl-h200-0"
        pcie = next_of(receiver, "gpu_pcie_downgraded")
        assert "x4" in pcie["subject"] and pcie["details"]["pcie_width_max"] == 16
        # Each delivery is in the history with its answer.
        wait_until(lambda: AlertDelivery.objects.filter(status="sent", response_code=200, attempts=1).count() >= 4,
                   10, "the deliveries recorded as sent")
    finally:
        stop_group(monitor)
    assert b"Traceback" not in log.read_bytes(), log.read_text()


def test_an_engine_that_crashes_is_alerted_and_resolved(tmp_path, celery_worker, receiver):
    webhook_to(receiver)
    control = tmp_path / "nvml.json"
    steer(control)
    profile = make_profile(host=settings.HOST_NAME, runtime_path=fake_server(tmp_path), name="qwen")
    dep = svc.deployment_start_process(deployment_id=make_deployment(profile).pk)
    monitor = None
    try:
        monitor, log = start_monitor(tmp_path, control)
        dep = wait_until(lambda: Deployment.objects.filter(pk=dep.pk, status="ready").first(), 60, "ready")
        os.killpg(dep.pgid, signal.SIGKILL)  # the engine dies
        killed = time.time()
        crash = next_of(receiver, "engine_crashed")
        assert crash["deployment_id"] == dep.pk and "qwen" in crash["subject"]
        assert crash["link"] == f"/deployments/{dep.pk}/"
        assert time.time() - killed < 10
        resolved = next_of(receiver, "engine_crashed", resolved=True)  # restarted and ready again
        assert resolved["deployment_id"] == dep.pk
    finally:
        if monitor is not None:
            stop_group(monitor)
        dep.refresh_from_db()
        if dep.pgid:
            try:
                os.killpg(dep.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        Deployment.objects.filter(pk=dep.pk).update(status="stopped")


@pytest.mark.parametrize("mode", ["slow", "down"])
def test_a_slow_or_dead_receiver_does_not_delay_sampling(transactional_db, redis_clean, receiver, mode):
    """The monitor's loop at 4 Hz raises an Xid every tick while the alert thread
    delivers to a receiver that takes 3 s to answer (or refuses connections):
    every tick still comes on time."""
    import asyncio

    from channels.layers import InMemoryChannelLayer

    from monitoring.alerts import events
    from monitoring.alerts.checks import HostAgent
    from monitoring.nvml import Nvml
    from monitoring.sampler import Monitor
    from tests.fakenvml import FakeGpu, FakeNvml

    receiver.delay_s = 3.0
    channel = webhook_to(receiver)
    if mode == "down":
        channel.url = "http://127.0.0.1:9/refused"
        channel.save()
    fake = FakeNvml([FakeGpu(uuid="GPU-a")])
    nvml = Nvml(lib=fake)
    nvml.init()
    ticks = []

    def on_tick(message):
        ticks.append(time.monotonic())
        fake.queue_xid(0, 40 + len(ticks))  # a new incident every tick

    agent = HostAgent("testhost", every_s=0.1, checks_every_s=3600)
    agent.start()
    try:
        monitor = Monitor(nvml=nvml, host="testhost", interval=0.25, layer=InMemoryChannelLayer(),
                          record_history=False, targets=[], on_tick=on_tick)
        asyncio.run(monitor.run(count=40))
    finally:
        events.drain()
        agent.stop()
        agent.join(15)
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert len(ticks) == 40
    assert max(gaps) < 0.25 * 1.6, f"a tick came late: {max(gaps):.3f} s"
    attempted = AlertDelivery.objects.exclude(attempts=0).count()
    assert attempted >= 1  # the receiver really was being called meanwhile
    assert AlertEvent.objects.filter(kind="gpu_xid").count() >= 35  # the monitor kept raising
