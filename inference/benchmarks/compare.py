"""Export, import and compare benchmark results.

The common result is a flat dict keyed like `vllm bench serve --save-result`
(mean_ttft_ms, p99_itl_ms, output_throughput, completed, ...) plus a few
identity keys: source ("kiln", "vllm" or "guidellm"), label, model_id,
max_concurrency, request_rate. Kiln runs, vLLM result files and guidellm
reports all become this dict, so any two can be compared key by key.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

from django.utils.translation import gettext as _

# Detailed per-request lists in vLLM result files: kept out of comparisons.
VLLM_DETAIL_FIELDS = ("input_lens", "output_lens", "start_times", "ttfts", "itls", "latencies",
                      "queue_times", "generated_texts", "errors")

# Metrics shown when comparing, with the direction that is better.
COMPARED_METRICS: dict[str, str] = {
    "request_throughput": "higher",
    "request_goodput": "higher",
    "output_throughput": "higher",
    "total_token_throughput": "higher",
    "max_output_tokens_per_s": "higher",
    "completed": "higher",
    "failed": "lower",
    "median_decode_tokens_per_s_per_stream": "higher",
    "median_prefill_tokens_per_s": "higher",
    "mean_tokens_per_chunk": "higher",
}
for _name in ("ttft", "tpot", "itl", "e2el", "ttft_content"):
    for _stat in ("mean", "median", "std", "p50", "p90", "p95", "p99"):
        COMPARED_METRICS[f"{_stat}_{_name}_ms"] = "lower"


class ResultFormatError(ValueError):
    """A file is neither a Kiln/vLLM result nor a guidellm report."""


# --------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------


def vllm_result_json(run, *, label: str | None = None, detailed: bool = False) -> dict:
    """A harness RunResult as a `vllm bench serve --save-result` JSON dict.

    vLLM readers ignore keys they do not know, so Kiln's extras
    (*_ttft_content_ms, send lag, token sources, server_metrics) stay in.
    """
    config = run.config
    load = config["load"]
    chat = config.get("endpoint") == "chat"
    rate = load.get("request_rate", "inf") if load.get("kind") == "rate" else "inf"
    out: dict[str, Any] = {
        "date": datetime.fromtimestamp(run.started_at or 0).strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai-chat" if chat else "openai",
        "backend": "openai-chat" if chat else "openai",
        "label": label,
        "model_id": config.get("model"),
        "tokenizer_id": None,
        "num_prompts": len(run.records),
        "request_rate": rate if rate != math.inf else "inf",
        "burstiness": load.get("burstiness", 1.0),
        "max_concurrency": load.get("concurrency"),
    }
    out.update(run.metrics)
    out["num_warmups"] = run.num_warmups
    out["cancelled"] = run.cancelled
    out["server_metrics"] = run.server_metrics
    out["client"] = run.client
    if detailed:
        records = run.records
        out.update({
            "input_lens": [r.prompt_tokens for r in records],
            "output_lens": [r.output_tokens if r.success else 0 for r in records],
            "ttfts": [r.ttft for r in records],
            "itls": [r.itl for r in records],
            "latencies": [r.latency for r in records],
            "start_times": [r.sent_at for r in records],
            "queue_times": [r.queue_time for r in records],
            "generated_texts": [r.generated_text for r in records],
            "errors": [r.error for r in records],
            "tokens_per_chunk": [r.tokens_per_chunk for r in records],
        })
    return out


# --------------------------------------------------------------------------
# Import
# --------------------------------------------------------------------------


def load_results(source: str | Path | dict | list) -> list[dict]:
    """Common result dicts from a vLLM result file (one) or a guidellm report
    (one per benchmark in it). Accepts a path, JSON text, or parsed JSON."""
    data = source
    if isinstance(source, Path) or (isinstance(source, str) and not source.lstrip().startswith(("{", "["))):
        path = Path(source)
        if not path.is_file():
            raise ResultFormatError(_("No result file at %(path)s.") % {"path": path})
        text = path.read_text(encoding="utf-8")
        # `vllm bench serve --append-result` writes one JSON object per line.
        try:
            data = json.loads(text)
        except ValueError:
            try:
                data = [json.loads(line) for line in text.splitlines() if line.strip()]
            except ValueError as exc:
                raise ResultFormatError(_("%(path)s is not JSON: %(error)s") % {"path": path, "error": exc}) from None
    elif isinstance(source, str):
        try:
            data = json.loads(source)
        except ValueError as exc:
            raise ResultFormatError(_("Result text is not JSON: %(error)s") % {"error": exc}) from None
    if isinstance(data, list):
        return [r for item in data for r in load_results(item)]
    if not isinstance(data, dict):
        raise ResultFormatError(_("A result must be a JSON object."))
    if isinstance(data.get("benchmarks"), list):
        return from_guidellm(data)
    if "completed" in data and ("request_throughput" in data or "mean_e2el_ms" in data):
        return [from_vllm(data)]
    raise ResultFormatError(_(
        "Not a known result format: expected a `vllm bench serve --save-result` file "
        "(with 'completed' and 'request_throughput') or a guidellm report (with 'benchmarks')."
    ))


def from_vllm(data: dict) -> dict:
    result = {k: v for k, v in data.items() if k not in VLLM_DETAIL_FIELDS}
    result.setdefault("source", "vllm")
    if result.get("request_rate") in ("inf", "Infinity"):
        result["request_rate"] = "inf"
    return result


def _dist(metrics: dict, name: str) -> dict | None:
    """guidellm's StatusDistributionSummary -> the 'successful' DistributionSummary."""
    summary = metrics.get(name)
    if not isinstance(summary, dict):
        return None
    dist = summary.get("successful", summary)
    return dist if isinstance(dist, dict) and "mean" in dist else None


