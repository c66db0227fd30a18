"""Relay a request to an engine and its answer back, reading usage on the way.

Streams are relayed event by event: every read from the engine is forwarded
at once up to its last complete SSE event ("\\n\\n"); only a torn event at the
end of a read waits for its rest (no client could use half an event). Engines
write whole events, so in practice every read goes straight through.

Usage: when the client streams without asking for usage, the gateway adds
stream_options.include_usage (it needs the counts) and removes that extra
usage-only chunk (`"choices": []`) from the client's stream, so the client
gets exactly what it asked for. A client that asked for usage gets it as the
engine sent it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
from dataclasses import dataclass, field

import aiohttp
import yarl
from django.utils.translation import gettext as _

from inference.deployments.presets import request_additions
from inference.gateway import errors, usage
from inference.gateway.clients import upstream
from inference.gateway.routing import Upstream

log = logging.getLogger(__name__)
MAX_PENDING = 1 << 20  # a "torn event" longer than this is forwarded anyway

DISCONNECTS = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


@dataclass
class Caller:
    key_id: int | None
    user_id: int | None


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seen: bool = False

    def take(self, obj: dict) -> None:
        u = obj.get("usage")
        if isinstance(u, dict):
            self.prompt_tokens = int(u.get("prompt_tokens") or 0)
            self.completion_tokens = int(u.get("completion_tokens") or 0)
            self.seen = True


class BadBody(ValueError):
    """A request body the gateway refuses (400); `param` names the field, as OpenAI's errors do."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message, self.param = message, param


MAX_INT = 2**63 - 1  # what an engine's integer fields hold (a C int64_t, a database column)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadBody(_("The number %(number)s is too large: JSON numbers must be finite.") % {"number": text})
    return value


def _no_constant(name: str):
    raise BadBody(_("%(name)s is not a JSON number: send a finite number (or null).") % {"name": name})


# One decoder for every request: Infinity, NaN and numbers that overflow to
# Infinity (1e400) are refused while parsing; everything else is json's own C scanner.
_DECODER = json.JSONDecoder(parse_float=_finite, parse_constant=_no_constant)


def read_body(raw: bytes, path: str) -> dict:
    """The client's JSON object, its fields checked for the type the gateway itself
    relies on (the engine checks the values); BadBody when it is not usable.

    Only what the gateway reads or what would otherwise crash it is checked here:
    `model` (routing), `stream` and `stream_options` (usage), `messages` and
    `max_tokens` (an engine given a wrong type answers with a 500 of its own).
    """
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass") if raw else "{}"
        body = _DECODER.decode(text)
    except BadBody:
        raise
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python's stack
        raise BadBody(_("The request body is not valid JSON.")) from None
    if not isinstance(body, dict):
        raise BadBody(_("The request body must be a JSON object."))
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadBody(_("'model' must be a string: the name of a model (GET /v1/models lists them)."), "model")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadBody(_("'stream' must be true or false."), "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadBody(_("'stream_options' must be an object such as {\"include_usage\": true}."), "stream_options")
    if path == "/v1/chat/completions" and "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise BadBody(_("'messages' must be a list of message objects such as "
                            "{\"role\": \"user\", \"content\": \"Hi\"}."), "messages")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (type(value) is not int or not 0 <= value <= MAX_INT):
            raise BadBody(_("'%(name)s' must be a whole number of tokens (0 to %(max)s) or null.")
                          % {"name": name, "max": MAX_INT}, name)
    return body


def prepare_body(body: dict, raw: bytes | None = None) -> tuple[bytes, bool]:
    """The body for the engine, and whether the usage chunk must be removed
    from the client's stream (the gateway asked for it, the client did not).

    With the client's own bytes (`raw`, already parsed into `body`), they go
    to the engine as they are, or with ``stream_options`` appended before the
    closing brace: no second JSON encoding of a long prompt per request.
    """
    strip = False
    if body.get("stream"):
        options = body.get("stream_options")
        if not isinstance(options, dict) or not options.get("include_usage"):
            strip = True
            if options is None and "stream_options" not in body and raw is not None:
                spliced = _append_fields(raw, b'"stream_options":{"include_usage":true}')
                if spliced is not None:
                    return spliced, strip
            body = dict(body, stream_options=dict(options or {}, include_usage=True))
        elif raw is not None:
            return raw, strip
    elif raw is not None:
        return raw, strip
    return json.dumps(body, separators=(",", ":")).encode(), strip


def _append_fields(raw: bytes, fields: bytes) -> bytes | None:
    """`raw` (a JSON object) with `fields` ('"name":value,...') added before its
    closing brace; None when `raw` is not a UTF-8 (or ASCII) JSON object."""
    head = raw.rstrip()
    if raw.lstrip()[:1] != b"{" or not head.endswith(b"}"):
        return None
    head = head[:-1].rstrip()
    return head + (b"" if head.endswith(b"{") else b",") + fields + b"}"


