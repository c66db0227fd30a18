"""Bad input to the deployments API is a 400 naming the field (or a 404 for an id that is just
unknown), never a 500, and nothing is written."""
import json
from urllib.parse import urlencode

import pytest
from django.conf import settings
from django.test import Client

from inference.models import Deployment, EngineRuntime, LaunchProfile
from tests.deployments.helpers import make_deployment, make_profile

HOST = settings.HOST_NAME
TOO_BIG = 2**63  # one more than a database integer column holds
BIGGEST = 2**63 - 1


@pytest.fixture
def api(operator):
    c = Client()
    c.force_login(operator)
    return c


@pytest.fixture
def deployment(db):
    return make_deployment(make_profile(host=HOST, runtime_path="/opt/llama/llama-server"))


def post(client, url, body):
    """Post a JSON text as it is (so that Infinity, NaN and non-objects reach the server)."""
    return client.post(url, body if isinstance(body, str) else json.dumps(body), content_type="application/json")


def refused(response, field, status=400, code="invalid"):
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == code, error
    assert field in error["fields"], error
    assert field in error["message"], error
    return error


def unchanged(deployment=None):
    """Nothing was written: no new deployment, runtime or profile, and the deployment as it was."""
    assert Deployment.objects.count() == (1 if deployment else 0)
    assert EngineRuntime.objects.count() == LaunchProfile.objects.count() == (1 if deployment else 0)
    if deployment:
        assert Deployment.objects.get().status == "pending"


@pytest.mark.parametrize("body, field", [
    ({"profile": "x"}, "profile"),
    ({"profile": 1.5}, "profile"),
    ({"profile": 0}, "profile"),
    ({"profile": [1]}, "profile"),
    ({"profile": TOO_BIG}, "profile"),
    ('{"profile": Infinity}', "profile"),
    ('{"profile": 1e400}', "profile"),
    ('{"profile": NaN}', "profile"),
    ({"preset": 5}, "preset"),
    ({"preset": "gemma3-270m-demo-cpu\x00"}, "preset"),
    ({"preset": "gemma3-270m-demo-cpu", "override": "perhaps"}, "override"),
    ({"preset": "x" * 101}, "preset"),
])
def test_a_launch_with_a_wrong_value_is_a_400_naming_the_field(api, db, body, field):
    refused(post(api, "/api/deployments/", body), field)
    unchanged()


