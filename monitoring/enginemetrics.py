"""An inference engine's /metrics page, turned into one schema for Kiln.

vLLM, llama.cpp's llama-server and SGLang all expose Prometheus text, each
with its own names, and the names drift between versions (vLLM renamed
``gpu_cache_usage_perc`` to ``kv_cache_usage_perc``; old vLLM published
ready-made ``avg_*_throughput_toks_per_s`` gauges that V1 dropped). So the
engine is detected from the names present, every schema field lists the
names it may come from (newest first), and a missing name reads ``None``.

Token rates come from counters, which need two scrapes: ``EngineMetricsReader``
keeps the previous scrape per deployment and turns counter deltas into
per-second rates, treating a counter that went down as an engine restart.

    reader = EngineMetricsReader()          # one per deployment
    snapshot = reader.read(metrics_text)    # call once per scrape
    snapshot["generation_tokens_per_s"]
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

ENGINE_PREFIXES = {"vllm": "vllm:", "llamacpp": "llamacpp:", "sglang": "sglang:"}

# Schema field -> metric names that may carry it, newest first.
# "sum" adds the samples of all label sets (e.g. several vLLM data-parallel
# engines); "max" keeps the fullest one (a KV cache is full when one is).
ENGINE_NAMES = {
    "vllm": {
        "prompt_tokens_total": (["vllm:prompt_tokens_total"], "sum"),
        "generation_tokens_total": (["vllm:generation_tokens_total"], "sum"),
        "requests_running": (["vllm:num_requests_running"], "sum"),
        "requests_waiting": (["vllm:num_requests_waiting"], "sum"),
        "kv_cache_usage": (["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"], "max"),
        "prefix_cache_queries_total": (["vllm:prefix_cache_queries_total",
                                        "vllm:gpu_prefix_cache_queries_total"], "sum"),
        "prefix_cache_hits_total": (["vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"], "sum"),
        "preemptions_total": (["vllm:num_preemptions_total"], "sum"),
        "spec_drafts_total": (["vllm:spec_decode_num_drafts_total"], "sum"),
        "spec_draft_tokens_total": (["vllm:spec_decode_num_draft_tokens_total"], "sum"),
        "spec_accepted_tokens_total": (["vllm:spec_decode_num_accepted_tokens_total"], "sum"),
        # Old vLLM (V0) only: the engine's own averages over its log interval.
        "prompt_tokens_per_s_gauge": (["vllm:avg_prompt_throughput_toks_per_s"], "sum"),
        "generation_tokens_per_s_gauge": (["vllm:avg_generation_throughput_toks_per_s"], "sum"),
        "spec_acceptance_gauge": (["vllm:spec_decode_draft_acceptance_rate"], "max"),
    },
    "llamacpp": {
        "prompt_tokens_total": (["llamacpp:prompt_tokens_total"], "sum"),
        "generation_tokens_total": (["llamacpp:tokens_predicted_total"], "sum"),
        "requests_running": (["llamacpp:requests_processing"], "sum"),
        "requests_waiting": (["llamacpp:requests_deferred"], "sum"),
        # Newer builds: prompt tokens reused from the cache (prompt_tokens_total excludes them).
        "cached_tokens_total": (["llamacpp:prompt_tokens_cached_total"], "sum"),
        # Dropped from newer llama-server builds: then None.
        "kv_cache_usage": (["llamacpp:kv_cache_usage_ratio"], "max"),
        # Newer llama-server builds with speculative decoding.
        "spec_drafts_total": (["llamacpp:spec_decode_num_drafts_total"], "sum"),
        "spec_draft_tokens_total": (["llamacpp:spec_decode_num_draft_tokens_total"], "sum"),
        "spec_accepted_tokens_total": (["llamacpp:spec_decode_num_accepted_tokens_total"], "sum"),
    },
    "sglang": {
        "prompt_tokens_total": (["sglang:prompt_tokens_total"], "sum"),
        "generation_tokens_total": (["sglang:generation_tokens_total"], "sum"),
        "cached_tokens_total": (["sglang:cached_tokens_total"], "sum"),
        "requests_running": (["sglang:num_running_reqs"], "sum"),
        "requests_waiting": (["sglang:num_queue_reqs"], "sum"),
        "kv_cache_usage": (["sglang:token_usage"], "max"),
        "prefix_cache_hit_rate_gauge": (["sglang:cache_hit_rate"], "max"),
        # SGLang calls a preemption a retraction.
        "preemptions_total": (["sglang:num_retracted_requests_total"], "sum"),
        "spec_acceptance_gauge": (["sglang:spec_accept_rate"], "max"),
        "spec_accept_length_gauge": (["sglang:spec_accept_length"], "max"),
        "generation_tokens_per_s_gauge": (["sglang:gen_throughput"], "sum"),
    },
}

# Counters whose per-second rate or interval delta the schema uses.
COUNTERS = ("prompt_tokens_total", "generation_tokens_total", "cached_tokens_total", "preemptions_total",
            "prefix_cache_queries_total", "prefix_cache_hits_total", "spec_drafts_total",
            "spec_draft_tokens_total", "spec_accepted_tokens_total")

SCHEMA_FIELDS = ("engine", "prompt_tokens_per_s", "generation_tokens_per_s", "requests_running",
                 "requests_waiting", "kv_cache_usage", "prefix_cache_hit_rate", "preemptions_total",
                 "preemptions_per_s", "spec_decode_acceptance_rate", "spec_decode_mean_accept_length",
                 "prompt_tokens_total", "generation_tokens_total", "problem")


class MetricsParseError(ValueError):
    pass


# ------------------------------------------------------------------ parsing

_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = re.compile(r'\\(.)')


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse_prometheus_text(text: str, prefixes: tuple[str, ...] | None = None) -> dict[str, list[tuple[dict, float]]]:
    """Prometheus text exposition -> {sample name: [(labels, value), ...]}.

    A small parser of our own: on a 54 KB vLLM page it is several times
    faster than prometheus_client's (bench/monitoring.py measures both), and
    with ``prefixes`` it skips the lines of metrics nobody asked for before
    looking at their labels. Comment/TYPE/HELP lines are skipped; a malformed
    line raises MetricsParseError naming the line.
    """
    out: dict[str, list[tuple[dict, float]]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
            if prefixes is not None and not name.startswith(prefixes):
                continue
            labels, end = _parse_labels(line, brace, number)
            rest = line[end:].split()
        else:
            if space == -1:
                line = line.strip()
                if not line:
                    continue
                raise MetricsParseError(f"/metrics line {number} has a name but no value: {line[:120]!r}")
            name = line[:space]
            if prefixes is not None and not name.startswith(prefixes):
                continue
            labels = {}
            rest = line[space:].split()
        if not rest:
            raise MetricsParseError(f"/metrics line {number} has no value: {line[:120]!r}")
        try:
            value = float(rest[0])
        except ValueError:
            raise MetricsParseError(f"/metrics line {number} has a value that is not a number: {line[:120]!r}")
        out.setdefault(name, []).append((labels, value))
    return out


def _parse_labels(line: str, brace: int, number: int) -> tuple[dict, int]:
    labels = {}
    pos = brace + 1
    while True:
        while pos < len(line) and line[pos] in " ,":
            pos += 1
        if pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        match = _LABEL.match(line, pos)
        if not match:
            raise MetricsParseError(f"/metrics line {number} has malformed labels: {line[:120]!r}")
        labels[match.group(1)] = _unescape(match.group(2))
        pos = match.end()


def detect_engine(names) -> str | None:
    """'vllm', 'llamacpp', 'sglang' or None, by which prefix most names carry."""
    counts = {engine: 0 for engine in ENGINE_PREFIXES}
    for name in names:
        for engine, prefix in ENGINE_PREFIXES.items():
            if name.startswith(prefix):
                counts[engine] += 1
    best = max(counts, key=counts.get)
    return best if counts[best] else None


def _pick(samples: dict, names: list[str], how: str) -> float | None:
    for name in names:
        found = samples.get(name)
        if found:
            values = [v for _, v in found if not math.isnan(v)]
            if not values:
                return None
            return sum(values) if how == "sum" else max(values)
    return None


def extract(samples: dict, engine: str) -> dict[str, float | None]:
    """The raw schema inputs (counters and gauges) for one engine's samples."""
    return {key: _pick(samples, names, how) for key, (names, how) in ENGINE_NAMES[engine].items()}


# --------------------------------------------------------------------- rates


@dataclass
class CounterDeltas:
    seconds: float
    deltas: dict[str, float | None]

    def rate(self, key: str) -> float | None:
        delta = self.deltas.get(key)
        return None if delta is None else delta / self.seconds


class RateTracker:
    """Counter deltas between two scrapes of one deployment.

    A counter lower than last time means the engine restarted and counted
    again from zero, so the delta is the new value (Prometheus' rule), never a
    negative rate.
    """

    def __init__(self):
        self._last: tuple[float, dict[str, float | None]] | None = None
        self.resets = 0

    def update(self, counters: dict[str, float | None], now: float) -> CounterDeltas | None:
        previous, self._last = self._last, (now, dict(counters))
        if previous is None:
            return None
        then, old = previous
        seconds = now - then
        if seconds <= 0:
            self._last = previous  # a clock that did not move: keep the older point
            return None
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
        self.tracker = RateTracker()

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
        self.engine = engine
        raw = extract(samples, engine)
        counters = {k: raw.get(k) for k in COUNTERS}
        deltas = self.tracker.update(counters, now)
        return summarize(engine, raw, deltas)


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
