"""vLLM's own memory arithmetic (V1 engine, 0.2x), written out so the estimate lands where vLLM does.

Plain Python, no Django. Checked against real starts of vLLM 0.26 on an H200
(tests/fixtures/vllm_gpu/*, tests/preflight/test_fit_real.py).

What vLLM does at start, per GPU (vllm/v1/worker/gpu_worker.py):

    requested = ceil(total memory x gpu_memory_utilization)
    KV cache  = requested - weights - peak activation - non-torch increase - CUDA graph estimate

then pages that memory (vllm/v1/core/kv_cache_utils.py):

    layers are grouped by kind (full attention, sliding window, mamba/DeltaNet state); every group has
    `group_size` layers, and each of the group_size tensors is shared by one layer of every group, so
    num_blocks = KV cache // page_bytes // group_size
    a request needs, per group, ceil(max_model_len / block_size) blocks (full attention),
    ceil((window - 1 + in-flight tokens) / block_size) + 1 (sliding), 1 or 2 (mamba state)
    Maximum concurrency = num_blocks / (blocks one request needs over all groups)
    GPU KV cache size   = int(Maximum concurrency x max_model_len) tokens

For a hybrid (attention + mamba/Gated DeltaNet) the block size grows until one attention page holds a
whole mamba state ("Setting attention block size to N tokens"), and the mamba page is padded to match.

With tensor parallel every rank does all of this on its own GPU (its own requested memory, its own
profile); a rank's attention layers hold max(1, KV heads // tp) heads (ModelConfig.get_num_kv_heads) and
its mamba state 1/tp of the channels and heads; then every rank is given the smallest num_blocks of them
all (get_kv_cache_configs), and the figures vLLM logs are one rank's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

GiB = 1024**3
MiB = 1024**2

BLOCK_SIZE = 16                 # vLLM's default --block-size on CUDA; the attention kernels' alignment too
LARGE_GPU_BYTES = 70 * GiB      # at or above this (A100 aside) vLLM's serve defaults grow


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def serve_defaults(total_memory_bytes: int, gpu_name: str = "") -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) that `vllm serve` picks when not told
    (EngineArgs.get_batch_defaults): 8192 / 1024 on GPUs of 70 GiB or more except the A100, else 2048 / 256."""
    if total_memory_bytes >= LARGE_GPU_BYTES and "a100" not in (gpu_name or "").lower():
        return 8192, 1024
    return 2048, 256


def requested_bytes(total_memory_bytes: int, gpu_memory_utilization: float) -> int:
    """What vLLM may use of one GPU (vllm/v1/worker/utils.py request_memory)."""
    return math.ceil(total_memory_bytes * gpu_memory_utilization)


