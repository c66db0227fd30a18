"""Bad input to POST /api/preflight is a 400 naming the field, never a 500; JSON's own
lists and objects stand for the launch form's text fields."""
import json

import pytest
from django.test import Client

from inference.deployments import presets
from inference.models import Deployment, EngineRuntime

TOO_BIG = 2**63  # one more than a database integer column holds
PLAN = {"preset": presets.QWEN_NVFP4.slug, "target": "v100-32gb-x1", "engine": "vllm", "engine_version": "0.33.0"}


@pytest.fixture
def api(viewer):
    c = Client()
    c.force_login(viewer)
    return c


def post(client, body):
    """Post a JSON text as it is (so that Infinity, NaN and non-objects reach the server)."""
    return client.post("/api/preflight", body if isinstance(body, str) else json.dumps(body),
                       content_type="application/json")


def refused(response, field):
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid", error
    assert field in error["fields"] and f"{field}:" in error["message"], error
    return error


@pytest.mark.parametrize("over, field", [
    ({"runtime": "x"}, "runtime"),
    ({"runtime": TOO_BIG}, "runtime"),
    ({"runtime": 0}, "runtime"),
    ({"model": TOO_BIG}, "model"),
    ({"model": [1]}, "model"),
    ({"gpus": {"0": 1}}, "gpus"),
    ({"gpus": [0.5]}, "gpus"),
    ({"gpus": [True]}, "gpus"),
    ({"gpus": "0,a"}, "gpus"),
    ({"max_num_seqs": "lots"}, "max_num_seqs"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"max_model_len": TOO_BIG}, "max_model_len"),
    ({"tensor_parallel_size": 2.5}, "tensor_parallel_size"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"engine_version": "0.33\x00"}, "engine_version"),
    ({"dtype": "half\x00"}, "dtype"),
    ({"dtype": 16}, "dtype"),
    ({"preset": "nope"}, "preset"),
    ({"sm70_build": "perhaps"}, "sm70_build"),
    ({"speculative_config": [1]}, "speculative_config"),
    ({"speculative_config": "[1]"}, "speculative_config"),
    ({"extra_args": ["--enforce-eager", None]}, "extra_args"),
    ({"extra_args": "--enforce-eager\x00"}, "extra_args"),
])
def test_a_wrong_value_is_a_400_naming_the_field(api, db, over, field):
    refused(post(api, {**PLAN, **over}), field)


@pytest.mark.parametrize("text, field", [
    ('"max_model_len": Infinity', "max_model_len"),
    ('"max_model_len": 1e400', "max_model_len"),
    ('"gpu_memory_utilization": NaN', "gpu_memory_utilization"),
    ('"gpu_memory_utilization": -Infinity', "gpu_memory_utilization"),
    ('"gpu_memory_utilization": 1e400', "gpu_memory_utilization"),
])
def test_infinite_numbers_are_a_400(api, db, text, field):
    refused(post(api, json.dumps(PLAN)[:-1] + ", " + text + "}"), field)


def test_a_form_post_is_checked_the_same_way(api, db):
    refused(api.post("/api/preflight", {**PLAN, "dtype": "half\x00"}), "dtype")
    refused(api.post("/api/preflight", {**PLAN, "gpu_memory_utilization": "inf"}), "gpu_memory_utilization")
    refused(api.post("/api/preflight", {**PLAN, "runtime": str(TOO_BIG)}), "runtime")
    ok = api.post("/api/preflight", {**PLAN, "runtime": "", "model": "", "max_model_len": "", "sm70_build": "on"})
    assert ok.status_code == 200, ok.content
    assert ok.json()["runtime"]["sm70_build"] is True


def test_an_unknown_runtime_within_range_is_named(api, db):
    error = refused(post(api, {**PLAN, "runtime": 2**63 - 1}), "runtime")
    assert "no such runtime" in error["fields"]["runtime"]


@pytest.mark.parametrize("body", ['"text"', "[1]", "null", "{nope", "7"])
def test_a_body_that_is_not_a_json_object_is_a_400(api, db, body):
    r = post(api, body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request", r.content


def test_an_empty_body_asks_for_a_runtime(api, db):
    r = api.post("/api/preflight", "", content_type="application/json")
    assert r.status_code == 400
    assert r.json()["error"]["fields"] == {"runtime": "choose a runtime, or an engine to plan with"}


def test_json_lists_and_objects_or_the_forms_text_give_the_same_answer(api, db):
    as_json = post(api, {**PLAN, "gpus": [0], "extra_args": ["--enforce-eager"], "max_model_len": 16384,
                         "speculative_config": {"method": "dflash", "model": "d", "num_speculative_tokens": 15}})
    as_text = post(api, {**PLAN, "gpus": "0", "extra_args": "--enforce-eager", "max_model_len": "16384",
                         "speculative_config": '{"method": "dflash", "model": "d", "num_speculative_tokens": 15}'})
    assert as_json.status_code == as_text.status_code == 200, (as_json.content, as_text.content)
    assert as_json.json() == as_text.json()
    body = as_json.json()
    assert body["where"] == "1× V100 32GB (sm70)" and body["fit"]["gpus"][0]["weights_bytes"] > 0
    assert any("CUDA graphs ~0.00 GiB" in n for n in body["fit"]["notes"])      # --enforce-eager was read
    assert Deployment.objects.count() == 0 and EngineRuntime.objects.count() == 0


def test_the_panels_form_post_with_its_csrf_token_is_read(viewer, db):
    c = Client(enforce_csrf_checks=True)
    c.force_login(viewer)
    c.get("/deployments/plan")
    token = c.cookies["csrftoken"].value
    r = c.post("/api/preflight", {**PLAN, "dtype": "bf17", "csrfmiddlewaretoken": token})     # multipart
    assert r.status_code == 400 and "bf17" in r.json()["error"]["fields"]["dtype"], r.content
    r = c.post("/api/preflight", {**PLAN, "csrfmiddlewaretoken": token})
    assert r.status_code == 200 and r.json()["where"] == "1× V100 32GB (sm70)", r.content
