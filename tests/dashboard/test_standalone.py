"""The README's first command, driven for real: embedded Redis, web, worker and
monitor come up, a browser signs in through the real login page, and Ctrl-C
leaves nothing running."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tests.helpers import REPO, free_port, wait_until


class Runner:
    def __init__(self, data_dir, *args, python=None, **environ):
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
        env.update(DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1", **environ)
        self.process = subprocess.Popen(
            [python or sys.executable, "manage.py", "standalone", *args],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self):
        return "\n".join(self.lines)

    def wait_for(self, pattern, timeout):
        def found():
            match = re.search(pattern, self.output)
            if match is None and self.process.poll() is not None:
                raise AssertionError(f"runner exited with {self.process.returncode}:\n{self.output}")
            return match

        return wait_until(found, timeout, f"{pattern!r} in the runner's output:\n{self.output}")

    def descendants(self):
        return psutil.Process(self.process.pid).children(recursive=True)


def first_sign_in(page, base, password, new_password="kiln-admin-2026"):
    """admin signs in with the one-time password the runner printed, which must be replaced first."""
    if "/login/" not in page.url:
        page.goto(base + "/login/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(base + "/password/")
    page.fill("input[name=old_password]", password)
    page.fill("input[name=new_password1]", new_password)
    page.fill("input[name=new_password2]", new_password)
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")


@pytest.mark.browser
def test_standalone_runner_serves_the_panel_and_stops_cleanly(tmp_path, browser):
    port = free_port()
    runner = Runner(tmp_path / "data", "--port", str(port))
    try:
        password = runner.wait_for(r"one-time password (\S+)", 240).group(1)
        runner.wait_for(rf"Kiln is up at http://127\.0\.0\.1:{port}/", 10)
        children = runner.descendants()
        names = " ".join(" ".join(p.cmdline()) for p in children)
        for part in ("redis-server", "gunicorn", "celery", "monitor"):
            assert part in names
        # Nothing listens beyond loopback.
        for proc in children:
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    assert conn.laddr.ip in ("127.0.0.1", "::1"), (proc.cmdline(), conn)

        page = browser.new_page()
        base = f"http://127.0.0.1:{port}"
        page.goto(base + "/")
        assert "/login/" in page.url
        page.fill("input[name=username]", "admin")
        page.fill("input[name=password]", "wrong password")
        page.click("button[type=submit]")
        assert "did not match" in page.inner_text("main")

        first_sign_in(page, base, password)

        assert page.inner_text("h1").startswith("Overview")
        nav = page.inner_text("nav.sections")
        for section in ("Models", "Deployments", "Monitoring", "Benchmarks"):
            assert section in nav
        # Live data: the monitor's heartbeat arrives over the websocket, the worker answers a ping.
        page.wait_for_selector("#svc-monitor.green", timeout=30000)
        page.wait_for_selector("#svc-workers.green", timeout=30000)
        assert page.inner_text("#svc-redis") == "up"
        # An operator action end to end: button → API → Redis → worker → row → page.
        page.click("#worker-check")
        page.wait_for_function("() => document.getElementById('worker-check-result').textContent.includes('ran on')", timeout=30000)
        # plotly.js is served locally (no CDN on these machines).
        response = page.request.get(base + "/static/vendor/plotly.min.js")
        assert response.status == 200 and len(response.body()) > 1_000_000
        page.screenshot(path=str(tmp_path / "overview.png"))
        artifacts = REPO / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        page.screenshot(path=str(artifacts / "overview.png"), full_page=True)
        page.close()

        runner.process.send_signal(signal.SIGINT)
        assert runner.process.wait(60) == 0, runner.output
        assert "nothing left running" in runner.output
        time.sleep(0.5)
        left = [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert left == [], [p.cmdline() for p in left]
    finally:
        # Children first: once the runner is killed they are re-parented and
        # descendants() no longer finds them (gunicorn, celery, redis were left running).
        try:
            leftovers = runner.descendants() if runner.process.poll() is None else []
        except psutil.NoSuchProcess:
            leftovers = []
        leftovers += [p for p in locals().get("children", []) if p not in leftovers]
        if runner.process.poll() is None:
            runner.process.kill()
        for proc in leftovers:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass


def test_second_start_prints_no_password_and_reuses_the_database(tmp_path):
    first = Runner(tmp_path / "data", "--port", str(free_port()))
    first.wait_for(r"Kiln is up at", 240)
    first.process.send_signal(signal.SIGINT)
    assert first.process.wait(60) == 0
    second = Runner(tmp_path / "data", "--port", str(free_port()))
    second.wait_for(r"Kiln is up at", 240)
    second.process.send_signal(signal.SIGINT)
    assert second.process.wait(60) == 0
    assert "one-time password" not in second.output
    assert "createoperator admin --reset" in second.output


def test_redis_down_at_start_is_a_clear_error_and_nothing_starts(tmp_path):
    dead = f"redis://127.0.0.1:{free_port()}/0"
    runner = Runner(tmp_path / "data", "--port", str(free_port()), REDIS_URL=dead)
    assert runner.process.wait(120) == 1
    runner.reader.join(5)
    assert f"Redis at {dead} is not reachable" in runner.output
    assert "unset REDIS_URL to use the embedded one" in runner.output
    assert "Traceback" not in runner.output
    assert not re.search(r"^(web|worker|monitor)\s*\|", runner.output, re.M)


def test_port_in_use_is_refused_before_anything_starts(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        runner = Runner(tmp_path / "data", "--port", str(port))
        assert runner.process.wait(120) != 0
        runner.reader.join(5)
    assert f"port {port} on 127.0.0.1 is already in use" in runner.output
    assert "Traceback" not in runner.output
