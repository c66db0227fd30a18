"""A lean Redis client for the one command every gateway request sends.

Each API call runs one Lua script (keys.authenticate: the key's cached row
and its rate-limit counter). Through redis-py's asyncio client that call cost
~220-290 us of CPU here (argument filtering, retry wrapper, pool checkout,
a wait_for per write, Python-side packing); over a plain asyncio protocol
with hiredis parsing the replies it costs ~75 us (bench, same Redis, same
script). On a busy host that CPU is time to first token, so the hot call
goes through this; everything else (cache fills, revocations, pub/sub) stays
on redis-py.

One connection per event loop; commands are pipelined on it and the replies
matched in order. A timeout or a dropped connection fails every command in
flight with redis-py's ConnectionError/TimeoutError (what callers already
handle), and the next command reconnects. Only plain ``redis://`` URLs are
served here; for any other (TLS, unix socket) `Lean.for_url` returns None
and the caller uses redis-py.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
from urllib.parse import unquote, urlsplit

import hiredis
import redis.exceptions

TIMEOUT_S = 3.0


class _Protocol(asyncio.Protocol):
    def __init__(self):
        self.reader = hiredis.Reader()
        self.waiting: collections.deque[asyncio.Future] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.lost = False

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.reader.feed(data)
        while True:
            try:
                reply = self.reader.gets()
            except hiredis.ProtocolError as exc:
                self.transport.close()
                self._fail(redis.exceptions.ConnectionError(f"Redis protocol error: {exc}"))
                return
            if reply is False:
                return
            if not self.waiting:  # a reply nobody asked for: the stream is out of step
                self.transport.close()
                return
            future = self.waiting.popleft()
            if future.done():
                continue
            if isinstance(reply, hiredis.ReplyError):
                future.set_exception(redis.exceptions.ResponseError(str(reply)))
            else:
                future.set_result(reply)

    def connection_lost(self, exc):
        self.lost = True
        self._fail(redis.exceptions.ConnectionError(f"Connection to Redis lost: {exc or 'closed'}"))

    def _fail(self, error: Exception):
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(error)


def pack(*args) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if not isinstance(arg, bytes):
            arg = str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


class Lean:
    """Pipelined commands on one connection: ``await lean.call("GET", "k")``."""

    def __init__(self, host: str, port: int, db: int = 0, username: str | None = None,
                 password: str | None = None):
        self.host, self.port, self.db = host, port, db
        self.username, self.password = username, password
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Future | None = None

    @classmethod
    def for_url(cls, url: str) -> "Lean | None":
        parts = urlsplit(url)
        if parts.scheme != "redis" or not parts.hostname:
            return None
        path = parts.path.strip("/")
        try:
            db = int(path) if path else 0
        except ValueError:
            return None
        return cls(parts.hostname, parts.port or 6379, db, unquote(parts.username) if parts.username else None,
                   unquote(parts.password) if parts.password else None)

    async def _connection(self) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and not protocol.lost:
            return protocol
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.ensure_future(self._connect())
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await loop.create_connection(_Protocol, self.host, self.port)
        except OSError as exc:
            raise redis.exceptions.ConnectionError(
                f"Cannot connect to Redis at {self.host}:{self.port}: {exc}") from exc
        setup = []
        if self.password is not None:
            setup.append(("AUTH", self.username, self.password) if self.username else ("AUTH", self.password))
        if self.db:
            setup.append(("SELECT", self.db))
        try:
            for command in setup:
                await self._send(protocol, command)
        except BaseException:
            protocol.transport.close()
            raise
        self._protocol = protocol
        return protocol

    @staticmethod
    def _send(protocol: _Protocol, args) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        protocol.waiting.append(future)
        protocol.transport.write(pack(*args))
        return future

    async def call(self, *args):
        """One command's reply; redis-py's exceptions on errors and timeouts."""
        try:
            async with asyncio.timeout(TIMEOUT_S):
                protocol = await self._connection()
                return await self._send(protocol, args)
        except TimeoutError:
            self.close()  # replies may still come: this connection is out of step now
            raise redis.exceptions.TimeoutError(f"Redis did not answer within {TIMEOUT_S} s") from None

    async def evalsha(self, script: "Script", keys: list, args: list):
        try:
            return await self.call("EVALSHA", script.sha, len(keys), *keys, *args)
        except redis.exceptions.ResponseError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
            return await self.call("EVAL", script.source, len(keys), *keys, *args)

    def close(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
        self._protocol = None


class Script:
    def __init__(self, source: str):
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
