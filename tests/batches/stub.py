"""A counting stub engine for batch tests and bench/batch.py.

Raw asyncio HTTP/1.1 with keep-alive on 127.0.0.1. Answers
/v1/chat/completions, /v1/completions and /v1/embeddings whole (no
streaming) after `delay` seconds; counts every request per prompt text
(`seen`; when each came in `arrivals`), the requests in flight, their peak
(`peak`) and their time integral (`busy`, in-flight seconds: busy / wall is
the average number in flight), so a test can prove that no line was sent
twice, that retries waited, and that the batch kept to its concurrency.
Markers in a prompt, each for its first N requests: "flaky-N" is answered
503; "slow-N" is answered after `slow` more seconds (past a client's
timeout); "drop-N" has its connection closed with no answer.
Run standalone: `python -m tests.batches.stub [delay]` prints `PORT <n>`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import sys
import threading
import time


class CountingStub:
    def __init__(self, delay: float = 0.0, model: str = "stub", slow: float = 5.0):
        self.delay = delay
        self.model = model
        self.slow = slow
        self.seen: collections.Counter = collections.Counter()
        self.arrivals: collections.defaultdict = collections.defaultdict(list)  # prompt -> monotonic times
        self.requests = 0
        self.in_flight = 0
        self.peak = 0
        self.busy = 0.0  # in-flight seconds since start (never reset: readers take differences)
        self._since = time.monotonic()
        self.port = 0
        self._server = None
        self._writers: set = set()
        self.loop = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port, backlog=2048)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()  # a crashed engine: open connections drop too

    async def shutdown(self) -> None:
        """Close, and end the answers still waiting (a "slow-N" one, after its client gave up)."""
        await self.close()
        waiting = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)

    def crash(self) -> None:
        """Stop answering at once, like an engine that died (from another thread)."""
        asyncio.run_coroutine_threadsafe(self.close(), self.loop).result(5)

    def revive(self) -> None:
        """Listen again on the same port, like the engine restarted."""
        asyncio.run_coroutine_threadsafe(self.start(self.port), self.loop).result(5)

    async def _serve(self, reader, writer) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = 0
                for line in lines[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                raw = await reader.readexactly(length) if length else b""
                status, body = await self._answer(method, path, raw)
                if status is None:  # "drop-N": the connection ends with no answer
                    writer.transport.abort()
                    return
                writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                             % (status, len(body)) + body)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    async def _answer(self, method, path, raw):
        if method == "GET" and path.startswith("/stats"):  # bench/batch.py reads (and resets) the counters
            self._tick()
            stats = {"requests": self.requests, "peak": self.peak, "in_flight": self.in_flight,
                     "busy_s": self.busy, "now": self._since}
            if "reset" in path:
                self.requests = self.peak = 0
                self.seen.clear()
                self.arrivals.clear()
            return 200, json.dumps(stats).encode()
        if method == "GET":
            return 200, json.dumps({"object": "list", "data": [{"id": self.model}]}).encode()
        body = json.loads(raw or b"{}")
        if "messages" in body:
            prompt = " ".join(str(m.get("content", "")) for m in body["messages"])
        else:
            prompt = str(body.get("prompt", body.get("input", "")))
        self.requests += 1
        self.seen[prompt] += 1
        self.arrivals[prompt].append(time.monotonic())
        if self._marked(prompt, "drop-"):
            return None, b""
        self._tick()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            if self._marked(prompt, "slow-"):
                await asyncio.sleep(self.slow)
        finally:
            self._tick()
            self.in_flight -= 1
        if self._marked(prompt, "flaky-"):
            return 503, b'{"error":{"message":"busy, try later"}}'
        words = len(prompt.split())
        usage = {"prompt_tokens": words, "completion_tokens": 3, "total_tokens": words + 3}
        if path.endswith("/embeddings"):
            return 200, json.dumps({"object": "list", "data": [{"object": "embedding", "index": 0,
                                    "embedding": [0.1, 0.2]}], "model": body.get("model"),
                                    "usage": {"prompt_tokens": words, "total_tokens": words}}).encode()
        if path.endswith("/chat/completions"):
            kind = "chat.completion"
            choice = {"index": 0, "message": {"role": "assistant", "content": "echo: " + prompt[:40]},
                      "finish_reason": "stop"}
        else:
            kind = "text_completion"
            choice = {"index": 0, "text": "echo: " + prompt[:40], "finish_reason": "stop"}
        return 200, json.dumps({"id": "cmpl-stub", "object": kind, "model": body.get("model"),
                                "choices": [choice], "usage": usage}).encode()

    def _marked(self, prompt: str, marker: str) -> bool:
        """The prompt carries `marker`N and this is one of its first N requests."""
        if marker not in prompt:
            return False
        return self.seen[prompt] <= int(prompt.split(marker, 1)[1].split()[0])

    def _tick(self) -> None:
        now = time.monotonic()
        self.busy += self.in_flight * (now - self._since)
        self._since = now


@contextlib.contextmanager
def running(delay: float = 0.0, model: str = "stub", slow: float = 5.0):
    stub = CountingStub(delay, model, slow)
    loop = asyncio.new_event_loop()
    started = threading.Event()

    stub.loop = loop

    def serve():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(stub.start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield stub
    finally:
        asyncio.run_coroutine_threadsafe(stub.shutdown(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


if __name__ == "__main__":
    async def main():
        stub = CountingStub(float(sys.argv[1]) if len(sys.argv) > 1 else 0.0)
        await stub.start()
        print(f"PORT {stub.port}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