@dataclass(frozen=True)
class KVLayout:
    """How vLLM pages one GPU's KV cache for a model (per tensor-parallel rank)."""

    block_size: int                 # tokens per attention block
    page_bytes: int                 # bytes of one block of one layer (every group's page is this size)
    group_size: int                 # layers per group = tensors the pool is split into
    groups: tuple[str, ...]         # one kind per group: "full", "sliding", "mamba"
    sliding_window: int | None = None
    mamba_state_bytes: int = 0      # one layer's recurrent state before padding to page_bytes
    mamba_cache_mode: str = "none"  # "none" (prefix caching off, vLLM's default for hybrids), "align", "all"

    @property
    def hybrid_block_size(self) -> bool:
        return self.block_size != BLOCK_SIZE and "mamba" in self.groups

    def group_blocks(self, kind: str, max_model_len: int, in_flight_tokens: int) -> int:
        """Blocks one request of max_model_len tokens holds in one group of this kind (max_memory_usage_bytes)."""
        if kind == "full":
            return cdiv(max_model_len, self.block_size)
        if kind == "sliding":
            tokens = min(int(self.sliding_window or max_model_len) - 1 + in_flight_tokens, max_model_len)
            return cdiv(tokens, self.block_size) + 1
        if self.mamba_cache_mode == "all":
            return cdiv(max_model_len, self.block_size)
        return 2 if self.mamba_cache_mode == "align" else 1

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int = 0) -> int:
        return sum(self.group_blocks(k, max_model_len, in_flight_tokens) for k in self.groups)

    def num_blocks(self, kv_cache_bytes: int) -> int:
        return max(0, int(kv_cache_bytes) // self.page_bytes // self.group_size)

    def capacity(self, kv_cache_bytes: int, max_model_len: int, in_flight_tokens: int = 0) -> tuple[int, float, int]:
        """(num_blocks, maximum concurrency, KV cache tokens) as vLLM logs them for one rank's cache."""
        blocks = self.num_blocks(kv_cache_bytes)
        per_request = self.blocks_per_request(max_model_len, in_flight_tokens)
        concurrency = blocks / per_request if per_request else 0.0
        return blocks, concurrency, int(concurrency * max_model_len)

    def bytes_for_concurrency(self, requests: int, max_model_len: int, in_flight_tokens: int = 0) -> int:
        """KV cache bytes (one rank) for `requests` requests of max_model_len tokens each."""
        return requests * self.blocks_per_request(max_model_len, in_flight_tokens) * self.page_bytes * self.group_size


def layer_groups(counts: dict[str, int]) -> tuple[int, tuple[str, ...]]:
    """vLLM's _get_kv_cache_groups_uniform_page_size: (group_size, kinds of the groups).

    The smallest layer count of a kind is the group size (the largest when it is under 1.5x the
    smallest); each kind is split into ceil(count / group_size) groups, the last padded."""
    counts = {k: n for k, n in counts.items() if n > 0}
    if not counts:
        return 0, ()
    if len(counts) == 1:
        kind, n = next(iter(counts.items()))
        return n, (kind,)
    smallest, largest = min(counts.values()), max(counts.values())
    size = largest if largest < smallest * 1.5 else smallest
    groups: list[str] = []
    for kind, n in counts.items():
        groups += [kind] * cdiv(n, size)
    return size, tuple(groups)


def kv_layout(*, full_layers: int, sliding_layers: int = 0, mamba_layers: int = 0, kv_heads: int = 0,
              head_dim: int = 0, v_head_dim: int | None = None, kv_bytes: float = 2, mla_latent_dim: int = 0,
              sliding_window: int | None = None, mamba_state_bytes: int = 0, tensor_parallel_size: int = 1,
              mamba_cache_mode: str = "none", mamba_chunk_size: int = 64, block_size: int = BLOCK_SIZE) -> KVLayout:
    """The paging of one rank's cache. Sizes are whole-model; heads and mamba state split over the ranks."""
    tp = max(1, int(tensor_parallel_size))
    if mla_latent_dim:
        # MLA keeps one latent per token, copied on every rank
        per_token = int(mla_latent_dim * kv_bytes)
    else:
        heads = max(1, int(kv_heads) // tp)          # fewer KV heads than ranks: each rank keeps a copy
        per_token = int(heads * (int(head_dim) + int(v_head_dim or head_dim)) * kv_bytes)
    state = int(mamba_state_bytes) // tp if mamba_layers else 0
    block = int(block_size)
    if state and per_token:
        if mamba_cache_mode == "all":
            chunk = math.lcm(int(mamba_chunk_size), block)
            block = chunk * cdiv(cdiv(state, per_token), chunk)
        else:
            block = max(block, block * cdiv(state, block * per_token))
    page = block * per_token if per_token else state
    size, groups = layer_groups({"full": full_layers, "sliding": sliding_layers, "mamba": mamba_layers})
    return KVLayout(block_size=block, page_bytes=page, group_size=size, groups=groups,
                    sliding_window=sliding_window if sliding_layers else None,
                    mamba_state_bytes=state, mamba_cache_mode=mamba_cache_mode)


@dataclass(frozen=True)
class Overhead:
    """One GPU's memory besides weights and KV cache, named as vLLM's "Actual usage is ..." line names it."""

    activation: int      # "peak activation": the torch peak of the profile run above the weights
    non_torch: int       # "non-torch memory": what grew outside torch's allocator during profiling
    cudagraph: int       # "CUDAGraph memory": vLLM's estimate for capturing its graphs (0 with --enforce-eager)
    counted: bool = True  # whether vLLM takes the graphs out of the KV cache's share (V1 model runner)

    @property
    def total(self) -> int:
        """All of it, as the "Actual usage is ..." line adds up."""
        return self.activation + self.non_torch + self.cudagraph

    @property
    def subtracted(self) -> int:
        """What vLLM takes away from the requested memory before the KV cache."""
        return self.activation + self.non_torch + (self.cudagraph if self.counted else 0)


# Calibrated against the real starts in tests/fixtures/vllm_gpu (vLLM 0.26, H200); see estimate_overhead.
SAMPLER_BYTES_PER_LOGIT = 8          # bf16 logits + their fp32 copy + the sampler's working copies
GDN_FP32_COPIES = 6                  # Gated DeltaNet prefill kernels keep ~6 fp32 tensors of v_heads x head dims
NON_TORCH_BYTES = int(0.23 * GiB)    # cuBLAS workspaces and the like (0.22-0.25 GiB measured)
TP_NON_TORCH_BYTES = int(0.35 * GiB)  # NCCL's buffers on each rank with tensor parallel (not measured yet)
CUDAGRAPH_BASE = int(0.9 * GiB)      # 51 PIECEWISE + 51 FULL graphs up to 512 tokens (the 0.26 default)
CUDAGRAPH_PER_LAYER = 4 * MiB
QWEN_VL_IMAGE_TOKENS = 16384         # Qwen-VL image processors' default max pixels (16384 x 32 x 32) per image


def forward_bytes_per_token(shape, tp: int = 1) -> int:
    """Activation bytes one batched token needs at the widest point of one decoder layer (16-bit activations).

    The profile run pushes max_num_batched_tokens through the model; layers run one after another,
    so the peak is the residual stream plus the widest layer's temporaries."""
    h, inter = shape.hidden_size, shape.intermediate_size
    residual = 6 * h * 2
    mlp = 3 * inter // tp * 2                                   # gate_up output + activation output
    heads, kv, hd = shape.num_attention_heads, shape.num_kv_heads, shape.head_dim
    attention = (2 * heads + 2 * kv) * hd // tp * 2 + heads * hd // tp * 2
    widest = max(mlp, attention)
    lin = getattr(shape, "linear_dims", None)
    if shape.linear_attention_layers and lin:
        k_heads, v_heads, k_dim, v_dim = lin
        key, value = k_heads * k_dim // tp, v_heads * v_dim // tp
        gdn = (2 * (2 * key + 2 * value) * 2                   # in_proj output and its split/conv copy
               + GDN_FP32_COPIES * (v_heads // tp) * (k_dim + v_dim) * 4   # fp32 chunk-kernel tensors
               + (v_heads // tp) * k_dim * v_dim * 4 // 64)      # one fp32 state per 64-token chunk
        widest = max(widest, gdn)
    return residual + widest


def estimate_overhead(shape, *, tensor_parallel_size: int = 1, max_num_batched_tokens: int = 8192,
                      max_num_seqs: int = 1024, enforce_eager: bool = False, with_vision: bool = False,
                      graphs_counted: bool = True) -> Overhead:
    """What vLLM's profile run measures on one GPU, part by part.

    peak activation = max(forward pass over max_num_batched_tokens, the sampler over max_num_seqs rows
    of logits), plus for a multimodal model the encoder's outputs kept in the encoder cache while the
    language model runs. CUDA graphs: vLLM's estimate, subtracted from the KV cache only where the
    V1 model runner profiles it (hybrids, MoE); the V2 runner (0.26's default for dense models)
    captures them afterwards, outside the requested memory.
    """
    tp = max(1, int(tensor_parallel_size))
    tokens = int(max_num_batched_tokens)
    forward = tokens * forward_bytes_per_token(shape, tp)
    # not split over the ranks: the LM head is, but its logits are all-gathered before sampling
    # (LogitsProcessor._gather_logits; Platform.use_all_gather() is True), so every rank samples all of them
    sampler = int(max_num_seqs) * shape.vocab_size * SAMPLER_BYTES_PER_LOGIT
    activation = max(forward, sampler)
    if with_vision:
        vision = getattr(shape, "vision", None) or {}
        budget = max(tokens, QWEN_VL_IMAGE_TOKENS if vision.get("spatial_merge_size") else tokens)
        # the encoder's output for one budget of tokens (two copies: the cache and the merged
        # embeddings) and the language model's input embeddings
        activation += 2 * budget * shape.hidden_size * 2 + tokens * shape.hidden_size * 2
    # Tensor parallel: the communicators' own buffers (NCCL, custom all-reduce, symmetric memory) are made
    # in init_worker_distributed_environment, before the snapshot the profile is measured from, so they
    # are outside this figure (and outside the KV cache's arithmetic). What can grow into it: NCCL channels
    # first connected by the profile's large all-reduces and all-gathers, and FlashInfer's all-reduce fusion
    # workspace where FlashInfer is installed. TP_NON_TORCH_BYTES is a guess no real multi-GPU start has checked.
    non_torch = NON_TORCH_BYTES + (TP_NON_TORCH_BYTES if tp > 1 else 0)
    graphs = 0 if enforce_eager else CUDAGRAPH_BASE + shape.num_layers * CUDAGRAPH_PER_LAYER
    return Overhead(activation, non_torch, graphs, counted=graphs_counted)
