"""Read vLLM's own start-up lines about memory, and set them beside the fit estimate.

The supervisor feeds each log line (or the whole log) to ``parse_vllm_capacity``;
the result is a plain dict to store on the deployment. The lines' wordings (a few
per figure, newest first) are the engine's knowledge: inference/engines/vllm.py,
``CAPACITY_LINES``.

With tensor parallel every rank prints its own "Model loading" and "Available KV
cache memory" line: the parser keeps the largest weights and the smallest KV cache
(the rank that limits).
"""
from __future__ import annotations

from typing import Iterable

from inference.engines.vllm import CAPACITY_LINES, CONCURRENCY_LINE, READY_LINE

GiB = 1024**3


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
        for name, pattern in CAPACITY_LINES:
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
        m = CONCURRENCY_LINE.search(line)
        if m:
            found["max_model_len"] = int(_number(m.group(1)))
            found["max_concurrency"] = _number(m.group(2))
        if READY_LINE in line:
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
