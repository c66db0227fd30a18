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
from collections.abc import Callable, Sequence
from dataclasses import asdict

from inference.benchmarks import metrics as metrics_mod
from inference.benchmarks.clients import AiohttpClient, HttpxClient
from inference.benchmarks.lean import LeanClient
from inference.benchmarks.records import (CLIENT_NAMES, DEFAULT_CLIENT, BenchmarkConfig, BenchmarkError,
                                          LoadShape, ProgressUpdate, RequestRecord, RequestSpec, RunResult,
                                          gettext_noop)
from inference.benchmarks.server import metrics_delta, scrape
from inference.benchmarks.stream import Deferred, build_payload, send_request

CLIENTS = {"lean": LeanClient, "aiohttp": AiohttpClient, "httpx": HttpxClient}
assert tuple(CLIENTS) == CLIENT_NAMES

__all__ = ["BenchmarkConfig", "BenchmarkError", "DEFAULT_CLIENT", "LoadShape", "ProgressUpdate", "RequestRecord",
           "RequestSpec", "RunResult", "arun_benchmark", "run_benchmark", "run_sweep"]


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
        raise BenchmarkError(gettext_noop("No requests to send: give at least one prompt."))
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
        before = await scrape(client, config)
        started_at = time.time()
        with gc_paused():
            records, duration, cancelled, loop_lags = await _run_phase(
                client, config, requests, "measure", progress, cancel, extra)
        after = await scrape(client, config) if before is not None else None
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
