"""Tensor parallel 2: Kiln's per-GPU figures against vLLM 0.26's own arithmetic, derived by hand.

No two-GPU vLLM start has been recorded yet (issue 20: the two-GPU machine was not lent), so the truth here
is vLLM 0.26.0's source: the wheel vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl (sha256 adb1e4c9...,
the one shared/tools/vllm-gpu installs). Each step names the file and line of that wheel it comes from.

What vLLM measures instead of computing (peak activation, non-torch memory, its CUDA graph estimate) is
Kiln's calibration on the one-GPU runs in tests/fixtures/vllm_gpu, written out again here with vLLM's
tensor-parallel split of each term; the non-torch share of NCCL on each rank is a guess until a real
two-GPU log exists (vllm_memory.TP_NON_TORCH_BYTES).
"""
import json
import math

import pytest

from inference.preflight import fit, vllm_memory
from inference.preflight.fit import GPU, GiB, LaunchSettings, MiB
from tests.helpers import FIXTURES
from tests.preflight import fit_truth

# The H200 of the real runs, as torch (and so vLLM) sees it: gpu.csv "torch total 150109880320"
H200 = GPU("NVIDIA H200", 150109880320, "9.0")
TP = 2


def load(name):
    return json.loads((FIXTURES / f"{name}_config.json").read_text())


