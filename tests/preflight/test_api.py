"""POST /api/preflight: the launch form's fields in, findings + fit out; bad input is a 400 naming the field."""
import pytest
from django.test import Client

from inference.deployments import presets
from inference.models import EngineRuntime

NVFP4 = presets.QWEN_NVFP4.slug
FORM = {"preset": NVFP4, "target": "v100-32gb-x1", "dtype": "half", "max_model_len": "32768",
        "max_num_seqs": "8", "gpu_memory_utilization": "0.92", "attention_backend": "FLASH_ATTN_V100",
        "speculative_config": '{"method": "dflash", "model": "z-lab/Qwen3.8-27B-DFlash2", '
                              '"num_speculative_tokens": 15}',
        # fields of the launch form that preflight does not use are ignored
        "name": "qwen", "port": "", "bind_host": "127.0.0.1", "csrfmiddlewaretoken": "x"}


@pytest.fixture
def runtimes(db):
    stock = EngineRuntime.objects.create(name="vLLM 0.33.0", host="gpu1", engine="vllm", kind="venv",
                                         version="0.33.0", torch_cuda="12.8",
                                         cuda_archs=["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100"])
    onecat = EngineRuntime.objects.create(name="1Cat-vLLM 0.10.2 sm70", host="gpu1", engine="vllm", kind="venv",
                                          version="0.10.2", torch_cuda="12.6", cuda_archs=["sm_70", "sm_75", "sm_80"])
    return stock, onecat


def client_for(user):
    c = Client()
    c.force_login(user)
    return c


def test_a_viewer_may_run_preflight_and_stock_vllm_on_v100_is_refused_with_fixes(viewer, runtimes):
    stock, _ = runtimes
    res = client_for(viewer).post("/api/preflight", {**FORM, "runtime": stock.pk})
    assert res.status_code == 200
    body = res.json()
    assert body["has_errors"] is True
    errors = {f["code"]: f for f in body["findings"] if f["level"] == "error"}
    assert {"no-sm70-kernels", "nvfp4-needs-sm75", "flash-attn-v100-needs-fork"} <= set(errors)
    assert errors["no-sm70-kernels"]["fix"].startswith("this vLLM build has no sm_70 kernels")
    assert body["where"] == "1× V100 32GB (sm70)"
    gpu = body["fit"]["gpus"][0]
    assert gpu["weights_bytes"] > 0 and gpu["kv_cache_bytes"] > 0 and gpu["overhead_bytes"] > 0
    # 8 planned; the cache holds fewer requests of 32768 tokens, so --max-num-seqs is suggested
    fit = body["fit"]
    assert 1 <= fit["max_concurrency_at_context"] == int(fit["concurrency_ratio"]) < 8
    assert f"--max-num-seqs {fit['max_concurrency_at_context']}" in " ".join(fit["suggestions"])


def test_the_1cat_runtime_leaves_only_warnings(operator, runtimes):
    _, onecat = runtimes
    body = client_for(operator).post("/api/preflight", {**FORM, "runtime": onecat.pk}).json()
    assert body["has_errors"] is False
    assert [f["code"] for f in body["findings"]] == ["nvfp4-emulated-on-sm70"]
    assert body["runtime"]["sm70_build"] is True


def test_json_body_and_an_adhoc_engine_with_the_sm70_box(viewer, db):
    body = {"preset": NVFP4, "target": "v100-32gb-x1", "engine": "vllm", "engine_version": "0.33.0",
            "dtype": "half", "max_model_len": 16384, "speculative_config": {"method": "dflash", "model": "d"},
            "extra_args": ["--enforce-eager"]}
    c = client_for(viewer)
    stock = c.post("/api/preflight", body, content_type="application/json").json()
    assert "stock-vllm-dropped-sm70" in {f["code"] for f in stock["findings"]}
    fork = c.post("/api/preflight", {**body, "sm70_build": True}, content_type="application/json").json()
    assert not fork["has_errors"]
    assert any("CUDA graphs ~0.00 GiB" in n for n in fork["fit"]["notes"])      # --enforce-eager was read


