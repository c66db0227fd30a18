"""/v1/files and /v1/batches on the gateway: OpenAI's Files and Batches APIs.

Same Bearer keys as the rest of /v1/ (or the signed-in session with its CSRF
token). Under the gateway's ASGI handler the request body is spooled to a
temporary file by Django (memory bounded by FILE_UPLOAD_MAX_MEMORY_SIZE); the
multipart part "file" is then streamed through storage.BatchUploadHandler,
which hashes, checks each line and writes it next to its final place. Nothing
holds the file in memory, so a 1 GB input is fine (BATCH_FILE_MAX_BYTES).
"""

from __future__ import annotations

import asyncio
import json
import os

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_not_required
from django.db import close_old_connections
from django.http import JsonResponse, StreamingHttpResponse
from django.utils.http import content_disposition_header
from django.utils.translation import gettext
from django.views.decorators.csrf import csrf_exempt

from dashboard.roles import OPERATOR_ONLY, is_operator
from inference.batches import schemas, selectors, services
from inference.batches.storage import BatchUploadHandler
from inference.gateway import keys
from inference.gateway.errors import bad_request, error_response
from inference.gateway.views import _caller, _session_user
from inference.models import ApiKey, BatchFile

CHUNK = 1 << 20


def _db(fn):
    """Run ORM work off the event loop, on a fresh-enough connection."""
    def run(*args, **kwargs):
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()
    return sync_to_async(run, thread_sensitive=False)


def _refused(exc: services.Refused):
    return error_response(exc.status, exc.message, "invalid_request_error", exc.code, param=exc.param)


def _no_file(ident: str) -> str:
    return gettext("No file with id %(id)r.") % {"id": ident}


def _not_found(what: str, ident: str):
    message = _no_file(ident) if what == "file" else gettext("No batch with id %(id)r.") % {"id": ident}
    return error_response(404, message, "invalid_request_error", f"{what}_not_found")


def _method(allowed: str, path: str):
    """405 naming the methods `path` takes ("GET" or "GET POST")."""
    methods = allowed.split()
    if len(methods) == 1:
        message = gettext("%(path)s takes %(method)s.") % {"path": path, "method": methods[0]}
    else:
        message = gettext("%(path)s takes %(first)s or %(second)s.") % {"path": path, "first": methods[0],
                                                                        "second": methods[1]}
    return error_response(405, message, "invalid_request_error", "method_not_allowed")


def _bad_limit():
    return bad_request(gettext("limit must be a whole number from 1 to 10000."), "limit")


def _json_body(request) -> dict | None:
    try:
        body = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError):  # "[" * 100000 nests past the parser's depth
        return None
    return body if isinstance(body, dict) else None


def _is_operator_id(user_id) -> bool:
    user = _user(user_id)
    return user is not None and is_operator(user)


async def _change_refused(caller):
    """A signed-in session may only read here unless its user is an operator
    (viewers look, operators change); a Bearer key was made by an operator."""
    if caller.key_id is not None or await _db(_is_operator_id)(caller.user_id):
        return None
    return error_response(403, str(OPERATOR_ONLY), "invalid_request_error", "forbidden")


async def _session_refused(request):
    """Who a key-less upload is from, before its body is read: 401 for no one
    signed in, 403 for a viewer. (The session's CSRF check reads the form, so it
    runs once the body is read: only an operator's upload gets that far.)"""
    user = await _session_user(request)
    if user is None or not user.is_authenticated:
        return error_response(401, gettext("No API key: send 'Authorization: Bearer kiln-…' (create a key on the "
                                           "panel's Keys page)."), "invalid_request_error", "missing_api_key")
    if not await sync_to_async(is_operator, thread_sensitive=False)(user):
        return error_response(403, str(OPERATOR_ONLY), "invalid_request_error", "forbidden")
    return None


def _limit(request) -> int | None:
    try:
        value = int(request.GET.get("limit", "20"))
    except ValueError:
        return None
    return value if 1 <= value <= 10000 else None


# ---------------------------------------------------------------- files
@login_not_required
@csrf_exempt
async def files(request):
    if request.method == "GET":
        caller, _, refused = await _caller(request, count=False)
        if refused:
            return refused
        limit = _limit(request)
        if limit is None:
            return _bad_limit()
        rows = await _db(selectors.files_for)(caller.user_id, purpose=request.GET.get("purpose") or None,
                                              limit=limit + 1, after=request.GET.get("after") or None)
        data = [schemas.file_object(f) for f in rows[:limit]]
        return JsonResponse({"object": "list", "data": data, "has_more": len(rows) > limit,
                             "first_id": data[0]["id"] if data else None,
                             "last_id": data[-1]["id"] if data else None})
    if request.method != "POST":
        return _method("GET POST", "/v1/files")
    handler = BatchUploadHandler(request)
    request.upload_handlers = [handler]
    secret = keys.bearer(request)
    try:
        multipart = (request.content_type or "").startswith("multipart/form-data")
        # Who is calling is settled before the body is read: a key, or a signed-in operator.
        if secret:
            caller, _, refused = await _caller(request, count=False)
        else:
            refused = await _session_refused(request)
        if refused:
            return refused
        if not multipart:
            return bad_request(gettext("Upload the file as multipart/form-data with the fields 'file' and "
                                       "'purpose' (the openai client's files.create does)."), "file")
        await sync_to_async(lambda: request.FILES, thread_sensitive=False)()
        if not secret:  # a session's CSRF token may be a form field: checked once the form is read
            caller, _, refused = await _caller(request, count=False)
            if refused:
                return refused
            refused = await _change_refused(caller)
            if refused:
                return refused
        if handler.incoming is None:
            return bad_request(gettext("No file: send it in the multipart field 'file'."), "file")
        purpose = request.POST.get("purpose", "")
        incoming, handler.incoming = handler.incoming, None
        try:
            row = await _db(services.file_store)(incoming, user=caller.user_id, purpose=purpose)
        except services.Refused as exc:
            return _refused(exc)
        return JsonResponse(schemas.file_object(row))
    finally:
        if handler.incoming is not None:
            handler.incoming.discard()


