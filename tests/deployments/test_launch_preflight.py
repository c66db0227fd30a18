"""Launch runs preflight first: errors refuse the launch unless overridden, and the
findings (and any override) stay on the deployment."""
import pytest
from django.conf import settings
from django.test import Client

from dashboard import jobs
from inference.preflight import services as preflight_service
from inference.preflight.fit import GPU
from inference.models import Deployment, EngineRuntime, LaunchProfile

HOST = settings.HOST_NAME
V100 = GPU("Tesla V100-SXM2-32GB", 32510 * 2**20, "7.0")


@pytest.fixture
def stock_vllm_on_v100(db, monkeypatch):
    # This machine has no GPU: the profile's host "has" a V100 (hardware we lack, faked in tests only).
    monkeypatch.setattr(preflight_service, "gpus_for_host", lambda host, indices: [V100])
    monkeypatch.setattr(jobs, "send", lambda *a, **k: None)
    runtime = EngineRuntime.objects.create(host=HOST, name="vLLM 0.33 (PyPI)", engine="vllm", kind="executable",
                                           path="/opt/vllm/bin/vllm", version="0.33.0",
                                           cuda_archs=["sm_80", "sm_90"], detect_status="ok")
    return LaunchProfile.objects.create(name="qwen bf16", host=HOST, runtime=runtime, model_path="/models/qwen",
                                        dtype="bfloat16", gpus=[0])


def operator_client(operator):
    c = Client()
    c.force_login(operator)
    return c


def test_preflight_errors_refuse_the_launch_with_the_fix(operator, stock_vllm_on_v100):
    response = operator_client(operator).post(
        "/api/deployments/", {"profile": stock_vllm_on_v100.pk}, content_type="application/json")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "preflight"
    assert "Fix:" in error["message"] and "override" in error["message"]
    assert Deployment.objects.count() == 0


def test_an_override_launches_and_is_recorded(operator, stock_vllm_on_v100):
    response = operator_client(operator).post(
        "/api/deployments/", {"profile": stock_vllm_on_v100.pk, "override": True}, content_type="application/json")
    assert response.status_code == 202
    dep = Deployment.objects.get()
    assert dep.preflight_overridden is True
    codes = {f["code"] for f in dep.preflight["findings"] if f["level"] == "error"}
    assert codes, dep.preflight
    page = operator_client(operator).get(f"/deployments/{dep.pk}/").content.decode()
    assert "errors overridden" in page and "Fix:" in page


def test_the_profile_page_launch_refusal_keeps_the_profile_and_explains(operator, stock_vllm_on_v100):
    c = operator_client(operator)
    response = c.post(f"/deployments/profiles/{stock_vllm_on_v100.pk}/launch", follow=True)
    assert Deployment.objects.count() == 0
    assert "was not launched. Preflight:" in response.content.decode()
