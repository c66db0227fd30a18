"""The JSON API: one NinjaAPI, a router per area, one error shape, one body parser.

Every JSON endpoint under /api/ is a route of `api` below, declared in its
area's `api.py` with its input and output as pydantic schemas (the area's
`schemas.py`). Input that does not fit its schema (a wrong type, a missing
field, a number out of range, a NUL byte, an id too large for the database)
is answered 400 with the field named before the route runs. Errors, whatever
raised them, leave in one shape:

    {"error": {"code": "invalid", "message": "repo_id: Input should be a valid string",
               "fields": {"repo_id": "Input should be a valid string"}}}

The OpenAPI document is /api/openapi.json and its page /api/docs; both need a
signed-in session, like every other route.
"""
from __future__ import annotations

import json
from functools import wraps
from typing import Annotated, Any

from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.views import redirect_to_login
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, JsonResponse
from django.http.request import RawPostDataException
from ninja import NinjaAPI, Router
from ninja import Schema as NinjaSchema
from ninja.errors import AuthenticationError, AuthorizationError, HttpError, ValidationError
from ninja.parser import Parser
from ninja.security import SessionAuth
from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field
from django.utils.translation import gettext as _

from dashboard.roles import OPERATOR_ONLY, is_operator

# The largest value a database integer column holds (64-bit signed): an id or
# a count beyond it is refused here instead of overflowing in the database.
MAX_INT = 2**63 - 1


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError(_("must not contain a NUL character (\\x00)"))
    return value


# Field types for schemas: text without NUL (PostgreSQL refuses it, file paths
# cannot hold it), and ids/counts a database column can store.
Text = Annotated[str, AfterValidator(_no_nul)]
RowId = Annotated[int, Field(ge=1, le=MAX_INT)]
Count = Annotated[int, Field(ge=0, le=MAX_INT)]


def _blank_is_none(value):
    return None if value == "" else value


# For an optional field that an HTML form posts empty: "" means "not given", e.g.
# `runtime: Annotated[Optional[RowId], Blank] = None`.
Blank = BeforeValidator(_blank_is_none)


class Schema(NinjaSchema):
    """Base of every API schema: no Infinity or NaN where a number is expected."""

    model_config = ConfigDict(allow_inf_nan=False)


class ApiError(Exception):
    """A refusal a route raises: becomes {"error": {"code", "message", **extra}} with `status`."""

    def __init__(self, code: str, message: str, status: int = 400, **extra: Any):
        super().__init__(message)
        self.code, self.message, self.status, self.extra = code, message, status, extra


class ErrorBody(Schema):
    code: str
    message: str


class ErrorOut(Schema):
    """What every refusal looks like (more keys may sit beside code and message)."""

    error: ErrorBody


def json_error(code, message, status=400, **extra):
    """{"error": {"code", "message", ...}}: the one error shape of Kiln's API."""
    return JsonResponse({"error": {"code": code, "message": message, **extra}}, status=status)


class KilnParser(Parser):
    """JSON bodies; an HTML form's fields as a flat dict (pages post both)."""

    def parse_body(self, request):
        if request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
            return request.POST.dict()
        data = json.loads(request.body)
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        return data


class Session(SessionAuth):
    """A signed-in user (the panel's session cookie, with its CSRF check)."""

    def __call__(self, request):
        # Read the body first: the CSRF check parses a multipart form from the request's
        # stream, after which the body parser could no longer read it (a 500, not a 400).
        # A body too large to hold in memory is left to stream: an uploaded file (a
        # benchmark result of many MiB) is read from request.FILES, not from the body.
        try:
            request.body  # noqa: B018 -- cached on the request for the body parser
        except (RawPostDataException, RequestDataTooBig):
            pass
        return super().__call__(request)

    def authenticate(self, request, key):
        return request.user if request.user.is_authenticated else None


class OperatorSession(Session):
    """A signed-in operator; a viewer is refused with 403, not 401."""

    def authenticate(self, request, key):
        user = super().authenticate(request, key)
        if user is not None and not is_operator(user):
            raise AuthorizationError(403, OPERATOR_ONLY)
        return user


session = Session()
operator = OperatorSession()


def signed_in_docs(view):
    """The OpenAPI document and its page need a signed-in user. Anonymous callers
    of the document get the API's 401 (what the login middleware answers under
    /api/); the page, opened in a browser, goes to the login page and back."""

    @wraps(view)
    def checked(request, *args, **kwargs):
        if request.user.is_authenticated:
            if request.method not in ("GET", "HEAD"):  # both are read by GET; a POST changes nothing
                return json_error("method_not_allowed", _("%(method)s is not allowed here; use GET.") % {"method": request.method}, 405)
            return view(request, *args, **kwargs)
        if request.resolver_match.url_name == "openapi-view":
            return redirect_to_login(request.get_full_path())
        return json_error("not_authenticated", _("Sign in first: this endpoint needs a Kiln session."), 401)

    return login_not_required(checked)


