"""What a benchmark is told and what it records: plain dataclasses.

The load shape, the requests, the run's configuration, one record per
request and the run's result; no I/O here. The harness (harness.py) fills
them, metrics.py aggregates them, the services store their dicts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

# Not Django's: the harness also runs as plain Python (bench/*.py, without Django's settings, which
# Django's own reads); the panel translates the English msgid when it shows it (BenchmarkError.translated).
from inference.engines.base import gettext_noop

# Chosen by bench/harness.py (bench/results/harness_2cpu.txt): at 256 paced
# streams the lean client (lean.py) sent with p99 lag 1.5 ms against aiohttp's
# 2.4 ms (both with parsing after the phase; before that aiohttp's per-read
# coroutine wake-ups saturated the loop, 18-70 ms), and parsed 1.17x the SSE
# chunks per CPU-second; httpx parsed ~6x fewer than aiohttp and needed
# seconds just to open 256 streams (httpx #3215).
DEFAULT_CLIENT = "lean"


# The HTTP clients the harness can send with (harness.CLIENTS): same interface,
# bench/harness.py measures them side by side.
CLIENT_NAMES = ("lean", "aiohttp", "httpx")


class BenchmarkError(Exception):
    """A benchmark could not run; the message says what to fix.

    Keeps its msgid and values apart: str() is the English text, translated()
    the text in the language a Django caller has active."""

    def __init__(self, message: str, **params):
        self.msgid, self.params = message, params
        super().__init__(message % params if params else message)

    def translated(self, gettext) -> str:
        """The message through `gettext` (Django's, passed in: this module stays plain Python)."""
        text = gettext(self.msgid)
        return text % self.params if self.params else text


class ServerHTTPError(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(f"HTTP {status}: {text[:300]}")
        self.status = status


@dataclass
class LoadShape:
    """How requests are sent.

    kind "concurrency": keep `concurrency` requests in flight (closed loop).
    kind "rate": open loop, `request_rate` requests/s with gamma-distributed
    gaps (`burstiness` 1.0 = Poisson, <1 burstier, >1 more even), optionally
    capped at `concurrency` in flight.
    """

    kind: str = "concurrency"
    concurrency: int | None = 1
    request_rate: float = math.inf
    burstiness: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        if self.kind not in ("concurrency", "rate"):
            raise BenchmarkError(gettext_noop("Unknown load shape %(kind)r: use 'concurrency' or 'rate'."),
                                 kind=self.kind)
        if self.kind == "concurrency" and (not self.concurrency or self.concurrency < 1):
            raise BenchmarkError(gettext_noop("A fixed-concurrency load needs concurrency >= 1."))
        if self.kind == "rate" and not self.request_rate > 0:
            raise BenchmarkError(gettext_noop("A request-rate load needs request_rate > 0 (inf sends all at once)."))
        if self.burstiness <= 0:
            raise BenchmarkError(gettext_noop("burstiness must be > 0 (1.0 is a Poisson process)."))


@dataclass
class RequestSpec:
    """One request to send: a prompt (text, or chat messages) and an output length."""

    prompt: str | list[dict]
    max_tokens: int
    prompt_tokens: int | None = None  # as counted by the tokenizer, if known


@dataclass
class BenchmarkConfig:
    base_url: str  # e.g. http://127.0.0.1:8000 (no /v1)
    model: str
    endpoint: str = "chat"  # "chat" -> /v1/chat/completions, "completions" -> /v1/completions
    load: LoadShape = field(default_factory=LoadShape)
    ignore_eos: bool = True  # synthetic prompts: generate the full output length
    extra_body: dict = field(default_factory=dict)
    api_key: str | None = None
    timeout_s: float = 6 * 3600
    client: str = DEFAULT_CLIENT  # "lean", "aiohttp" or "httpx"
    # vLLM (and SGLang) put usage in every chunk with this, which gives exact
    # tokens per chunk; servers that do not know it ignore it.
    continuous_usage: bool = True
    goodput_slos: dict[str, float] = field(default_factory=dict)  # {"ttft": ms, "tpot": ms, "e2el": ms}
    scrape_metrics: bool = True  # /metrics before and after the measured phase
    percentiles: tuple[float, ...] = (50, 90, 95, 99)

    @property
    def api_url(self) -> str:
        path = "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"
        return self.base_url.rstrip("/") + path

    def validate(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise BenchmarkError(gettext_noop("base_url %(url)r must start with http:// or https://."),
                                 url=self.base_url)
        if self.endpoint not in ("chat", "completions"):
            raise BenchmarkError(gettext_noop("Unknown endpoint %(endpoint)r: use 'chat' or 'completions'."),
                                 endpoint=self.endpoint)
        if self.client not in CLIENT_NAMES:
            raise BenchmarkError(gettext_noop("Unknown HTTP client %(client)r: use one of %(names)s."),
                                 client=self.client, names=sorted(CLIENT_NAMES))
        for name in self.goodput_slos:
            if name not in ("ttft", "tpot", "e2el"):
                raise BenchmarkError(gettext_noop("Unknown goodput SLO %(name)r: use ttft, tpot or e2el "
                                                  "(milliseconds)."), name=name)
        self.load.validate()


@dataclass
class RequestRecord:
    """What happened to one request. Times are seconds; `*_at` are relative
    to the start of the measured phase, the rest relative to `sent_at`."""

    index: int
    scheduled_at: float = 0.0  # when the load shape wanted it sent
    ready_at: float = 0.0  # when it was allowed (a concurrency slot was free)
    sent_at: float = 0.0  # when the HTTP request started
    success: bool = False
    error: str = ""
    ttft: float = 0.0  # first chunk with a choice (vLLM's definition)
    ttft_content: float = 0.0  # first chunk with generated text
    latency: float = 0.0  # end-to-end: last token chunk
    chunk_times: list[float] = field(default_factory=list)  # every chunk with a choice
    tokens_per_chunk: list[int] = field(default_factory=list)  # aligned with chunk_times
    tokens_per_chunk_source: str = "counted"  # "usage" (continuous usage) or "counted"
    output_tokens: int = 0
    output_tokens_source: str = "counted"  # "usage" or "counted" (content chunks)
    prompt_tokens: int = 0
    prompt_tokens_source: str = "unknown"  # "usage", "tokenizer" or "unknown"
    finish_reason: str | None = None
    generated_text: str = ""
    server_timings: dict | None = None  # llama.cpp's "timings" object, if sent

    @property
    def send_lag(self) -> float:
        return self.sent_at - self.ready_at

    @property
    def queue_time(self) -> float:
        return self.ready_at - self.scheduled_at

    @property
    def itl(self) -> list[float]:
        times = self.chunk_times
        return [b - a for a, b in zip(times, times[1:])]

    def to_dict(self) -> dict:
        data = asdict(self)
        data["send_lag"] = self.send_lag
        data["itl"] = self.itl
        return data


@dataclass
class ProgressUpdate:
    phase: str  # "warmup", "measure" or "done"
    completed: int
    failed: int
    total: int
    elapsed_s: float
    step: int = 0  # sweep step (0-based) and how many there are
    steps: int = 1
    concurrency: int | None = None


@dataclass
class RunResult:
    config: dict  # snapshot of BenchmarkConfig (no api key)
    records: list[RequestRecord]
    duration: float  # measured phase, first send to last response
    num_warmups: int
    cancelled: bool = False
    started_at: float = 0.0  # wall clock (time.time()) at the measured phase start
    metrics: dict = field(default_factory=dict)
    server_metrics: dict | None = None  # /metrics deltas over the measured phase
    client: str = DEFAULT_CLIENT

    def to_dict(self, detailed: bool = False) -> dict:
        out = {
            "config": self.config,
            "duration": self.duration,
            "num_warmups": self.num_warmups,
            "cancelled": self.cancelled,
            "started_at": self.started_at,
            "client": self.client,
            "metrics": self.metrics,
            "server_metrics": self.server_metrics,
        }
        if detailed:
            out["records"] = [r.to_dict() for r in self.records]
        return out