def from_guidellm(report: dict) -> list[dict]:
    """One common result per benchmark in a guidellm report (schema v2:
    benchmarks[].metrics.<metric>.successful.{mean, median, std_dev,
    percentiles.{p50,p90,p95,p99}, total_sum}; older reports share the layout)."""
    results = []
    model = None
    config = report.get("config") or report.get("args") or {}
    if isinstance(config, dict):
        model = config.get("model")
    for index, bench in enumerate(report["benchmarks"]):
        metrics = bench.get("metrics") or {}
        strategy = (bench.get("config") or {}).get("strategy") or bench.get("args", {}).get("strategy") or {}
        kind = strategy.get("type_") if isinstance(strategy, dict) else None
        duration = bench.get("duration")
        if duration is None:
            sm = bench.get("scheduler_metrics") or {}
            if "measure_end_time" in sm and "measure_start_time" in sm:
                duration = sm["measure_end_time"] - sm["measure_start_time"]
        totals = metrics.get("request_totals") or {}
        out: dict[str, Any] = {
            "source": "guidellm",
            "label": f"guidellm {kind or 'benchmark'}" + (f"@{strategy.get('streams') or strategy.get('rate')}"
                                                           if isinstance(strategy, dict) and (strategy.get('streams') or strategy.get('rate')) else ""),
            "model_id": model,
            "benchmark_index": index,
            "strategy": kind,
            "max_concurrency": strategy.get("streams") if isinstance(strategy, dict) else None,
            "request_rate": strategy.get("rate", "inf") if isinstance(strategy, dict) else "inf",
            "duration": duration,
            "completed": totals.get("successful"),
            "failed": (totals.get("errored") or 0) + (totals.get("incomplete") or 0),
        }
        for key, name in (("total_input_tokens", "prompt_token_count"), ("total_output_tokens", "output_token_count")):
            dist = _dist(metrics, name)
            out[key] = int(dist["total_sum"]) if dist and dist.get("total_sum") is not None else None
        # guidellm's rates are distributions over time; their mean is the rate.
        for key, name in (("request_throughput", "requests_per_second"),
                          ("output_throughput", "output_tokens_per_second"),
                          ("total_token_throughput", "tokens_per_second")):
            dist = _dist(metrics, name)
            out[key] = dist["mean"] if dist else None
        for ours, theirs, scale in (("ttft", "time_to_first_token_ms", 1.0),
                                    ("ttft_content", "time_to_first_output_token_ms", 1.0),
                                    ("tpot", "time_per_output_token_ms", 1.0),
                                    ("itl", "inter_token_latency_ms", 1.0),
                                    ("e2el", "request_latency", 1000.0)):  # seconds
            dist = _dist(metrics, theirs)
            if not dist:
                continue
            pct = dist.get("percentiles") or {}
            out[f"mean_{ours}_ms"] = dist["mean"] * scale
            out[f"median_{ours}_ms"] = dist["median"] * scale
            out[f"std_{ours}_ms"] = dist.get("std_dev", 0.0) * scale
            for p in ("p50", "p90", "p95", "p99"):
                if p in pct:
                    out[f"{p}_{ours}_ms"] = pct[p] * scale
        dist = _dist(metrics, "output_tokens_per_iteration")
        if dist:
            out["mean_tokens_per_chunk"] = dist["mean"]
        results.append(out)
    return results


# --------------------------------------------------------------------------
# Compare
# --------------------------------------------------------------------------