# What any route may answer besides its own responses: the shared refusals, in the
# one error shape. 400 only where there is input to refuse, 404 only where a path names a row.
COMMON_REFUSALS = {
    "400": "The input does not fit the schema (the field is named) or the body is not a JSON object.",
    "401": "No signed-in session.",
    "403": "A viewer asking for a change, a missing CSRF token, or a one-time password still to change.",
    "404": "No such row.",
}


class KilnAPI(NinjaAPI):
    """The one API; its document also lists the refusals every route shares, so a
    client (or a fuzzer) reading it knows every status it can get."""

    def get_openapi_schema(self, *, path_prefix=None, path_params=None):
        document = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        error = document._create_schema_from_model(ErrorOut, remove_level=False, mode="serialization")[0]
        for operations in document["paths"].values():
            for operation in operations.values():
                parameters = operation.get("parameters", [])
                statuses = ["401", "403"]
                if parameters or "requestBody" in operation:
                    statuses.append("400")
                if any(p.get("in") == "path" for p in parameters):
                    statuses.append("404")
                responses = operation["responses"]
                for status in statuses:
                    if status not in responses and int(status) not in responses:
                        responses[status] = {"description": COMMON_REFUSALS[status],
                                             "content": {"application/json": {"schema": error}}}
        return document


api = KilnAPI(
    title="Kiln API",
    version="1",
    description="Kiln's JSON API. Sign in to the panel first: every route uses the browser session "
                "(and its CSRF token for changes). Errors are {\"error\": {\"code\", \"message\"}}.",
    urls_namespace="api",
    auth=session,
    parser=KilnParser(),
    docs_decorator=signed_in_docs,
)


# Pydantic puts the member of a union it tried into an error's location ("include",
# "list[function-after[_no_nul(), str]]", 0): not a field anyone wrote, so left out.
_UNION_MEMBERS = {"str", "int", "float", "bool", "list", "dict"}


def _union_member(part) -> bool:
    return isinstance(part, str) and ("[" in part or part in _UNION_MEMBERS)


def _field(loc) -> str:
    """("body", "payload", "repo_id") -> "repo_id"; ("path", "run_id") -> "run_id"."""
    parts = [str(p) for p in loc if not _union_member(p)]
    if parts and parts[0] in ("body", "form") and len(parts) > 2:
        parts = parts[2:]
    elif parts and parts[0] in ("body", "form", "path", "query", "header", "cookie"):
        parts = parts[1:]
    return ".".join(parts) or "body"


@api.exception_handler(ValidationError)
def _invalid(request, exc):
    fields: dict[str, str] = {}
    for error in exc.errors:
        fields.setdefault(_field(error.get("loc", ())), error.get("msg", _("is not valid")))
    message = "; ".join(f"{name}: {msg}" for name, msg in fields.items()) or _("The request is not valid.")
    return json_error("invalid", message, 400, fields=fields)


@api.exception_handler(ApiError)
def _refused(request, exc):
    return json_error(exc.code, exc.message, exc.status, **exc.extra)


@api.exception_handler(AuthenticationError)
def _not_signed_in(request, exc):
    return json_error("not_authenticated", _("Sign in first: this endpoint needs a Kiln session."), 401)


@api.exception_handler(AuthorizationError)
def _forbidden(request, exc):
    return json_error("forbidden", exc.message, 403)


@api.exception_handler(Http404)
def _not_found(request, exc):
    return json_error("not_found", str(exc) or _("Nothing lives at %(path)s.") % {"path": request.path}, 404)


# A route whose unreadable body had another error code before it moved onto `api`
# keeps that code here (url name -> code); every other route answers "bad_json".
BAD_BODY_CODES: dict[str, str] = {}


@api.exception_handler(HttpError)
def _http_error(request, exc):
    if exc.status_code == 400 and str(exc).startswith("Cannot parse request body"):
        code = BAD_BODY_CODES.get(getattr(request.resolver_match, "url_name", None), "bad_json")
        return json_error(code, _("The body is not a JSON object: send Content-Type: application/json "
                                  "and a JSON object."), 400)
    if exc.status_code == 403:  # ninja's session check: the CSRF token is missing or wrong
        return json_error("csrf_failed", _("The CSRF check failed: send the csrftoken cookie’s value in an "
                                           "X-CSRFToken header (the pages do this), or reload the page and try again."), 403)
    return json_error("bad_request", str(exc), exc.status_code)


@api.exception_handler(RequestDataTooBig)
def _too_large(request, exc):
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return json_error("too_large", _("The request body is larger than %(limit)s bytes; send a large file "
                                     "as a multipart upload.") % {"limit": limit}, 413)


def router(tag: str) -> Router:
    """A router for one area's routes, listed under `tag` in the API docs."""
    return Router(tags=[tag])
