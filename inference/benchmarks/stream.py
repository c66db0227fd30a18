"""One streaming request: its payload, sending it, and reading its events.

While an answer streams in, only (arrival time, bytes) per network read is
kept; the server-sent events are parsed afterwards (analyze_stream) into the
request's record: TTFT, every chunk's time and tokens, usage, errors.
"""

from __future__ import annotations

import asyncio
import json
import time

from inference.benchmarks.records import (BenchmarkConfig, BenchmarkError, RequestRecord, RequestSpec,
                                          ServerHTTPError, gettext_noop)


class SSEParser:
    """Incremental server-sent-events parser: feed bytes, get event payloads.

    One network read may hold several events, or half of one; events end at
    a blank line (LF or CRLF). Returns (field, data) pairs where field is
    "data" for normal events and "error" for llama.cpp's `error:` lines.
    """

    def __init__(self):
        self._buf = b""

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        buf = self._buf + data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        out = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            block = buf[start:end]
            start = end + 2
            for line in block.split(b"\n"):
                if line.startswith(b"data:"):
                    out.append(("data", line[5:].strip().decode("utf-8", "replace")))
                elif line.startswith(b"error:"):
                    out.append(("error", line[6:].strip().decode("utf-8", "replace")))
                # comments (":ping"), "event:" and "id:" lines carry no tokens
        self._buf = buf[start:]
        return out

    @property
    def pending(self) -> bytes:
        return self._buf


def choice_text(choice: dict, chat: bool) -> str:
    """Generated text in one choice, reasoning included (it is generated tokens)."""
    if not chat:
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    text = delta.get("content") or ""
    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
    if delta.get("tool_calls"):
        reasoning += json.dumps(delta["tool_calls"])
    return reasoning + text if reasoning else text


def build_payload(config: BenchmarkConfig, spec: RequestSpec) -> dict:
    options = {"include_usage": True}
    if config.continuous_usage:
        options["continuous_usage_stats"] = True
    if config.endpoint == "chat":
        messages = spec.prompt if isinstance(spec.prompt, list) else [{"role": "user", "content": spec.prompt}]
        payload = {"model": config.model, "messages": messages, "max_completion_tokens": spec.max_tokens,
                   "max_tokens": spec.max_tokens}
    else:
        if isinstance(spec.prompt, list):
            raise BenchmarkError(gettext_noop("The completions endpoint needs text prompts, not chat messages."))
        payload = {"model": config.model, "prompt": spec.prompt, "max_tokens": spec.max_tokens}
    payload.update({"stream": True, "stream_options": options})
    if config.ignore_eos:
        payload["ignore_eos"] = True
    payload.update(config.extra_body)
    return payload


async def send_request(client, config: BenchmarkConfig, spec: RequestSpec, record: RequestRecord,
                       t0: float, body: bytes | None = None, deferred: "Deferred | None" = None) -> RequestRecord:
    """Send one streaming request and fill `record`. Never raises for server faults.

    While the answer streams in, only (arrival time, bytes) per network read
    is kept; the events are parsed when the stream has ended
    (analyze_stream), or, with `deferred`, after the whole phase, so a busy
    client spends no time per chunk beyond storing it and sends stay on
    schedule. Timestamps are taken per read, as they arrive, so the figures
    are the same as parsing on the fly.
    """
    headers = {"Content-Type": "application/json"}
    if config.api_key:
        headers["Authorization"] = f"Bearer {config.api_key}"
    if body is None:
        body = json.dumps(build_payload(config, spec)).encode()
    if spec.prompt_tokens:
        record.prompt_tokens, record.prompt_tokens_source = spec.prompt_tokens, "tokenizer"
    chat = config.endpoint == "chat"
    reads: list[tuple[float, bytes]] = []
    transport_error = None
    st = time.perf_counter()
    record.sent_at = st - t0
    try:
        await client.collect(config.api_url, body, headers, reads, st)
    except ServerHTTPError as exc:
        transport_error = str(exc)
    except asyncio.CancelledError:
        analyze_stream(record, reads, chat, "cancelled")
        raise
    except Exception as exc:  # network faults, timeouts, cut streams
        transport_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if deferred is not None:
        deferred.add(record, reads, chat, transport_error)
    else:
        analyze_stream(record, reads, chat, transport_error)
    return record


