"""Start, watch, stop and re-adopt engine processes. Plain Python, Linux.

An engine runs detached: its own session and process group (so it outlives a
restart of the panel and can be stopped as a whole, grandchildren included),
an argv list (never a shell), stdout+stderr appended to its log file.

A process is identified by (pid, start time): the start time is field 22 of
/proc/<pid>/stat, in clock ticks since boot. A PID that the kernel gave to an
unrelated process after the engine died has another start time, so it is never
mistaken for the engine -- neither when re-adopting nor when stopping.

The monitor calls Watcher.tick() about once a second; watch_step() is the pure
decision behind it (phase from the log, ready from health, crash -> restart
with exponential backoff, crash loop -> failed), so the caller only persists
WatchState and executes the returned actions.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from inference.engines.base import gettext_noop

# --------------------------------------------------------------------------- errors


class SupervisorError(Exception):
    pass


class SpawnError(SupervisorError):
    pass


class PortUnavailable(SupervisorError):
    pass


# --------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class ProcessHandle:
    pid: int
    start_time: int  # /proc/<pid>/stat starttime (clock ticks since boot)
    pgid: int
    log_path: str = ""


def _read_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, pgid, starttime) of a process, or None if there is none."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            data = f.read().decode("ascii", "replace")
    except (OSError, ValueError):
        return None
    # The command name (field 2) is in parentheses and may itself contain
    # spaces or parentheses, so split after the last ")".
    rest = data[data.rfind(")") + 2:].split()
    try:
        return rest[0], int(rest[2]), int(rest[19])
    except (IndexError, ValueError):
        return None


def process_start_time(pid: int) -> int | None:
    st = _read_stat(pid)
    return st[2] if st else None


def is_running(pid: int, start_time: int) -> bool:
    """True if `pid` is alive and is the very process that started at
    `start_time`. A zombie (exited, not yet reaped) counts as not running."""
    st = _read_stat(pid)
    return bool(st) and st[0] not in ("Z", "X") and st[2] == int(start_time)


def group_members(pgid: int, not_before: int = 0) -> list[int]:
    """Live processes of a process group that started at or after
    `not_before` (older ones can't belong to the engine: pgid reuse guard)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _read_stat(int(entry))
        if st and st[1] == pgid and st[0] not in ("Z", "X") and st[2] >= not_before:
            out.append(int(entry))
    return sorted(out)


# Exit codes of engines this process started (the reaper thread fills it).
exit_codes: dict[int, int] = {}


def _reap(proc: subprocess.Popen) -> None:
    # Without a wait() the exited engine stays a zombie of the spawning
    # process (the Celery worker) forever.
    exit_codes[proc.pid] = proc.wait()


def spawn(argv: list[str], env: dict[str, str] | None, log_path: str | os.PathLike,
          cwd: str | os.PathLike | None = None) -> ProcessHandle:
    """Start `argv` detached, output appended to `log_path`; return its handle."""
    if not isinstance(argv, (list, tuple)) or not argv or not all(isinstance(a, str) for a in argv):
        raise SpawnError("the command must be a non-empty list of strings")
    program = argv[0]
    if "/" in program:
        if not os.access(program, os.X_OK) or os.path.isdir(program):
            raise SpawnError(f"{program} does not exist or is not executable; check the runtime's path")
    else:
        import shutil
        search = (env or os.environ).get("PATH", os.defpath)
        if not shutil.which(program, path=search):
            raise SpawnError(f"{program} is not on PATH; register the runtime with its full path")
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if cwd is not None and not Path(cwd).is_dir():
        raise SpawnError(f"working directory {cwd} does not exist")
    with open(log_path, "ab", buffering=0) as log:
        log.write(f"--- kiln: starting {Path(program).name} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        try:
            proc = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=cwd, env=env, start_new_session=True, close_fds=True,
            )
        except OSError as exc:
            raise SpawnError(f"could not start {program}: {exc.strerror or exc}") from exc
    threading.Thread(target=_reap, args=(proc,), daemon=True, name=f"reap-{proc.pid}").start()
    start = process_start_time(proc.pid)
    if start is None:  # exited (and was reaped) within microseconds
        start = -1
    return ProcessHandle(pid=proc.pid, start_time=start, pgid=proc.pid, log_path=str(log_path))


def adopt(pid: int, start_time: int, pgid: int | None = None, log_path: str = "") -> ProcessHandle | None:
    """Re-create the handle of an engine recorded before the panel restarted;
    None if that process is gone (or its PID now belongs to another one)."""
    if not pid or start_time is None or not is_running(pid, start_time):
        return None
    return ProcessHandle(pid=int(pid), start_time=int(start_time), pgid=int(pgid or pid), log_path=log_path)


@dataclass
class StopResult:
    was_running: bool
    killed: bool  # SIGKILL was needed after the grace period
    survivors: list[int] = field(default_factory=list)  # non-empty = something could not be stopped


def _signal_group(handle: ProcessHandle, sig: int) -> None:
    if is_running(handle.pid, handle.start_time):
        try:
            os.killpg(handle.pgid, sig)
            return
        except ProcessLookupError:
            pass
        except PermissionError:
            pass
    # The leader is gone: signal what is left of its group one by one, only
    # processes that started after it (a reused pgid is someone else's).
    for pid in group_members(handle.pgid, handle.start_time):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop(handle: ProcessHandle, grace_s: float = 10.0, kill_wait_s: float = 5.0, launch_dir: str = "") -> StopResult:
    """SIGTERM the engine's process group, SIGKILL after `grace_s`, wait.

    Returns what was left; an empty `survivors` means no process of the
    engine (children and grandchildren included) survived. With `launch_dir`,
    processes that carry that launch's marker but left the group are ended too.
    """
    was_running = is_running(handle.pid, handle.start_time)
    if launch_dir:
        stray = [p for p in marked_processes(launch_dir) if p not in group_members(handle.pgid, handle.start_time)]
        if stray:
            end_processes(stray, grace_s=min(grace_s, 5.0))
    if not was_running and not group_members(handle.pgid, handle.start_time):
        return StopResult(was_running=False, killed=False)
    _signal_group(handle, signal.SIGTERM)
    if _wait_group_gone(handle, grace_s):
        return StopResult(was_running=was_running, killed=False)
    _signal_group(handle, signal.SIGKILL)
    _wait_group_gone(handle, kill_wait_s)
    left = [p for p in group_members(handle.pgid, handle.start_time)]
    if is_running(handle.pid, handle.start_time) and handle.pid not in left:
        left.insert(0, handle.pid)
    return StopResult(was_running=was_running, killed=True, survivors=left)


def _wait_group_gone(handle: ProcessHandle, timeout: float) -> bool:
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        if not is_running(handle.pid, handle.start_time) and not group_members(handle.pgid, handle.start_time):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


# --------------------------------------------------------------------------- per-launch directories

# Every process an engine starts inherits this variable, so the engine's
# helpers (vLLM's EngineCore and resource tracker) can be found by it even when
# the API server that started them was killed and they were orphaned.
LAUNCH_MARKER = "KILN_LAUNCH_DIR"
# A Unix socket path holds at most 107 bytes and vLLM appends "/<uuid4>" (37)
# to its RPC base path: a longer launch directory is reached through a short link.
MAX_LAUNCH_DIR_CHARS = 48


def prepare_launch_dir(launch_dir: str | os.PathLike) -> str:
    """Create a launch's own directory (under DATA_DIR) and return the path to
    hand to the engine: the directory itself, or a short link to it in the
    temp dir when the real path is too long for a socket path."""
    real = Path(launch_dir)
    real.mkdir(parents=True, exist_ok=True)
    if len(str(real)) <= MAX_LAUNCH_DIR_CHARS:
        return str(real)
    import hashlib
    import tempfile

    link = Path(tempfile.gettempdir()) / ("kiln-" + hashlib.sha1(str(real.resolve()).encode()).hexdigest()[:12])
    if link.is_symlink() and os.readlink(link) != str(real.resolve()):
        link.unlink()
    if not link.is_symlink():
        link.symlink_to(real.resolve(), target_is_directory=True)
    return str(link)


def clean_launch_dir(launch_dir: str | os.PathLike) -> None:
    """Remove a launch's directory and its short link (after the engine stopped)."""
    import hashlib
    import shutil
    import tempfile

    if not launch_dir or not str(launch_dir).strip():
        return  # never Path("") == the working directory
    real = Path(launch_dir)
    link = Path(tempfile.gettempdir()) / ("kiln-" + hashlib.sha1(str(real.resolve()).encode()).hexdigest()[:12])
    if link.is_symlink():
        link.unlink()
    shutil.rmtree(real, ignore_errors=True)


def marked_processes(launch_dir: str) -> list[int]:
    """Live processes whose environment carries this launch's marker."""
    needle = f"{LAUNCH_MARKER}={launch_dir}\0".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read() + b"\0"
        except OSError:
            continue
        if needle in env:
            st = _read_stat(int(entry))
            if st and st[0] not in ("Z", "X"):
                out.append(int(entry))
    return sorted(out)


def listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on TCP `port` (any address), from /proc/net/tcp{,6}."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for row in f:
                    cols = row.split()
                    if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == int(port):
                        found.add(cols[9])
        except (OSError, ValueError):
            continue
    return found


def holds_socket(pids, inodes: set[str]) -> bool:
    """Whether one of `pids` has one of the socket `inodes` open."""
    wanted = {f"socket:[{i}]" for i in inodes}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{int(pid)}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    return True
            except OSError:
                continue
    return False


def process_name(pid: int) -> str:
    """What `ps` shows for a process: its (possibly retitled) command line."""
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()[:120]


def end_processes(pids: list[int], grace_s: float = 5.0) -> list[int]:
    """SIGTERM, then SIGKILL what is left after `grace_s`; return the survivors."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            pids = [p for p in pids if _read_stat(p) and _read_stat(p)[0] not in ("Z", "X")]
            if not pids:
                return []
            time.sleep(0.05)
    return pids


# --------------------------------------------------------------------------- ports


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could bind host:port right now (as servers do, with
    SO_REUSEADDR, so a port in TIME_WAIT counts as free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise PortUnavailable(f"cannot bind {host}:{port}: {exc.strerror}; "
                                  "is the host address one of this machine's?") from exc
    return True


def pick_free_port(host: str = "127.0.0.1", preferred: int | None = None,
                   first: int = 8000, last: int = 8999, exclude: set[int] | frozenset = frozenset()) -> int:
    """A port free on `host`: `preferred` if it is free, else the first free
    one in first..last that is not in `exclude` (ports promised to other
    deployments that have not bound yet).

    An explicitly preferred port that is taken raises PortUnavailable: the
    user asked for that port, silently using another would surprise them.
    """
    if preferred:
        if preferred in exclude or not port_is_free(host, preferred):
            raise PortUnavailable(f"port {preferred} on {host} is already in use; "
                                  "leave the port empty to pick a free one")
        return int(preferred)
    for port in range(first, last + 1):
        if port not in exclude and port_is_free(host, port):
            return port
    raise PortUnavailable(f"no free port on {host} between {first} and {last}")


# --------------------------------------------------------------------------- health


@dataclass(frozen=True)
class HealthResult:
    status: int | None  # HTTP status, None when nothing answered
    body: str = ""
    error: str = ""
    elapsed_s: float = 0.0

    @property
    def answered(self) -> bool:
        return self.status is not None


# Never go through an HTTP proxy from the environment to reach an engine.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def probe_health(url: str, timeout: float = 2.0, api_key: str = "") -> HealthResult:
    t0 = time.monotonic()
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with _opener.open(req, timeout=timeout) as resp:
            body = resp.read(4096).decode("utf-8", "replace")
            return HealthResult(resp.status, body, "", time.monotonic() - t0)
    except urllib.error.HTTPError as exc:
        body = exc.read(4096).decode("utf-8", "replace") if exc.fp else ""
        return HealthResult(exc.code, body, "", time.monotonic() - t0)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return HealthResult(None, "", str(reason), time.monotonic() - t0)


# --------------------------------------------------------------------------- logs


def read_log_tail(path: str | os.PathLike, lines: int = 50, max_bytes: int = 256 * 1024) -> list[str]:
    """The last `lines` lines of a log (reads at most `max_bytes` from the end)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    text = data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    out = text.split("\n")
    if size > max_bytes:
        out = out[1:]  # the first one is probably cut
    if out and out[-1] == "":
        out.pop()
    return out[-lines:] if lines > 0 else []


class LogFollower:
    """Yields the lines appended to a log since the last call.

    `offset` (bytes consumed, complete lines only) can be stored and passed
    back after a restart of the monitor. A truncated or replaced log starts
    over from its beginning. Progress bars rewrite a line with "\\r"; each
    rewrite counts as a line.
    """

    def __init__(self, path: str | os.PathLike, offset: int = 0):
        self.path = str(path)
        self.offset = int(offset)

    def read_new(self, max_bytes: int = 1024 * 1024) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(0, os.SEEK_END)
                if f.tell() < self.offset:
                    self.offset = 0
                f.seek(self.offset)
                data = f.read(max_bytes)
        except OSError:
            return []
        end = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if end < 0:
            if len(data) >= max_bytes:  # one enormous line: take it as is
                end = len(data) - 1
            else:
                return []
        chunk = data[: end + 1]
        self.offset += len(chunk)
        text = chunk.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
        return [ln for ln in text.split("\n")[:-1] if ln.strip()]


# --------------------------------------------------------------------------- restart policy


@dataclass
class RestartDecision:
    give_up: bool
    delay_s: float
    failures_in_window: int


class RestartPolicy:
    """Exponential backoff; `max_failures` failures within `window_s` seconds
    is a crash loop and the policy gives up.

    Pure apart from the clock, which is injectable (tests pass a fake one).
    Failure times are wall-clock seconds so they survive a monitor restart
    when stored (to_dict / from_dict).
    """

    def __init__(self, max_failures: int = 3, window_s: float = 300.0, base_delay_s: float = 2.0,
                 max_delay_s: float = 60.0, clock=time.time, failures: list[float] | None = None):
        if max_failures < 1 or window_s <= 0 or base_delay_s < 0:
            raise ValueError("max_failures >= 1, window_s > 0 and base_delay_s >= 0")
        self.max_failures = max_failures
        self.window_s = window_s
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.clock = clock
        self.failures: list[float] = list(failures or [])

    def _recent(self, now: float) -> list[float]:
        return [t for t in self.failures if now - t <= self.window_s]

    def record_failure(self, now: float | None = None) -> RestartDecision:
        now = self.clock() if now is None else now
        self.failures = self._recent(now) + [now]
        n = len(self.failures)
        if n >= self.max_failures:
            return RestartDecision(give_up=True, delay_s=0.0, failures_in_window=n)
        delay = min(self.max_delay_s, self.base_delay_s * (2 ** (n - 1)))
        return RestartDecision(give_up=False, delay_s=delay, failures_in_window=n)

    def reset(self) -> None:
        self.failures = []

    def to_dict(self) -> dict:
        return {"max_failures": self.max_failures, "window_s": self.window_s, "base_delay_s": self.base_delay_s,
                "max_delay_s": self.max_delay_s, "failures": list(self.failures)}

    @classmethod
    def from_dict(cls, d: dict, clock=time.time) -> "RestartPolicy":
        return cls(d.get("max_failures", 3), d.get("window_s", 300.0), d.get("base_delay_s", 2.0),
                   d.get("max_delay_s", 60.0), clock=clock, failures=d.get("failures"))


# --------------------------------------------------------------------------- watching

# Deployment statuses as the monitor sees them.
STARTING = "starting"
READY = "ready"
RESTARTING = "restarting"  # crashed, waiting for the backoff delay to pass
FAILED = "failed"
STOPPED = "stopped"


@dataclass
class WatchState:
    """What the monitor keeps per deployment between ticks (store as JSON).

    `status` is one of starting / ready / restarting / failed / stopped.
    """

    status: str = STARTING
    phase: str = "starting"
    started_at: float = 0.0  # when the current process was spawned
    ready_at: float | None = None
    restart_at: float | None = None
    failure: str = ""  # code of the last known failure of this run
    hint: str = ""
    fatal: bool = False
    failure_line: str = ""
    failure_at: float | None = None  # when `failure` was logged (the watch's clock)
    unhealthy_ticks: int = 0
    policy: dict = field(default_factory=dict)  # RestartPolicy.to_dict()
    facts: dict = field(default_factory=dict)  # e.g. {"max_model_len_estimate": "12345"}
    # The engine logged that a signal asked it to stop (someone ran kill or
    # pressed Ctrl-C outside Kiln): its exit is a stop, not a crash.
    shutdown_seen: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "WatchState":
        known = {k: v for k, v in (d or {}).items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def on_spawned(self, now: float) -> None:
        """Call after (re)starting the process."""
        self.status, self.phase = STARTING, "starting"
        self.started_at, self.ready_at, self.restart_at = now, None, None
        self.failure = self.hint = self.failure_line = ""
        self.failure_at = None
        self.fatal = False
        self.shutdown_seen = False
        self.unhealthy_ticks = 0


@dataclass(frozen=True)
class Observation:
    running: bool
    health: "HealthResult | None" = None  # None: not probed this tick
    new_lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class Action:
    """kind: phase | ready | crashed | stop_process | restart | failed | stopped

    - phase: the start-up phase changed (`phase`)
    - ready: the engine answers health checks
    - crashed: the process exited or hung; a restart follows after `delay_s`
    - stop_process: kill what is left of the current process (hung start,
      dead engine behind a live HTTP server) before restarting
    - restart: start the process again now (`new_port` if the old port was taken)
    - failed: give up; show `reason`, `hint` (and the log tail, `log_tail`)
    - stopped: the engine was stopped from outside Kiln (a signal it logged)
      and exited: no restart, no failure
    """

    kind: str
    phase: str = ""
    reason: str = ""
    hint: str = ""
    delay_s: float = 0.0
    new_port: bool = False
    log_tail: tuple[str, ...] = ()


# How long after a failure line a shutdown signal still explains it (vLLM's API server shuts itself
# down within its 5 s watchdog once the engine core is dead).
SIGNAL_FALLOUT_S = 5.0


@dataclass(frozen=True)
class WatchConfig:
    start_timeout_s: float = 1800.0  # loading a big model from a slow disk takes a while
    unhealthy_ticks_to_restart: int = 5  # consecutive failed health checks once ready
    max_failures: int = 3
    window_s: float = 300.0
    base_delay_s: float = 2.0
    max_delay_s: float = 60.0


def watch_step(state: WatchState, obs: Observation, now: float, engine, config: WatchConfig = WatchConfig()
               ) -> list[Action]:
    """Decide what to do this tick. Mutates `state`; returns the actions.

    `engine` is an inference.engines.base.Engine (for classify_line and
    is_ready). Pure: no I/O, the clock is `now`.
    """
    actions: list[Action] = []
    if state.status in (FAILED, STOPPED):
        return actions

    # 1. Read the log: phases, and the failure that explains a coming exit.
    for line in obs.new_lines:
        ev = engine.classify_line(line)
        if ev is None:
            continue
        if getattr(ev, "shutdown", False):
            if (state.failure and not state.fatal and state.failure_at is not None
                    and now - state.failure_at <= SIGNAL_FALLOUT_S):
                # Ctrl-C signals the whole process group at once: vLLM's worker and engine core can die
                # of it and their errors reach the log before the API server logs the signal
                # (tests/fixtures/vllm_cpu/ctrl_c_engine_core_first.log). The signal explains them.
                state.failure = state.hint = state.failure_line = ""
                state.failure_at = None
            state.shutdown_seen = True
            continue
        if ev.failure and state.shutdown_seen and not state.failure:
            continue  # tracebacks printed while an ordinary stop shuts the engine down
        if ev.failure:
            # Keep the first fatal cause; a later generic line ("engine core
            # failed") must not hide the specific one before it.
            if not (state.fatal and not ev.fatal):
                state.failure, state.hint, state.fatal, state.failure_line = ev.failure, ev.hint, ev.fatal, ev.line
                state.failure_at = now
            m = re.search(r"estimated maximum model length is ([0-9][0-9,]*)", ev.line)
            if m:
                state.facts["max_model_len_estimate"] = m.group(1).replace(",", "")
        elif ev.phase and ev.phase != state.phase and state.status == STARTING:
            state.phase = ev.phase
            actions.append(Action("phase", phase=ev.phase))

    policy = RestartPolicy(config.max_failures, config.window_s, config.base_delay_s, config.max_delay_s,
                           failures=state.policy.get("failures"))

    # 2. Waiting out a backoff delay.
    if state.status == RESTARTING:
        if state.restart_at is not None and now >= state.restart_at:
            actions.append(Action("restart", new_port=state.failure == "port_in_use"))
        return actions

    # 3. The process is gone: a crash -- unless a signal from outside asked it
    # to stop and nothing failed before that (vLLM exits 0 both after an
    # ordinary Ctrl-C and after its engine core died; only the log tells).
    reason = ""
    if not obs.running and state.shutdown_seen and not state.failure:
        state.status = STOPPED
        state.hint = ("The engine was stopped from outside Kiln (it logged a shutdown signal) and exited; "
                      "it was not restarted.")
        actions.append(Action("stopped", reason="stopped_outside", hint=state.hint))
        return actions
    if not obs.running:
        reason = state.failure or "exited"
    elif state.status == STARTING and now - state.started_at > config.start_timeout_s:
        reason = "start_timeout"
        state.hint = state.hint or (f"The engine did not become ready within {config.start_timeout_s:g} s; "
                                    "the log shows where it stopped.")
        actions.append(Action("stop_process", reason=reason))

    # 4. Health.
    if not reason and obs.health is not None:
        healthy = engine.is_ready(obs.health.status, obs.health.body)
        if healthy:
            state.unhealthy_ticks = 0
            if state.status == STARTING:
                state.status, state.ready_at = READY, now
                if state.phase != "ready":
                    state.phase = "ready"
                    actions.append(Action("phase", phase="ready"))
                actions.append(Action("ready"))
        elif state.status == READY:
            state.unhealthy_ticks += 1
            if state.unhealthy_ticks >= config.unhealthy_ticks_to_restart and state.shutdown_seen and not state.failure:
                # Stopped from outside and still shutting down: vLLM waits for open streams to close
                # (tests/fixtures/vllm_cpu/ctrl_c_waits_for_open_stream.log). Finish that stop.
                state.status = STOPPED
                state.hint = gettext_noop("The engine was stopped from outside Kiln (it logged a shutdown signal) "
                                          "but kept waiting for open client connections; Kiln ended it and did "
                                          "not restart it.")
                actions += [Action("stop_process", reason="stopped_outside"),
                            Action("stopped", reason="stopped_outside", hint=state.hint)]
                return actions
            if state.unhealthy_ticks >= config.unhealthy_ticks_to_restart:
                reason = "unhealthy"
                state.hint = state.hint or ("The engine stopped answering its health check "
                                            f"({obs.health.status or obs.health.error}); restarting it.")
                actions.append(Action("stop_process", reason=reason))

    if not reason:
        state.policy = policy.to_dict()
        return actions

    # 5. Crash handling: fatal -> failed at once; else backoff or crash loop.
    decision = policy.record_failure(now)
    state.policy = policy.to_dict()
    if state.fatal or decision.give_up:
        state.status = FAILED
        why = reason if state.fatal else f"{reason} ({decision.failures_in_window} failures within " \
                                         f"{config.window_s:g} s)"
        actions.append(Action("failed", reason=why, hint=state.hint or "The engine keeps exiting; see the log."))
        return actions
    state.status, state.restart_at = RESTARTING, now + decision.delay_s
    actions.append(Action("crashed", reason=reason, hint=state.hint, delay_s=decision.delay_s))
    return actions


class Watcher:
    """The I/O shell around watch_step for one deployment.

    The monitor keeps one per deployment; each tick: `actions = w.tick()`,
    then persist `w.state.to_dict()` and `w.follower.offset`, and execute the
    actions (restart -> spawn again and call `w.restarted(new_handle)`).
    The "failed" action comes with the log tail filled in.
    """

    def __init__(self, handle: ProcessHandle, engine, health_url: str, state: WatchState | None = None,
                 log_offset: int = 0, config: WatchConfig = WatchConfig(), api_key: str = "",
                 health_timeout_s: float = 2.0, clock=time.time, launch_dir: str = "", check_port_owner: bool = True):
        self.handle = handle
        self.launch_dir = launch_dir
        # Off for Docker: the published port is held by Docker's proxy, not the engine's processes.
        self.check_port_owner = check_port_owner
        self.engine = engine
        self.health_url = health_url
        self.config = config
        self.api_key = api_key
        self.health_timeout_s = health_timeout_s
        self.clock = clock
        self.state = state or WatchState(started_at=clock())
        self.follower = LogFollower(handle.log_path, log_offset)

    def tick(self) -> list[Action]:
        running = is_running(self.handle.pid, self.handle.start_time)
        lines = tuple(self.follower.read_new())
        health = None
        if running and self.state.status in (STARTING, READY):
            health = probe_health(self.health_url, self.health_timeout_s, self.api_key)
            if (self.check_port_owner and self.state.status == STARTING and health.status == 200
                    and not self.answer_is_ours()):
                # Another program took the port while the engine was still importing
                # (vLLM binds late): its 200 is not this engine being ready.
                health = HealthResult(None, "", "the port answers, but from another program")
        actions = watch_step(self.state, Observation(running, health, lines), self.clock(), self.engine,
                             self.config)
        out = []
        for a in actions:
            if a.kind in ("crashed", "failed") and not running:
                ended = self.end_leftovers()
                if ended:
                    a = replace(a, hint=(a.hint + " " if a.hint else "") + ended)
            if a.kind == "stop_process":
                stop(self.handle, grace_s=5.0, launch_dir=self.launch_dir)
            if a.kind == "failed":
                a = Action(**{**asdict(a), "log_tail": tuple(read_log_tail(self.handle.log_path, 40))})
            out.append(a)
        return out

    def answer_is_ours(self) -> bool:
        """Whether the process listening on the health URL's port is this engine
        (its process group or its launch marker). True when it cannot be told."""
        try:
            port = int(self.health_url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        except (IndexError, ValueError):
            return True
        inodes = listening_inodes(port)
        if not inodes:
            return True  # nothing visible listens (another network namespace): trust the answer
        ours = set(group_members(self.handle.pgid, self.handle.start_time)) if self.handle.pgid else set()
        if self.launch_dir:
            ours |= set(marked_processes(self.launch_dir))
        return holds_socket(ours, inodes)

    def end_leftovers(self) -> str:
        """The engine's leader is gone (killed with -9, say): end what it left
        running -- vLLM's EngineCore and resource tracker keep the GPU memory
        when their API server dies -- and say what was ended ("" if nothing)."""
        pids = set(group_members(self.handle.pgid, self.handle.start_time)) if self.handle.pgid else set()
        if self.launch_dir:
            pids |= set(marked_processes(self.launch_dir))
        pids.discard(os.getpid())
        if not pids:
            return ""
        names = {p: process_name(p) or str(p) for p in sorted(pids)}
        left = end_processes(sorted(pids), grace_s=3.0)
        listed = ", ".join(f"{n.split()[0] if n else '?'} (pid {p})" for p, n in names.items())
        if left:
            return f"The engine's server process is gone but {listed} kept running; {left} could not be ended."
        return (f"The engine's server process is gone but {listed} kept running and holding memory; "
                "Kiln ended them, so the GPU is free again.")

    def restarted(self, handle: ProcessHandle) -> None:
        """Call after spawning the replacement process."""
        if handle.log_path != self.follower.path:
            self.follower = LogFollower(handle.log_path, 0)
        # Same log file: keep reading where we were; the new run's lines follow.
        self.handle = handle
        self.state.on_spawned(self.clock())


# --------------------------------------------------------------------------- launch


@dataclass(frozen=True)
class Launched:
    handle: ProcessHandle
    port: int
    argv: list
    command: str  # the copyable preview (secrets hidden)


def launch(engine, spec, runtime, log_path: str | os.PathLike, exclude_ports=frozenset(),
           cwd: str | os.PathLike | None = None, launch_dir: str | os.PathLike | None = None) -> Launched:
    """Pick the port (the spec's own, refused if taken, or a free one),
    build argv and environment, and spawn. Raises InvalidLaunch,
    PortUnavailable or SpawnError, each with a message for the user.

    With `launch_dir` the engine's scratch files (vLLM's ZMQ sockets and
    compile cache) go into that directory (clean_launch_dir removes it after
    the stop) and every process of the launch carries its marker."""
    port = pick_free_port(spec.host, preferred=spec.port, exclude=exclude_ports)
    spec = spec.with_port(port)
    argv = engine.build_argv(spec, runtime)
    launch_env = {}
    if launch_dir:
        launch_env = engine.launch_env(prepare_launch_dir(launch_dir))
        for v in launch_env.values():
            Path(v).mkdir(parents=True, exist_ok=True)
    env = engine.build_env(spec, runtime=runtime, launch_env=launch_env)
    if launch_dir:
        env[LAUNCH_MARKER] = str(launch_dir)
    handle = spawn(argv, env, log_path, cwd=cwd)
    return Launched(handle, port, argv, engine.command_preview(spec, runtime, launch_env))
