"""Read what a model is from its files: config.json for Hugging Face-style
folders, the metadata header for GGUF files. Returns plain dicts (JSON-safe)
for the model row; the VRAM fit check reads them later.

Both functions raise ModelMetaError with a message naming the file and the
problem; they never return half-parsed garbage silently.
"""
from __future__ import annotations

import json
import os
from collections import Counter

from inference.library.gguf import GGUFError, read_gguf_header


class ModelMetaError(Exception):
    pass


def _int(v):
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def read_config(folder: str) -> dict:
    """Summarise `folder/config.json`.

    Multimodal checkpoints (Qwen3.5/3.6, Gemma 3, Llava...) keep the language
    model's shape under `text_config`; those values win over the top level,
    where they are often absent or describe the vision tower.
    """
    path = os.path.join(folder, "config.json")
    try:
        with open(path, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except FileNotFoundError:
        raise ModelMetaError(f"{path} does not exist; this folder has no Hugging Face config.")
    except (OSError, ValueError) as e:
        raise ModelMetaError(f"{path} is not readable JSON: {e}")
    if not isinstance(cfg, dict):
        raise ModelMetaError(f"{path} does not hold a JSON object.")

    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}

    def pick(key):
        return text.get(key, cfg.get(key))

    archs = cfg.get("architectures") or text.get("architectures") or []
    heads = _int(pick("num_attention_heads"))
    hidden = _int(pick("hidden_size"))
    kv_heads = _int(pick("num_key_value_heads"))
    head_dim = _int(pick("head_dim"))
    layers = _int(pick("num_hidden_layers"))
    # transformers renamed torch_dtype to dtype; accept both.
    dtype = pick("torch_dtype") or pick("dtype")
    layer_types = pick("layer_types")
    quant = cfg.get("quantization_config") or text.get("quantization_config")

    meta = {
        "format": "hf",
        "architecture": archs[0] if isinstance(archs, list) and archs else None,
        "model_type": cfg.get("model_type"),
        "text_model_type": text.get("model_type") if text else None,
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        # Absent means plain multi-head attention: as many KV heads as heads.
        "num_kv_heads": kv_heads if kv_heads is not None else heads,
        "head_dim": head_dim if head_dim is not None else (
            hidden // heads if hidden and heads else None),
        "max_position_embeddings": _int(pick("max_position_embeddings")),
        "torch_dtype": str(dtype) if dtype else None,
        "vocab_size": _int(pick("vocab_size")),
        "intermediate_size": _int(pick("intermediate_size")),
        "layer_types": None,
        "full_attention_layers": None,
        "quantization": None,
    }
    if isinstance(layer_types, list) and layer_types:
        meta["layer_types"] = dict(Counter(str(t) for t in layer_types))
        meta["full_attention_layers"] = sum(1 for t in layer_types if t == "full_attention")
    elif _int(pick("full_attention_interval")) and layers:
        # Qwen3-Next style: every Nth layer is full attention, the rest linear.
        n = _int(pick("full_attention_interval"))
        meta["full_attention_layers"] = layers // n
    elif layers:
        meta["full_attention_layers"] = layers
    if isinstance(quant, dict):
        meta["quantization"] = {
            k: quant[k] for k in ("quant_method", "bits", "group_size", "zero_point",
                                  "version", "quant_algo", "kv_cache_quant_algo",
                                  "desc_act", "sym", "format")
            if k in quant and isinstance(quant[k], (str, int, float, bool))}
        # compressed-tensors / NVFP4 keep bits under config_groups: keep the gist.
        groups = quant.get("config_groups")
        if isinstance(groups, dict):
            for g in groups.values():
                w = (g or {}).get("weights") or {}
                if isinstance(w, dict):
                    meta["quantization"].setdefault("bits", w.get("num_bits"))
                    meta["quantization"].setdefault("weight_type", w.get("type"))
                break
    return meta


# --------------------------------------------------------------------------- GGUF
def read_gguf(path: str) -> dict:
    """Summarise a GGUF file's header (metadata and tensor table; the weights
    are not read). The header reader (gguf.py) skips the long
    tokenizer arrays: gguf.GGUFReader decodes them and took 79 s for Gemma 3
    270M on a loaded 2-core host, against well under a second this way."""
    try:
        from gguf import LlamaFileType
    except ImportError as e:  # pragma: no cover - gguf is a dependency
        raise ModelMetaError(f"the gguf package is missing ({e}); install gguf")
    if not os.path.exists(path):
        raise ModelMetaError(f"{path} does not exist.")
    try:
        fields, tensors = read_gguf_header(path)
    except GGUFError as e:
        raise ModelMetaError(f"{path} is not a readable GGUF file: {e}")

    def value(key):
        return fields.get(key)

    arch = value("general.architecture")
    if not arch:
        raise ModelMetaError(f"{path} has no general.architecture key; not a model GGUF?")

    def arch_int(suffix):
        v = value(f"{arch}.{suffix}")
        if isinstance(v, list):  # per-layer values: the largest is what memory needs
            return max(v) if v else None
        return _int(v)

    file_type = _int(value("general.file_type"))
    try:
        file_type_name = LlamaFileType(file_type).name if file_type is not None else None
    except ValueError:
        file_type_name = f"unknown({file_type})"

    by_type: dict[str, dict] = {}
    total_bytes = 0
    params = 0
    for t in tensors:
        entry = by_type.setdefault(t["type"], {"tensors": 0, "bytes": 0})
        entry["tensors"] += 1
        entry["bytes"] += int(t["n_bytes"])
        total_bytes += int(t["n_bytes"])
        params += int(t["n_elements"])

    heads = arch_int("attention.head_count")
    embd = arch_int("embedding_length")
    key_len = arch_int("attention.key_length")
    return {
        "format": "gguf",
        "architecture": arch,
        "name": value("general.name"),
        "context_length": arch_int("context_length"),
        "num_layers": arch_int("block_count"),
        "embedding_length": embd,
        "num_attention_heads": heads,
        "num_kv_heads": arch_int("attention.head_count_kv") or heads,
        "head_dim": key_len or (embd // heads if embd and heads else None),
        "file_type": file_type,
        "quantization": (file_type_name or "").replace("MOSTLY_", "") or None,
        "tensor_count": len(tensors),
        "parameter_count": params,
        "tensor_bytes": total_bytes,
        "tensor_types": dict(sorted(by_type.items(), key=lambda kv: -kv[1]["bytes"])),
    }
