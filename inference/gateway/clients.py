"""Per-event-loop shared clients: one Redis connection pool, the lean Redis
connection for the per-request auth script (resp.py), and one aiohttp
connection pool to the engines for the whole web process (a uvicorn worker
runs one loop). Created on first use; a new loop (tests) gets new ones."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp
import redis.asyncio as aioredis
from django.conf import settings

from inference.gateway.resp import Lean

# llama-server (cpp-httplib) drops idle keep-alive connections after 5 s;
# closing ours first avoids most "server disconnected" on reuse (the proxy
# also retries once when that happens before any response byte).
KEEPALIVE_S = 4.0
CONNECT_TIMEOUT_S = 5.0
# An engine that sends nothing for this long is treated as dead.
READ_TIMEOUT_S = 600.0

_UNSET = object()


@dataclass
class _Clients:
    loop: asyncio.AbstractEventLoop
    redis: aioredis.Redis | None = None
    session: aiohttp.ClientSession | None = None
    lean: object = _UNSET  # Lean, or None where REDIS_URL is not a plain redis:// URL


_by_loop: dict[int, _Clients] = {}


def _slot() -> _Clients:
    loop = asyncio.get_running_loop()
    entry = _by_loop.get(id(loop))
    if entry is None or entry.loop is not loop:
        entry = _by_loop[id(loop)] = _Clients(loop)
    return entry


def redis() -> aioredis.Redis:
    slot = _slot()
    if slot.redis is None:
        slot.redis = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=3, socket_timeout=3)
    return slot.redis


def upstream() -> aiohttp.ClientSession:
    slot = _slot()
    if slot.session is None or slot.session.closed:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S, enable_cleanup_closed=True)
        slot.session = aiohttp.ClientSession(
            connector=connector, trust_env=False, auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S),
        )
    return slot.session


def lean() -> Lean | None:
    """The lean Redis connection of this loop; None where REDIS_URL is not a plain redis:// URL."""
    slot = _slot()
    if slot.lean is _UNSET:
        slot.lean = Lean.for_url(settings.REDIS_URL)
    return slot.lean
