"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}}."""

import json

from django.http import HttpResponse
from django.utils.translation import gettext as _


def error_body(message: str, type_: str, code: str, param=None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str, code: str, retry_after: int | None = None,
                   param=None) -> HttpResponse:
    response = HttpResponse(json.dumps(error_body(message, type_, code, param)), status=status,
                            content_type="application/json")
    if retry_after is not None:
        response["Retry-After"] = str(int(retry_after))
    return response


def error_event(message: str, code: str = "upstream_error") -> bytes:
    """An SSE event that ends a broken stream; the openai client raises APIError on it."""
    body = error_body(message, "upstream_error", code)
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def bad_request(message: str, param=None) -> HttpResponse:
    return error_response(400, message, "invalid_request_error", "invalid_request", param=param)


def too_large(limit: int) -> HttpResponse:
    return error_response(413, _("The request body is larger than %(limit)s bytes (DATA_UPLOAD_MAX_MEMORY_SIZE); "
                                 "send a shorter prompt or raise that setting.") % {"limit": limit},
                          "invalid_request_error", "request_too_large")
