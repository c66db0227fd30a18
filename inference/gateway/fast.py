"""API calls with a key, served straight from ASGI messages.

An OpenAI client's POST to /v1/chat/completions, /v1/completions or
/v1/embeddings with ``Authorization: Bearer …`` needs none of what Django's
request and response objects do for pages (sessions, CSRF, forms, cookies,
URL resolution). Measured with py-spy on bench/gateway.py, building and
tearing those down (request object, headers, script prefix, resolving,
StreamingHttpResponse and its send loop) was about a fifth of the gateway's
CPU per request, and on a busy host CPU is time to first token. So those
calls are read from the ASGI scope and answered with ASGI messages here;
the checks, routing and relaying are the same code as the Django views use
(views.proxy, proxy.Relay). Everything else under /v1/ -- the playground's
session calls, /v1/models, a GET, a request without a key -- goes to the
Django views as before. The Host header is checked before a request gets
here (asgi.with_gateway), as it is for the Django views.
"""

from __future__ import annotations

import asyncio

from django.conf import settings
from django.http import HttpResponseBase

from inference.gateway import views
from inference.gateway.errors import too_large
from inference.gateway.keys import parse_bearer

# path -> whether the endpoint may stream
PATHS = {"/v1/chat/completions": True, "/v1/completions": True, "/v1/embeddings": False}


def bearer(scope) -> str | None:
    """The API key of a request, from its raw headers; None if there is none."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            return parse_bearer(value.decode("latin-1"))
    return None


def takes(scope) -> str | None:
    """The key if this request is one for the fast path, else None."""
    if scope["method"] != "POST" or scope["path"] not in PATHS:
        return None
    return bearer(scope)


async def handle(scope, receive, send, secret: str) -> None:
    path = scope["path"]
    body = await _read_body(receive, settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    if body is None:
        return  # the client left before sending its body
    if body is False:
        await _send_response(send, too_large(settings.DATA_UPLOAD_MAX_MEMORY_SIZE))
        return
    result = await views.proxy(path, body, PATHS[path], secret=secret)
    if isinstance(result, HttpResponseBase):
        await _send_response(send, result)
    elif result.streaming:
        await _relay(result, receive, send)
    else:
        status, raw = await result.read()
        if status is None:
            await _send_response(send, raw)
        else:
            await send({"type": "http.response.start", "status": status,
                        "headers": _headers(result.headers(), result.content_type, len(raw))})
            await send({"type": "http.response.body", "body": raw})


async def _read_body(receive, limit: int | None):
    """The whole body; None if the client disconnected, False if over `limit`."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            return False
        chunks.append(chunk)
        if not message.get("more_body"):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _headers(extra: dict, content_type: str, length: int | None = None) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", content_type.encode("latin-1"))]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    headers.extend((k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in extra.items())
    return headers


async def _send_response(send, response: HttpResponseBase) -> None:
    """An (error) HttpResponse, sent as ASGI messages."""
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.items()]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": response.content})


async def _relay(result, receive, send) -> None:
    """Stream the engine's events to the client; a client that leaves cancels
    the relay, which closes the engine's request and counts it as broken."""
    await send({"type": "http.response.start", "status": 200,
                "headers": _headers(result.headers(), result.content_type)})
    relaying = asyncio.current_task()
    gone = False

    async def watch():
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        relaying.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        async for chunk in result.relay():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    except asyncio.CancelledError:
        if not gone:
            raise
        relaying.uncancel()  # the client left: the relay is over, nothing failed here
    finally:
        watcher.cancel()
