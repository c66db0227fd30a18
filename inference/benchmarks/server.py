"""What the harness asks the engine itself: token counts (/tokenize) and the
counters of /metrics before and after the measured phase.

Metric names come from the engine plugins' tables and the one Prometheus
parser (inference/engines/metrics.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from inference.benchmarks.records import BenchmarkConfig
from inference.engines.metrics import (
    MetricsParseError,
    detect_engine,
    first_present,
    parse_prometheus_text,
    sum_by_name,
)


class ServerTokenizer:
    """Counts tokens with the deployment's own /tokenize, else estimates.

    vLLM: POST /tokenize {"model", "prompt"} -> {"count", "tokens"}.
    llama.cpp: POST /tokenize {"content"} -> {"tokens"} (an empty list when
    "content" is missing, so the vLLM shape cannot simply be tried on it).
    `source` records which was used: "vllm /tokenize", "llama.cpp /tokenize"
    or "estimate (4 characters per token)".
    """

    def __init__(self, base_url: str, model: str, engine: str | None = None, timeout_s: float = 30.0,
                 api_key: str | None = None):
        self.url = base_url.rstrip("/") + "/tokenize"
        self.model = model
        self.engine = engine
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=timeout_s, trust_env=False, headers=headers)
        self.source: str | None = None
        self.failure: str | None = None

    def close(self) -> None:
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _try(self, body: dict) -> int | None:
        try:
            resp = self._http.post(self.url, json=body)
        except httpx.HTTPError as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
            return None
        if resp.status_code != 200:
            self.failure = f"HTTP {resp.status_code} from {self.url}"
            return None
        try:
            data = resp.json()
        except ValueError:
            self.failure = f"{self.url} did not answer JSON"
            return None
        if isinstance(data, dict):
            if isinstance(data.get("count"), int):
                return data["count"]
            if isinstance(data.get("tokens"), list):
                return len(data["tokens"])
        self.failure = f"{self.url} answered without tokens"
        return None

    def count(self, text: str) -> int:
        if self.source in (None, "vllm /tokenize") and self.engine in (None, "vllm", "sglang"):
            n = self._try({"model": self.model, "prompt": text})
            if n is not None and (n > 0 or not text.strip()):
                self.source = "vllm /tokenize"
                return n
        if self.source in (None, "llama.cpp /tokenize") and self.engine in (None, "llamacpp"):
            n = self._try({"content": text})
            if n is not None and (n > 0 or not text.strip()):
                self.source = "llama.cpp /tokenize"
                return n
        self.source = "estimate (4 characters per token)"
        return max(1, round(len(text) / 4))


# server_metrics key -> the field of the engines' metric-name tables
# (inference/engines/<engine>.py: metric_names) whose counter it reports.
SERVER_COUNTERS = {
    "prompt_tokens": "prompt_tokens_total",
    "generation_tokens": "generation_tokens_total",
    "prefix_cache_queries": "prefix_cache_queries_total",
    "prefix_cache_hits": "prefix_cache_hits_total",
    "preemptions": "preemptions_total",
    "requests_success": "requests_success_total",
}


async def scrape(client, config: BenchmarkConfig) -> dict[str, float] | None:
    """Every metric of /metrics summed over its label sets; None when there
    are none (llama.cpp without --metrics), the page does not parse, or
    scraping is off."""
    if not config.scrape_metrics:
        return None
    try:
        status, text = await asyncio.wait_for(client.get_text(config.base_url.rstrip("/") + "/metrics"), 10)
    except Exception:
        return None
    if status != 200:
        return None
    try:
        return sum_by_name(parse_prometheus_text(text))
    except MetricsParseError:
        return None


def metrics_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict | None:
    """Server-side view of a run: counter deltas and the prefix-cache hit rate."""
    if before is None or after is None:
        return None
    delta = {name: after[name] - before.get(name, 0.0) for name in after
             if name.endswith("_total") and not name.endswith("_created")}
    summary: dict[str, Any] = {}
    engine = detect_engine(after)
    for key, table_field in SERVER_COUNTERS.items():
        value = first_present(delta, engine, table_field) if engine else None
        if value is not None:
            summary[key] = value
    queries, hits = summary.get("prefix_cache_queries"), summary.get("prefix_cache_hits")
    summary["prefix_cache_hit_rate"] = hits / queries if queries else None
    summary["counters"] = delta
    return summary
