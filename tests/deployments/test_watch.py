"""The monitor's watch loop over Deployment rows, with real processes:
crash -> restart -> crash loop -> failed, re-adoption after the loop restarts,
port collisions, and the stop path leaving nothing behind."""
import os
import signal
import socket
import time

import psutil
import pytest
from django.conf import settings

from inference.deployments import services as svc
from inference.models import Deployment
from inference.deployments.supervisor import WatchConfig, group_members, port_is_free
from inference.deployments.watch import watch_deployments
from tests.deployments.helpers import fake_server, make_deployment, make_profile
from tests.helpers import pid_alive, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.django_db(transaction=True)]
HOST = settings.HOST_NAME
FAST = WatchConfig(max_failures=3, window_s=60, base_delay_s=0.2, max_delay_s=1)


def tick_until(watchers, predicate, timeout=30, config=FAST):
    """Tick like the monitor does (about 10 per second here) until predicate(row)."""
    messages = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        messages += watch_deployments(HOST, watchers, config)
        dep = Deployment.objects.get()
        if predicate(dep):
            return dep, messages
        time.sleep(0.1)
    raise AssertionError(f"timed out; last row: {Deployment.objects.values().get()}")


def launched(tmp_path, **profile_kw):
    profile = make_profile(host=HOST, runtime_path=fake_server(tmp_path), **profile_kw)
    dep = svc.deployment_start_process(deployment_id=make_deployment(profile).pk)
    assert dep.status == "starting" and dep.pid, (dep.failure, dep.hint)
    return dep


def test_a_crashing_engine_is_restarted_with_backoff_then_failed_as_a_crash_loop(tmp_path):
    dep = launched(tmp_path, env={"FAKE_MODE": "crash"})
    first_pid = dep.pid
    watchers = {}
    seen_status = []

    def record(d):
        if not seen_status or seen_status[-1] != d.status:
            seen_status.append(d.status)
        return d.status == "failed"

    dep, messages = tick_until(watchers, record)
    assert seen_status[0] in ("starting", "restarting") and "restarting" in seen_status
    assert seen_status[-1] == "failed"
    assert dep.restarts == 2  # crashed twice with a restart each, the third is the crash loop
    assert "3 failures" in dep.failure
    assert "the fake engine gives up" in dep.log_tail
    assert dep.hint
    phases = [p["phase"] for p in dep.phases]
    assert phases.count("crashed") == 2 and phases.count("restarted") == 2 and phases[-1] == "failed"
    assert dep.pid != first_pid  # it really was started again
    # Live messages carried the status changes and the log lines.
    assert any(m["status"] == "restarting" for m in messages)
    assert any("the fake engine gives up" in ln for m in messages for ln in m["lines"])
    assert messages[-1]["status"] == "failed" and messages[-1]["colour"] == "red"
    assert watchers == {}  # a failed deployment is no longer watched
    assert not pid_alive(dep.pid) or psutil.Process(dep.pid).status() == psutil.STATUS_ZOMBIE


def test_a_crash_is_noticed_within_two_seconds_at_the_monitors_one_second_tick(tmp_path):
    dep = launched(tmp_path)
    watchers = {}
    tick_until(watchers, lambda d: d.status == "ready")
    os.killpg(dep.pgid, signal.SIGKILL)
    killed_at = time.monotonic()
    config = WatchConfig(base_delay_s=30)
    while time.monotonic() - killed_at < 5:
        watch_deployments(HOST, watchers, config)
        if Deployment.objects.get().status == "restarting":
            break
        time.sleep(1.0)  # the monitor's cadence
    assert Deployment.objects.get().status == "restarting"
    assert time.monotonic() - killed_at < 2.0
    svc.deployment_stop(deployment=dep)
    svc.deployment_stop_process(deployment_id=dep.pk, grace_s=2)


def test_running_engines_are_readopted_when_the_watch_loop_restarts(tmp_path):
    dep = launched(tmp_path)
    watchers = {}
    dep, _ = tick_until(watchers, lambda d: d.status == "ready")
    pid, start_time = dep.pid, dep.start_time

    # The monitor restarts: new process, no watchers; the rows are all it has.
    fresh = {}
    messages = watch_deployments(HOST, fresh, FAST)
    dep = Deployment.objects.get()
    assert dep.status == "ready" and dep.pid == pid and dep.restarts == 0
    assert any(f"watching pid {pid}" in m["note"] for m in messages)

    # The engine died while the monitor was down: the next monitor treats it
    # as a crash and restarts it.
    os.killpg(dep.pgid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 5, "kill")
    later = {}
    messages = watch_deployments(HOST, later, FAST)
    assert any("treating it as a crash" in m["note"] for m in messages)
    dep, _ = tick_until(later, lambda d: d.status == "ready" and d.pid != pid)
    assert dep.restarts == 1

    # A PID that now belongs to another process (another start time) is not the engine.
    Deployment.objects.filter(pk=dep.pk).update(start_time=start_time)  # stale start time
    other = {}
    messages = watch_deployments(HOST, other, FAST)
    assert Deployment.objects.get().status == "restarting"
    # Clean up: the real engine (the row's start time was falsified) is stopped by its handle.
    Deployment.objects.filter(pk=dep.pk).update(start_time=dep.start_time)
    svc.deployment_stop(deployment=dep)
    svc.deployment_stop_process(deployment_id=dep.pk, grace_s=2)
    assert group_members(dep.pgid, dep.start_time) == []


def test_a_port_someone_else_holds_is_refused_with_a_message(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        profile = make_profile(host=HOST, runtime_path=fake_server(tmp_path), port=taken)
        dep = svc.deployment_start_process(deployment_id=make_deployment(profile).pk)
    assert dep.status == "failed" and dep.pid is None
    assert f"port {taken}" in dep.failure and "already in use" in dep.failure
    assert "Leave the port empty" in dep.hint


def test_an_automatic_port_skips_ports_promised_to_other_deployments(tmp_path):
    first = launched(tmp_path)
    profile2 = make_profile(host=HOST, runtime_path=fake_server(tmp_path), name="second")
    second = svc.deployment_start_process(deployment_id=make_deployment(profile2).pk)
    try:
        assert second.status == "starting" and second.port != first.port
    finally:
        for d in (first, second):
            svc.deployment_stop(deployment=d)
            svc.deployment_stop_process(deployment_id=d.pk, grace_s=2)
    assert port_is_free("127.0.0.1", first.port) and port_is_free("127.0.0.1", second.port)


def test_stop_wins_over_the_watch_loop_and_leaves_no_process(tmp_path):
    dep = launched(tmp_path)
    watchers = {}
    tick_until(watchers, lambda d: d.status == "ready")
    svc.deployment_stop(deployment=dep)
    assert Deployment.objects.get().status == "stopping"
    watch_deployments(HOST, watchers, FAST)  # the monitor must leave a stopping row alone
    assert watchers == {} and Deployment.objects.get().status == "stopping"
    dep = svc.deployment_stop_process(deployment_id=dep.pk, grace_s=2)
    assert dep.status == "stopped" and dep.phases[-1]["phase"] == "stopped"
    assert group_members(dep.pgid, dep.start_time) == []
    assert not any(p.info["pid"] == dep.pid for p in psutil.process_iter(["pid"])
                   if p.info["pid"] == dep.pid and p.status() != psutil.STATUS_ZOMBIE)
