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

import re
from typing import Iterable

from inference.engines.base import gettext_noop
from inference.engines.vllm import CAPACITY_LINES, CONCURRENCY_LINE, READY_LINE

GiB = 1024**3
MiB = 1024**2


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


# vLLM's summary after profiling (vllm/v1/worker/gpu_worker.py, 0.2x): the overhead's parts.
ACTUAL_USAGE_LINE = re.compile(
    r"Actual usage is ([\d.]+) GiB for weight, ([\d.]+) GiB for peak activation, "
    r"([\d.]+) GiB for non-torch memory, and ([\d.]+) GiB for CUDAGraph memory")
ACTUAL_USAGE_KEYS = ("actual_weight_gib", "peak_activation_gib", "non_torch_gib", "cudagraph_gib")


def parse_actual_usage(lines: Iterable[str] | str) -> dict:
    """The parts of vLLM's "Actual usage is ..." line (the largest per figure over tensor-parallel ranks)."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    found: dict = {}
    for line in lines:
        m = ACTUAL_USAGE_LINE.search(line) if isinstance(line, str) else None
        if m:
            for key, value in zip(ACTUAL_USAGE_KEYS, m.groups()):
                found[key] = max(float(value), found.get(key, 0.0))
    return found


# llama-server's own figures (llama.cpp b7xxx+, printed at verbosity 4: `-lv 4`). Every buffer line is
# per device (CPU_Mapped, CUDA0, ...) and an interleaved-SWA model has two KV caches: they add up.
LLAMACPP_SUMS = (
    ("model_buffer_mib", re.compile(r"load_tensors:\s+\S+ model buffer size =\s*([\d.]+) MiB")),
    ("kv_cache_mib", re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB")),
    ("compute_buffer_mib", re.compile(r"\S+ compute buffer size =\s*([\d.]+) MiB")),
    ("output_buffer_mib", re.compile(r"\S+\s+output buffer size =\s*([\d.]+) MiB")),
)
LLAMACPP_VALUES = (
    ("n_ctx", re.compile(r"llama_context: n_ctx\s*=\s*(\d+)")),
    ("n_ctx_seq", re.compile(r"llama_context: n_ctx_seq\s*=\s*(\d+)")),
    ("n_seq_max", re.compile(r"llama_context: n_seq_max\s*=\s*(\d+)")),
)
# a new start of the server: figures from an earlier start no longer count
LLAMACPP_RESTART = re.compile(r"srv\s+load_model: loading model '|llama_model_loader: loaded meta data")


def parse_llamacpp_memory(lines: Iterable[str] | str, previous: dict | None = None) -> dict:
    """llama-server's memory lines: model, KV cache, compute and output buffers (MiB), n_ctx, n_seq_max.

    The watch loop hands the log over in chunks; pass what the earlier chunks gave as `previous` and
    the sums go on from there (a line that starts the model again begins new sums)."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    found = dict(previous or {})
    for line in lines:
        if not isinstance(line, str):
            continue
        if LLAMACPP_RESTART.search(line):
            found = {}
            continue
        for name, pattern in LLAMACPP_SUMS:
            m = pattern.search(line)
            if m:
                found[name] = round(found.get(name, 0.0) + float(m.group(1)), 2)
        for name, pattern in LLAMACPP_VALUES:
            m = pattern.search(line)
            if m:
                found[name] = int(m.group(1))
    return found


def compare_llamacpp(report, actual: dict) -> list[dict]:
    """Rows of Kiln's estimate vs llama-server's own figures (MiB), for a llama.cpp deployment."""
    r = (report if isinstance(report, dict) else report.as_dict()) if report else {}
    gpu = (r.get("gpus") or [{}])[0]
    rows = [
        # `what` stays English (the page's data-what); the page translates it (and the unit) when it shows it
        (gettext_noop("model buffers"), gpu.get("weights_bytes"), actual.get("model_buffer_mib"), "MiB"),
        (gettext_noop("KV cache"), gpu.get("kv_cache_bytes"), actual.get("kv_cache_mib"), "MiB"),
        (gettext_noop("compute and output buffers"), gpu.get("overhead_bytes"),
         round(actual["compute_buffer_mib"] + actual.get("output_buffer_mib", 0), 2)
         if "compute_buffer_mib" in actual else None, "MiB"),
        # Kiln passes max_model_len as --ctx-size: the context of all slots together
        (gettext_noop("context (all slots)"), r.get("max_model_len"), actual.get("n_ctx"), gettext_noop("tokens")),
    ]
    out = []
    for what, est, act, unit in rows:
        if unit == "MiB" and est is not None:
            est = round(est / MiB, 1)
        ratio = round(act / est, 3) if est and act is not None else None
        out.append({"what": what, "estimate": est, "actual": act, "unit": unit, "ratio": ratio})
    return out


def compare_with_estimate(report, actual: dict) -> list[dict]:
    """Rows of estimate vs actual for the deployment page.

    `report` is a ``fit.FitReport`` (or its ``as_dict()``); `actual` is what
    ``parse_vllm_capacity`` returned. Each row: what, estimate, actual, unit, ratio
    (actual / estimate, None when either side is missing).
    """
    r = report if isinstance(report, dict) else report.as_dict()
    gpu = (r.get("gpus") or [{}])[0]
    rows = [
        (gettext_noop("weights per GPU"), gpu.get("weights_bytes"), actual.get("model_loading_gib"), "GiB"),
        (gettext_noop("KV cache per GPU"), gpu.get("kv_cache_bytes"), actual.get("available_kv_cache_gib"), "GiB"),
        (gettext_noop("KV cache tokens"), r.get("kv_cache_tokens"), actual.get("kv_cache_tokens"), "tokens"),
        (gettext_noop("max concurrency at max_model_len"), r.get("concurrency_ratio"), actual.get("max_concurrency"),
         "x"),
    ]
    parts = [actual.get(k) for k in ("peak_activation_gib", "non_torch_gib", "cudagraph_gib")]
    if gpu.get("activation_bytes") or all(p is not None for p in parts):
        est = sum(gpu.get(k) or 0 for k in ("activation_bytes", "non_torch_bytes", "cudagraph_bytes")) or None
        rows.append((gettext_noop("activation, non-torch and CUDA graphs per GPU"), est,
                     round(sum(parts), 2) if all(p is not None for p in parts) else None, "GiB"))
    out = []
    for what, est, act, unit in rows:
        if unit == "GiB" and est is not None:
            est = round(est / GiB, 2)
        ratio = round(act / est, 3) if est and act is not None else None
        out.append({"what": what, "estimate": est, "actual": act, "unit": unit, "ratio": ratio})
    return out
