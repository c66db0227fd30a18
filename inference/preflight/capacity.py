"""Read vLLM's own start-up lines about memory, and set them beside the fit estimate.

The supervisor feeds each log line (or the whole log) to ``parse_vllm_capacity``;
the result is a plain dict to store on the deployment. Line formats differ between
vLLM versions, so each figure has a few patterns, newest first:

    Model loading took 15.06 GiB memory and 8.123456 seconds        (2025-26, gpu_model_runner)
    Model loading took 27.5185 GiB and 305.873276 seconds           (V1, late 2025)
    Loading model weights took 67.7229 GB                           (early V1 / V0)
    Available KV cache memory: 8.11 GiB
    GPU KV cache size: 178,880 tokens
    GPU KV cache size: 34,952 tokens, Maximum concurrency for 8,192 tokens per request: 4.27x
    Maximum concurrency for 2048 tokens per request: 10.79x
    # GPU blocks: 1381                                              (tokens = blocks x block size)
    Estimated CUDA graph memory: 0.73 GiB total
    ... the rest of the memory reserved for KV Cache is 1.57GiB.    (V0 worker summary)

With tensor parallel every rank prints its own "Model loading" and "Available KV
cache memory" line: the parser keeps the largest weights and the smallest KV cache
(the rank that limits).
"""
from __future__ import annotations

import re
from typing import Iterable

GiB = 1024**3

_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"

PATTERNS: list[tuple[str, re.Pattern]] = [
    ("model_loading_gib", re.compile(r"Model loading took " + _NUM + r" ?GiB")),
    ("model_loading_gib", re.compile(r"Loading model weights took " + _NUM + r" ?GB")),
    ("model_loading_gib", re.compile(r"model weights take " + _NUM + r" ?GiB")),
    ("available_kv_cache_gib", re.compile(r"Available KV cache memory: " + _NUM + r" ?GiB")),
    ("available_kv_cache_gib", re.compile(r"memory reserved for KV Cache is " + _NUM + r" ?GiB")),
    ("kv_cache_tokens", re.compile(r"GPU KV cache size: " + _NUM + r" tokens")),
    ("gpu_blocks", re.compile(r"# (?:GPU|cuda|CUDA) blocks: " + _NUM)),
    ("cuda_graph_gib", re.compile(r"Estimated CUDA graph memory: " + _NUM + r" ?GiB")),
    ("cuda_graph_gib", re.compile(r"Graph capturing finished in \S+ secs?, took " + _NUM + r" ?GiB")),
]
_CONCURRENCY = re.compile(r"Maximum concurrency for " + _NUM + r" tokens per request: " + _NUM + r"x")
_STARTED = "Application startup complete."


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_vllm_capacity(lines: Iterable[str] | str, block_size: int = 16) -> dict:
    """Pull vLLM's memory figures out of its log.

    Returns a dict with whichever of these were found: model_loading_gib,
    available_kv_cache_gib, kv_cache_tokens, max_model_len, max_concurrency,
    cuda_graph_gib, gpu_blocks, started (bool).
    """
    if isinstance(lines, str):
        lines = lines.splitlines()
    found: dict = {}
    for line in lines:
        if not isinstance(line, str):
            continue
        for name, pattern in PATTERNS:
            m = pattern.search(line)
            if m:
                value = _number(m.group(1))
                if name in ("kv_cache_tokens", "gpu_blocks"):
                    # the engine-wide figure is printed once; keep the smallest if repeated
                    found[name] = int(min(value, found.get(name, value)))
                elif name == "available_kv_cache_gib":
                    found[name] = min(value, found.get(name, value))   # the poorest rank limits
                else:
                    found[name] = max(value, found.get(name, value))
        m = _CONCURRENCY.search(line)
        if m:
            found["max_model_len"] = int(_number(m.group(1)))
            found["max_concurrency"] = _number(m.group(2))
        if _STARTED in line:
            found["started"] = True
    if "kv_cache_tokens" not in found and "gpu_blocks" in found:
        found["kv_cache_tokens"] = found["gpu_blocks"] * block_size
    return found


def compare_with_estimate(report, actual: dict) -> list[dict]:
    """Rows of estimate vs actual for the deployment page.

    `report` is a ``fit.FitReport`` (or its ``as_dict()``); `actual` is what
    ``parse_vllm_capacity`` returned. Each row: what, estimate, actual, unit, ratio
    (actual / estimate, None when either side is missing).
    """
    r = report if isinstance(report, dict) else report.as_dict()
    gpu = (r.get("gpus") or [{}])[0]
    rows = [
        ("weights per GPU", gpu.get("weights_bytes"), actual.get("model_loading_gib"), "GiB"),
        ("KV cache per GPU", gpu.get("kv_cache_bytes"), actual.get("available_kv_cache_gib"), "GiB"),
        ("KV cache tokens", r.get("kv_cache_tokens"), actual.get("kv_cache_tokens"), "tokens"),
        ("max concurrency at max_model_len", r.get("concurrency_ratio"), actual.get("max_concurrency"), "x"),
    ]
    out = []
    for what, est, act, unit in rows:
        if unit == "GiB" and est is not None:
            est = round(est / GiB, 2)
        ratio = round(act / est, 3) if est and act is not None else None
        out.append({"what": what, "estimate": est, "actual": act, "unit": unit, "ratio": ratio})
    return out