def _user(user_id):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.filter(pk=user_id).first()


@login_not_required
@csrf_exempt
async def file_detail(request, file_id):
    if request.method not in ("GET", "DELETE"):
        return _method("GET DELETE", "/v1/files/{id}")
    caller, _, refused = await _caller(request, count=False)
    if refused:
        return refused
    if request.method == "DELETE":
        refused = await _change_refused(caller)
        if refused:
            return refused
    row = await _db(selectors.file_for)(caller.user_id, file_id)
    if row is None:
        return _not_found("file", file_id)
    if request.method == "DELETE":
        try:
            await _db(services.file_delete)(row)
        except services.Refused as exc:
            return _refused(exc)
        return JsonResponse({"id": file_id, "object": "file", "deleted": True})
    return JsonResponse(schemas.file_object(row))


@login_not_required
@csrf_exempt
async def file_content(request, file_id):
    if request.method != "GET":
        return _method("GET", "/v1/files/{id}/content")
    caller, _, refused = await _caller(request, count=False)
    if refused:
        return refused
    row = await _db(selectors.file_for)(caller.user_id, file_id)
    if row is None:
        return _not_found("file", file_id)
    size = await _db(selectors.committed_size)(row)
    return stream_file(row.path, size, row.filename)


def stream_file(path: str, size: int, filename: str) -> StreamingHttpResponse:
    """The first `size` bytes of the file (an output file's committed part), read 1 MiB at a time."""
    async def chunks():
        fd = await asyncio.to_thread(os.open, path, os.O_RDONLY)
        try:
            offset = 0
            while offset < size:
                data = await asyncio.to_thread(os.pread, fd, min(CHUNK, size - offset), offset)
                if not data:
                    break
                offset += len(data)
                yield data
        finally:
            os.close(fd)

    response = StreamingHttpResponse(chunks(), content_type="application/jsonl")
    response["Content-Length"] = str(size)
    # Django's builder quotes and escapes the name (an uploaded name may hold quotes or non-ASCII).
    response["Content-Disposition"] = content_disposition_header(True, filename)
    return response


# ---------------------------------------------------------------- batches
@login_not_required
@csrf_exempt
async def batches(request):
    caller, info, refused = await _caller(request, count=False)
    if refused:
        return refused
    if request.method == "GET":
        limit = _limit(request)
        if limit is None:
            return _bad_limit()
        rows = await _db(selectors.batches_for)(caller.user_id, limit=limit + 1,
                                                after=request.GET.get("after") or None)
        data = [schemas.batch_object(b) for b in rows[:limit]]
        return JsonResponse({"object": "list", "data": data, "has_more": len(rows) > limit,
                             "first_id": data[0]["id"] if data else None,
                             "last_id": data[-1]["id"] if data else None})
    if request.method != "POST":
        return _method("GET POST", "/v1/batches")
    refused = await _change_refused(caller)
    if refused:
        return refused
    body = _json_body(request)
    if body is None:
        return bad_request(gettext("The request body must be a JSON object."))
    for name in ("input_file_id", "endpoint"):
        if not isinstance(body.get(name), str):
            return bad_request(gettext("'%(name)s' is required (a string).") % {"name": name}, name)
    window = body.get("completion_window", "24h")

    def create():
        f = selectors.file_for(caller.user_id, body["input_file_id"])
        if f is None:
            raise services.Refused(_no_file(body["input_file_id"]), "file_not_found", "input_file_id", 404)
        key = ApiKey.objects.filter(pk=caller.key_id).first() if caller.key_id else None
        return services.batch_create(user=caller.user_id, key=key, input_file=f, endpoint=body["endpoint"],
                                     completion_window=window if isinstance(window, str) else "",
                                     metadata=body.get("metadata"))
    try:
        batch = await _db(create)()
    except services.Refused as exc:
        return _refused(exc)
    return JsonResponse(schemas.batch_object(batch))


@login_not_required
@csrf_exempt
async def batch_detail(request, batch_id):
    if request.method != "GET":
        return _method("GET", "/v1/batches/{id}")
    caller, _, refused = await _caller(request, count=False)
    if refused:
        return refused
    batch = await _db(selectors.batch_for)(caller.user_id, batch_id)
    if batch is None:
        return _not_found("batch", batch_id)
    return JsonResponse(schemas.batch_object(batch))


@login_not_required
@csrf_exempt
async def batch_cancel(request, batch_id):
    if request.method != "POST":
        return _method("POST", "/v1/batches/{id}/cancel")
    caller, _, refused = await _caller(request, count=False)
    if refused:
        return refused
    refused = await _change_refused(caller)
    if refused:
        return refused
    batch = await _db(selectors.batch_for)(caller.user_id, batch_id)
    if batch is None:
        return _not_found("batch", batch_id)
    batch = await _db(services.batch_cancel)(batch)
    return JsonResponse(schemas.batch_object(batch))
