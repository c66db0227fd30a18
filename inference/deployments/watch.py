"""The monitor's watch loop over this host's deployments.

`watch_deployments(host, watchers)` is one tick: it keeps one
supervisor.Watcher per starting / ready / restarting Deployment row, ticks
each (phase from the log, health, crash -> restart with backoff, crash loop ->
failed), persists the state on the row and returns the live messages to
publish ("deployment" type: status, phase, new log lines).

Decisions:
- Re-adoption: a row without a watcher (the monitor just started, or the
  launch task just spawned it) gets one built from the row: (pid, start
  time, pgid, log offset, watch state). If that process is gone -- or its
  PID now belongs to another program -- the first tick sees "not running"
  and treats it as a crash (restart with backoff, per the stored policy).
- Restarts happen here, in the monitor, not through a Celery task: the
  monitor runs on the engine's host already, a restart must not wait for a
  busy worker, and the backoff delay is measured here anyway.
- Every write is conditional on the row still being watched, so a stop
  request (status "stopping") always wins; the stop task kills whatever a
  racing restart started (it re-reads the row).
- Ticks run once a second, so a crash is seen within about one second.
"""
from __future__ import annotations

import asyncio
import logging
import time

from django.db import close_old_connections
from redis.exceptions import RedisError
from django.utils import timezone

from dashboard.outage import DB_UNREACHABLE, Outage
from inference.deployments import supervisor
from inference.deployments.services import (
    deployment_record_phase,
    handle_of,
    launch_dir_for,
    log_offset_of_latest_run,
    spawn_for,
)
from inference.engines import InvalidLaunch, get_engine
from inference.models import Deployment
from inference.preflight.services import record_capacity
from monitoring.alerts import hooks as alert_hooks

log = logging.getLogger(__name__)

MAX_LINES_PER_MESSAGE = 200


class _RecordingFollower(supervisor.LogFollower):
    """A LogFollower that also keeps the lines it handed out, for the live tail."""

    def __init__(self, path, offset=0):
        super().__init__(path, offset)
        self.fresh: list[str] = []
        self.fresh_from = self.offset  # byte offset where the fresh lines start

    def read_new(self, max_bytes=1024 * 1024):
        before = self.offset
        lines = super().read_new(max_bytes)
        if not self.fresh:
            self.fresh_from = before if self.offset >= before else 0
        self.fresh.extend(lines)
        return lines

    def take(self) -> tuple[list[str], int, int]:
        """(lines, from, to): the lines read since the last take and the byte
        range they came from, so a page that rendered part of it can skip that."""
        out, self.fresh = self.fresh, []
        start, self.fresh_from = self.fresh_from, self.offset
        return out, start, self.offset


def _new_watcher(dep: Deployment, config: supervisor.WatchConfig) -> supervisor.Watcher:
    engine = get_engine(dep.engine)
    handle = handle_of(dep) or supervisor.ProcessHandle(pid=0, start_time=-1, pgid=0, log_path=dep.log_path)
    state = supervisor.WatchState.from_dict(dep.watch_state) if dep.watch_state else None
    if state is not None:
        state.status = dep.status if dep.status in Deployment.WATCHED else state.status
    w = supervisor.Watcher(handle, engine, engine.health_url(dep.bind_host, dep.port or 0), state=state,
                           log_offset=dep.log_offset, config=config, api_key=dep.api_key,
                           launch_dir=str(launch_dir_for(dep.pk)),
                           check_port_owner=not (dep.profile and dep.profile.runtime.kind == "docker"))
    w.follower = _RecordingFollower(handle.log_path, dep.log_offset)
    return w


