"""The monitor process: one per GPU host, the single producer of live data.

Each tick it samples, publishes one message to the channel layer group that
browser tabs listen on, and refreshes its heartbeat in Redis so the panel can
tell a dead monitor from a quiet one.
"""
import asyncio
import json
import os
import signal
import time

from channels.layers import get_channel_layer
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from redis import asyncio as aioredis
from redis.exceptions import RedisError

from dashboard.services import MONITOR_HEARTBEAT_KEY
from monitoring.consumers import LIVE_GROUP


class Command(BaseCommand):
    help = "Sample this host and publish live data to the panel (runs until stopped)."

    def add_arguments(self, parser):
        parser.add_argument("--interval", type=float, default=None, help="seconds between samples (0.25 to 60)")
        parser.add_argument("--count", type=int, default=0, help="stop after this many samples (0 = forever)")

    def handle(self, *args, interval=None, count=0, **options):
        interval = settings.MONITOR_INTERVAL if interval is None else interval
        if not 0.25 <= interval <= 60:
            raise CommandError(f"--interval {interval} is out of range: use 0.25 to 60 seconds.")
        try:
            asyncio.run(self.run(interval, count))
        except RedisError as exc:
            raise CommandError(f"Redis at {settings.REDIS_URL} is not reachable ({exc}).") from None

    async def run(self, interval, count):
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        layer = get_channel_layer()
        redis = aioredis.from_url(settings.REDIS_URL)
        key = MONITOR_HEARTBEAT_KEY.format(host=settings.HOST_NAME)
        started = time.time()
        self.stdout.write(f"monitor on host {settings.HOST_NAME}: sampling every {interval:g} s", ending="\n")
        self.stdout.flush()
        samples = 0
        from inference.watch import run_watch_loop  # deployments: phases, health, restarts (own 1 s cadence)
        deployments = asyncio.create_task(run_watch_loop(layer, settings.HOST_NAME, stop, group=LIVE_GROUP))
        next_tick = time.monotonic()
        while not stop.is_set():
            sample = {
                "type": "heartbeat",
                "host": settings.HOST_NAME,
                "time": time.time(),
                "pid": os.getpid(),
                "interval": interval,
                "uptime_s": round(time.time() - started, 1),
                "samples": samples,
            }
            await redis.set(key, json.dumps(sample), ex=max(5, int(interval * 5)))
            await layer.group_send(LIVE_GROUP, {"type": "live.message", "payload": sample})
            samples += 1
            if count and samples >= count:
                break
            # Fixed-rate ticks: a slow sample does not push every later one back.
            next_tick += interval
            try:
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, next_tick - time.monotonic()))
            except asyncio.TimeoutError:
                pass
        stop.set()
        await deployments
        await redis.delete(key)
        await redis.aclose()
