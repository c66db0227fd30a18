"""Aggregate per-request records exactly as `vllm bench serve` does.

Same definitions and JSON field names as vLLM's calculate_metrics(), so a
Kiln run and a `vllm bench serve --save-result` file compare key by key:

- TTFT: send -> first streamed chunk carrying a choice.
- TPOT: (E2EL - TTFT) / (output tokens - 1), requests with > 1 output token.
- ITL: gaps between successive chunks carrying a choice (per chunk, so with
  speculative decoding one gap may cover several tokens: see tokens per chunk).
- E2EL: send -> last chunk carrying a choice.
- Throughputs divide totals over successful requests by the wall duration.
- Goodput: successful requests meeting every SLO (ms) / duration; a request
  with <= 1 output token counts as TPOT 0 for the SLO.
- mean/median/std are numpy's (population std), percentiles numpy's linear.

Extras that vLLM does not report carry their own names: *_ttft_content_ms
(first chunk with generated text), *_send_lag_ms (client scheduling delay),
mean_tokens_per_chunk, decode/prefill rates per stream, token sources, and
*_loop_lag_ms (how late the client's event loop ran: client health).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np


def _stats(prefix: str, values_s: Sequence[float], percentiles: Iterable[float], out: dict) -> None:
    """mean/median/std/pN of values given in seconds, written in milliseconds."""
    arr = np.asarray(values_s if len(values_s) else [0.0], dtype=float) * 1000.0
    out[f"mean_{prefix}_ms"] = float(np.mean(arr))
    out[f"median_{prefix}_ms"] = float(np.median(arr))
    out[f"std_{prefix}_ms"] = float(np.std(arr))
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{prefix}_ms"] = float(np.percentile(arr, p))


def _source(values: Iterable[str]) -> str | None:
    seen = set(values)
    if not seen:
        return None
    return seen.pop() if len(seen) == 1 else "mixed"


def summarize(records: Sequence, duration: float, goodput_slos: dict[str, float] | None = None,
              percentiles: Iterable[float] = (50, 90, 95, 99)) -> dict:
    """Aggregate RequestRecords (records.py) over a measured phase of `duration` s."""
    percentiles = tuple(percentiles)
    ok = [r for r in records if r.success]
    failed = [r for r in records if not r.success]
    dur = duration if duration > 0 else math.nan

    ttfts, tpots, all_tpots, itls, e2els = [], [], [], [], []
    ttft_content, send_lags, per_chunk = [], [], []
    decode_rates, prefill_rates = [], []
    total_input = total_output = 0
    for r in ok:
        out = r.output_tokens
        total_input += r.prompt_tokens
        total_output += out
        tpot = 0.0
        if out > 1:
            tpot = (r.latency - r.ttft) / (out - 1)
            tpots.append(tpot)
            if r.latency > r.ttft:
                decode_rates.append((out - 1) / (r.latency - r.ttft))
        all_tpots.append(tpot)
        itls.extend(r.itl)
        ttfts.append(r.ttft)
        e2els.append(r.latency)
        if r.ttft_content:
            ttft_content.append(r.ttft_content)
        if r.prompt_tokens and r.ttft > 0:
            prefill_rates.append(r.prompt_tokens / r.ttft)
        per_chunk.extend(n for n in r.tokens_per_chunk if n)
    send_lags = [r.send_lag for r in records if r.sent_at or r.success]

    good = 0
    slos = goodput_slos or {}
    if slos:
        per_request = {"ttft": ttfts, "tpot": all_tpots, "e2el": e2els}
        for i in range(len(ok)):
            if all(per_request[name][i] <= limit_ms / 1000.0 for name, limit_ms in slos.items()):
                good += 1

    peak_tokens, peak_concurrency = _peaks(ok)
    result = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(failed),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(ok) / dur,
        "request_goodput": good / dur if slos else None,
        "output_throughput": total_output / dur,
        "total_token_throughput": (total_input + total_output) / dur,
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_concurrency,
    }
    _stats("ttft", ttfts, percentiles, result)
    _stats("tpot", tpots, percentiles, result)
    _stats("itl", itls, percentiles, result)
    _stats("e2el", e2els, percentiles, result)
    _stats("ttft_content", ttft_content, percentiles, result)
    _stats("send_lag", send_lags, percentiles, result)
    result.update({
        "goodput_slos_ms": dict(slos) or None,
        "mean_tokens_per_chunk": float(np.mean(per_chunk)) if per_chunk else None,
        "max_tokens_per_chunk": int(max(per_chunk)) if per_chunk else None,
        "tokens_per_chunk_source": _source(r.tokens_per_chunk_source for r in ok),
        "output_tokens_source": _source(r.output_tokens_source for r in ok),
        "prompt_tokens_source": _source(r.prompt_tokens_source for r in ok),
        # Per stream: the decode speed a user watching one answer sees, and the
        # prompt-processing speed implied by TTFT (both medians over requests).
        "median_decode_tokens_per_s_per_stream": float(np.median(decode_rates)) if decode_rates else None,
        "median_prefill_tokens_per_s": float(np.median(prefill_rates)) if prefill_rates else None,
        "error_counts": dict(Counter(_short_error(r.error) for r in failed)),
    })
    return result


def loop_lag_summary(lags_s: Sequence[float]) -> dict:
    """Client health: how late the harness's event loop ran due timers (ms).
    p99 above a few ms means the client machine skewed the latencies."""
    arr = np.asarray(lags_s if len(lags_s) else [0.0]) * 1000.0
    return {"p50_loop_lag_ms": float(np.percentile(arr, 50)), "p99_loop_lag_ms": float(np.percentile(arr, 99)),
            "max_loop_lag_ms": float(arr.max())}


def _short_error(error: str) -> str:
    line = (error or "unknown error").strip().splitlines()[0]
    return line[:200]


def _peaks(ok: Sequence) -> tuple[float, int]:
    """Peak output tokens in any 1 s bucket and peak concurrent requests (vLLM's way)."""
    if not ok:
        return 0.0, 0
    start = min(r.sent_at for r in ok)
    end = max(r.sent_at + r.latency for r in ok)
    buckets = np.zeros(int(np.ceil(end - start)) + 1)
    for r in ok:
        weights = r.tokens_per_chunk if r.tokens_per_chunk_source == "usage" else [1] * len(r.chunk_times)
        for t, w in zip(r.chunk_times, weights):
            b = int(r.sent_at + t - start)
            if 0 <= b < len(buckets):
                buckets[b] += w
    events = sorted([(r.sent_at, 1) for r in ok] + [(r.sent_at + r.latency, -1) for r in ok])
    current = peak = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return float(buckets.max()), peak