def test_invalid_fields_are_a_400_naming_each_field(viewer, db):
    res = client_for(viewer).post("/api/preflight", {
        "preset": NVFP4, "target": "v100-32gb-x9", "dtype": "bf17", "max_num_seqs": "0",
        "gpu_memory_utilization": "1.5", "speculative_config": "{nope", "gpus": "0,a", "extra_args": "x; rm -rf /"})
    assert res.status_code == 400
    err = res.json()["error"]
    assert err["code"] == "invalid"
    fields = err["fields"]
    assert set(fields) == {"target", "dtype", "max_num_seqs", "gpu_memory_utilization", "speculative_config",
                           "gpus", "extra_args"}
    assert "bf17" in fields["dtype"] and "half" in fields["dtype"]
    assert "not valid JSON" in fields["speculative_config"]
    assert "0,1" in fields["gpus"]
    assert "dtype:" in err["message"]


def test_nothing_to_check_against_is_a_400_asking_for_a_runtime(viewer, db):
    res = client_for(viewer).post("/api/preflight", {"target": "v100-32gb-x1"})
    assert res.status_code == 400
    assert res.json()["error"]["fields"] == {"runtime": "choose a runtime, or an engine to plan with"}
    res = client_for(viewer).post("/api/preflight", {"runtime": "999", "target": "v100-32gb-x1"})
    assert "no such runtime" in res.json()["error"]["fields"]["runtime"]
    res = client_for(viewer).post("/api/preflight", "[1]", content_type="application/json")
    assert res.status_code == 400 and res.json()["error"]["code"] == "bad_request"


def test_this_hosts_gpus_without_monitor_rows_is_a_warning_not_a_failure(viewer, runtimes):
    stock, _ = runtimes
    body = client_for(viewer).post("/api/preflight", {"preset": NVFP4, "runtime": stock.pk, "gpus": "0"}).json()
    assert body["fit"] is None
    assert any(f["code"] == "no-gpu-facts" and "planning target" in f["fix"] for f in body["findings"])


def test_signed_out_is_refused_and_get_is_not_allowed(db, viewer):
    res = Client().post("/api/preflight", FORM)
    assert res.status_code in (302, 401, 403)
    assert client_for(viewer).get("/api/preflight").status_code == 405


def test_plan_page_renders_for_a_viewer(viewer, runtimes):
    res = client_for(viewer).get("/deployments/plan")
    assert res.status_code == 200
    html = res.content.decode()
    assert "Plan a launch" in html and "1× V100 32GB (sm70)" in html and "1Cat-vLLM 0.10.2 sm70" in html
    assert "preflight.js" in html and 'data-url="/api/preflight"' in html


def test_the_includes_render_for_the_launch_form_and_the_deployment_page(db):
    from django.template.loader import render_to_string

    from inference.models import Deployment
    from inference.preflight.services import estimate_vs_actual, record_capacity
    from tests.preflight.test_capacity import V1_LOG

    panel = render_to_string("preflight/_preflight_panel.html")
    assert 'name="preflight_override"' in panel and "preflight.js" in panel
    assert "preflight_override" not in render_to_string("preflight/_preflight_panel.html", {"no_override": True})
    d = Deployment.objects.create(name="q", host="gpu1", fit_estimate={"gpus": [{"weights_bytes": 27 * 1024**3,
                                                                                   "kv_cache_bytes": 8 * 1024**3}],
                                                                         "kv_cache_tokens": 30000,
                                                                         "concurrency_ratio": 3.66})
    empty = render_to_string("preflight/_estimate_vs_actual.html", {"rows": estimate_vs_actual(d)})
    assert "not printed yet" in empty
    record_capacity(d, V1_LOG)
    html = render_to_string("preflight/_estimate_vs_actual.html", {"rows": estimate_vs_actual(d)})
    assert "27.5185 GiB" in html and "34952 tokens" in html and "1.019" in html
