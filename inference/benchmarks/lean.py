"""The harness's lean HTTP/1.1 client: reads stored straight from the socket callback.

With aiohttp each network read of a stream wakes the request's coroutine:
future, task step, StreamReader, iterator. Paced like an engine (one SSE
event per read), 256 streams cost ~90 us of client CPU per chunk here, the
client's event loop saturated, and requests left up to 50 ms late
(bench/harness.py). This client parses responses with httptools (C) inside
``data_received`` and only appends ``(time, bytes)`` to the request's list;
the coroutine wakes once, when the response is complete. The events are
read after that (stream.analyze_stream), with the same timestamps: one per
network read, as before.

Scope: what the harness sends -- POST with a body, keep-alive connections
pooled per host, chunked or sized or close-delimited responses, http and
https. ``get_text``/``post_json`` (metrics scrapes, /tokenize) are rare and
go through aiohttp.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from urllib.parse import urlsplit

import httptools

from inference.benchmarks.clients import AiohttpClient
from inference.benchmarks.records import ServerHTTPError

perf = time.perf_counter


class StaleConnection(ConnectionError):
    """A pooled connection closed before any byte of the response: safe to resend."""


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time."""

    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._reset(None, None, 0.0)

    def _reset(self, reads, done, start):
        self.reads = reads
        self.done: asyncio.Future | None = done
        self.start = start
        self.now = 0.0
        self.status = 0
        self.error_body = bytearray()
        self.received = False
        self.headers_done = False
        self.delimited = False  # Content-Length or chunked: the body's end is known
        self.keep_alive = True
        self.parser = httptools.HttpResponseParser(self)

    # -- asyncio
    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.received = True
        self.now = perf() - self.start
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._finish(ConnectionError(f"malformed HTTP response: {exc}"))
            self.transport.close()

    def connection_lost(self, exc):
        self.closed = True
        if self.done is None or self.done.done():
            return
        if self.headers_done and not self.delimited:
            self._finish(None)  # a body delimited by closing the connection
        elif not self.received:
            self._finish(StaleConnection(f"connection closed before the response: {exc or 'closed'}"))
        else:
            self._finish(ConnectionError(f"connection closed mid-response: {exc or 'closed'}"))

    # -- httptools
    def on_header(self, name: bytes, value: bytes):
        name = name.lower()
        if name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value.lower()):
            self.delimited = True

    def on_headers_complete(self):
        self.headers_done = True
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes):
        if self.status == 200:
            self.reads.append((self.now, body))
        elif len(self.error_body) < 65536:
            self.error_body += body

    def on_message_complete(self):
        self._finish(None)

    def _finish(self, error: Exception | None):
        if self.done is not None and not self.done.done():
            if error is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(error)

    # -- one request
    async def request(self, head: bytes, body: bytes, reads: list, start: float) -> None:
        done = asyncio.get_running_loop().create_future()
        self._reset(reads, done, start)
        self.transport.write(head + body)
        await done
        if self.status != 200:
            raise ServerHTTPError(self.status, self.error_body.decode("utf-8", "replace"))


class LeanClient:
    """Same interface as the harness's aiohttp and httpx clients, plus `collect`."""

    name = "lean"

    def __init__(self, max_connections: int | None, timeout_s: float):
        self._timeout = timeout_s
        self._slots = asyncio.Semaphore(max_connections) if max_connections else None
        self._idle: dict[tuple, list[_Connection]] = {}
        self._all: set[_Connection] = set()
        self._ssl: ssl.SSLContext | None = None
        self._aiohttp = None

    async def __aenter__(self):
        self._aiohttp = await AiohttpClient(None, self._timeout).__aenter__()
        return self

    async def __aexit__(self, *exc):
        for conn in self._all:
            if conn.transport is not None:
                conn.transport.close()
        self._all.clear()
        self._idle.clear()
        await self._aiohttp.__aexit__(*exc)

    async def _connect(self, key) -> _Connection:
        scheme, host, port = key
        context = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        _, conn = await asyncio.get_running_loop().create_connection(_Connection, host, port, ssl=context)
        self._all.add(conn)
        return conn

    async def collect(self, url: str, body: bytes, headers: dict, reads: list, start: float) -> None:
        """POST `body` to `url`; append (seconds since `start`, bytes) per read of a 200 answer."""
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        key = (parts.scheme, parts.hostname, port)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
        lines = [f"POST {target} HTTP/1.1", f"Host: {host}", "User-Agent: kiln-bench", "Accept: */*",
                 f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("host", "content-length")]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if self._slots is not None:
            await self._slots.acquire()
        try:
            async with asyncio.timeout(self._timeout):
                await self._send(key, head, body, reads, start)
        finally:
            if self._slots is not None:
                self._slots.release()

    async def _send(self, key, head, body, reads, start) -> None:
        idle = self._idle.setdefault(key, [])
        while True:
            conn, pooled = None, False
            while idle:
                candidate = idle.pop()
                if not candidate.closed:
                    conn, pooled = candidate, True
                    break
            if conn is None:
                conn = await self._connect(key)
            ok = False
            try:
                await conn.request(head, body, reads, start)
                ok = True
            except StaleConnection:
                if pooled:
                    # The server dropped this idle connection (llama-server does
                    # after 5 s): nothing was generated, send on a fresh one.
                    self._all.discard(conn)
                    continue
                raise
            except Exception as exc:
                ok = isinstance(exc, ServerHTTPError)  # a whole answer was read: still usable
                raise
            finally:
                if ok and conn.keep_alive and not conn.closed:
                    conn.reads = conn.done = None
                    idle.append(conn)
                else:
                    self._all.discard(conn)
                    if conn.transport is not None:
                        conn.transport.close()
            return

    async def stream(self, url: str, body: bytes, headers: dict):
        reads: list = []
        await self.collect(url, body, headers, reads, perf())
        for _, data in reads:
            yield data

    async def get_text(self, url: str):
        return await self._aiohttp.get_text(url)

    async def post_json(self, url: str, obj: dict):
        return await self._aiohttp.post_json(url, obj)