def test_a_launch_without_a_profile_or_preset_says_what_to_give(api, db):
    for body in ({}, {"profile": None, "preset": ""}, ""):
        r = api.post("/api/deployments/", body, content_type="application/json")
        assert r.status_code == 400, r.content
        assert r.json()["error"]["code"] == "missing" and "preset" in r.json()["error"]["message"]
    for body in ('"text"', "[1]", "null", "{nope", "7"):
        r = post(api, "/api/deployments/", body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_json", (body, r.content)
    unchanged()


def test_an_unknown_profile_within_range_is_a_404(api, db):
    r = post(api, "/api/deployments/", {"profile": BIGGEST})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert f"#{BIGGEST}" in r.json()["error"]["message"]
    unchanged()


@pytest.mark.parametrize("method, suffix", [("get", ""), ("post", "/stop"), ("post", "/restart")])
def test_deployment_ids_beyond_the_database_are_a_400_and_unknown_ones_a_404(api, deployment, method, suffix):
    for bad in (TOO_BIG, 10**30, 0):
        refused(getattr(api, method)(f"/api/deployments/{bad}{suffix}"), "deployment_id")
    r = getattr(api, method)(f"/api/deployments/{BIGGEST}{suffix}")
    assert r.status_code == 404 and r.json()["error"] == {"code": "not_found",
                                                          "message": f"No deployment #{BIGGEST}."}
    unchanged(deployment)


@pytest.mark.parametrize("query", ["x", "-1", "1e400", "inf", "1.5", str(TOO_BIG)])
def test_a_log_line_count_that_is_not_a_count_is_a_400(api, deployment, query):
    refused(api.get(f"/api/deployments/{deployment.pk}?log={query}"), "log")


def test_the_log_is_returned_only_when_asked_for(api, deployment, tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("".join(f"line {i}\n" for i in range(1500)))
    Deployment.objects.filter(pk=deployment.pk).update(log_path=str(log))
    plain = api.get(f"/api/deployments/{deployment.pk}").json()["deployment"]
    assert "log" not in plain and plain["id"] == deployment.pk and plain["status"] == "pending"
    assert "log" not in api.get(f"/api/deployments/{deployment.pk}?log=").json()["deployment"]
    assert api.get(f"/api/deployments/{deployment.pk}?log=3").json()["deployment"]["log"] == [
        "line 1497", "line 1498", "line 1499"]
    assert len(api.get(f"/api/deployments/{deployment.pk}?log={BIGGEST}").json()["deployment"]["log"]) == 1000


@pytest.mark.parametrize("body, field", [
    ({"name": 5, "engine": "vllm", "kind": "executable", "path": "/x"}, "name"),
    ({"name": "x\x00", "engine": "vllm", "kind": "executable", "path": "/x"}, "name"),
    ({"name": "x", "engine": "vllm", "kind": "executable", "path": "/opt/vllm\x00/bin/vllm"}, "path"),
    ({"name": "x", "engine": ["vllm"], "kind": "executable", "path": "/x"}, "engine"),
    ({"name": "x", "engine": "vllm", "kind": "executable", "path": "/x", "host": "h" * 101}, "host"),
    ({"name": "x" * 201, "engine": "vllm", "kind": "executable", "path": "/x"}, "name"),
    ({"name": "x", "engine": "vllm", "kind": "docker", "image": {"name": "vllm"}}, "image"),
])
def test_a_runtime_with_a_wrong_value_is_a_400_naming_the_field(api, db, body, field):
    refused(post(api, "/api/runtimes/", body), field)
    unchanged()


def test_a_runtime_without_its_required_fields_names_them(api, db):
    error = refused(post(api, "/api/runtimes/", {"engine": "vllm", "path": "/x"}), "name", code="missing")
    assert error["fields"] == {"name": "required", "kind": "required"}
    refused(post(api, "/api/runtimes/", {"name": "x", "engine": "nope", "kind": "executable", "path": "/x"}),
            "engine")
    r = post(api, "/api/runtimes/", "[1]")
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_json"
    unchanged()


def test_runtime_ids_beyond_the_database_are_a_400_and_unknown_ones_a_404(api, db):
    refused(api.get(f"/api/runtimes/{TOO_BIG}"), "runtime_id")
    r = api.get(f"/api/runtimes/{BIGGEST}")
    assert r.status_code == 404 and r.json()["error"]["message"] == f"No runtime #{BIGGEST}."


def test_a_registered_runtime_reads_back_with_every_field(api, db, monkeypatch):
    from inference.deployments import services

    monkeypatch.setattr(services, "runtime_queue_detect", lambda runtime: None)
    r = post(api, "/api/runtimes/", {"name": "vLLM", "engine": "vllm", "kind": "executable",
                                     "path": "/opt/vllm/bin/vllm"})
    assert r.status_code == 201, r.content
    runtime = r.json()["runtime"]
    assert runtime["host"] == HOST and runtime["cuda_archs"] == [] and runtime["detected_at"] is None
    assert api.get(f"/api/runtimes/{runtime['id']}").json() == {"runtime": runtime}
    assert api.get("/api/runtimes/").json() == {"runtimes": [runtime]}


@pytest.fixture
def runtime(db):
    return EngineRuntime.objects.create(host=HOST, name="llama", engine="llamacpp", kind="executable",
                                        path="/opt/llama/llama-server")


@pytest.mark.parametrize("over, field", [
    ({"runtime": "x"}, "runtime"),
    ({"runtime": TOO_BIG}, "runtime"),
    ({"model": TOO_BIG}, "model"),
    ({"gpus": {"0": 1}}, "gpus"),
    ({"gpus": [0.5]}, "gpus"),
    ({"gpus": [True]}, "gpus"),
    ({"gpus": [-1]}, "gpus"),
    ({"max_model_len": "1e400"}, "max_model_len"),
    ({"max_model_len": TOO_BIG}, "max_model_len"),
    ({"gpu_memory_utilization": "inf"}, "gpu_memory_utilization"),
    ({"model_path": "/models/m.gguf\x00"}, "model_path"),
    ({"extra_args": ["--threads", {"n": 2}]}, "extra_args"),
    ({"extra_args": "--threads 2\x00"}, "extra_args"),
    ({"env": ["A=1"]}, "env"),
    ({"speculative_config": [1]}, "speculative_config"),
    ({"enable_prefix_caching": 3}, "enable_prefix_caching"),
    ({"trust_remote_code": "perhaps"}, "trust_remote_code"),
])
def test_the_command_preview_refuses_wrong_types_naming_the_field(api, runtime, over, field):
    body = {"name": "demo", "runtime": runtime.pk, "model_path": "/models/m.gguf", **over}
    refused(post(api, "/api/launch-profiles/preview", body), field)
    assert LaunchProfile.objects.count() == 0


def test_the_command_preview_takes_json_lists_and_objects_for_the_forms_text_fields(api, runtime):
    body = {"name": "demo", "runtime": runtime.pk, "model_path": "/models/m.gguf", "gpus": [0],
            "tensor_parallel_size": 1, "bind_host": "127.0.0.1", "extra_args": ["--threads", 2],
            "env": {"LLAMA_ARG_X": "1"}, "port": 8123, "max_model_len": 4096,
            "enable_prefix_caching": True, "trust_remote_code": False}
    data = post(api, "/api/launch-profiles/preview", body).json()
    assert data["errors"] == {} and data["note"] == ""
    assert data["command"].startswith("CUDA_VISIBLE_DEVICES=0 LLAMA_ARG_X=1 /opt/llama/llama-server")
    assert "--port 8123" in data["command"] and data["command"].endswith("--threads 2")
    data = post(api, "/api/launch-profiles/preview", {**body, "gpus": "0,zero", "port": None}).json()
    assert data == {"command": "", "errors": {"gpus": ["GPUs are indexes separated by commas, such as 0,1"]}}
    data = post(api, "/api/launch-profiles/preview", {**body, "port": ""}).json()
    assert data["errors"] == {} and "is free now" in data["note"]
    assert LaunchProfile.objects.count() == 0


def test_a_browser_form_post_with_its_csrf_token_is_read_multipart_or_urlencoded(operator, runtime):
    c = Client(enforce_csrf_checks=True)
    c.force_login(operator)
    c.get("/deployments/profiles/new")
    token = c.cookies["csrftoken"].value
    form = {"name": "demo", "runtime": runtime.pk, "model_path": "/models/m.gguf", "tensor_parallel_size": "1",
            "bind_host": "127.0.0.1", "port": "8123", "extra_args": "--threads 2 && reboot", "gpus": "",
            "csrfmiddlewaretoken": token}
    multipart = c.post("/api/launch-profiles/preview", form)
    urlencoded = c.post("/api/launch-profiles/preview", urlencode(form),
                        content_type="application/x-www-form-urlencoded", HTTP_X_CSRFTOKEN=token)
    for r in (multipart, urlencoded):
        assert r.status_code == 200, r.content
        assert r.json()["command"] == "" and "shell characters" in r.json()["errors"]["extra_args"][0]
    assert c.post("/api/launch-profiles/preview", {**form, "csrfmiddlewaretoken": "x" * 64}).status_code == 403
