"""A fast OpenAI-style SSE stub server for benchmark-harness tests.

Raw asyncio HTTP/1.1 on 127.0.0.1 with keep-alive and chunked responses, so a
single process can feed hundreds of concurrent streams. Every stream follows a
`StubScript`: delays before each chunk, a role-only first chunk, several SSE
events per TCP write, several tokens per chunk (what speculative decoding
looks like from the client), the trailing usage chunk, and failures mid-stream
(dropped connection or an error event).

A test sets the server's default script, or overrides it per request by
sending `"stub": {...script fields...}` in the request body (the harness's
`extra_body`).

The stub's "tokenizer" is whitespace words, so prompt lengths are exact:
`/tokenize` answers in vLLM style ({"model", "prompt"} -> {"count", "tokens"})
or llama.cpp style ({"content"} -> {"tokens"}), or is absent (404).

Run standalone (used by bench/harness.py): `python tests/sse_stub.py` prints
`PORT <n>` and serves until killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
import threading
from dataclasses import dataclass


@dataclass
class StubScript:
    tokens: int | None = None  # None: the request's max_tokens (16 if absent)
    first_delay: float = 0.0  # seconds before the first content chunk (prefill)
    token_delay: float = 0.0  # seconds before each later content chunk
    delays: list[float] | None = None  # explicit delay before each content chunk
    role_first: bool = True  # chat only: a role-only delta first, no content
    role_delay: float = 0.0  # seconds before the role-only chunk
    tokens_per_chunk: int = 1
    events_per_write: int = 1  # SSE events packed into one TCP write
    fail_after_chunks: int | None = None  # fail after this many content chunks
    fail_mode: str = "drop"  # "drop" the connection or send an "error_event"
    status: int = 200  # anything else: answer with this HTTP error
    send_done: bool = True  # final "data: [DONE]"
    usage: bool = True  # honour stream_options (False: a server that never sends usage)


def count_words(text: str) -> int:
    return len(text.split())


def _prompt_text(body: dict) -> str:
    if "messages" in body:
        parts = []
        for message in body["messages"]:
            content = message.get("content")
            if isinstance(content, list):
                parts.extend(p.get("text", "") for p in content if isinstance(p, dict))
            elif content:
                parts.append(str(content))
        return " ".join(parts)
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))


class StubServer:
    def __init__(self, script: StubScript | None = None, tokenize_style: str = "vllm"):
        self.script = script or StubScript()
        self.tokenize_style = tokenize_style  # "vllm", "llamacpp" or "none"
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests: list[dict] = []  # request bodies, for assertions
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1)

    # -- HTTP plumbing ---------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, value = line.split(":", 1)
                        headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0"))
                raw = await reader.readexactly(length) if length else b""
                keep_open = await self._route(method, path.split("?")[0], raw, writer)
                if not keep_open:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return
        finally:
            self._connections.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    @staticmethod
    def _respond(writer, status: int, body: bytes, content_type="application/json") -> None:
        reason = {200: "OK", 404: "Not Found", 400: "Bad Request"}.get(status, "Error")
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        )

    async def _route(self, method: str, path: str, raw: bytes, writer) -> bool:
        if method == "GET" and path == "/metrics":
            text = (
                "# TYPE vllm:prompt_tokens_total counter\n"
                f'vllm:prompt_tokens_total{{model_name="stub"}} {self.prompt_tokens_total}\n'
                "# TYPE vllm:generation_tokens_total counter\n"
                f'vllm:generation_tokens_total{{model_name="stub"}} {self.generation_tokens_total}\n'
            )
            self._respond(writer, 200, text.encode(), "text/plain; version=0.0.4")
            await writer.drain()
            return True
        if method == "GET" and path in ("/health", "/v1/models"):
            self._respond(writer, 200, b'{"object":"list","data":[{"id":"stub","root":"stub"}]}')
            await writer.drain()
            return True
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._respond(writer, 400, b'{"error":"bad json"}')
            return True
        if method == "POST" and path == "/tokenize":
            await self._tokenize(body, writer)
            return True
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            return await self._complete(body, chat=path.endswith("chat/completions"), writer=writer)
        self._respond(writer, 404, b'{"error":"not found"}')
        await writer.drain()
        return True

    async def _tokenize(self, body: dict, writer) -> None:
        if self.tokenize_style == "vllm" and "prompt" in body:
            words = body["prompt"].split()
            answer = {"count": len(words), "max_model_len": 32768, "tokens": list(range(len(words)))}
        elif self.tokenize_style == "llamacpp":
            # llama.cpp answers an empty list when "content" is missing.
            words = str(body.get("content", "")).split()
            answer = {"tokens": list(range(len(words)))}
        else:
            self._respond(writer, 404, b'{"error":"not found"}')
            await writer.drain()
            return
        self._respond(writer, 200, json.dumps(answer).encode())
        await writer.drain()

    # -- completions -----------------------------------------------------
    async def _complete(self, body: dict, chat: bool, writer) -> bool:
        self.requests.append(body)
        script = self.script
        if isinstance(body.get("stub"), dict):
            script = dataclasses.replace(script, **body["stub"])
        if script.status != 200:
            self._respond(writer, script.status, b'{"error":{"message":"scripted failure"}}')
            await writer.drain()
            return True
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        n_tokens = script.tokens if script.tokens is not None else int(max_tokens)
        prompt_tokens = count_words(_prompt_text(body))
        self.prompt_tokens_total += prompt_tokens
        options = body.get("stream_options") or {}
        want_usage = bool(options.get("include_usage")) and script.usage
        continuous = bool(options.get("continuous_usage_stats")) and script.usage
        model = body.get("model", "stub")
        if not body.get("stream"):
            self.generation_tokens_total += n_tokens
            text = "tok " * n_tokens
            choice = {"index": 0, "finish_reason": "length"}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            answer = {"choices": [choice], "usage": {"prompt_tokens": prompt_tokens,
                      "completion_tokens": n_tokens, "total_tokens": prompt_tokens + n_tokens}}
            self._respond(writer, 200, json.dumps(answer).encode())
            await writer.drain()
            return True

        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        prefix = '{"id":"cmpl-stub","object":"%s","created":0,"model":%s,"choices":[' % (
            "chat.completion.chunk" if chat else "text_completion", json.dumps(model))

        def event(choice: dict | None, usage: dict | None = None, extra: str = "") -> bytes:
            choices = json.dumps(choice) if choice is not None else ""
            tail = ',"usage":%s' % json.dumps(usage) if usage is not None else ""
            return ("data: " + prefix + choices + "]" + tail + extra + "}\n\n").encode()

        def usage_at(done: int) -> dict:
            return {"prompt_tokens": prompt_tokens, "completion_tokens": done,
                    "total_tokens": prompt_tokens + done}

        # A timeline of (delay before, event bytes); writes group events.
        timeline: list[tuple[float, bytes]] = []
        if chat and script.role_first:
            timeline.append((script.role_delay, event(
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None},
                usage_at(0) if continuous else None)))
        n_chunks = -(-n_tokens // script.tokens_per_chunk) if n_tokens else 0
        done = 0
        failed_at = None
        for i in range(n_chunks):
            if script.fail_after_chunks is not None and i >= script.fail_after_chunks:
                failed_at = i
                break
            k = min(script.tokens_per_chunk, n_tokens - done)
            done += k
            text = "tok " * k
            delta = {"content": text} if chat else None
            choice = ({"index": 0, "delta": delta, "finish_reason": None} if chat
                      else {"index": 0, "text": text, "finish_reason": None})
            if script.delays is not None:
                delay = script.delays[i] if i < len(script.delays) else 0.0
            else:
                delay = script.first_delay if i == 0 else script.token_delay
            timeline.append((delay, event(choice, usage_at(done) if continuous else None)))
        self.generation_tokens_total += done

        if failed_at is None:
            final = ({"index": 0, "delta": {}, "finish_reason": "length"} if chat
                     else {"index": 0, "text": "", "finish_reason": "length"})
            timeline.append((0.0, event(final, usage_at(done) if continuous else None)))
            if want_usage:
                timeline.append((0.0, event(None, usage_at(done))))
            if script.send_done:
                timeline.append((0.0, b"data: [DONE]\n\n"))
        elif script.fail_mode == "error_event":
            error = {"error": {"message": "scripted engine error", "type": "InternalServerError", "code": 500}}
            timeline.append((0.0, ("data: " + json.dumps(error) + "\n\n").encode()))
            timeline.append((0.0, b"data: [DONE]\n\n"))

        group: list[bytes] = []

        async def flush() -> None:
            if group:
                payload = b"".join(group)
                writer.write(b"%x\r\n%s\r\n" % (len(payload), payload))
                group.clear()
                await writer.drain()

        for delay, data in timeline:
            if delay > 0:
                await flush()
                await asyncio.sleep(delay)
            group.append(data)
            if len(group) >= script.events_per_write:
                await flush()
        await flush()
        if failed_at is not None and script.fail_mode == "drop":
            writer.transport.abort()  # no terminating chunk: the client sees a cut stream
            return False
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


@contextlib.contextmanager
def running_stub(script: StubScript | None = None, tokenize_style: str = "vllm"):
    """Serve a StubServer from a background thread; yields the server."""
    server = StubServer(script, tokenize_style)
    loop = asyncio.new_event_loop()
    started = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, name="sse-stub", daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("SSE stub did not start within 10 s")
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def serve_forever(server: "StubServer", port: int = 0) -> None:
    """Run `server` as this process's only job: print `PORT <n>` once it listens, then serve
    until the process is stopped (what tests that start a stub engine as a process read)."""

    async def serve() -> None:
        await server.start(port)
        print(f"PORT {server.port}", flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


def main() -> None:
    serve_forever(StubServer(), int(sys.argv[1]) if len(sys.argv) > 1 else 0)


if __name__ == "__main__":
    main()