def _number(value) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def compare(results: list[dict], baseline: int = 0, launch_argvs: list[list[str]] | None = None) -> dict:
    """Side-by-side table of 2+ common results.

    rows: [{"metric", "better", "values", "ratios"}] for every metric any
    result has; ratios are value / baseline value (None where undefined).
    launch_args: the flags whose values differ between the runs' argv lists.
    """
    if len(results) < 2:
        raise ValueError(_("Comparing needs at least two results."))
    if not 0 <= baseline < len(results):
        raise ValueError(_("Baseline index %(index)s is out of range for %(count)s results.")
                         % {"index": baseline, "count": len(results)})
    if launch_argvs is not None and len(launch_argvs) != len(results):
        raise ValueError(_("Give one argv list per result (or none at all)."))
    rows = []
    for metric, better in COMPARED_METRICS.items():
        values = [_number(r.get(metric)) for r in results]
        if all(v is None for v in values):
            continue
        base = values[baseline]
        ratios = [(v / base) if (v is not None and base not in (None, 0.0)) else None for v in values]
        rows.append({"metric": metric, "better": better, "values": values, "ratios": ratios})
    columns = [r.get("label") or f"{r.get('source', 'run')} #{i + 1}" for i, r in enumerate(results)]
    return {
        "columns": columns,
        "baseline": baseline,
        "rows": rows,
        "launch_args": diff_launch_args(launch_argvs) if launch_argvs else {},
    }


def parse_argv(argv: list[str]) -> dict[str, str | None]:
    """Flags of an engine command line: {"--max-model-len": "8192", "--enforce-eager": None}.

    The first element(s) before any flag (program, model path) are kept under
    the key "" so a changed model shows up as a difference too.
    """
    flags: dict[str, str | None] = {}
    positional: list[str] = []
    i = 0
    while i < len(argv):
        item = argv[i]
        if item.startswith("-") and item != "-" and item != "--":
            if "=" in item:
                name, value = item.split("=", 1)
                flags[name] = value
            elif i + 1 < len(argv) and not (argv[i + 1].startswith("-") and not _is_number(argv[i + 1])):
                flags[item] = argv[i + 1]
                i += 1
            else:
                flags[item] = None
        elif item != "--":
            positional.append(item)
        i += 1
    if positional:
        flags[""] = " ".join(positional)
    return flags


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


# Where an engine listens and the key it asks for: not what it is. The panel
# picks a free port per launch, so two launches of one profile differ here and
# nowhere else; an API key is a secret, not a setting that changes speed.
ADDRESS_FLAGS = ("--port", "--host", "--api-key", "--api-key-file")


def configuration_argv(argv: list[str]) -> list[str]:
    """The command line without ADDRESS_FLAGS and their values: what makes two
    launches the same configuration (order and repeated flags kept)."""
    out: list[str] = []
    argv = list(argv or [])
    i = 0
    while i < len(argv):
        item = argv[i]
        if item in ADDRESS_FLAGS:
            has_value = i + 1 < len(argv) and not (argv[i + 1].startswith("-") and not _is_number(argv[i + 1]))
            i += 2 if has_value else 1
            continue
        if item.split("=", 1)[0] in ADDRESS_FLAGS and "=" in item:
            i += 1
            continue
        out.append(item)
        i += 1
    return out


def diff_launch_args(argvs: list[list[str]]) -> dict[str, list[str | bool | None]]:
    """{flag: [value per run]} for flags that differ; a bare switch is True,
    a flag a run does not pass is None. The address flags (port, host, API
    key) are left out: they differ between launches of one configuration."""
    parsed = [parse_argv(configuration_argv(a)) for a in argvs]
    names = sorted({name for p in parsed for name in p})
    diff = {}
    for name in names:
        values = [(p[name] if p[name] is not None else True) if name in p else None for p in parsed]
        if len(set(map(str, values))) > 1:
            diff[name] = values
    return diff


# --------------------------------------------------------------------------
# Roofline
# --------------------------------------------------------------------------

# Peak memory bandwidth, GB/s (vendor data sheets).
GPU_MEMORY_BANDWIDTH_GBPS = {
    "V100": 900.0, "V100S": 1134.0, "T4": 320.0, "A10": 600.0, "A100-40GB": 1555.0, "A100-80GB": 2039.0,
    "L4": 300.0, "L40S": 864.0, "H100-PCIe": 2000.0, "H100-SXM": 3350.0, "H200": 4800.0,
    "RTX 3090": 936.0, "RTX 4090": 1008.0,
}


def roofline_decode_tokens_per_s(memory_bandwidth_gbps: float, weight_bytes: float) -> float:
    """Upper bound on single-stream decode speed: every token reads every
    weight once, so tokens/s <= bandwidth / weight bytes (KV-cache reads and
    kernel overheads only lower it; speculative decoding can beat it)."""
    if memory_bandwidth_gbps <= 0 or weight_bytes <= 0:
        raise ValueError(_("Memory bandwidth and weight size must both be positive."))
    return memory_bandwidth_gbps * 1e9 / weight_bytes
