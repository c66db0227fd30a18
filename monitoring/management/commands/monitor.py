"""The monitor process: one per GPU host, the single producer of live data.

Each tick it samples the GPUs (NVML), scrapes the running deployments'
/metrics, publishes one message to the channel layer group that browser tabs
listen on, refreshes its heartbeat in Redis so the panel can tell a dead
monitor from a quiet one, and buffers history rows (monitoring/sampler.py).

Without a GPU or driver it keeps running: the page then says why there are no
GPU readings, and engine tokens/s (llama.cpp on a CPU) still show.
"""
import asyncio
import importlib
import os
import signal

from channels.layers import get_channel_layer
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from redis import asyncio as aioredis
from redis.exceptions import RedisError

from dashboard.migrations_check import refuse_if_unmigrated
from monitoring.alerts.checks import HostAgent
from monitoring.consumers import LIVE_GROUP
from monitoring.nvml import Nvml
from monitoring.sampler import Monitor

# Test-only: "module:factory" of a stand-in for pynvml (tests/fakenvml.py).
# Production never sets it, so nothing under tests/ is imported there.
NVML_LIB_ENV = "KILN_NVML_LIB"


def nvml_lib_from_env():
    spec = os.environ.get(NVML_LIB_ENV)
    if not spec:
        return None
    module, _, factory = spec.partition(":")
    if not factory:
        raise CommandError(f"{NVML_LIB_ENV}={spec!r} must look like 'package.module:factory'.")
    try:
        return getattr(importlib.import_module(module), factory)()
    except (ImportError, AttributeError) as exc:
        raise CommandError(f"{NVML_LIB_ENV}={spec!r} cannot be loaded: {exc}") from None


class Command(BaseCommand):
    help = "Sample this host's GPUs and engines and publish live data to the panel (runs until stopped)."

    def add_arguments(self, parser):
        parser.add_argument("--interval", type=float, default=None, help="seconds between samples (0.25 to 60)")
        parser.add_argument("--count", type=int, default=0, help="stop after this many samples (0 = forever)")
        parser.add_argument("--no-history", action="store_true", help="publish live data only, write no history")

    def handle(self, *args, interval=None, count=0, no_history=False, **options):
        interval = settings.MONITOR_INTERVAL if interval is None else interval
        if not 0.25 <= interval <= 60:
            raise CommandError(f"--interval {interval} is out of range: use 0.25 to 60 seconds.")
        refuse_if_unmigrated("the monitor")  # it writes GPUs, history and deployment phases every tick
        nvml = Nvml(lib=nvml_lib_from_env())
        status = nvml.init()
        self.stdout.write(f"monitor on host {settings.HOST_NAME}: sampling every {interval:g} s; {status.message}")
        self.stdout.flush()
        try:
            asyncio.run(self.run(nvml, interval, count, not no_history))
        except RedisError as exc:
            raise CommandError(f"Redis at {settings.REDIS_URL} is not reachable ({exc}).") from None
        finally:
            nvml.shutdown()

    async def run(self, nvml, interval, count, record_history):
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        # Timeouts: with the link to Redis cut, a heartbeat must fail (and be retried next
        # tick) rather than hold the sampling loop until TCP gives up.
        redis = aioredis.from_url(settings.REDIS_URL, socket_connect_timeout=3, socket_timeout=3)
        layer = get_channel_layer()
        monitor = Monitor(nvml=nvml, host=settings.HOST_NAME, interval=interval, layer=layer,
                          redis=redis, flush_interval=settings.MONITOR_FLUSH_INTERVAL,
                          record_history=record_history)
        from inference.deployments.watch import run_watch_loop  # deployments: phases, health, restarts (own 1 s cadence)

        deployments = asyncio.create_task(run_watch_loop(layer, settings.HOST_NAME, stop, group=LIVE_GROUP))
        alert_agent = HostAgent(settings.HOST_NAME)  # alert backstop and host checks, on a thread of its own
        alert_agent.start()
        try:
            await monitor.run(count=count, stop=stop)
        finally:
            stop.set()
            alert_agent.stop()
            await deployments
            await redis.aclose()
