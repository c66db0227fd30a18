"""An inference engine's /metrics page, turned into one schema for Kiln.

vLLM, llama.cpp's llama-server and SGLang all expose Prometheus text, each
with its own names, and the names drift between versions (vLLM renamed
``gpu_cache_usage_perc`` to ``kv_cache_usage_perc``; old vLLM published
ready-made ``avg_*_throughput_toks_per_s`` gauges that V1 dropped). So the
engine is detected from the names present, every schema field lists the
names it may come from (newest first), and a missing name reads ``None``.
The parser and the names are inference/engines/metrics.py's (each engine
module declares its own names); the benchmark harness reads the same ones.

Token rates come from counters, which need two scrapes: ``EngineMetricsReader``
keeps the previous scrape per deployment and turns counter deltas into
per-second rates, treating a counter that went down as an engine restart.

    reader = EngineMetricsReader()          # one per deployment
    snapshot = reader.read(metrics_text)    # call once per scrape
    snapshot["generation_tokens_per_s"]
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from inference.engines.metrics import (
    ENGINE_NAMES,
    ENGINE_PREFIXES,
    MetricsParseError,
    detect_engine,
    extract,
    parse_prometheus_text,
)

# Counters whose per-second rate or interval delta the schema uses.
COUNTERS = ("prompt_tokens_total", "generation_tokens_total", "cached_tokens_total", "preemptions_total",
            "prefix_cache_queries_total", "prefix_cache_hits_total", "spec_drafts_total",
            "spec_draft_tokens_total", "spec_accepted_tokens_total")

SCHEMA_FIELDS = ("engine", "prompt_tokens_per_s", "generation_tokens_per_s", "requests_running",
                 "requests_waiting", "kv_cache_usage", "prefix_cache_hit_rate", "preemptions_total",
                 "preemptions_per_s", "spec_decode_acceptance_rate", "spec_decode_mean_accept_length",
                 "prompt_tokens_total", "generation_tokens_total", "rate_window_s", "problem")

# llama-server adds a request's tokens to its counters only when the request
# ends, so a rate between two 1-second scrapes jumps between 0 and several times
# the real rate. Its rates are taken over this many seconds instead (the page
# says "averaged over 30 s"); engines that count as they go use two scrapes.
RATE_WINDOW_S = {"llamacpp": 30.0}


# --------------------------------------------------------------------- rates


@dataclass
class CounterDeltas:
    seconds: float
    deltas: dict[str, float | None]

    def rate(self, key: str) -> float | None:
        delta = self.deltas.get(key)
        return None if delta is None else delta / self.seconds


class RateTracker:
    """Counter deltas between two scrapes of one deployment, or over a window.

    With `window_s`, the delta is taken from the newest scrape at least that
    old (the oldest one while the window fills), so a counter that moves in
    steps gives a steady rate. A counter lower than last time means the engine
    restarted and counted again from zero, so the delta is the new value
    (Prometheus' rule), never a negative rate; the window starts again there.
    """

    def __init__(self, window_s: float = 0.0):
        self.window_s = window_s
        self._points: deque[tuple[float, dict[str, float | None]]] = deque()
        self.resets = 0

    @property
    def _last(self):
        return self._points[-1] if self._points else None

    def update(self, counters: dict[str, float | None], now: float) -> CounterDeltas | None:
        previous = self._last
        if previous is not None and now - previous[0] <= 0:
            return None  # a clock that did not move: keep the older point
        restarted = previous is not None and any(
            v is not None and previous[1].get(k) is not None and v < previous[1][k] for k, v in counters.items())
        if restarted:
            self._points.clear()  # the engine counted again from zero: the window starts here
            self._points.append(previous)
        base = previous
        for point in self._points:
            if now - point[0] >= self.window_s:
                base = point  # the newest point at least window_s old
            else:
                break
        if self.window_s and base is previous and self._points:
            base = self._points[0]  # the window is still filling: its oldest point
        if restarted:
            self._points.clear()
        self._points.append((now, dict(counters)))
        while len(self._points) > 2 and now - self._points[1][0] >= self.window_s:
            self._points.popleft()
        if base is None:
            return None
        then, old = base
        seconds = now - then
        deltas: dict[str, float | None] = {}
        reset = False
        for key, value in counters.items():
            before = old.get(key)
            if value is None or before is None:
                deltas[key] = None
            elif value < before:
                deltas[key] = value
                reset = True
            else:
                deltas[key] = value - before
        if reset:
            self.resets += 1
        return CounterDeltas(seconds, deltas)


def _ratio(part: float | None, whole: float | None) -> float | None:
    if part is None or whole is None or whole <= 0:
        return None
    return part / whole


class EngineMetricsReader:
    """Turns successive /metrics texts of ONE deployment into schema dicts."""

    def __init__(self, engine: str | None = None):
        if engine is not None and engine not in ENGINE_NAMES:
            raise ValueError(f"Unknown engine {engine!r}: expected one of {sorted(ENGINE_NAMES)}")
        self.engine = engine
        self.tracker = RateTracker(RATE_WINDOW_S.get(engine, 0.0))

    def read(self, text: str, now: float | None = None) -> dict:
        now = time.monotonic() if now is None else now
        try:
            samples = parse_prometheus_text(text, prefixes=tuple(ENGINE_PREFIXES.values()))
        except MetricsParseError as exc:
            return empty_snapshot(self.engine, problem=str(exc))
        engine = self.engine or detect_engine(samples)
        if engine is None:
            return empty_snapshot(None, problem="No vLLM, llama.cpp or SGLang metrics on this /metrics page "
                                                "(for llama-server, start it with --metrics).")
        if self.engine is None:
            self.tracker.window_s = RATE_WINDOW_S.get(engine, 0.0)
        self.engine = engine
        raw = extract(samples, engine)
        counters = {k: raw.get(k) for k in COUNTERS}
        deltas = self.tracker.update(counters, now)
        snapshot = summarize(engine, raw, deltas)
        snapshot["rate_window_s"] = self.tracker.window_s or None
        return snapshot


def empty_snapshot(engine: str | None, problem: str | None = None) -> dict:
    snapshot = dict.fromkeys(SCHEMA_FIELDS)
    snapshot["engine"] = engine
    snapshot["problem"] = problem
    return snapshot


def summarize(engine: str, raw: dict, deltas: CounterDeltas | None) -> dict:
    """One schema dict from raw values and (from the 2nd scrape on) counter deltas."""
    snap = empty_snapshot(engine)
    rate = deltas.rate if deltas else (lambda key: None)
    delta = deltas.deltas.get if deltas else (lambda key: None)

    snap["prompt_tokens_per_s"] = rate("prompt_tokens_total")
    snap["generation_tokens_per_s"] = rate("generation_tokens_total")
    # Old vLLM and SGLang also publish their own averages: use them when
    # counters cannot give a rate yet (first scrape) or at all.
    if snap["prompt_tokens_per_s"] is None:
        snap["prompt_tokens_per_s"] = raw.get("prompt_tokens_per_s_gauge")
    if snap["generation_tokens_per_s"] is None:
        snap["generation_tokens_per_s"] = raw.get("generation_tokens_per_s_gauge")

    for key in ("requests_running", "requests_waiting", "kv_cache_usage", "preemptions_total",
                "prompt_tokens_total", "generation_tokens_total"):
        snap[key] = raw.get(key)
    for key in ("requests_running", "requests_waiting", "preemptions_total", "prompt_tokens_total",
                "generation_tokens_total"):
        if snap[key] is not None:
            snap[key] = int(snap[key])
    snap["preemptions_per_s"] = rate("preemptions_total")

    # Prefix cache: hit rate over the last interval when there were lookups,
    # else over the engine's life (so an idle engine does not show "n/a").
    hit = _ratio(delta("prefix_cache_hits_total"), delta("prefix_cache_queries_total"))
    if hit is None and engine == "llamacpp":
        cached, prompt = delta("cached_tokens_total"), delta("prompt_tokens_total")
        hit = _ratio(cached, cached + prompt if cached is not None and prompt is not None else None)
        if hit is None:
            cached, prompt = raw.get("cached_tokens_total"), raw.get("prompt_tokens_total")
            hit = _ratio(cached, cached + prompt if cached is not None and prompt is not None else None)
    if hit is None and engine == "sglang":
        hit = raw.get("prefix_cache_hit_rate_gauge")
        if hit is None:
            hit = _ratio(delta("cached_tokens_total"), delta("prompt_tokens_total"))
    if hit is None:
        hit = _ratio(raw.get("prefix_cache_hits_total"), raw.get("prefix_cache_queries_total"))
    snap["prefix_cache_hit_rate"] = hit

    # Speculative decoding: accepted / drafted tokens, same interval rule.
    acceptance = _ratio(delta("spec_accepted_tokens_total"), delta("spec_draft_tokens_total"))
    if acceptance is None:
        acceptance = raw.get("spec_acceptance_gauge")
    if acceptance is None:
        acceptance = _ratio(raw.get("spec_accepted_tokens_total"), raw.get("spec_draft_tokens_total"))
    snap["spec_decode_acceptance_rate"] = acceptance

    per_draft = _ratio(delta("spec_accepted_tokens_total"), delta("spec_drafts_total"))
    if per_draft is None:
        per_draft = _ratio(raw.get("spec_accepted_tokens_total"), raw.get("spec_drafts_total"))
    # Mean acceptance length conventionally counts the bonus token (vLLM's log line does).
    snap["spec_decode_mean_accept_length"] = 1 + per_draft if per_draft is not None else raw.get(
        "spec_accept_length_gauge")
    return snap
