"""Weight sizes of the fixture models, counted tensor by tensor as the checkpoints store them.

This is the independent side of the fit calculator's accuracy check: it never
calls inference.preflight.fit, it lists every tensor with its shape and storage format.
"""
from __future__ import annotations

import math

BF16, FP32, FP8, I32 = 2, 4, 1, 4


def _n(shape):
    return math.prod(shape)


def llama3_8b_tensors():
    """(name, shape) of every tensor in meta-llama/Meta-Llama-3-8B."""
    H, I, V, L, KV = 4096, 14336, 128256, 32, 8 * 128
    out = [("model.embed_tokens.weight", (V, H)), ("model.norm.weight", (H,)), ("lm_head.weight", (V, H))]
    for i in range(L):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (H, H)), (p + "self_attn.k_proj.weight", (KV, H)),
                (p + "self_attn.v_proj.weight", (KV, H)), (p + "self_attn.o_proj.weight", (H, H)),
                (p + "mlp.gate_proj.weight", (I, H)), (p + "mlp.up_proj.weight", (I, H)),
                (p + "mlp.down_proj.weight", (H, I)),
                (p + "input_layernorm.weight", (H,)), (p + "post_attention_layernorm.weight", (H,))]
    return out


def llama3_8b_weight_bytes():
    return sum(_n(s) for _, s in llama3_8b_tensors()) * BF16


def qwen3_5_27b_tensors():
    """(name, shape, quantizable) for Qwen/Qwen3.5-27B as vLLM loads it (MTP head left out)."""
    H, I, V, L = 5120, 17408, 248320, 64
    heads, kv, hd = 24, 4, 256
    kdim, vdim, vheads = 16 * 128, 48 * 128, 48
    out = [("model.language_model.embed_tokens.weight", (V, H), False),
           ("model.language_model.norm.weight", (H,), False), ("lm_head.weight", (V, H), False)]
    for i in range(L):
        p = f"model.language_model.layers.{i}."
        out += [(p + "input_layernorm.weight", (H,), False), (p + "post_attention_layernorm.weight", (H,), False),
                (p + "mlp.gate_proj.weight", (I, H), True), (p + "mlp.up_proj.weight", (I, H), True),
                (p + "mlp.down_proj.weight", (H, I), True)]
        if (i + 1) % 4 == 0:   # full attention with an output gate folded into q_proj
            out += [(p + "self_attn.q_proj.weight", (2 * heads * hd, H), True),
                    (p + "self_attn.k_proj.weight", (kv * hd, H), True),
                    (p + "self_attn.v_proj.weight", (kv * hd, H), True),
                    (p + "self_attn.o_proj.weight", (H, heads * hd), True),
                    (p + "self_attn.q_norm.weight", (hd,), False), (p + "self_attn.k_norm.weight", (hd,), False)]
        else:                  # Gated DeltaNet
            out += [(p + "linear_attn.in_proj_qkv.weight", (2 * kdim + vdim, H), True),
                    (p + "linear_attn.in_proj_z.weight", (vdim, H), True),
                    (p + "linear_attn.in_proj_b.weight", (vheads, H), True),
                    (p + "linear_attn.in_proj_a.weight", (vheads, H), True),
                    (p + "linear_attn.conv1d.weight", (2 * kdim + vdim, 1, 4), False),
                    (p + "linear_attn.dt_bias", (vheads,), False), (p + "linear_attn.A_log", (vheads,), False),
                    (p + "linear_attn.norm.weight", (128,), False),
                    (p + "linear_attn.out_proj.weight", (H, vdim), True)]
    vh, vi = 1152, 4304
    out += [("model.visual.patch_embed.proj.weight", (vh, 3, 2, 16, 16), False),
            ("model.visual.patch_embed.proj.bias", (vh,), False),
            ("model.visual.pos_embed.weight", (2304, vh), False)]
    for b in range(27):
        p = f"model.visual.blocks.{b}."
        out += [(p + n, s, False) for n, s in [
            ("norm1.weight", (vh,)), ("norm1.bias", (vh,)), ("norm2.weight", (vh,)), ("norm2.bias", (vh,)),
            ("attn.qkv.weight", (3 * vh, vh)), ("attn.qkv.bias", (3 * vh,)),
            ("attn.proj.weight", (vh, vh)), ("attn.proj.bias", (vh,)),
            ("mlp.linear_fc1.weight", (vi, vh)), ("mlp.linear_fc1.bias", (vi,)),
            ("mlp.linear_fc2.weight", (vh, vi)), ("mlp.linear_fc2.bias", (vh,))]]
    m = vh * 4
    out += [("model.visual.merger.norm.weight", (vh,), False), ("model.visual.merger.norm.bias", (vh,), False),
            ("model.visual.merger.linear_fc1.weight", (m, m), False), ("model.visual.merger.linear_fc1.bias", (m,), False),
            ("model.visual.merger.linear_fc2.weight", (H, m), False), ("model.visual.merger.linear_fc2.bias", (H,), False)]
    return out


def qwen3_5_27b_weight_bytes(fmt: str = "bf16") -> int:
    """Bytes of the checkpoint's loaded tensors in format bf16 | awq (4 bit, g128) | nvfp4."""
    total = 0
    for _, shape, quantizable in qwen3_5_27b_tensors():
        if not quantizable or fmt == "bf16":
            total += _n(shape) * BF16
            continue
        out_f, in_f = shape
        if fmt == "awq":       # qweight int32 [in, out/8], qzeros int32 [in/128, out/8], scales fp16 [in/128, out]
            total += in_f * (out_f // 8) * I32 + (in_f // 128) * (out_f // 8) * I32 + (in_f // 128) * out_f * BF16
        elif fmt == "nvfp4":   # weight uint8 [out, in/2], weight_scale fp8 [out, in/16], two fp32 scalars
            total += out_f * (in_f // 2) + out_f * (in_f // 16) * FP8 + 2 * FP32
        else:
            raise ValueError(fmt)
    return total


def kv_bytes_per_token(attention_layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """The textbook formula, written out: K and V, per attention layer, per KV head."""
    return 2 * attention_layers * kv_heads * head_dim * dtype_bytes