class Deferred:
    """Streams read during a phase and parsed after it: parsing (~7 us per
    event here) stays out of the event loop while requests are being sent.
    Until then a record's `success` only says the transport finished; more
    than LIMIT bytes held are parsed at once instead, to bound memory."""

    LIMIT = 64 << 20

    def __init__(self):
        self.items: list[tuple] = []
        self.held = 0

    def add(self, record: RequestRecord, reads: list, chat: bool, transport_error: str | None) -> None:
        size = sum(len(data) for _, data in reads)
        if self.held + size > self.LIMIT:
            analyze_stream(record, reads, chat, transport_error)
            return
        record.success = transport_error is None  # provisional, for live progress
        self.items.append((record, reads, chat, transport_error))
        self.held += size

    def flush(self) -> None:
        for item in self.items:
            analyze_stream(*item)
        self.items.clear()
        self.held = 0


def analyze_stream(record: RequestRecord, reads: list[tuple[float, bytes]], chat: bool,
                   transport_error: str | None = None) -> RequestRecord:
    """Fill `record` from a stream's reads: (seconds since sent, bytes) each.

    An error event in the stream ends the request there (later events are
    not counted); a transport error applies after the events that did arrive.
    """
    record.success = False
    parser = SSEParser()
    last_usage_tokens = 0
    usage_tokens = None
    saw_done = False
    texts = []
    times = record.chunk_times
    per_chunk = record.tokens_per_chunk
    continuous = True  # every token chunk carried usage so far
    error = None
    try:
        for now, data in reads:
            for kind, payload in parser.feed(data):
                if kind == "error":
                    raise ServerHTTPError(500, f"error event in stream: {payload}")
                if payload == "[DONE]":
                    saw_done = True
                    continue
                try:
                    event = json.loads(payload)
                except ValueError:
                    raise ServerHTTPError(200, f"stream sent a line that is not JSON: {payload[:120]}")
                if "error" in event and not event.get("choices"):
                    err = event["error"]
                    message = err.get("message", err) if isinstance(err, dict) else err
                    raise ServerHTTPError(500, f"error event in stream: {message}")
                usage = event.get("usage")
                choices = event.get("choices")
                if choices:
                    choice = choices[0]
                    if not times:
                        record.ttft = now
                    times.append(now)
                    text = choice_text(choice, chat)
                    if usage and usage.get("completion_tokens") is not None:
                        done = usage["completion_tokens"]
                        per_chunk.append(done - last_usage_tokens)
                        last_usage_tokens = done
                    else:
                        continuous = False
                        per_chunk.append(1 if text else 0)
                    if text:
                        if not texts:
                            record.ttft_content = now
                        texts.append(text)
                    if choice.get("finish_reason"):
                        record.finish_reason = choice["finish_reason"]
                if usage:
                    if usage.get("completion_tokens") is not None:
                        usage_tokens = usage["completion_tokens"]
                    if usage.get("prompt_tokens") is not None:
                        record.prompt_tokens, record.prompt_tokens_source = usage["prompt_tokens"], "usage"
                if "timings" in event:
                    record.server_timings = event["timings"]
    except ServerHTTPError as exc:
        error = str(exc)
    if error is None:
        error = transport_error
    if error is not None:
        record.error = error
    elif not times:
        # Marked only: the panel translates a stored error when it reports it (services._record).
        record.error = gettext_noop("The stream ended without any chunk carrying a choice; TTFT cannot be "
                                    "measured.")
    elif not saw_done and record.finish_reason is None:
        record.error = gettext_noop("The stream ended before [DONE] or a finish_reason: the connection was cut.")
    else:
        record.success = True
    record.generated_text = "".join(texts)
    if times:
        record.latency = times[-1]
    if continuous and times and last_usage_tokens:
        record.tokens_per_chunk_source = "usage"
    if usage_tokens is not None:
        record.output_tokens, record.output_tokens_source = usage_tokens, "usage"
    else:
        record.output_tokens = sum(1 for n in per_chunk if n)  # chunks with text
        record.output_tokens_source = "counted"
    return record
