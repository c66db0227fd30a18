"""The /v1/ endpoints (async, key or session auth) and the keys and playground pages."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from dataclasses import dataclass
from importlib import import_module

import aiohttp
import redis.exceptions
from django.conf import settings
from django.contrib.auth import aget_user
from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from dashboard.roles import is_operator, operator_required
from inference.gateway import keys, routing, selectors, usage
from inference.gateway.errors import bad_request, error_response, too_large
from inference.gateway.proxy import BadBody, Caller, Relay, open_upstream, prepare_body, read_body
from inference.gateway.routing import Upstream

RETRY_AFTER_UNREACHABLE = 5
RETRY_AFTER_NO_REDIS = 5
log = logging.getLogger(__name__)


def _no_view(request):
    return None


async def _session_user(request):
    """The signed-in user; under the gateway handler (no middleware) read from
    the session cookie here."""
    if hasattr(request, "auser"):
        return await request.auser()
    session_key = request.COOKIES.get(settings.SESSION_COOKIE_NAME)
    if not session_key:
        return None
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    return await aget_user(request)


async def key_caller(secret: str, count: bool = True, hashed: str | None = None
                     ) -> tuple[Caller | None, keys.KeyInfo | None, HttpResponse | None]:
    """Who is calling with this API key, or the error response that refuses it."""
    try:
        info, wait = await keys.authenticate(secret, count, hashed)
    except (redis.exceptions.RedisError, OSError) as exc:
        log.warning("gateway: cannot check API keys, Redis is not answering: %r", exc)
        return None, None, error_response(
            503, _("The panel cannot check API keys right now (its Redis is not answering); retry shortly."),
            "server_error", "auth_unavailable", retry_after=RETRY_AFTER_NO_REDIS)
    if info is None:
        return None, None, error_response(
            401, _("Incorrect or revoked API key. Create one on the panel's Keys page and send it as "
                   "'Authorization: Bearer kiln-…'."), "invalid_request_error", "invalid_api_key")
    if wait is not None:
        return None, None, error_response(
            429, _("Rate limit of %(limit)s requests per minute reached for this key; retry in %(wait)s s.")
            % {"limit": info.rate_limit, "wait": wait}, "rate_limit_error", "rate_limit_exceeded", retry_after=wait)
    return Caller(info.id, info.user_id), info, None


async def _caller(request, count: bool = True) -> tuple[Caller | None, keys.KeyInfo | None, HttpResponse | None]:
    """Who is calling: an API key (Bearer) or a signed-in user of the panel
    (the playground, which must send the CSRF token like any form)."""
    secret = keys.bearer(request)
    if secret:
        return await key_caller(secret, count)
    user = await _session_user(request)
    if user is not None and user.is_authenticated:
        csrf = CsrfViewMiddleware(_no_view)
        csrf.process_request(request)
        refused = csrf.process_view(request, _no_view, (), {})
        if refused is not None:
            return None, None, error_response(403, _("Signed-in calls need the CSRF token (X-CSRFToken header)."),
                                              "invalid_request_error", "csrf_failed")
        return Caller(None, user.pk), None, None
    return None, None, error_response(
        401, _("No API key: send 'Authorization: Bearer kiln-…' (create a key on the panel's Keys page)."),
        "invalid_request_error", "missing_api_key")


async def _proxy(request, path: str, streams: bool = True):
    """The Django view side of proxy(): session callers (the playground) and
    anything the raw ASGI path (inference/gateway/fast.py) does not take."""
    if request.method != "POST":
        return error_response(405, _("%(path)s takes POST.") % {"path": path}, "invalid_request_error", "method_not_allowed")
    try:
        raw_body = request.body  # before the CSRF check, which would read a form post's stream
    except RequestDataTooBig:
        return too_large(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    secret = keys.bearer(request)
    caller = None
    if not secret:
        caller, _info, refused = await _caller(request)
        if refused:
            return refused
    result = await proxy(path, raw_body, streams, secret=secret, caller=caller)
    if not isinstance(result, Upstreamed):
        return result  # an error response
    if result.streaming:
        return StreamingHttpResponse(result.relay(), content_type=result.content_type, headers=result.headers())
    status, raw = await result.read()
    if status is None:
        return raw  # the engine broke off: an error response
    return HttpResponse(raw, status=status, content_type=result.content_type, headers=result.headers())


async def proxy(path: str, raw_body: bytes, streams: bool, *, secret: str | None = None,
                caller: Caller | None = None) -> "Upstreamed | HttpResponse":
    """Check one API call (key, body, model), route it and open the engine's request.

    Either `secret` (an API key) or `caller` (already authenticated) is given.
    Returns the engine's response, ready to relay, or an error response.

    A key this process has just seen valid and under its limit is "vouched"
    (keys.vouched): its Redis check (the verdict) then runs while the engine's
    request is opened instead of before it. The verdict still decides: a
    refused request is dropped upstream before the client gets a byte of it.
    Any other key is checked first.
    """
    info = verdict = None
    if secret is not None:
        hashed = keys.hash_key(secret)
        info = keys.vouched(secret, hashed)
        if info is None:
            caller, info, refused = await key_caller(secret, hashed=hashed)
            if refused:
                return refused
        else:
            verdict = asyncio.ensure_future(key_caller(secret, hashed=hashed))
    opening = None
    try:
        checked = await _checked_request(path, raw_body, streams, info, verdict)
        if not isinstance(checked, tuple):
            return checked  # an error response
        opening, model, stream, strip = checked
        if verdict is not None:
            caller, info, refused = await verdict
            if refused is None and not info.allows(model):
                refused = _not_allowed(info, model)
            if refused is not None:
                return refused
        response, target = await opening
        opening = None
    finally:
        if verdict is not None and not verdict.done():
            verdict.cancel()
        if opening is not None:  # refused or cancelled: drop the engine's request
            await _abandon(opening)
    if response is None:
        return error_response(503, _("The deployment(s) serving %(model)r are marked ready but do not answer; "
                                     "retry in %(wait)s s.") % {"model": model, "wait": RETRY_AFTER_UNREACHABLE}, "server_error",
                              "deployment_unreachable", retry_after=RETRY_AFTER_UNREACHABLE)
    return Upstreamed(response, target, model, caller, stream, strip)


def _not_allowed(info: keys.KeyInfo, model: str) -> HttpResponse:
    return error_response(403, _("This key may not use %(model)r; it is limited to %(models)s.")
                          % {"model": model, "models": ", ".join(info.allowed_models)}, "invalid_request_error",
                          "model_not_allowed", param="model")


async def _checked_request(path, raw_body, streams, info, verdict):
    """Check the body and route it; start opening the engine's request.

    Returns an error response, or (opening task, model, stream, strip). With a
    verdict pending, an error waits for it: a refused key gets 401/429, not a
    hint about the body or the models.
    """
    async def refuse(response):
        if verdict is not None:
            _caller_, _info, refused = await verdict
            return refused or response
        return response

    try:
        body = read_body(raw_body, path)
    except BadBody as exc:
        return await refuse(bad_request(exc.message, exc.param))
    model = body.get("model")
    if not model:
        return await refuse(bad_request(
            _("Name the model: the 'model' field is required (GET /v1/models lists them)."), "model"))
    if info is not None and not info.allows(model):
        return await refuse(_not_allowed(info, model))
    route = await routing.route(model)
    if not route.upstreams:
        if not route.statuses:
            known = await routing.served_models()
            listed = ", ".join(known) if known else _("none is ready")
            return await refuse(error_response(
                404, _("The model %(model)r does not exist on this panel (ready models: %(listed)s).")
                % {"model": model, "listed": listed},
                "invalid_request_error", "model_not_found", param="model"))
        if routing.UNREACHABLE in route.statuses:
            return await refuse(error_response(
                503, _("The deployment(s) serving %(model)r are on a host that has stopped reporting (offline or "
                       "cut off); retry in %(wait)s s.") % {"model": model, "wait": RETRY_AFTER_UNREACHABLE},
                "server_error", "deployment_unreachable", retry_after=RETRY_AFTER_UNREACHABLE))
        wait = routing.retry_after(route.statuses)
        return await refuse(error_response(
            503, _("No deployment of %(model)r is ready (now: %(statuses)s); retry in %(wait)s s.")
            % {"model": model, "statuses": ", ".join(sorted(set(route.statuses))), "wait": wait},
            "server_error", "deployment_not_ready", retry_after=wait))
    stream = streams and bool(body.get("stream"))
    payload, strip = prepare_body(body, raw_body) if stream else (raw_body, False)
    opening = asyncio.ensure_future(_open_first(route.upstreams, path, payload, stream, body))
    return opening, model, stream, strip


async def _open_first(upstreams, path: str, payload: bytes, stream: bool, body: dict | None = None):
    """The engine's response from the first replica that answers, or (None, None).
    `body`: the parsed request, for the replica's request defaults (open_upstream)."""
    for target in upstreams:
        try:
            return await open_upstream(target, path, payload, stream, body), target
        except (aiohttp.ClientConnectionError, OSError, TimeoutError):
            continue  # the next replica, if any
    return None, None