def with_request_defaults(target: Upstream, path: str, payload: bytes, body: dict | None = None) -> bytes:
    """The payload for `target`, with the request defaults of its deployment's
    preset added where the request leaves them out (presets.request_additions).

    Called by open_upstream, per replica: every request the gateway's pieces
    send to an engine gets it (both doors of views.proxy, the batch runner).
    `body` is the client's parsed request when the caller has it; without it
    the payload is parsed here, but only for a deployment that has defaults for
    `path`. A deployment without any costs one dict lookup, and its payload
    goes out untouched.
    """
    defaults = target.request_defaults.get(path)
    if not defaults:
        return payload
    if body is None:
        try:
            body = json.loads(payload)
        except ValueError:
            return payload  # the engine answers a body it cannot read, as it would have anyway
        if not isinstance(body, dict):
            return payload
    added = request_additions(defaults, body)
    if not added:
        return payload
    if not any(k in body for k in added):  # none there, not even as null: no duplicate keys
        spliced = _append_fields(payload, json.dumps(added, separators=(",", ":"))[1:-1].encode())
        if spliced is not None:
            return spliced
    return json.dumps({**json.loads(payload), **added}, separators=(",", ":")).encode()


async def open_upstream(target: Upstream, path: str, payload: bytes, stream: bool,
                        body: dict | None = None) -> aiohttp.ClientResponse:
    """POST to the engine, with the request defaults of the target's preset
    (with_request_defaults; `body`: the parsed payload, if the caller has it);
    retry once if a pooled connection turns out closed before any response
    (nothing was generated yet)."""
    payload = with_request_defaults(target, path, payload, body)
    headers = {"Content-Type": "application/json"}
    if stream:
        headers["Accept"] = "text/event-stream"
    if target.api_key:
        headers["Authorization"] = f"Bearer {target.api_key}"
    url = _url(target.base_url, path)
    for attempt in (1, 2):
        try:
            return await upstream().post(url, data=payload, headers=headers)
        except aiohttp.ClientConnectorError:
            raise  # nothing listens there: the caller tries the next replica
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            # llama-server (cpp-httplib) closes a keep-alive connection after a
            # few requests or 5 s idle; a request sent on it fails before any
            # response, so sending it once more on a fresh connection is safe.
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@functools.lru_cache(maxsize=1024)
def _url(base_url: str, path: str) -> yarl.URL:
    """Parsed once per engine and endpoint, not on every request."""
    return yarl.URL(base_url + path)


@dataclass
class Relay:
    """Async iterator over the client's stream; records usage when it ends."""

    response: aiohttp.ClientResponse
    target: Upstream
    model: str
    caller: Caller
    strip_usage: bool
    counted: Usage = field(default_factory=Usage)

    def __aiter__(self):
        return self._run()

    def _events(self, out: bytes) -> bytes:
        """Read usage from complete events (the last one carrying it wins, so
        with per-chunk usage only one event per read is parsed); drop the
        usage-only event if the gateway asked for it and the client did not."""
        events = out.split(b"\n\n")
        for event in reversed(events):
            if b'"usage"' in event:
                obj = _event_json(event)
                if obj is not None and isinstance(obj.get("usage"), dict):
                    self.counted.take(obj)
                    break
        if not self.strip_usage:
            return out
        kept = [e for e in events if not (b'"usage"' in e and _usage_only(e))]
        return b"\n\n".join(kept) if len(kept) != len(events) else out

    async def _run(self):
        pending = b""
        error = False
        finished = False  # the engine sent [DONE]: a client leaving after it is no error
        response = self.response
        try:
            async for chunk in response.content.iter_any():
                data = pending + chunk if pending else chunk
                cut = data.rfind(b"\n\n")
                if cut < 0:
                    if len(data) < MAX_PENDING:
                        pending = data
                        continue
                    cut = len(data) - 2
                out, pending = data[:cut + 2], data[cut + 2:]
                if b'"usage"' in out:
                    out = self._events(out)
                if b"data: [DONE]" in out:
                    finished = True
                if out:
                    yield out
            if pending:
                yield pending
        except DISCONNECTS as exc:
            error = True
            log.warning("gateway: deployment #%s stopped mid-stream: %r", self.target.deployment_id, exc)
            yield errors.error_event(
                _("The engine serving %(model)r (deployment %(deployment)r) stopped answering mid-stream; the answer "
                  "is incomplete. Retry the request.") % {"model": self.model, "deployment": self.target.name},
                "upstream_disconnected")
        except asyncio.CancelledError:  # the client went away: the engine's request is closed below
            error = not finished
            raise
        finally:
            response.close()
            usage.record(key_id=self.caller.key_id, user_id=self.caller.user_id,
                         deployment_id=self.target.deployment_id, model=self.model,
                         prompt_tokens=self.counted.prompt_tokens,
                         completion_tokens=self.counted.completion_tokens, error=error)


def _usage_only(event: bytes) -> bool:
    obj = _event_json(event)
    return obj is not None and bool(obj.get("usage")) and obj.get("choices") == []


def _event_json(event: bytes) -> dict | None:
    lines = [ln[5:].strip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
    if not lines:
        return None
    try:
        obj = json.loads(b"\n".join(lines))
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None
