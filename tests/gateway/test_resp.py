"""The lean Redis client of the gateway's hot path, against a real redis-server."""

import asyncio
import subprocess
import tempfile
import time

import pytest
import redis as redis_lib
import redis.exceptions

from dashboard.standalone import find_redis_server
from inference.gateway.resp import Lean, Script
from tests.helpers import free_port


def run(coro):
    return asyncio.run(coro)


def test_only_plain_redis_urls_are_taken():
    lean = Lean.for_url("redis://:s%40cret@10.0.0.5:6390/3")
    assert (lean.host, lean.port, lean.db, lean.password, lean.username) == ("10.0.0.5", 6390, 3, "s@cret", None)
    assert Lean.for_url("redis://localhost").port == 6379
    for other in ("rediss://h:6379/0", "unix:///tmp/redis.sock", "redis://h:6379/zero"):
        assert Lean.for_url(other) is None  # the caller uses redis-py for these


def test_commands_pipelined_replies_in_order_and_scripts(redis_clean):
    async def main():
        lean = Lean.for_url(redis_clean)
        assert await lean.call("SET", "a", "1") == b"OK"
        replies = await asyncio.gather(*(lean.call("INCR", "n") for _ in range(50)))
        assert replies == list(range(1, 51))
        script = Script("return {redis.call('GET', KEYS[1]), tonumber(ARGV[1]) + 1}")
        redis_lib.Redis.from_url(redis_clean).script_flush()
        assert await lean.evalsha(script, ["a"], [41]) == [b"1", 42]  # NOSCRIPT: sent whole, then cached
        assert await lean.evalsha(script, ["missing"], [0]) == [None, 1]
        with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
            await lean.call("LPUSH", "a", "x")
        assert await lean.call("GET", "a") == b"1"  # the connection is still in step after an error
        lean.close()
    run(main())


def test_password_and_database_are_applied_and_a_wrong_password_is_an_error():
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="kiln-redis-auth-")
    server = subprocess.Popen([find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--requirepass", "pw-1", "--dir", workdir], stdout=subprocess.DEVNULL)
    try:
        admin = redis_lib.Redis(port=port, password="pw-1", db=2)
        deadline = time.monotonic() + 10
        while True:
            try:
                admin.set("where", "db2")
                break
            except redis.exceptions.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.1)

        async def main():
            assert await Lean.for_url(f"redis://:pw-1@127.0.0.1:{port}/2").call("GET", "where") == b"db2"
            with pytest.raises(redis.exceptions.ResponseError):
                await Lean.for_url(f"redis://:wrong@127.0.0.1:{port}/2").call("GET", "where")
        run(main())
    finally:
        server.terminate()
        server.wait(10)


def test_a_dead_or_silent_redis_fails_fast_with_redis_errors_and_recovers():
    async def main():
        port = free_port()
        nobody = Lean("127.0.0.1", port)
        with pytest.raises(redis.exceptions.ConnectionError, match="Cannot connect"):
            await nobody.call("PING")

        accepted = []

        async def silent(reader, writer):
            accepted.append(writer)
            await reader.read()  # reads, never answers

        server = await asyncio.start_server(silent, "127.0.0.1", port)
        import inference.gateway.resp as resp
        resp.TIMEOUT_S, saved = 0.3, resp.TIMEOUT_S
        try:
            lean = Lean("127.0.0.1", port)
            with pytest.raises(redis.exceptions.TimeoutError):
                await lean.call("PING")
            # A fresh connection next time (the old one may still answer late).
            with pytest.raises(redis.exceptions.TimeoutError):
                await lean.call("PING")
            assert len(accepted) == 2
            # The server drops the connection: commands in flight fail at once.
            pending = asyncio.ensure_future(lean.call("PING"))
            await asyncio.sleep(0.05)
            accepted[-1].close()
            with pytest.raises(redis.exceptions.ConnectionError, match="lost"):
                await pending
        finally:
            resp.TIMEOUT_S = saved
            server.close()
    run(main())