async def _abandon(opening: asyncio.Future) -> None:
    """Cancel an engine request nobody will read; close its response if it came."""
    opening.cancel()
    await asyncio.wait([opening])
    if not opening.cancelled() and opening.exception() is None:
        response, _target = opening.result()
        if response is not None:
            response.close()


@dataclass
class Upstreamed:
    """An engine's response to relay: streamed event by event, or read whole."""

    response: aiohttp.ClientResponse
    target: Upstream
    model: str
    caller: Caller
    stream: bool
    strip: bool

    @property
    def streaming(self) -> bool:
        return self.stream and self.response.status == 200

    @property
    def content_type(self) -> str:
        return self.response.headers.get("Content-Type", "application/json")

    def headers(self) -> dict:
        headers = {"X-Kiln-Deployment": str(self.target.deployment_id)}
        if self.streaming:
            headers.update({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return headers

    def relay(self) -> Relay:
        return Relay(self.response, self.target, self.model, self.caller, self.strip)

    async def read(self) -> tuple[int | None, "bytes | HttpResponse"]:
        """(status, body) of a whole answer, usage recorded; (None, error response) if the engine broke off."""
        response, caller, model = self.response, self.caller, self.model
        try:
            raw = await response.read()
        except (aiohttp.ClientError, TimeoutError):
            usage.record(key_id=caller.key_id, user_id=caller.user_id, deployment_id=self.target.deployment_id,
                         model=model, error=True)
            return None, error_response(502, _("The engine serving %(model)r stopped answering; retry.") % {"model": model},
                                        "server_error", "upstream_disconnected")
        finally:
            response.close()
        prompt = completion = 0
        if response.status == 200:
            try:
                u = json.loads(raw).get("usage") or {}
                prompt, completion = int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
            except (ValueError, AttributeError, TypeError):
                pass
        usage.record(key_id=caller.key_id, user_id=caller.user_id, deployment_id=self.target.deployment_id,
                     model=model, prompt_tokens=prompt, completion_tokens=completion, error=response.status >= 400)
        return response.status, raw


@login_not_required
@csrf_exempt
async def chat_completions(request):
    return await _proxy(request, "/v1/chat/completions")


@login_not_required
@csrf_exempt
async def completions(request):
    return await _proxy(request, "/v1/completions")


@login_not_required
@csrf_exempt
async def embeddings(request):
    return await _proxy(request, "/v1/embeddings", streams=False)


@login_not_required
@csrf_exempt
async def models(request):
    if request.method != "GET":
        return error_response(405, _("/v1/models takes GET."), "invalid_request_error", "method_not_allowed")
    caller, info, refused = await _caller(request, count=False)
    if refused:
        return refused
    names = [n for n in await routing.served_models() if info is None or info.allows(n)]
    now = int(time.time())
    return JsonResponse({"object": "list", "data": [
        {"id": n, "object": "model", "created": now, "owned_by": "kiln"} for n in names]})


# ---------------------------------------------------------------- pages

USAGE_WINDOWS = {"1": 1, "24": 24, "168": 168}


@require_GET
def keys_page(request):
    hours = USAGE_WINDOWS.get(request.GET.get("hours", "24"), 24)
    since = timezone.now() - dt.timedelta(hours=hours)
    return render(request, "gateway/keys.html", {
        "keys": selectors.keys_for(request.user),
        "new_secret": request.session.pop("gateway_new_key", None),
        "model_choices": selectors.model_choices(),
        "usage_keys": selectors.usage_by_key(request.user, since),
        "usage_deployments": selectors.usage_by_deployment(request.user, since),
        "series": selectors.usage_series(request.user, since),
        "hours": hours,
        "show_owner": is_operator(request.user),
        "form": request.session.pop("gateway_key_form", {}),
    })


# A key calls the gateway as its owner; creating and revoking keys is an operator's
# action (a viewer sees the page, their own keys and usage, but no buttons).
@require_POST
@operator_required
def key_create(request):
    allowed = request.POST.getlist("allowed_models") + request.POST.get("allowed_extra", "").split(",")
    try:
        rate = int(request.POST.get("rate_limit") or 0)
    except ValueError:
        rate = -1
    try:
        key, secret = keys.key_create(user=request.user, name=request.POST.get("name", ""),
                                      allowed_models=allowed, rate_limit=rate)
    except keys.KeyFormError as exc:
        messages.error(request, str(exc))
        request.session["gateway_key_form"] = {"name": request.POST.get("name", ""),
                                               "rate_limit": request.POST.get("rate_limit", "")}
        return redirect("gateway_keys")
    request.session["gateway_new_key"] = {"name": key.name, "secret": secret}
    return redirect("gateway_keys")


@require_POST
@operator_required
def key_revoke(request, key_id):
    key = get_object_or_404(selectors.keys_for(request.user), pk=key_id)
    if keys.key_revoke(key=key, by=request.user):
        messages.success(request, _("Key %(name)s (%(prefix)s…) revoked; requests with it now get 401.") % {"name": key.name, "prefix": key.prefix})
    return redirect("gateway_keys")


@require_GET
def playground(request):
    deployments = selectors.ready_deployments()
    return render(request, "gateway/playground.html", {"deployments": deployments})

