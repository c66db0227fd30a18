"""Async load generator for OpenAI-compatible streaming endpoints.

Measures the way `vllm bench serve` does (see metrics.py for the aggregate):
per request the send time, TTFT (first chunk carrying a choice), the TTFT to
the first chunk with generated text (a role-only first delta is not a token),
every chunk's arrival time and how many tokens it carried, end-to-end latency,
and output/prompt tokens taken from the server's `usage` (asked for with
`stream_options.include_usage`) with the source recorded.

Plain Python: the Celery task calls `run_benchmark` / `run_sweep` from a
worker thread with a progress callback and a `threading.Event` to cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import math
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import httpx

from inference.benchmarks import metrics as metrics_mod
from inference.engines.metrics import (
    MetricsParseError,
    detect_engine,
    first_present,
    parse_prometheus_text,
    sum_by_name,
)

# Chosen by bench/harness.py (bench/results/harness_2cpu.txt): at 256 paced
# streams the lean client (lean.py) sent with p99 lag 1.5 ms against aiohttp's
# 2.4 ms (both with parsing after the phase; before that aiohttp's per-read
# coroutine wake-ups saturated the loop, 18-70 ms), and parsed 1.17x the SSE
# chunks per CPU-second; httpx parsed ~6x fewer than aiohttp and needed
# seconds just to open 256 streams (httpx #3215).
DEFAULT_CLIENT = "lean"


class BenchmarkError(Exception):
    """A benchmark could not run; the message says what to fix."""


class ServerHTTPError(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(f"HTTP {status}: {text[:300]}")
        self.status = status


# --------------------------------------------------------------------------
# Configuration and records
# --------------------------------------------------------------------------


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
            raise BenchmarkError(f"Unknown load shape {self.kind!r}: use 'concurrency' or 'rate'.")
        if self.kind == "concurrency" and (not self.concurrency or self.concurrency < 1):
            raise BenchmarkError("A fixed-concurrency load needs concurrency >= 1.")
        if self.kind == "rate" and not self.request_rate > 0:
            raise BenchmarkError("A request-rate load needs request_rate > 0 (inf sends all at once).")
        if self.burstiness <= 0:
            raise BenchmarkError("burstiness must be > 0 (1.0 is a Poisson process).")


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
            raise BenchmarkError(f"base_url {self.base_url!r} must start with http:// or https://.")
        if self.endpoint not in ("chat", "completions"):
            raise BenchmarkError(f"Unknown endpoint {self.endpoint!r}: use 'chat' or 'completions'.")
        if self.client not in CLIENTS:
            raise BenchmarkError(f"Unknown HTTP client {self.client!r}: use one of {sorted(CLIENTS)}.")
        for name in self.goodput_slos:
            if name not in ("ttft", "tpot", "e2el"):
                raise BenchmarkError(f"Unknown goodput SLO {name!r}: use ttft, tpot or e2el (milliseconds).")
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


# --------------------------------------------------------------------------
# HTTP clients: same interface, bench/harness.py measures both.
# --------------------------------------------------------------------------


class _CollectsStream:
    """`collect` on top of `stream`: (seconds since `start`, bytes) per read."""

    async def collect(self, url: str, body: bytes, headers: dict, reads: list, start: float) -> None:
        perf = time.perf_counter
        async for data in self.stream(url, body, headers):
            reads.append((perf() - start, data))


class AiohttpClient(_CollectsStream):
    name = "aiohttp"

    def __init__(self, max_connections: int | None, timeout_s: float):
        self._limit = max_connections or 0
        self._timeout = timeout_s
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self):
        connector = aiohttp.TCPConnector(limit=self._limit, limit_per_host=self._limit, keepalive_timeout=60)
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self._timeout), trust_env=False
        )
        return self

    async def __aexit__(self, *exc):
        await self.session.close()

    async def stream(self, url: str, body: bytes, headers: dict) -> AsyncIterator[bytes]:
        # A pooled connection the server already closed (llama-server's
        # cpp-httplib drops idle keep-alive connections after 5 s) fails before
        # any response arrives: send once more on a fresh connection. Nothing
        # was generated, so the measurement is not skewed beyond one connect.
        for attempt in (1, 2):
            try:
                resp = await self.session.post(url, data=body, headers=headers)
                break
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                if attempt == 2:
                    raise
        async with resp:
            if resp.status != 200:
                raise ServerHTTPError(resp.status, await resp.text())
            async for data in resp.content.iter_any():
                yield data

    async def get_text(self, url: str) -> tuple[int, str]:
        async with self.session.get(url) as resp:
            return resp.status, await resp.text()

    async def post_json(self, url: str, obj: dict) -> tuple[int, Any]:
        async with self.session.post(url, json=obj) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text


class HttpxClient(_CollectsStream):
    name = "httpx"

    def __init__(self, max_connections: int | None, timeout_s: float):
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._timeout = timeout_s
        self.client: httpx.AsyncClient | None = None

    async def __aenter__(self):
        self.client = httpx.AsyncClient(limits=self._limits, timeout=self._timeout, trust_env=False)
        return self

    async def __aexit__(self, *exc):
        await self.client.aclose()

    async def stream(self, url: str, body: bytes, headers: dict) -> AsyncIterator[bytes]:
        async with self.client.stream("POST", url, content=body, headers=headers) as resp:
            if resp.status_code != 200:
                raise ServerHTTPError(resp.status_code, (await resp.aread()).decode("utf-8", "replace"))
            async for data in resp.aiter_raw():
                yield data

    async def get_text(self, url: str) -> tuple[int, str]:
        resp = await self.client.get(url)
        return resp.status_code, resp.text

    async def post_json(self, url: str, obj: dict) -> tuple[int, Any]:
        resp = await self.client.post(url, json=obj)
        try:
            return resp.status_code, resp.json()
        except ValueError:
            return resp.status_code, resp.text


from inference.benchmarks.lean import LeanClient  # noqa: E402  (uses ServerHTTPError above)

CLIENTS = {"lean": LeanClient, "aiohttp": AiohttpClient, "httpx": HttpxClient}


# --------------------------------------------------------------------------
# SSE parsing
# --------------------------------------------------------------------------


class SSEParser:
    """Incremental server-sent-events parser: feed bytes, get event payloads.

    One network read may hold several events, or half of one; events end at
    a blank line (LF or CRLF). Returns (field, data) pairs where field is
    "data" for normal events and "error" for llama.cpp's `error:` lines.
    """

    def __init__(self):
        self._buf = b""

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        buf = self._buf + data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        out = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            block = buf[start:end]
            start = end + 2
            for line in block.split(b"\n"):
                if line.startswith(b"data:"):
                    out.append(("data", line[5:].strip().decode("utf-8", "replace")))
                elif line.startswith(b"error:"):
                    out.append(("error", line[6:].strip().decode("utf-8", "replace")))
                # comments (":ping"), "event:" and "id:" lines carry no tokens
        self._buf = buf[start:]
        return out

    @property
    def pending(self) -> bytes:
        return self._buf


def _choice_text(choice: dict, chat: bool) -> str:
    """Generated text in one choice, reasoning included (it is generated tokens)."""
    if not chat:
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    text = delta.get("content") or ""
    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
    if delta.get("tool_calls"):
        reasoning += json.dumps(delta["tool_calls"])
    return reasoning + text if reasoning else text


# --------------------------------------------------------------------------
# One request
# --------------------------------------------------------------------------


def build_payload(config: BenchmarkConfig, spec: RequestSpec) -> dict:
    options = {"include_usage": True}
    if config.continuous_usage:
        options["continuous_usage_stats"] = True
    if config.endpoint == "chat":
        messages = spec.prompt if isinstance(spec.prompt, list) else [{"role": "user", "content": spec.prompt}]
        payload = {"model": config.model, "messages": messages, "max_completion_tokens": spec.max_tokens,
                   "max_tokens": spec.max_tokens}
    else:
        if isinstance(spec.prompt, list):
            raise BenchmarkError("The completions endpoint needs text prompts, not chat messages.")
        payload = {"model": config.model, "prompt": spec.prompt, "max_tokens": spec.max_tokens}
    payload.update({"stream": True, "stream_options": options})
    if config.ignore_eos:
        payload["ignore_eos"] = True
    payload.update(config.extra_body)
    return payload


async def send_request(client, config: BenchmarkConfig, spec: RequestSpec, record: RequestRecord,
                       t0: float, body: bytes | None = None, deferred: "Deferred | None" = None) -> RequestRecord:
    """Send one streaming request and fill `record`. Never raises for server faults.

    While the answer streams in, only (arrival time, bytes) per network read
    is kept; the events are parsed when the stream has ended
    (analyze_stream), or, with `deferred`, after the whole phase, so a busy
    client spends no time per chunk beyond storing it and sends stay on
    schedule. Timestamps are taken per read, as they arrive, so the figures
    are the same as parsing on the fly.
    """
    headers = {"Content-Type": "application/json"}
    if config.api_key:
        headers["Authorization"] = f"Bearer {config.api_key}"
    if body is None:
        body = json.dumps(build_payload(config, spec)).encode()
    if spec.prompt_tokens:
        record.prompt_tokens, record.prompt_tokens_source = spec.prompt_tokens, "tokenizer"
    chat = config.endpoint == "chat"
    reads: list[tuple[float, bytes]] = []
    transport_error = None
    st = time.perf_counter()
    record.sent_at = st - t0
    try:
        await client.collect(config.api_url, body, headers, reads, st)
    except ServerHTTPError as exc:
        transport_error = str(exc)
    except asyncio.CancelledError:
        analyze_stream(record, reads, chat, "cancelled")
        raise
    except Exception as exc:  # network faults, timeouts, cut streams
        transport_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if deferred is not None:
        deferred.add(record, reads, chat, transport_error)
    else:
        analyze_stream(record, reads, chat, transport_error)
    return record


class Deferred:
    """Streams read during a phase and parsed after it: parsing (~7 us per
    event here) stays out of the event loop while requests are being sent.
    Until then a record's `success` only says the transport finished; more
    than LIMIT bytes held are parsed at once instead, to bound memory."""

    LIMIT = 64 << 20

    def __init__(self):
        self.items: list[tuple] = []
        self.held = 0

    def add(self, record: RequestRecord, reads: list, chat: bool, transport_error: str | None) -> None:
        size = sum(len(data) for _, data in reads)
        if self.held + size > self.LIMIT:
            analyze_stream(record, reads, chat, transport_error)
            return
        record.success = transport_error is None  # provisional, for live progress
        self.items.append((record, reads, chat, transport_error))
        self.held += size

    def flush(self) -> None:
        for item in self.items:
            analyze_stream(*item)
        self.items.clear()
        self.held = 0


def analyze_stream(record: RequestRecord, reads: list[tuple[float, bytes]], chat: bool,
                   transport_error: str | None = None) -> RequestRecord:
    """Fill `record` from a stream's reads: (seconds since sent, bytes) each.

    An error event in the stream ends the request there (later events are
    not counted); a transport error applies after the events that did arrive.
    """
    record.success = False
    parser = SSEParser()
    last_usage_tokens = 0
    usage_tokens = None
    saw_done = False
    texts = []
    times = record.chunk_times
    per_chunk = record.tokens_per_chunk
    continuous = True  # every token chunk carried usage so far
    error = None
    try:
        for now, data in reads:
            for kind, payload in parser.feed(data):
                if kind == "error":
                    raise ServerHTTPError(500, f"error event in stream: {payload}")
                if payload == "[DONE]":
                    saw_done = True
                    continue
                try:
                    event = json.loads(payload)
                except ValueError:
                    raise ServerHTTPError(200, f"stream sent a line that is not JSON: {payload[:120]}")
                if "error" in event and not event.get("choices"):
                    err = event["error"]
                    message = err.get("message", err) if isinstance(err, dict) else err
                    raise ServerHTTPError(500, f"error event in stream: {message}")
                usage = event.get("usage")
                choices = event.get("choices")
                if choices:
                    choice = choices[0]
                    if not times:
                        record.ttft = now
                    times.append(now)
                    text = _choice_text(choice, chat)
                    if usage and usage.get("completion_tokens") is not None:
                        done = usage["completion_tokens"]
                        per_chunk.append(done - last_usage_tokens)
                        last_usage_tokens = done
                    else:
                        continuous = False
                        per_chunk.append(1 if text else 0)
                    if text:
                        if not texts:
                            record.ttft_content = now
                        texts.append(text)
                    if choice.get("finish_reason"):
                        record.finish_reason = choice["finish_reason"]
                if usage:
                    if usage.get("completion_tokens") is not None:
                        usage_tokens = usage["completion_tokens"]
                    if usage.get("prompt_tokens") is not None:
                        record.prompt_tokens, record.prompt_tokens_source = usage["prompt_tokens"], "usage"
                if "timings" in event:
                    record.server_timings = event["timings"]
    except ServerHTTPError as exc:
        error = str(exc)
    if error is None:
        error = transport_error
    if error is not None:
        record.error = error
    elif not times:
        record.error = "The stream ended without any chunk carrying a choice; TTFT cannot be measured."
    elif not saw_done and record.finish_reason is None:
        record.error = "The stream ended before [DONE] or a finish_reason: the connection was cut."
    else:
        record.success = True
    record.generated_text = "".join(texts)
    if times:
        record.latency = times[-1]
    if continuous and times and last_usage_tokens:
        record.tokens_per_chunk_source = "usage"
    if usage_tokens is not None:
        record.output_tokens, record.output_tokens_source = usage_tokens, "usage"
    else:
        record.output_tokens = sum(1 for n in per_chunk if n)  # chunks with text
        record.output_tokens_source = "counted"
    return record


# --------------------------------------------------------------------------
# Load shapes
# --------------------------------------------------------------------------


def arrival_offsets(n: int, request_rate: float, burstiness: float, seed: int) -> list[float]:
    """Send offsets (s) for an open-loop load, as vllm bench serve draws them:
    gamma-distributed gaps with mean 1/rate, rescaled so the n-th request is due
    at n/rate exactly (keeps throughput comparable between seeds)."""
    if math.isinf(request_rate):
        return [0.0] * n
    rng = random.Random(seed)
    theta = 1.0 / (request_rate * burstiness)
    offsets, total = [], 0.0
    for _ in range(n):
        total += rng.gammavariate(burstiness, theta)
        offsets.append(total)
    if offsets and offsets[-1] > 0:
        scale = (n / request_rate) / offsets[-1]
        offsets = [o * scale for o in offsets]
    return offsets


class _Progress:
    """Throttles progress callbacks to a few per second (they may write a DB row)."""

    def __init__(self, callback, total, phase, t0, interval=0.25, **extra):
        self.callback, self.total, self.phase, self.t0 = callback, total, phase, t0
        self.interval, self.extra = interval, extra
        self.completed = self.failed = 0
        self._last = 0.0

    def done(self, record: RequestRecord, force: bool = False) -> None:
        if record.success:
            self.completed += 1
        else:
            self.failed += 1
        self.report(force)

    def report(self, force: bool = False, phase: str | None = None) -> None:
        if self.callback is None:
            return
        now = time.perf_counter()
        finished = self.completed + self.failed >= self.total
        if force or finished or now - self._last >= self.interval:
            self._last = now
            self.callback(ProgressUpdate(phase or self.phase, self.completed, self.failed, self.total,
                                         now - self.t0, **self.extra))


async def _run_phase(client, config: BenchmarkConfig, specs: Sequence[RequestSpec], phase: str,
                     progress, cancel: threading.Event | None, extra: dict):
    """Send `specs` under the configured load shape.
    Returns (records, duration, cancelled, event-loop lags)."""
    load = config.load
    n = len(specs)
    records = [RequestRecord(index=i) for i in range(n)]
    bodies = [json.dumps(build_payload(config, s)).encode() for s in specs]  # off the hot path
    t0 = time.perf_counter()
    tracker = _Progress(progress, n, phase, t0, **extra)
    tracker.report(force=True)
    cancelled = False
    deferred = Deferred()

    async def one(i: int) -> None:
        await send_request(client, config, specs[i], records[i], t0, bodies[i], deferred)
        tracker.done(records[i])

    loop_lags: list[float] = []
    monitor = asyncio.ensure_future(_watch_loop_lag(loop_lags))
    collector = asyncio.ensure_future(_young_gc()) if phase == "measure" else None
    tasks: list[asyncio.Task] = []
    if load.kind == "concurrency":
        # Closed loop: each worker sends its next request as soon as the last ends.
        cursor = iter(range(n))

        async def worker() -> None:
            free_at = 0.0
            for i in cursor:
                records[i].scheduled_at = records[i].ready_at = free_at
                await one(i)
                free_at = time.perf_counter() - t0

        tasks = [asyncio.ensure_future(worker()) for _ in range(min(load.concurrency, n))]
    else:
        offsets = arrival_offsets(n, load.request_rate, load.burstiness, load.seed)
        slots = asyncio.Semaphore(load.concurrency) if load.concurrency else None

        async def timed(i: int) -> None:
            records[i].scheduled_at = offsets[i]
            if slots is None:
                records[i].ready_at = offsets[i]
                await one(i)
                return
            # Only time spent waiting for a free slot is queueing; a late
            # dispatcher is send lag and must stay visible as such.
            waited = slots.locked()
            async with slots:
                records[i].ready_at = (time.perf_counter() - t0) if waited else offsets[i]
                await one(i)

        async def dispatcher() -> None:
            for i in range(n):
                # uvloop's timers have millisecond resolution and may fire a
                # little early: sleep again until the request is really due.
                while (delay := offsets[i] - (time.perf_counter() - t0)) > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(timed(i)))

        dispatch = asyncio.ensure_future(dispatcher())
        cancelled = await _wait_or_cancel([dispatch], cancel)
        if cancelled:
            dispatch.cancel()
    if not cancelled:
        cancelled = await _wait_or_cancel(tasks, cancel)
    duration = time.perf_counter() - t0
    monitor.cancel()
    if collector is not None:
        collector.cancel()
    if cancelled:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    deferred.flush()
    tracker.completed = sum(r.success for r in records)  # events parsed now: the exact tally
    tracker.failed = sum(1 for r in records if r.error and r.error != "cancelled")
    if cancelled:
        for r in records:
            if not r.success and not r.error:
                r.error = "cancelled"
    tracker.report(force=True)
    return records, duration, cancelled, loop_lags


# Python's cyclic GC, left to itself, stopped the client for up to ~60 ms at
# a time in a paced 256-stream run (full collections over a heap that grows
# with the records), and every late send counts against the measurement. The
# measured phase runs with automatic collection off; young objects are
# collected every few seconds (a short, bounded pass) and a full pass runs
# after the phase.
_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = True
YOUNG_GC_INTERVAL_S = 5.0


@contextlib.contextmanager
def gc_paused():
    """Automatic garbage collection off for the block (nested and thread-safe)."""
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()
                gc.collect()


async def _young_gc(interval: float = YOUNG_GC_INTERVAL_S) -> None:
    while True:
        await asyncio.sleep(interval)
        gc.collect(1)


async def _watch_loop_lag(lags: list[float], interval: float = 0.005) -> None:
    """How late the event loop runs a timer that is due: the lateness any due
    send or chunk timestamp suffers. High values mean the client, not the
    server, is the bottleneck."""
    perf = time.perf_counter
    while True:
        due = perf() + interval
        await asyncio.sleep(interval)
        lags.append(max(0.0, perf() - due))


async def _wait_or_cancel(tasks: list[asyncio.Task], cancel: threading.Event | None) -> bool:
    """Wait for all tasks; True if `cancel` was set while some were pending."""
    pending = set(tasks)
    while pending:
        _, pending = await asyncio.wait(pending, timeout=0.05 if cancel is not None else None)
        if pending and cancel is not None and cancel.is_set():
            return True
    return False


def config_snapshot(config: BenchmarkConfig) -> dict:
    data = asdict(config)
    data.pop("api_key", None)
    data["load"]["request_rate"] = "inf" if math.isinf(config.load.request_rate) else config.load.request_rate
    data["percentiles"] = list(config.percentiles)
    return data


async def arun_benchmark(config: BenchmarkConfig, requests: Sequence[RequestSpec],
                         warmup_requests: Sequence[RequestSpec] = (),
                         progress: Callable[[ProgressUpdate], None] | None = None,
                         cancel: threading.Event | None = None,
                         _step: tuple[int, int] = (0, 1)) -> RunResult:
    config.validate()
    if not requests:
        raise BenchmarkError("No requests to send: give at least one prompt.")
    limit = config.load.concurrency if config.load.concurrency else None
    extra = {"step": _step[0], "steps": _step[1], "concurrency": config.load.concurrency}
    async with CLIENTS[config.client](limit, config.timeout_s) as client:
        if warmup_requests:
            # Warm-ups run under the same concurrency and are not measured.
            warm_config = dataclasses.replace(config, load=LoadShape(
                "concurrency", config.load.concurrency or len(warmup_requests)))
            await _run_phase(client, warm_config, warmup_requests, "warmup", progress, cancel, extra)
            if cancel is not None and cancel.is_set():
                return RunResult(config_snapshot(config), [], 0.0, len(warmup_requests), cancelled=True,
                                 started_at=time.time(), client=config.client)
        before = await _scrape(client, config)
        started_at = time.time()
        with gc_paused():
            records, duration, cancelled, loop_lags = await _run_phase(
                client, config, requests, "measure", progress, cancel, extra)
        after = await _scrape(client, config) if before is not None else None
    measured = [r for r in records if r.error != "cancelled"]
    result = RunResult(config_snapshot(config), measured, duration, len(warmup_requests), cancelled,
                       started_at, client=config.client)
    result.metrics = metrics_mod.summarize(measured, duration, config.goodput_slos, config.percentiles)
    result.metrics.update(metrics_mod.loop_lag_summary(loop_lags))
    result.server_metrics = metrics_delta(before, after)
    if progress is not None:
        ok = sum(r.success for r in measured)
        progress(ProgressUpdate("done", ok, len(measured) - ok, len(requests), duration, **extra))
    return result


def run_async(coro):
    """Run `coro` on a fresh event loop: uvloop's where installed (it comes
    with uvicorn[standard]); its I/O callbacks cost the client less per read."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def run_benchmark(config: BenchmarkConfig, requests: Sequence[RequestSpec],
                  warmup_requests: Sequence[RequestSpec] = (),
                  progress: Callable[[ProgressUpdate], None] | None = None,
                  cancel: threading.Event | None = None) -> RunResult:
    """Run one load (blocking). Safe to call from a Celery worker thread."""
    return run_async(arun_benchmark(config, requests, warmup_requests, progress, cancel))


def run_sweep(config: BenchmarkConfig, concurrencies: Sequence[int],
              make_requests: Callable[[int], tuple[list[RequestSpec], list[RequestSpec]]],
              progress: Callable[[ProgressUpdate], None] | None = None,
              cancel: threading.Event | None = None) -> list[RunResult]:
    """Run one fixed-concurrency load per level (1, 8, 16, 32...).

    `make_requests(concurrency)` returns (measured, warm-up) requests for that
    level. Stops early, keeping finished steps, when cancelled.
    """
    results = []
    for step, level in enumerate(concurrencies):
        step_config = dataclasses.replace(config, load=LoadShape("concurrency", level))
        measured, warmups = make_requests(level)
        result = run_async(arun_benchmark(step_config, measured, warmups, progress, cancel,
                                            _step=(step, len(concurrencies))))
        results.append(result)
        if result.cancelled:
            break
    return results


# --------------------------------------------------------------------------
# Tokenization and engine metrics
# --------------------------------------------------------------------------


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


async def _scrape(client, config: BenchmarkConfig) -> dict[str, float] | None:
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
