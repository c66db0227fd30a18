"""Per-event-loop shared clients: one Redis connection pool, the lean Redis
connection for the per-request auth script (resp.py), and one aiohttp
connection pool to the engines for the whole web process (a uvicorn worker
runs one loop). Created on first use; a new loop (tests) gets new ones."""

from __future__ import annotations

import asyncio

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

_by_loop: dict[int, tuple[asyncio.AbstractEventLoop, aioredis.Redis | None, aiohttp.ClientSession | None]] = {}
_lean: dict[int, tuple[asyncio.AbstractEventLoop, Lean | None]] = {}


def _slot(loop):
    entry = _by_loop.get(id(loop))
    if entry is None or entry[0] is not loop:
        entry = (loop, None, None)
        _by_loop[id(loop)] = entry
    return entry


def redis() -> aioredis.Redis:
    loop = asyncio.get_running_loop()
    _, client, session = _slot(loop)
    if client is None:
        client = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=3, socket_timeout=3)
        _by_loop[id(loop)] = (loop, client, session)
    return client


def upstream() -> aiohttp.ClientSession:
    loop = asyncio.get_running_loop()
    _, client, session = _slot(loop)
    if session is None or session.closed:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S, enable_cleanup_closed=True)
        session = aiohttp.ClientSession(
            connector=connector, trust_env=False, auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S),
        )
        _by_loop[id(loop)] = (loop, client, session)
    return session


def lean() -> Lean | None:
    """The lean Redis connection of this loop; None where REDIS_URL is not a plain redis:// URL."""
    loop = asyncio.get_running_loop()
    entry = _lean.get(id(loop))
    if entry is None or entry[0] is not loop:
        entry = _lean[id(loop)] = (loop, Lean.for_url(settings.REDIS_URL))
    return entry[1]
