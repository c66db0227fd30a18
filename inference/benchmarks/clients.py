"""The aiohttp and httpx clients of the harness (the lean one is lean.py).

Each streams a POST's body as (arrival time, bytes) per network read
(`collect`), and makes the plain GET and JSON POST calls a run needs.
bench/harness.py measures all three side by side.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx

from inference.benchmarks.records import ServerHTTPError


class CollectsStream:
    """`collect` on top of `stream`: (seconds since `start`, bytes) per read."""

    async def collect(self, url: str, body: bytes, headers: dict, reads: list, start: float) -> None:
        perf = time.perf_counter
        async for data in self.stream(url, body, headers):
            reads.append((perf() - start, data))


class AiohttpClient(CollectsStream):
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


class HttpxClient(CollectsStream):
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