def message_for(dep: Deployment, lines=(), note="", log_range=(0, 0)) -> dict:
    return {
        "log_from": log_range[0], "log_to": log_range[1],
        "type": "deployment", "id": dep.pk, "name": dep.name, "host": dep.host,
        "status": dep.status, "status_label": dep.get_status_display(), "colour": dep.colour,
        "phase": dep.phase, "phases": dep.phases, "port": dep.port, "base_url": dep.base_url,
        "pid": dep.pid, "restarts": dep.restarts, "command": dep.command,
        # The live page fills these in without a reload (ISO 8601, UTC).
        "started": dep.started.isoformat() if dep.started else None,
        "ready_at": dep.ready_at.isoformat() if dep.ready_at else None,
        "failure": dep.failure, "hint": dep.hint, "lines": list(lines)[-MAX_LINES_PER_MESSAGE:], "note": note,
    }


def watch_deployments(host_name: str, watchers: dict, config: supervisor.WatchConfig | None = None) -> list[dict]:
    """One tick over the host's watched deployments; returns live messages."""
    config = config or supervisor.WatchConfig()
    close_old_connections()
    messages = []
    rows = list(Deployment.objects.filter(host=host_name, status__in=Deployment.WATCHED)
                .select_related("profile__runtime"))
    seen = set()
    for dep in rows:
        if dep.pid is None and dep.status == Deployment.Status.STARTING:
            continue  # the launch task is still spawning it
        seen.add(dep.pk)
        try:
            msg = _tick_one(dep, watchers, config)
        except DB_UNREACHABLE:
            raise  # not this row's fault: the whole tick waits for the database (run_watch_loop)
        except Exception:  # one broken row must not stop the others being watched
            log.exception("watching deployment %s failed", dep.pk)
            continue
        if msg:
            messages.append(msg)
    for pk in list(watchers):
        if pk not in seen:
            del watchers[pk]
    return messages


def _tick_one(dep: Deployment, watchers: dict, config) -> dict | None:
    note = ""
    w = watchers.get(dep.pk)
    if w is None:
        w = watchers[dep.pk] = _new_watcher(dep, config)
        if dep.pid:
            adopted = supervisor.adopt(dep.pid, dep.start_time, dep.pgid, dep.log_path)
            note = (f"watching pid {dep.pid}" if adopted else
                    f"pid {dep.pid} is gone (or belongs to another process now): treating it as a crash")
    before = (dep.status, dep.phase)
    actions = w.tick()
    alert_hooks.deployment_actions(dep, actions)  # crashed / failed / ready -> alerts, before the row writes
    fields: dict = {}
    now = time.time()
    for a in actions:
        if a.kind == "phase":
            fields["phase"] = a.phase
            deployment_record_phase(dep.pk, a.phase, now)
        elif a.kind == "ready":
            fields["ready_at"] = timezone.now()
            fields["failure"] = fields["hint"] = ""
        elif a.kind == "crashed":
            fields["failure"] = a.reason
            fields["hint"] = a.hint or f"The engine exited; restarting in {a.delay_s:g} s."
            fields["restarts"] = dep.restarts + 1
            deployment_record_phase(dep.pk, "crashed", now)
        elif a.kind == "restart":
            result = _restart(dep, w, a)
            if result is None:  # a stop request won
                watchers.pop(dep.pk, None)
                return None
            fields.update(result)
        elif a.kind == "failed":
            fields.update(failure=a.reason, hint=a.hint, log_tail="\n".join(a.log_tail), stopped=timezone.now(),
                          phase="failed")
            deployment_record_phase(dep.pk, "failed", now)
            if w.handle.pid:  # nothing of it may linger (a child of a dead leader)
                supervisor.stop(w.handle, grace_s=2, launch_dir=w.launch_dir)
            supervisor.clean_launch_dir(w.launch_dir)
        elif a.kind == "stopped":  # stopped from outside Kiln: no restart
            fields.update(hint=a.hint, stopped=timezone.now(), phase="stopped", stop_requested=True)
            deployment_record_phase(dep.pk, "stopped", now)
            if w.handle.pid:
                supervisor.stop(w.handle, grace_s=2, launch_dir=w.launch_dir)
            supervisor.clean_launch_dir(w.launch_dir)
    status = {supervisor.STARTING: Deployment.Status.STARTING, supervisor.READY: Deployment.Status.READY,
              supervisor.RESTARTING: Deployment.Status.RESTARTING,
              supervisor.FAILED: Deployment.Status.FAILED,
              supervisor.STOPPED: Deployment.Status.STOPPED}.get(w.state.status, dep.status)
    fields.update(status=status, watch_state=w.state.to_dict(), log_offset=w.follower.offset)
    wrote = Deployment.objects.filter(pk=dep.pk, status__in=Deployment.WATCHED).update(**fields)
    if not wrote:
        watchers.pop(dep.pk, None)
        return None
    if status not in Deployment.WATCHED:
        watchers.pop(dep.pk, None)
    lines, log_from, log_to = w.follower.take()
    if lines and dep.engine in ("vllm", "llamacpp"):
        # vLLM prints what it really allocated (weights GiB, KV cache GiB and tokens,
        # maximum concurrency) while it starts, llama-server its buffer sizes: keep them beside the estimate.
        record_capacity(dep, lines)
    dep.refresh_from_db()
    alert_hooks.deployment_watched(dep, w.state, actions)  # unhealthy for N s, a failed restart -> alerts
    if lines or note or (dep.status, dep.phase) != before or actions:
        return message_for(dep, lines, note, (log_from, log_to))
    return None


