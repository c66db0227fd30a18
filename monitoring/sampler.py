"""The monitor loop: the one producer of live data on a GPU host.

Every tick (fixed rate, 1 s by default, down to 0.25 s) it samples all GPUs
through NVML, drains Xid events, scrapes each running deployment's /metrics,
and publishes ONE message with everything to the channel layer group that
browser tabs listen on. History rows are buffered and written in batches on a
database thread, off the tick's path; the heartbeat key in Redis says the
monitor is alive (and what NVML found) to pages rendered on the server.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import httpx
from django.db import close_old_connections, connections
from redis.exceptions import RedisError

from dashboard.outage import DB_UNREACHABLE, Outage
from dashboard.services import MONITOR_HEARTBEAT_KEY
from monitoring import history
from monitoring.alerts.checks import GpuConditions
from monitoring.consumers import LIVE_GROUP
from monitoring.liveness import KNOWN_HOSTS_KEY
from monitoring.enginemetrics import EngineMetricsReader, empty_snapshot
from monitoring.nvml import Nvml, attach_deployments
from monitoring.targets import engine_targets

log = logging.getLogger("kiln.monitor")

HEARTBEAT_EVERY_S = 5.0  # the "heartbeat" message the overview page listens to
TARGETS_EVERY_S = 5.0  # re-read the running deployments
PRUNE_EVERY_S = 60.0
MAX_SCRAPE_TIMEOUT_S = 2.0


class Monitor:
    """One host's sampler. ``nvml`` must be init()-ed already.

    ``targets``: None reads the running deployments from the database
    (monitoring.targets); a callable is called on the database thread; a list
    is used as it is (tests inject stub targets this way).
    """

    def __init__(self, *, nvml: Nvml, host: str, interval: float, layer, redis=None,
                 targets: list | Callable[[], list] | None = None, flush_interval: float = 5.0,
                 record_history: bool = True, on_tick: Callable[[dict], None] | None = None):
        self.nvml = nvml
        self.host = host
        self.interval = interval
        self.layer = layer
        self.redis = redis
        self.targets_source = targets
        self.flush_interval = flush_interval
        self.record_history = record_history
        self.on_tick = on_tick
        self.targets: list[dict] = []
        self.readers: dict[object, EngineMetricsReader] = {}
        self.watcher = None
        self.xid_problem = None
        self.history: history.HistoryBuffer | None = None
        self.seq = 0
        self.started = time.time()
        self.flush_task: asyncio.Future | None = None
        self.write_errors = 0
        self.publish_failing = 0
        self._db = ThreadPoolExecutor(1, thread_name_prefix="kiln-monitor-db")
        self._http: httpx.AsyncClient | None = None
        self.next_scrape: asyncio.Future | None = None  # the engines' part of the next tick
        self.alerts = GpuConditions(host)  # Xid, slowdown, PCIe, ECC, memory: events written off this loop
        self.db_outage = Outage("the database (monitor)", "GPUs and engines are still sampled and published")

    # ------------------------------------------------------------ database thread

    async def _in_db(self, fn, *args):
        def call():
            close_old_connections()
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._db, call)

    def _setup_db(self) -> history.HistoryBuffer | None:
        status = self.nvml.status
        gpu_ids = {}
        if status.ok:
            gpu_ids = history.upsert_gpus(self.host, self.nvml.gpu_info(), driver=status.driver_version,
                                          cuda=status.cuda_driver_version)
        return history.HistoryBuffer(self.host, gpu_ids) if self.record_history else None

    def _read_targets(self) -> list[dict]:
        source = self.targets_source
        if source is None:
            return engine_targets(self.host)
        return list(source()) if callable(source) else list(source)

    def _took_targets(self, reading: asyncio.Future) -> None:
        if reading.cancelled():
            return
        exc = reading.exception()
        if exc is None:
            self.targets = reading.result()
            self.db_outage.over()
        elif isinstance(exc, DB_UNREACHABLE):
            self.db_outage.failed(exc)  # keep the last list: the engines did not go anywhere
        else:
            log.error("monitor: could not read the running deployments", exc_info=exc)

    def _write(self, rows, prune: bool) -> None:
        try:
            history.write_rows(*rows)
            if prune:
                history.prune()
            self.db_outage.over()
        except DB_UNREACHABLE as exc:  # said once per outage; the batch is lost, sampling goes on
            self.write_errors += 1
            self.db_outage.failed(exc)
        except Exception:  # noqa: BLE001 - a lost batch must not stop live monitoring
            self.write_errors += 1
            log.exception("monitor: could not write %d history rows", sum(len(r) for r in rows))

    # --------------------------------------------------------------------- loop

    async def run(self, count: int = 0, stop: asyncio.Event | None = None) -> int:
        """Tick until ``stop`` is set or ``count`` ticks are done; returns ticks published."""
        stop = stop or asyncio.Event()
        self.history = await self._in_db(self._setup_db)
        if self.nvml.status.ok:
            try:
                self.watcher = self.nvml.xid_watcher()
                if self.watcher.unwatched:
                    self.xid_problem = "; ".join(f"GPU {i}: {why}" for i, why in sorted(self.watcher.unwatched.items()))
            except Exception as exc:  # noqa: BLE001 - Xid watching is optional per driver
                self.xid_problem = f"Xid events are not watched: {exc}"
        self._http = httpx.AsyncClient(timeout=min(MAX_SCRAPE_TIMEOUT_S, max(0.2, self.interval * 0.6)))
        next_tick = time.monotonic()
        last_targets = last_beat = last_flush = last_prune = float("-inf")
        reading = None
        try:
            while not stop.is_set():
                now = time.monotonic()
                if now - last_targets >= TARGETS_EVERY_S and (reading is None or reading.done()):
                    # Read beside the ticks, not before one: with the database away (a cut
                    # link) a query can hang for seconds, and the GPUs must still be sampled.
                    last_targets = now
                    first = reading is None
                    reading = asyncio.ensure_future(self._in_db(self._read_targets))
                    reading.add_done_callback(self._took_targets)
                    if first:  # the first tick already scrapes what runs
                        await asyncio.wait([reading])
                message = await self.tick()
                if now - last_beat >= HEARTBEAT_EVERY_S and not self.publish_failing:
                    last_beat = now
                    try:
                        await self.layer.group_send(LIVE_GROUP, {"type": "live.message", "payload": self.heartbeat()})
                    except (RedisError, OSError):
                        self.publish_failing += 1
                if self.history is not None and now - last_flush >= self.flush_interval:
                    last_flush = now
                    prune = now - last_prune >= PRUNE_EVERY_S
                    if prune:
                        last_prune = now
                    self._flush(prune=prune)
                if self.on_tick:
                    self.on_tick(message)
                if count and self.seq >= count:
                    break
                # Fixed-rate ticks: a slow tick does not push every later one back,
                # and a tick more than one period late is skipped, not bunched.
                next_tick += self.interval
                late = time.monotonic() - next_tick
                if late > self.interval:
                    next_tick += self.interval * int(late // self.interval)
                try:
                    await asyncio.wait_for(stop.wait(), timeout=max(0.0, next_tick - time.monotonic()))
                except asyncio.TimeoutError:
                    pass
        finally:
            await self._close()
        return self.seq

    async def tick(self) -> dict:
        """Sample, publish once. Returns the published message.

        The engines' part is the scrape started right after the previous tick's publish:
        it ran in the idle time between ticks, so publishing a GPU sample does not wait for
        the engines' /metrics (a 54 KB vLLM page costs ~5 ms to parse; an engine that does
        not answer held every sample back by up to the scrape timeout, 0.2-2 s), nor, on a
        busy host, for the engine processes to be scheduled (bench/soak.py measures the
        sample-to-browser latency). The first tick scrapes and waits.
        """
        sampled_at = time.time()
        scrape = self.next_scrape or asyncio.ensure_future(self.scrape_engines())
        self.next_scrape = None
        gpus = self.nvml.sample_all() if self.nvml.status.ok else []
        xids = self.watcher.poll(timeout_ms=0) if self.watcher is not None else []
        self.alerts.observe(gpus, xids)
        engines = await scrape  # done already unless it is the first tick or an engine is slow
        pids = {t["pid"]: {"id": t["deployment_id"], "name": t["name"]} for t in self.targets if t.get("pid")}
        if pids:
            attach_deployments(gpus, pids)
        self.seq += 1
        message = {
            "type": "monitor",
            "host": self.host,
            "time": sampled_at,
            "seq": self.seq,
            "interval": self.interval,
            "nvml": {"ok": self.nvml.status.ok, "message": self.nvml.status.message},
            "xid_problem": self.xid_problem,
            "gpus": gpus,
            "engines": engines,
            "xids": xids,
        }
        if self.history is not None:
            self.history.add_tick(sampled_at, gpus, [e for e in engines if not e.get("problem")], xids)
        try:
            # Encoded once here; consumers forward the text as it is.
            await self.layer.group_send(LIVE_GROUP, {"type": "live.message", "text": json.dumps(message)})
            if self.redis is not None:
                key = MONITOR_HEARTBEAT_KEY.format(host=self.host)
                beat = self.heartbeat()
                pipe = self.redis.pipeline(transaction=False)
                pipe.set(key, json.dumps(beat), ex=max(5, int(self.interval * 5)))
                # Known hosts: once seen, a host whose heartbeat expires is shown offline
                # (monitoring.liveness), its deployments unreachable.
                pipe.hset(KNOWN_HOSTS_KEY, self.host, beat["time"])
                await pipe.execute()
            if self.publish_failing:
                log.warning("monitor: publishing again after %d failed samples", self.publish_failing)
                self.publish_failing = 0
        except (RedisError, OSError) as exc:
            # Redis away for a while: keep sampling and recording history, say so once.
            if not self.publish_failing:
                log.warning("monitor: cannot publish to Redis (%s); still sampling and recording history", exc)
            self.publish_failing += 1
        self.next_scrape = asyncio.ensure_future(self.scrape_engines())
        return message

    def heartbeat(self) -> dict:
        status = self.nvml.status
        return {
            "type": "heartbeat",
            "host": self.host,
            "time": time.time(),
            "pid": os.getpid(),
            "interval": self.interval,
            "uptime_s": round(time.time() - self.started, 1),
            "samples": self.seq,
            "nvml": {"ok": status.ok, "message": status.message, "gpu_count": status.gpu_count,
                     "driver_version": status.driver_version, "cuda_driver_version": status.cuda_driver_version},
            "deployments": len(self.targets),
        }

    async def scrape_engines(self) -> list[dict]:
        if not self.targets:
            return []
        return list(await asyncio.gather(*(self._scrape_one(t) for t in self.targets)))

    async def _scrape_one(self, target: dict) -> dict:
        key = target["deployment_id"]
        reader = self.readers.get(key)
        if reader is None:
            reader = self.readers[key] = EngineMetricsReader(target.get("engine"))
        try:
            secret = target.get("api_key")
            response = await self._http.get(target["metrics_url"],
                                            headers={"Authorization": f"Bearer {secret}"} if secret else None)
            if response.status_code != 200:
                snap = empty_snapshot(reader.engine, problem=f"{target['metrics_url']} answered HTTP "
                                      f"{response.status_code} (llama-server needs --metrics)")
            else:
                snap = reader.read(response.text)
        except httpx.HTTPError as exc:
            snap = empty_snapshot(reader.engine, problem=f"cannot read {target['metrics_url']}: "
                                  f"{type(exc).__name__} {exc}".strip())
        snap.update(deployment_id=key, name=target.get("name"), metrics_url=target["metrics_url"])
        return snap

    def _flush(self, prune: bool) -> None:
        if self.flush_task is not None and not self.flush_task.done():
            return  # the last batch is still being written: this one waits for the next flush
        if not len(self.history) and not prune:
            return
        rows = self.history.take()
        self.flush_task = asyncio.get_running_loop().run_in_executor(self._db, self._write, rows, prune)

    async def _close(self) -> None:
        if self.next_scrape is not None:
            self.next_scrape.cancel()
            await asyncio.gather(self.next_scrape, return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()
        if self.flush_task is not None:
            await self.flush_task
        if self.history is not None:
            self.history.close()
            rows = self.history.take()
            await asyncio.get_running_loop().run_in_executor(self._db, self._write, rows, False)
        if self.watcher is not None:
            self.watcher.close()
        if self.redis is not None:
            try:
                await self.redis.delete(MONITOR_HEARTBEAT_KEY.format(host=self.host))
            except Exception:  # noqa: BLE001 - Redis gone at shutdown: the key expires anyway
                pass
        await asyncio.get_running_loop().run_in_executor(self._db, connections.close_all)
        self._db.shutdown(wait=True)