def cdiv(a, b):
    return -(-a // b)


def rank_weight_bytes(tensors, tp):
    """One rank's share of a bf16 checkpoint, tensor by tensor, as vLLM's layers shard it:
    RMSNorm weights are plain parameters on every rank (replicated); embed_tokens / lm_head are
    VocabParallelEmbedding / ParallelLMHead: the vocabulary padded to 64 (vocab_parallel_embedding.py:32, :87)
    and divided by tp (:302); every other tensor here is a column- or row-parallel linear, a conv1d
    ColumnParallelLinear or a per-head A_log/dt_bias (qwen_gdn_linear_attn.py:390, :439-449): 1/tp each."""
    total = 0
    for name, shape in tensors:
        if name.endswith("norm.weight"):
            total += math.prod(shape) * 2
        elif "embed_tokens" in name or "lm_head" in name:
            vocab, hidden = shape
            total += cdiv(vocab, 64) * 64 // tp * hidden * 2
        else:
            total += math.prod(shape) // tp * 2
    return total


# --- the pieces of vLLM's start that do not depend on the model --------------------------------------

# vllm/v1/worker/utils.py:430  requested_memory = math.ceil(total_memory * gpu_memory_utilization),
# per worker, from its own GPU's snapshot (gpu_worker.py:388-389)
REQUESTED = math.ceil(150109880320 * 0.92)
# Kiln's calibration (vllm_memory.py): cuBLAS & co. 0.23 GiB + NCCL's share with TP 0.35 GiB
NON_TORCH = int(0.23 * GiB) + int(0.35 * GiB)
# H200 (>= 70 GiB, not an A100): `vllm serve` defaults 8192 batched tokens, 1024 seqs (arg_utils.py:2460-2469);
# the world size does not change them on CUDA (only the CPU branch, :2502-2510, multiplies by it)
BATCHED, SEQS = 8192, 1024


def test_the_constants_are_vllms():
    assert REQUESTED == 138_101_089_895
    assert vllm_memory.serve_defaults(H200.total_memory_bytes, H200.name) == (BATCHED, SEQS)
    assert NON_TORCH == 622_770_257


# --- Llama-3-8B (dense, 32 layers, 32 heads / 8 KV heads of 128, vocab 128256) at TP=2 ----------------

def llama_tp2_by_hand():
    weights = rank_weight_bytes(fit_truth.llama3_8b_tensors(), TP)
    assert weights == 8_030_527_488          # 16,060,522,496 / 2 + half of the 532,480 replicated norm bytes
    # forward: residual stream (replicated: the all-reduce output is the full hidden size) + the widest
    # sharded layer, MergedColumnParallelLinear gate_up + act output = 3 x 14336 / 2 per token
    forward = BATCHED * (6 * 4096 * 2 + 3 * 14336 // TP * 2)
    # sampler: LogitsProcessor._gather_logits all-gathers the vocab-parallel logits
    # (model_executor/layers/logits_processor.py:87-93; Platform.use_all_gather() is True, platforms/interface.py:1096),
    # so every rank samples SEQS rows of the full vocabulary: not divided by tp
    sampler = SEQS * 128256 * vllm_memory.SAMPLER_BYTES_PER_LOGIT
    activation = max(forward, sampler)
    assert (forward, sampler, activation) == (754_974_720, 1_050_673_152, 1_050_673_152)
    # gpu_worker.py:541: KV = requested - (non-torch + torch peak + weights) - graphs applied; dense Llama runs
    # on the V2 model runner (config/vllm.py:_is_default_v2_model_runner_model; TP alone is no "unsupported
    # feature", :2127-2214), whose profile_cudagraph_memory() returns 0 (v1/worker/gpu/model_runner.py:705-707)
    kv = REQUESTED - weights - activation - NON_TORCH
    # config/model.py:1339 get_num_kv_heads = max(1, 8 // 2) = 4; FullAttentionSpec page (kv_cache_interface.py:328-340)
    # = block_size 16 x 4 heads x (128 + 128) x 2 bytes
    page = 16 * max(1, 8 // TP) * (128 + 128) * 2
    # one group of all 32 layers; kv_cache_utils.py:1005 num_blocks = available // page // layers
    blocks = kv // page // 32
    # kv_cache_utils.py:954 concurrency = num_blocks / blocks per request (cdiv(8192, 16), kv_cache_interface.py:263);
    # :1829 tokens = int(concurrency x max_model_len)
    concurrency = blocks / cdiv(8192, 16)
    tokens = int(concurrency * 8192)
    assert (page, blocks, tokens) == (32768, 122_449, 1_959_184)
    return weights, activation, kv, concurrency, tokens


def test_llama3_8b_per_gpu_figures_at_tp2():
    weights, activation, kv, concurrency, tokens = llama_tp2_by_hand()
    report = fit.fit_from_config(
        load("llama3_8b"), [H200, H200],
        LaunchSettings(tensor_parallel_size=TP, gpu_memory_utilization=0.92, max_model_len=8192),
        weight_file_bytes=fit_truth.llama3_8b_weight_bytes())
    assert report.fits and not report.errors
    assert len(report.gpus) == 2
    for g in report.gpus:
        assert g.budget_bytes == REQUESTED
        # Kiln splits every byte over the ranks; vLLM keeps the norms whole (266,240 bytes more per rank)
        assert abs(g.weights_bytes - weights) / weights < 1e-4
        assert g.activation_bytes == activation
        assert g.non_torch_bytes == NON_TORCH
        assert g.overhead_bytes == activation + NON_TORCH      # graphs outside the budget (V2 runner)
        assert abs(g.kv_cache_bytes - kv) / kv < 1e-5
    assert report.kv_cache_tokens == tokens
    assert report.concurrency_ratio == round(concurrency, 2) == 239.16
    assert report.max_concurrency_at_context == 239


# --- Qwen3.5-27B text-only (48 Gated DeltaNet + 16 full-attention layers, 4 KV heads of 256) at TP=2 ----

def qwen_tp2_by_hand():
    text = [(n, s) for n, s, _ in fit_truth.qwen3_5_27b_tensors() if not n.startswith("model.visual")]
    weights = rank_weight_bytes(text, TP)
    assert weights == 26_896_673_280
    # forward: the widest sharded layer is the Gated DeltaNet's (Kiln's calibration, vllm_memory.py), with
    # vLLM's split: in_proj_qkvz/ba MergedColumnParallelLinear, key 16x128/2, value 48x128/2 channels and
    # 48/2 value heads per rank
    key, value, v_heads = 16 * 128 // TP, 48 * 128 // TP, 48 // TP
    gdn = (2 * (2 * key + 2 * value) * 2 + vllm_memory.GDN_FP32_COPIES * v_heads * (128 + 128) * 4
           + v_heads * 128 * 128 * 4 // 64)
    forward = BATCHED * (6 * 5120 * 2 + gdn)
    sampler = SEQS * 248320 * vllm_memory.SAMPLER_BYTES_PER_LOGIT    # full vocabulary on each rank, as above
    activation = max(forward, sampler)
    assert (forward, sampler) == (2_181_038_080, 2_034_237_440)
    # hybrids stay on the V1 runner (config/vllm.py: is_hybrid -> not a default-V2 model), whose CUDA graph
    # estimate is taken out of the KV cache (gpu_worker.py:541-545); its size is Kiln's calibration
    graphs = int(0.9 * GiB) + 64 * 4 * MiB
    kv = REQUESTED - weights - activation - NON_TORCH - graphs
    # per rank: get_num_kv_heads = max(1, 4 // 2) = 2 -> 2 x (256 + 256) x 2 bytes per token per layer
    attn_per_token = max(1, 4 // TP) * (256 + 256) * 2
    # mamba_utils.py:223-233 gated_delta_net_state_shape: conv (divide(2x16x128 + 48x128, tp), 4 - 1) in bf16,
    # temporal (divide(48, tp), 128, 128) in float32 (mamba_ssm_dtype)
    state = (2 * 16 * 128 + 48 * 128) // TP * (4 - 1) * 2 + 48 // TP * 128 * 128 * 4
    # platforms/interface.py:898 block = 16 x cdiv(mamba page, 16 x attention page of one token)
    block = 16 * cdiv(state, 16 * attn_per_token)
    page = block * attn_per_token
    # kv_cache_utils.py:1221-1232: 16 full + 48 mamba layers -> group size 16 (48 >= 1.5 x 16): 4 groups
    blocks = kv // page // 16
    # per request: full group cdiv(32768, 784) blocks (kv_cache_interface.py:263), each mamba group 1
    # (:718, mamba_cache_mode "none": prefix caching off for hybrids by default)
    per_request = cdiv(32768, block) + 3 * 1
    concurrency = blocks / per_request
    tokens = int(concurrency * 32768)
    assert (attn_per_token, state, block, page) == (2048, 1_603_584, 784, 1_605_632)
    assert (blocks, per_request, tokens) == (4171, 45, 3_037_229)
    return weights, activation, graphs, kv, block, concurrency, tokens


def test_qwen3_5_27b_hybrid_per_gpu_figures_at_tp2():
    weights, activation, graphs, kv, block, concurrency, tokens = qwen_tp2_by_hand()
    report = fit.fit_from_config(
        load("qwen3_5_27b"), [H200, H200],
        LaunchSettings(tensor_parallel_size=TP, gpu_memory_utilization=0.92, max_model_len=32768,
                       language_model_only=True),
        weight_file_bytes=fit_truth.qwen3_5_27b_weight_bytes("bf16"))
    assert report.fits and not report.errors
    for g in report.gpus:
        assert g.budget_bytes == REQUESTED
        # the file total less Kiln's estimate of the vision tower, halved; vLLM keeps the norms whole
        assert abs(g.weights_bytes - weights) / weights < 1e-4
        assert g.activation_bytes == activation
        assert g.cudagraph_bytes == graphs
        assert g.overhead_bytes == activation + NON_TORCH + graphs
        assert abs(g.kv_cache_bytes - kv) / kv < 1e-5
    assert any(f"blocks of {block} tokens" in n for n in report.notes)
    assert report.kv_cache_tokens == tokens
    assert report.concurrency_ratio == round(concurrency, 2) == 92.69


def test_the_hybrid_layout_per_rank_is_vllms():
    shape = fit.shape_from_config(load("qwen3_5_27b"))
    layout = vllm_memory.kv_layout(
        full_layers=16, mamba_layers=48, kv_heads=4, head_dim=256, kv_bytes=2,
        mamba_state_bytes=shape.linear_state_bytes_per_layer, tensor_parallel_size=TP)
    # the same numbers as qwen_tp2_by_hand: heads and state both halve, so the block stays at 784 tokens
    assert (layout.mamba_state_bytes, layout.block_size, layout.page_bytes) == (1_603_584, 784, 1_605_632)
    assert (layout.group_size, layout.groups) == (16, ("full", "mamba", "mamba", "mamba"))
    assert layout.blocks_per_request(32768) == 45


# --- rules that only show with more than one GPU ------------------------------------------------------

def test_the_rank_with_the_least_memory_pages_them_all():
    """Every worker profiles its own GPU; get_kv_cache_configs (kv_cache_utils.py:2155-2160) gives every
    rank the smallest num_blocks. Each rank's own "Available KV cache memory" stays its own."""
    small = GPU("NVIDIA H100 100GB", 100 * GiB, "9.0")      # >= 70 GiB: the same serve defaults
    weights, activation, kv_big, _, _ = llama_tp2_by_hand()
    requested_small = math.ceil(100 * GiB * 0.92)
    kv_small = requested_small - weights - activation - NON_TORCH
    blocks = min(kv_big, kv_small) // 32768 // 32
    tokens = int(blocks / 512 * 8192)
    assert (blocks, tokens) == (84_953, 1_359_248)
    report = fit.fit_from_config(
        load("llama3_8b"), [H200, small],
        LaunchSettings(tensor_parallel_size=TP, gpu_memory_utilization=0.92, max_model_len=8192),
        weight_file_bytes=fit_truth.llama3_8b_weight_bytes())
    big, little = report.gpus
    assert abs(big.kv_cache_bytes - kv_big) / kv_big < 1e-5
    assert abs(little.kv_cache_bytes - kv_small) / kv_small < 1e-5
    assert report.kv_cache_tokens == tokens


TINY_GQA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 8,
            "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 5632,
            "vocab_size": 32000, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}


def test_fewer_kv_heads_than_gpus_are_copied_onto_every_rank():
    """TP=4 over 2 KV heads: linear.py:1005-1006 gives each rank num_kv_heads = 1 and
    num_kv_head_replicas = divide(4, 2) = 2; config/model.py:1339 max(1, 2 // 4) = 1 head in the cache."""
    tp = 4
    report = fit.fit_from_config(TINY_GQA, [H200] * tp,
                                 LaunchSettings(tensor_parallel_size=tp, max_model_len=4096))
    assert not report.errors
    g = report.gpus[0]
    whole = fit.shape_from_config(TINY_GQA).estimated_weight_bytes
    # K and V projections: one whole head of 128 each (2048 inputs, bf16) in every one of the 8 layers,
    # where 1/tp of the checkpoint's 2 heads would be half a head
    per_rank_kv = 8 * 2 * 128 * 2048 * 2
    split_kv = 8 * 2 * (2 * 128) * 2048 * 2 // tp
    assert g.weights_bytes - whole // tp == per_rank_kv - split_kv == 4_194_304
    # the cache: one head per rank, page = 16 x 1 x (128 + 128) x 2 bytes, one group of 8 layers
    blocks = g.kv_cache_bytes // (16 * 1 * 256 * 2) // 8
    assert report.kv_cache_tokens == int(blocks / cdiv(4096, 16) * 4096)


@pytest.mark.parametrize("tp,refused", [(2, False), (3, False), (4, True), (6, False), (12, False)])
def test_kv_heads_must_split_over_or_copy_evenly_onto_the_gpus(tp, refused):
    """QKVParallelLinear: divide(kv_heads, tp) or divide(tp, kv_heads) (linear.py:1005-1009) must be exact."""
    cfg = dict(TINY_GQA, num_attention_heads=12, num_key_value_heads=6, head_dim=128, hidden_size=1536)
    report = fit.fit_from_config(cfg, [H200] * tp, LaunchSettings(tensor_parallel_size=tp, max_model_len=4096))
    said = [e for e in report.errors if "KV heads" in e]
    assert bool(said) == refused
    if refused:
        assert said == ["6 KV heads neither split over nor copy evenly onto tensor_parallel_size 4"]