def _restart(dep: Deployment, w: supervisor.Watcher, action) -> dict | None:
    claimed = Deployment.objects.filter(pk=dep.pk, status=Deployment.Status.RESTARTING).update(
        status=Deployment.Status.STARTING)
    if not claimed:
        return None
    dep.refresh_from_db()
    try:
        launched = spawn_for(dep, keep_port=not action.new_port)
    except (InvalidLaunch, supervisor.SupervisorError, OSError, ValueError) as exc:
        w.state.status = supervisor.FAILED
        return {"failure": f"Could not restart the engine: {exc}", "stopped": timezone.now(), "phase": "failed"}
    h = launched.handle
    wrote = Deployment.objects.filter(pk=dep.pk, status=Deployment.Status.STARTING).update(
        pid=h.pid, start_time=h.start_time, pgid=h.pgid, port=launched.port, argv=launched.argv,
        command=launched.command, bind_host=dep.bind_host, api_key=dep.api_key)
    if not wrote:  # stopped while we were spawning
        supervisor.stop(h, grace_s=5)
        return None
    w.restarted(h)
    w.health_url = w.engine.health_url(dep.bind_host, launched.port)
    w.api_key = dep.api_key
    if not isinstance(w.follower, _RecordingFollower):
        w.follower = _RecordingFollower(h.log_path, log_offset_of_latest_run(h.log_path))
    deployment_record_phase(dep.pk, "restarted")
    return {"phase": "starting", "started": timezone.now()}


async def run_watch_loop(layer, host_name: str, stop: asyncio.Event, interval: float = 1.0, group: str = "live"):
    """The monitor's task: tick every `interval` seconds and publish what changed."""
    watchers: dict = {}
    next_tick = time.monotonic()
    outage = Outage("the database (deployment watch)", "the engines are left running as they are")
    while not stop.is_set():
        try:
            messages = await asyncio.to_thread(watch_deployments, host_name, watchers)
            outage.over()
        except DB_UNREACHABLE as exc:
            # PostgreSQL away (a cut link): nothing is marked or restarted for it; the
            # watchers and their engines stay as they are, and the next ticks retry, spaced out.
            messages = []
            next_tick = time.monotonic() + outage.failed(exc) - interval
        except Exception:
            log.exception("deployment watch tick failed")
            messages = []
        for m in messages:
            try:
                await layer.group_send(group, {"type": "live.message", "payload": m})
            except (RedisError, OSError) as exc:
                log.warning("deployment watch: cannot publish to Redis (%s); the row has the news", exc)
                break
        next_tick += interval
        try:
            await asyncio.wait_for(stop.wait(), timeout=max(0.0, next_tick - time.monotonic()))
        except asyncio.TimeoutError:
            pass
