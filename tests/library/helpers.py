"""Shared pieces of the model library tests: signed-in clients, the files the
fake hub serves and a restartable real Celery worker (fixtures: conftest.py)."""
import subprocess
import sys

from django.conf import settings

from tests.helpers import REPO, child_env, stop_group, wait_until

MiB = 1 << 20
TOKEN = "hf_good_token"


def served(hub, repo, path, rev="main"):
    return hub.repos[repo].revisions[rev][path]


def login(client, user):
    assert client.post("/login/", {"username": user.username, "password": user.plain_password}).status_code == 302
    return client


class Worker:
    """A real Celery worker (solo pool, like the shared fixture) that a test may kill and start again."""

    def __init__(self, log_path):
        self.log_path = log_path
        self.process = None

    def start(self):
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "dashboard", "worker", "-Q", f"default,host.{settings.HOST_NAME}",
             "-n", f"test@{settings.HOST_NAME}", "--pool", "solo", "--without-mingle", "--without-gossip", "-l", "INFO"],
            cwd=REPO, env=child_env(), stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: b" ready." in self.log_path.read_bytes()[start:] or self.process.poll() is not None, 60, "worker start")
        assert self.process.poll() is None, self.log_path.read_text()
        return self

    def kill(self):
        import os
        import signal
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self):
        if self.process is not None:
            stop_group(self.process)
        self.log.close()

    def text(self):
        return self.log_path.read_text(errors="replace")
