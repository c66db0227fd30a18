"""The harness's lean HTTP client against hand-written servers: how responses
end, stale keep-alive connections, errors, and the deferred parsing."""

import asyncio
import time

import pytest

from inference.benchmarks.records import RequestRecord, ServerHTTPError
from inference.benchmarks.stream import Deferred, analyze_stream
from inference.benchmarks.lean import LeanClient

EVENTS = (b'data: {"choices":[{"index":0,"delta":{"content":"a "}}]}\n\n'
          b'data: {"choices":[{"index":0,"delta":{"content":"b "},"finish_reason":"length"}]}\n\n'
          b"data: [DONE]\n\n")


async def serve(handler):
    """A one-off HTTP server on loopback; `handler(reader, writer, n)` answers request n."""
    count = {"n": 0, "connections": 0}

    async def on_connection(reader, writer):
        count["connections"] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                count["n"] += 1
                if not await handler(reader, writer, count["n"]):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions", count


def run(coro):
    return asyncio.run(coro)


async def post(client, url):
    reads = []
    await client.collect(url, b'{"x":1}', {"Content-Type": "application/json"}, reads, time.perf_counter())
    return reads


def test_chunked_sized_and_close_delimited_answers_are_read_whole():
    async def handler(reader, writer, n):
        if n == 1:  # chunked, one event per chunk, kept alive
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for event in EVENTS.split(b"\n\n")[:-1]:
                event += b"\n\n"
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
                await asyncio.sleep(0.01)
            writer.write(b"0\r\n\r\n")
            return True
        if n == 2:  # Content-Length
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(EVENTS), EVENTS))
            return True
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + EVENTS)  # ends at close
        await writer.drain()
        return False

    async def main():
        server, url, count = await serve(handler)
        async with LeanClient(None, 10) as client:
            chunked = await post(client, url)
            sized = await post(client, url)
            closed = await post(client, url)
        server.close()
        return chunked, sized, closed, count

    chunked, sized, closed, count = run(main())
    assert len(chunked) == 3 and chunked[0][0] < chunked[-1][0]  # one read per event, times rising
    for reads in (chunked, sized, closed):
        assert b"".join(data for _, data in reads) == EVENTS
        record = analyze_stream(RequestRecord(index=0), reads, chat=True)
        assert record.success and record.output_tokens == 2 and record.generated_text == "a b "
    assert count["connections"] == 1  # keep-alive: all three on one connection


def test_a_pooled_connection_the_server_dropped_is_resent_once_on_a_fresh_one():
    async def handler(reader, writer, n):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(EVENTS), EVENTS))
        await writer.drain()
        return False  # closes without saying so, like llama-server after 5 s idle

    async def main():
        server, url, count = await serve(handler)
        async with LeanClient(None, 10) as client:
            await post(client, url)
            await asyncio.sleep(0.05)
            second = await post(client, url)
        server.close()
        return second, count

    second, count = run(main())
    assert b"".join(d for _, d in second) == EVENTS
    assert count["n"] == 2 and count["connections"] == 2


def test_an_http_error_carries_its_body_and_a_cut_stream_is_an_error():
    async def handler(reader, writer, n):
        if n == 1:
            body = b'{"error":{"message":"model not loaded"}}'
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\ndata:\r\n")
        await writer.drain()
        return False  # cut mid-stream

    async def main():
        server, url, count = await serve(handler)
        async with LeanClient(None, 10) as client:
            with pytest.raises(ServerHTTPError, match="HTTP 503.*model not loaded"):
                await post(client, url)
            with pytest.raises(ConnectionError, match="closed mid-response"):
                await post(client, url)
        server.close()
        return count

    assert run(main())["connections"] == 1  # the 503 answer left the connection usable


def test_a_silent_server_times_out_and_max_connections_is_kept():
    async def handler(reader, writer, n):
        await asyncio.sleep(0.3)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(EVENTS), EVENTS))
        return True

    async def main():
        server, url, count = await serve(handler)
        async with LeanClient(2, 10) as client:
            await asyncio.gather(*(post(client, url) for _ in range(4)))
        async with LeanClient(None, 0.1) as hasty:
            with pytest.raises(TimeoutError):
                await post(hasty, url)
        server.close()
        return count

    assert run(main())["connections"] == 2 + 1


def test_deferred_streams_are_parsed_at_flush_and_memory_is_bounded():
    reads = [(0.01, EVENTS)]
    deferred = Deferred()
    held = RequestRecord(index=0)
    deferred.add(held, reads, True, None)
    assert held.success and not held.chunk_times  # provisional until parsed
    broken = RequestRecord(index=1)
    deferred.add(broken, [(0.01, b'data: {"error":{"message":"boom"}}\n\n')], True, None)
    deferred.flush()
    assert held.success and held.output_tokens == 2
    assert not broken.success and "boom" in broken.error
    deferred.LIMIT = 10
    at_once = RequestRecord(index=2)
    deferred.add(at_once, reads, True, None)  # over the limit: parsed right away
    assert at_once.output_tokens == 2 and not deferred.items
