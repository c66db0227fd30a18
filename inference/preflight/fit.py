"""Will this model fit on these GPUs? A VRAM calculator from the model's own metadata.

No Django beyond gettext (see the end of this docstring): the services call it before a
launch and store the report's ``as_dict()`` on the deployment.

The arithmetic, per GPU:

    budget   = ceil(total memory x gpu_memory_utilization)  (vLLM; SGLang without the ceil)
             = total memory - CUDA context                  (llama.cpp)
    weights  = sum of the weight files / tensor-parallel size  (or an estimate; a text-only
               launch of a multimodal checkpoint leaves the vision tower out; with fewer KV
               heads than GPUs each GPU keeps a whole head's K and V projections)
    overhead = activation peak + non-torch memory (+ CUDA graphs where vLLM counts them)
    KV cache = budget - weights - overhead                   (vLLM takes all of it)

For vLLM on GPUs the overhead and the paging of the KV cache into blocks (hybrid models'
large blocks, per-request block counts, concurrency, tokens) follow vLLM's own code:
``inference/preflight/vllm_memory.py``, checked against real starts (tests/preflight/test_fit_real.py).

and the KV cache a request needs:

    full-attention layers:   2 x layers x KV heads x head_dim x KV dtype bytes, per token
    sliding-window layers:   the same, but never for more than `window` tokens
    MLA layers:              (kv_lora_rank + qk_rope_head_dim) x KV dtype bytes, per token
    linear attention/DeltaNet: a fixed state per sequence, whatever its length

Every number here is an estimate to check a plan against; after a real start
the engine's own lines (see ``inference/preflight/capacity.py``) are the truth.

The report's errors, suggestions and notes are worded through Django's gettext when
check_fit runs (importing it needs no settings; bench/fit_accuracy.py sets Django up).
A suggestion starts with its flag, outside the translation, so the services and the page
can tell suggestions apart in any language.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from django.utils.translation import gettext as _
from django.utils.translation import ngettext

# The model's side (config.json / GGUF -> ModelShape, KV cost per token) lives in shapes.py;
# its names stay importable from here, where the services and the rules look for them.
from inference.preflight import vllm_memory
from inference.preflight.shapes import (  # noqa: F401
    DTYPE_BYTES, GGUF_KV_TYPES, GGUF_SLIDING_PATTERN, MAX_LEN_KEYS, GiB, MiB, FitError, KVCost, ModelShape,
    WeightFormat, config_dtype, dtype_bytes, kv_cost, kv_dtype_bytes, lm_head_quantized, model_max_len, read_gguf,
    shape_from_config, shape_from_gguf, shape_from_gguf_file, text_config, weight_format,
)

# ---------------------------------------------------------------------------
# GPUs, settings, the report
# ---------------------------------------------------------------------------

@dataclass
class GPU:
    """One device. compute_capability None means a CPU (total_memory_bytes = host RAM)."""

    name: str
    total_memory_bytes: int
    compute_capability: str | tuple[int, int] | None = None
    used_bytes: int = 0                   # taken by other processes before we start
    driver_cuda_version: str | None = None

    @property
    def cc(self) -> float | None:
        return parse_cc(self.compute_capability)


def parse_cc(value) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, (tuple, list)):
        return float(f"{int(value[0])}.{int(value[1])}")
    text = str(value).lower().replace("sm_", "").replace("sm", "")
    if "." not in text and text.isdigit():
        text = f"{text[:-1]}.{text[-1]}"
    try:
        return float(text)
    except ValueError:
        raise FitError(_("compute capability %(value)r is not like '7.0' or 'sm_70'") % {"value": value}) from None


@dataclass
class LaunchSettings:
    engine: str = "vllm"                  # vllm | sglang | llamacpp
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None      # per request; None = the model's maximum
    max_num_seqs: int = 1                 # the concurrency you plan for
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    quantization: str | None = None
    attention_backend: str | None = None
    speculative_config: dict | None = None
    # what vLLM is told, when it is told (None: vLLM's own default for the GPU, see vllm_memory)
    engine_max_num_seqs: int | None = None
    enable_prefix_caching: bool | None = None   # hybrids: on changes how mamba state is paged
    language_model_only: bool = False     # --language-model-only or every --limit-mm-per-prompt at 0:
                                          # a multimodal checkpoint's vision tower is neither loaded nor profiled


@dataclass
class GpuBudget:
    name: str
    total_bytes: int
    budget_bytes: int                     # what the engine may use
    weights_bytes: int
    overhead_bytes: int
    kv_cache_bytes: int                   # what is left for the cache (may be negative)
    free_bytes: int                       # outside the engine's budget
    # the overhead's parts, as vLLM's "Actual usage is ..." line names them (0 where not estimated)
    activation_bytes: int = 0
    non_torch_bytes: int = 0
    cudagraph_bytes: int = 0


@dataclass
class FitReport:
    fits: bool
    engine: str
    gpus: list[GpuBudget]
    weights_bytes: int                    # whole model, before tensor parallel
    weights_source: str                   # "files" | "gguf" | "estimate"
    kv_bytes_per_token: int               # growing part, whole model
    sliding_kv_bytes_per_token: int
    sliding_window: int | None
    state_bytes_per_sequence: int
    kv_cache_tokens: int                  # capacity in tokens of the cache (all GPUs together)
    max_model_len: int
    max_num_seqs: int
    max_context_at_concurrency: int       # at max_num_seqs sequences
    max_concurrency_at_context: int       # at max_model_len tokens each
    concurrency_ratio: float              # vLLM's "Maximum concurrency for N tokens per request: X"
    errors: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Which error is which (ERROR_NO_KV_ROOM, ERROR_ABOVE_MODEL_MAX), by its text: the rules and
    # the services pick these out, and the text is in the reader's language. Not in as_dict().
    error_kinds: dict[str, str] = field(default_factory=dict, repr=False)

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data.pop("error_kinds")
        return data


ERROR_NO_KV_ROOM = "no-kv-room"             # weights and overhead leave no room for the KV cache
ERROR_ABOVE_MODEL_MAX = "above-model-max"   # max_model_len above the model's maximum


def suggestion(flag: str, why: str) -> str:
    """A suggestion: the flag to pass as typed, then (why), which is translated."""
    return f"{flag} ({why})"


def context_advice() -> tuple[str, ...]:
    """check_fit's fixed advice for a context longer than the room it finds, in the active
    language (the services drop it when the model's maximum caps the context anyway)."""
    return ("--kv-cache-dtype fp8 " + _("halves the KV cache per token"),
            "--gpu-memory-utilization 0.95 " + _("if nothing else runs on these GPUs"),
            "--enforce-eager " + _("frees the CUDA graph memory (slower decoding)"))


def _overhead_bytes(shape: ModelShape, s: LaunchSettings, tp: int, cpu: bool = False) -> tuple[int, list[str]]:
    """Per-GPU memory the engine needs besides weights and KV cache (`cpu`: the machine's RAM)."""
    notes = []
    if s.engine == "llamacpp":
        # compute buffer: one ubatch's f32 attention scores over a slot's context and its widest
        # layer; output buffer: one row of f32 logits per slot (checked on a real llama-server log)
        seqs = max(1, int(s.max_num_seqs or 1))
        per_slot = _llamacpp_slot_context(s, shape)
        compute = LLAMACPP_UBATCH * (per_slot * shape.num_attention_heads
                                     + shape.intermediate_size + 4 * shape.hidden_size) * 4
        compute += seqs * shape.vocab_size * 4
        notes.append(_("llama.cpp compute and output buffers ~%(size).0f MiB (ubatch %(ubatch)s)")
                     % {"size": compute / MiB, "ubatch": LLAMACPP_UBATCH})
        return compute, notes
    # vLLM / SGLang: the profile run's activation peak, sampler logits, NCCL and CUDA graphs
    tokens = s.max_num_batched_tokens or (8192 if s.engine == "sglang" else 2048)
    act_bytes = 2
    activations = tokens * (4 * shape.hidden_size + 2 * shape.intermediate_size // tp) * act_bytes
    logits = min(s.max_num_seqs or 256, 256) * shape.vocab_size * 4 * 2 // tp
    non_torch = int(0.25 * GiB) + (int(0.35 * GiB) if tp > 1 else 0)
    graphs = 0 if s.enforce_eager else int(0.5 * GiB + shape.num_layers * 4 * MiB)
    values = {"activation": (activations + logits) / GiB, "tokens": tokens, "graphs": graphs / GiB,
              "non_torch": non_torch / GiB}
    if cpu:
        notes.append(_("activation peak ~%(activation).2f GiB at %(tokens)s batched tokens, CUDA graphs "
                       "~%(graphs).2f GiB, non-torch ~%(non_torch).2f GiB") % values)
    else:
        notes.append(_("activation peak ~%(activation).2f GiB at %(tokens)s batched tokens, CUDA graphs "
                       "~%(graphs).2f GiB, non-torch ~%(non_torch).2f GiB per GPU") % values)
    return activations + logits + non_torch + graphs, notes


CUDA_CONTEXT_BYTES = int(0.5 * GiB)
LLAMACPP_UBATCH = 512


def _replicated_kv_weight_bytes(shape: ModelShape, tp: int) -> int:
    """What one GPU holds beyond 1/tp of the weights when there are fewer KV heads than GPUs:
    vLLM's QKVParallelLinear gives every rank one whole KV head (tp // KV heads copies of each),
    so a rank keeps 1/KV heads of the K and V projections, not 1/tp of them."""
    kv = shape.num_kv_heads
    if tp <= kv or not kv or shape.mla_latent_dim:
        return 0
    per_param = shape.weight_format.bytes_per_param if shape.weight_format else dtype_bytes(shape.torch_dtype)
    kv_proj = shape.attention_layers * shape.hidden_size * kv * (shape.head_dim + shape.v_head_dim) * per_param
    return int(kv_proj / kv - kv_proj / tp)


def _llamacpp_slot_context(s: LaunchSettings, shape: ModelShape) -> int:
    """llama-server splits --ctx-size (Kiln's max_model_len) evenly over its --parallel slots."""
    total = int(s.max_model_len or shape.max_context or 4096)
    return max(1, total // max(1, int(s.max_num_seqs or 1)))


def _llamacpp_kv_bytes(cost: KVCost, slot_tokens: int, seqs: int) -> int:
    """What llama-server's KV caches hold: every slot its own cells (kv_unified off); an interleaved
    sliding-window cache keeps window + one ubatch per slot, padded to 256 cells, never more than the slot."""
    swa = slot_tokens
    if cost.window:
        swa = min(slot_tokens, -(-(cost.window + LLAMACPP_UBATCH) // 256) * 256)
    return seqs * (cost.bytes_per_token * slot_tokens + cost.sliding_bytes_per_token * swa
                   + cost.state_bytes_per_sequence)


def _vllm_overhead(shape: ModelShape, s: LaunchSettings, g: GPU, tp: int) -> vllm_memory.Overhead:
    batched, default_seqs = vllm_memory.serve_defaults(g.total_memory_bytes, g.name)
    return vllm_memory.estimate_overhead(
        shape, tensor_parallel_size=tp, max_num_batched_tokens=s.max_num_batched_tokens or batched,
        max_num_seqs=s.engine_max_num_seqs or default_seqs, enforce_eager=s.enforce_eager,
        with_vision=bool(shape.vision) and not s.language_model_only,
        # vLLM 0.26 runs dense models on its V2 model runner, which captures CUDA graphs after sizing
        # the KV cache; hybrids and MoE stay on V1, which takes its graph estimate out first
        graphs_counted=bool(shape.linear_attention_layers or shape.num_experts))


def _in_flight_tokens(s: LaunchSettings, g: GPU) -> int:
    # sliding-window groups hold the window plus what two scheduled batches add (async scheduling)
    batched, _seqs = vllm_memory.serve_defaults(g.total_memory_bytes, g.name)
    return 2 * int(s.max_num_batched_tokens or batched)


def _vllm_layout(shape: ModelShape, s: LaunchSettings, tp: int, draft_kv: KVCost | None) -> vllm_memory.KVLayout:
    kv_bytes = kv_dtype_bytes(s.kv_cache_dtype, shape.torch_dtype)
    full = shape.full_attention_layers
    if draft_kv and not shape.mla_latent_dim:
        # a draft's own attention layers join the full-attention group(s)
        per_layer = shape.num_kv_heads * (shape.head_dim + shape.v_head_dim) * kv_bytes
        full += round(draft_kv.bytes_per_token / per_layer) if per_layer else 0
    mode = "none"
    if s.enable_prefix_caching:
        mode = "align"          # vLLM's choice for Gated DeltaNet hybrids with prefix caching
    return vllm_memory.kv_layout(
        full_layers=full, sliding_layers=shape.sliding_window_layers, mamba_layers=shape.linear_attention_layers,
        kv_heads=shape.num_kv_heads, head_dim=shape.head_dim, v_head_dim=shape.v_head_dim, kv_bytes=kv_bytes,
        mla_latent_dim=shape.mla_latent_dim, sliding_window=shape.sliding_window,
        mamba_state_bytes=shape.linear_state_bytes_per_layer, tensor_parallel_size=tp, mamba_cache_mode=mode)


def check_fit(shape: ModelShape, gpus: Sequence[GPU], settings: LaunchSettings | None = None, *,
              weight_file_bytes: int | None = None, draft_weight_bytes: int = 0,
              draft_kv: KVCost | None = None) -> FitReport:
    """Does `shape` fit on `gpus` with `settings`? See the module docstring for the arithmetic.

    weight_file_bytes: the sum of the model's safetensors/GGUF file sizes; when given it
    replaces the estimate (it is what gets loaded, give or take MTP heads).
    draft_weight_bytes / draft_kv: a speculative draft model (DFlash, EAGLE) on the same GPUs.
    """
    s = settings or LaunchSettings()
    if not gpus:
        raise FitError(_("no GPUs given; for a CPU run pass GPU(name='CPU', total_memory_bytes=<RAM>)"))
    tp = int(s.tensor_parallel_size or 1)
    if tp < 1:
        raise FitError(_("tensor_parallel_size must be 1 or more"))
    if tp > len(gpus):
        raise FitError(_("tensor_parallel_size %(tp)s needs %(tp)s GPUs; %(count)s given")
                       % {"tp": tp, "count": len(gpus)})
    if not 0 < s.gpu_memory_utilization <= 1:
        raise FitError(_("gpu_memory_utilization must be in (0, 1], e.g. 0.9"))
    used_gpus = list(gpus[:tp])
    cpu = used_gpus[0].compute_capability is None
    errors: list[str] = []
    error_kinds: dict[str, str] = {}
    suggestions: list[str] = []

    if weight_file_bytes:
        weights, source = int(weight_file_bytes), "files"
    elif shape.exact_weight_bytes:
        weights, source = shape.exact_weight_bytes, "gguf"
    else:
        weights, source = shape.estimated_weight_bytes, "estimate"
        if s.dtype not in ("auto", None) and shape.weight_format and not shape.weight_format.quantized:
            weights = int(weights * dtype_bytes(s.dtype) / shape.weight_format.bytes_per_param)
    weights += int(draft_weight_bytes or 0)

    cost = kv_cost(shape, s.kv_cache_dtype)
    if draft_kv:
        cost = KVCost(cost.bytes_per_token + draft_kv.bytes_per_token,
                      cost.sliding_bytes_per_token + draft_kv.sliding_bytes_per_token,
                      cost.window or draft_kv.window,
                      cost.state_bytes_per_sequence + draft_kv.state_bytes_per_sequence)
    # KV heads split across tensor-parallel ranks; with fewer heads than ranks they are copied
    kv_split = tp if (shape.num_kv_heads >= tp and not shape.mla_latent_dim) else (
        1 if shape.mla_latent_dim else max(1, shape.num_kv_heads))
    if shape.num_attention_heads % tp:
        errors.append(_("%(heads)s attention heads do not split over tensor_parallel_size %(tp)s")
                      % {"heads": shape.num_attention_heads, "tp": tp})
    kv_heads = shape.num_kv_heads
    if (s.engine != "llamacpp" and kv_heads and not shape.mla_latent_dim and tp > 1
            and kv_heads % tp and tp % kv_heads):
        # vLLM's QKVParallelLinear splits the KV heads over the GPUs or copies them evenly onto them
        errors.append(_("%(heads)s KV heads neither split over nor copy evenly onto tensor_parallel_size %(tp)s")
                      % {"heads": kv_heads, "tp": tp})

    max_len = int(s.max_model_len or shape.max_context or 4096)
    # vLLM and SGLang refuse a longer context; llama.cpp starts (the rule ctx-per-slot-above-model warns)
    if s.engine != "llamacpp" and shape.max_context and max_len > shape.max_context:
        errors.append(_("max_model_len %(tokens)s is above the model's maximum %(max)s")
                      % {"tokens": max_len, "max": shape.max_context})
        error_kinds[errors[-1]] = ERROR_ABOVE_MODEL_MAX
    seqs = max(1, int(s.max_num_seqs or 1))

    overhead, notes = _overhead_bytes(shape, s, tp, cpu)
    generic_notes = list(notes)
    on_vllm = s.engine == "vllm" and used_gpus[0].compute_capability is not None
    if on_vllm and s.language_model_only and shape.vision_weight_bytes:
        weights -= shape.vision_weight_bytes      # the vision tower is not built at all
        notes.append(_("text only: the vision tower (%(size).2f GiB) is not loaded")
                     % {"size": shape.vision_weight_bytes / GiB})
    parts = {}
    if on_vllm:
        parts = {id(g): _vllm_overhead(shape, s, g, tp) for g in used_gpus}
        first = parts[id(used_gpus[0])]
        notes[:] = [x for x in notes if x not in generic_notes]    # vLLM's own profile replaces the rough one
        notes.append(_("vLLM's profile: activation peak ~%(activation).2f GiB, non-torch ~%(non_torch).2f GiB, "
                       "CUDA graphs ~%(graphs).2f GiB per GPU")
                     % {"activation": first.activation / GiB, "non_torch": first.non_torch / GiB,
                        "graphs": first.cudagraph / GiB})
    budgets = []
    for g in used_gpus:
        if g.compute_capability is None:        # CPU: the whole RAM minus the OS's share
            budget = int(g.total_memory_bytes * 0.9) - g.used_bytes
        elif s.engine == "llamacpp":
            budget = g.total_memory_bytes - g.used_bytes - CUDA_CONTEXT_BYTES
        else:
            budget = (vllm_memory.requested_bytes(g.total_memory_bytes, s.gpu_memory_utilization) if on_vllm
                      else int(g.total_memory_bytes * s.gpu_memory_utilization))
            free_at_start = g.total_memory_bytes - g.used_bytes - CUDA_CONTEXT_BYTES
            if free_at_start < budget:
                errors.append(_("%(gpu)s: only %(free).1f GiB free at start, below gpu_memory_utilization's "
                                "%(budget).1f GiB") % {"gpu": g.name, "free": free_at_start / GiB,
                                                       "budget": budget / GiB})
                util = max(0.05, math.floor((free_at_start / g.total_memory_bytes) * 100) / 100)
                suggestions.append(suggestion(f"--gpu-memory-utilization {util:.2f}",
                                              _("other processes hold %(used).1f GiB on %(gpu)s")
                                              % {"used": g.used_bytes / GiB, "gpu": g.name}))
        w = weights // tp + (_replicated_kv_weight_bytes(shape, tp) if s.engine != "llamacpp" else 0)
        part = parts.get(id(g))
        g_overhead = part.subtracted if part else overhead
        kv_room = budget - w - g_overhead
        budgets.append(GpuBudget(g.name, g.total_memory_bytes, budget, w, g_overhead, kv_room,
                                 g.total_memory_bytes - budget,
                                 *((part.activation, part.non_torch, part.cudagraph) if part else ())))
    overhead = max(b.overhead_bytes for b in budgets)

    kv_room = min(b.kv_cache_bytes for b in budgets)
    ceiling = int(shape.max_context or max(max_len, 1 << 20))
    if on_vllm:
        # vLLM's own paging, per rank (every rank holds the same number of blocks)
        layout = _vllm_layout(shape, s, tp, draft_kv)
        in_flight = _in_flight_tokens(s, used_gpus[0])
        kv_total = max(0, kv_room)

        def per_seq(tokens: int) -> int:
            return layout.bytes_for_concurrency(1, tokens, in_flight)

        _blocks, ratio, cache_tokens = layout.capacity(kv_total, max_len, in_flight)
        max_conc = int(ratio)
        one_request = per_seq(max_len)
        max_ctx = _largest_context(lambda t: per_seq(t), kv_total, seqs, ceiling)
        if layout.hybrid_block_size:
            notes.append(_("vLLM pages this hybrid in blocks of %(size)s tokens (one block of an attention layer "
                           "holds one layer's recurrent state)") % {"size": layout.block_size})
    else:
        # the whole engine's cache, in whole-model bytes
        kv_total = max(0, kv_room) * kv_split

        def per_seq(tokens: int) -> int:
            return cost.bytes_for(tokens)

        one_request = per_seq(max_len)
        max_conc = kv_total // one_request if one_request else 0
        ratio = kv_total / one_request if one_request else 0.0
        max_ctx = _largest_context(per_seq, kv_total, seqs, ceiling)
        growing = cost.bytes_per_token + (cost.sliding_bytes_per_token if not cost.window else 0)
        if growing:
            cache_tokens = (kv_total - cost.state_bytes_per_sequence * seqs) // growing
        else:
            cache_tokens = 0
    if s.engine == "llamacpp" or used_gpus[0].compute_capability is None:
        # llama.cpp allocates exactly the context it is given, not the whole card
        if s.engine == "llamacpp":
            need = _llamacpp_kv_bytes(cost, _llamacpp_slot_context(s, shape), seqs) // kv_split
        else:
            need = per_seq(max_len) * seqs // kv_split
        for b in budgets:
            b.kv_cache_bytes = need
            b.free_bytes = b.total_bytes - b.weights_bytes - b.overhead_bytes - need
        fits_weights = all(b.free_bytes >= 0 for b in budgets)
    else:
        fits_weights = kv_room > 0

    if kv_room <= 0:
        values = {"weights": weights // tp / GiB, "overhead": overhead / GiB}
        if cpu:
            errors.append(_("weights (%(weights).1f GiB) and overhead (%(overhead).1f GiB) leave no room for "
                            "the KV cache") % values)
        else:
            errors.append(_("weights (%(weights).1f GiB per GPU) and overhead (%(overhead).1f GiB) leave no room "
                            "for the KV cache") % values)
        error_kinds[errors[-1]] = ERROR_NO_KV_ROOM
        suggestions += _weight_suggestions(shape, gpus, s, weights, overhead, one_request)
    elif max_conc < 1:
        errors.append(_("one request of %(tokens)s tokens needs %(need).2f GiB of KV cache; %(room).2f GiB is "
                        "available") % {"tokens": max_len, "need": one_request / GiB, "room": kv_total / GiB})
        suggestions += [x for x in _weight_suggestions(shape, gpus, s, weights, overhead, one_request)
                        if x.startswith("--tensor-parallel-size")]
    fits = not errors and fits_weights and max_conc >= 1
    if max_conc >= 1 and max_conc < seqs:
        suggestions.append(suggestion(f"--max-num-seqs {max_conc}",
                                      ngettext("the cache holds %(count)s request of %(tokens)s tokens, not %(seqs)s",
                                               "the cache holds %(count)s requests of %(tokens)s tokens, not "
                                               "%(seqs)s", max_conc)
                                      % {"count": max_conc, "tokens": max_len, "seqs": seqs}))
    # short of memory for the context asked; a context above the model's maximum is not that (the rules say it)
    if max_conc < 1 or max_ctx < min(max_len, ceiling):
        best = _largest_context(per_seq, kv_total, 1, max_len)
        if best >= 256:
            suggestions.append(suggestion(f"--max-model-len {best}", _("largest context one request can have")))
        kv_fp8, utilization, eager = context_advice()
        if str(s.kv_cache_dtype).lower() == "auto" and used_gpus[0].cc and used_gpus[0].cc >= 8.9:
            suggestions.append(kv_fp8)
        if s.gpu_memory_utilization < 0.95 and s.engine != "llamacpp":
            suggestions.append(utilization)
        if not s.enforce_eager and s.engine != "llamacpp":
            suggestions.append(eager)
    if cost.state_bytes_per_sequence:
        notes.append(_("linear-attention state %(size).0f MiB per sequence")
                     % {"size": cost.state_bytes_per_sequence / MiB})
    if cost.window:
        notes.append(_("%(layers)s sliding-window layers keep at most %(window)s tokens")
                     % {"layers": shape.sliding_window_layers, "window": cost.window})
    if source == "estimate":
        notes.append(_("weights estimated from config (%(format)s, %(params).2fB params); pass weight file sizes "
                       "for the exact figure") % {"format": shape.weight_format.name if shape.weight_format else "?",
                                                  "params": shape.estimated_params / 1e9})
    return FitReport(
        fits=fits, engine=s.engine, gpus=budgets, weights_bytes=weights, weights_source=source,
        kv_bytes_per_token=cost.bytes_per_token, sliding_kv_bytes_per_token=cost.sliding_bytes_per_token,
        sliding_window=cost.window, state_bytes_per_sequence=cost.state_bytes_per_sequence,
        kv_cache_tokens=int(max(0, cache_tokens)), max_model_len=max_len, max_num_seqs=seqs,
        max_context_at_concurrency=max_ctx, max_concurrency_at_context=int(max_conc),
        concurrency_ratio=round(ratio, 2), errors=errors, suggestions=_unique(suggestions), notes=notes,
        error_kinds=error_kinds)


def _largest_context(per_seq, kv_total: int, seqs: int, ceiling: int) -> int:
    """Largest token count t with seqs x per_seq(t) <= kv_total (per_seq grows with t)."""
    if seqs * per_seq(1) > kv_total:
        return 0
    lo, hi = 1, max(1, ceiling)
    if seqs * per_seq(hi) <= kv_total:
        return hi
    while lo < hi:          # at most ~40 steps
        mid = (lo + hi + 1) // 2
        if seqs * per_seq(mid) <= kv_total:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _weight_suggestions(shape: ModelShape, gpus, s: LaunchSettings, weights: int, overhead: int,
                        one_request_kv: int) -> list[str]:
    out = []
    per_gpu = [g.total_memory_bytes * (s.gpu_memory_utilization if s.engine != "llamacpp" else 1)
               for g in gpus]
    tp = s.tensor_parallel_size
    for n in (2, 4, 8):
        if n > tp and n <= len(gpus) and shape.num_attention_heads % n == 0:
            # the weights and one full-length request's cache must fit on each of the n GPUs
            if weights / n + overhead + one_request_kv / n <= min(per_gpu[:n]):
                out.append(suggestion(f"--tensor-parallel-size {n}",
                                      _("splits %(size).1f GiB of weights") % {"size": weights / GiB}))
                break
    fmt = shape.weight_format
    if fmt and fmt.bytes_per_param >= 1 and shape.estimated_params:
        four_bit = shape.estimated_params * 0.56
        out.append(_("a 4-bit checkpoint (AWQ/GPTQ, ~%(size).1f GiB) instead of %(format)s")
                   % {"size": four_bit / GiB, "format": fmt.name})
    if s.max_num_batched_tokens is None or s.max_num_batched_tokens > 1024:
        out.append("--max-num-batched-tokens 1024 " + _("lowers the activation peak"))
    return out


def _unique(items: list[str]) -> list[str]:
    seen, out = set(), []
    for i in items:
        if i not in seen:
            seen.add(i)
            out.append(i)
    return out


def fit_from_config(config: Mapping[str, Any], gpus: Sequence[GPU], settings: LaunchSettings | None = None,
                    **kwargs) -> FitReport:
    """Shortcut: config.json dict in, FitReport out."""
    return check_fit(shape_from_config(config), gpus, settings, **kwargs)


def weight_files_bytes(paths: Iterable[str | os.PathLike]) -> int:
    """Sum of the sizes of a model's weight files (*.safetensors, *.gguf, *.bin)."""
    total = 0
    for p in paths:
        name = os.fspath(p)
        if name.endswith((".safetensors", ".gguf", ".bin", ".pt")):
            total += os.path.getsize(name)
    return total
