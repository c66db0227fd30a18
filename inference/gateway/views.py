"""The /v1/ endpoints (async, key or session auth) and the keys and playground pages."""

from __future__ import annotations

import datetime as dt
import json
import time

from importlib import import_module

import aiohttp
from django.conf import settings
from django.contrib.auth import aget_user
from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from dashboard.roles import is_operator
from inference.gateway import keys, routing, selectors, usage
from inference.gateway.errors import bad_request, error_response
from inference.gateway.proxy import Caller, Relay, open_upstream, prepare_body

RETRY_AFTER_UNREACHABLE = 5


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


async def _caller(request, count: bool = True) -> tuple[Caller | None, keys.KeyInfo | None, HttpResponse | None]:
    """Who is calling: an API key (Bearer) or a signed-in user of the panel
    (the playground, which must send the CSRF token like any form)."""
    secret = keys.bearer(request)
    if secret:
        info, wait = await keys.authenticate(secret, count)
        if info is None:
            return None, None, error_response(
                401, "Incorrect or revoked API key. Create one on the panel's Keys page and send it as "
                     "'Authorization: Bearer kiln-…'.", "invalid_request_error", "invalid_api_key")
        if wait is not None:
            return None, None, error_response(
                429, f"Rate limit of {info.rate_limit} requests per minute reached for this key; retry in "
                     f"{wait} s.", "rate_limit_error", "rate_limit_exceeded", retry_after=wait)
        return Caller(info.id, info.user_id), info, None
    user = await _session_user(request)
    if user is not None and user.is_authenticated:
        csrf = CsrfViewMiddleware(_no_view)
        csrf.process_request(request)
        refused = csrf.process_view(request, _no_view, (), {})
        if refused is not None:
            return None, None, error_response(403, "Signed-in calls need the CSRF token (X-CSRFToken header).",
                                              "invalid_request_error", "csrf_failed")
        return Caller(None, user.pk), None, None
    return None, None, error_response(
        401, "No API key: send 'Authorization: Bearer kiln-…' (create a key on the panel's Keys page).",
        "invalid_request_error", "missing_api_key")


async def _proxy(request, path: str, streams: bool = True):
    if request.method != "POST":
        return error_response(405, f"{path} takes POST.", "invalid_request_error", "method_not_allowed")
    caller, info, refused = await _caller(request)
    if refused:
        return refused
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        return bad_request("The request body is not valid JSON.")
    if not isinstance(body, dict):
        return bad_request("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return bad_request("Name the model: the 'model' field is required (GET /v1/models lists them).", "model")
    if info is not None and not info.allows(model):
        return error_response(403, f"This key may not use {model!r}; it is limited to "
                                   f"{', '.join(info.allowed_models)}.", "invalid_request_error",
                              "model_not_allowed", param="model")
    route = await routing.route(model)
    if not route.upstreams:
        if not route.statuses:
            known = await routing.served_models()
            listed = ", ".join(known) if known else "none is ready"
            return error_response(404, f"The model {model!r} does not exist on this panel (ready models: "
                                       f"{listed}).", "invalid_request_error", "model_not_found", param="model")
        wait = routing.retry_after(route.statuses)
        return error_response(503, f"No deployment of {model!r} is ready (now: {', '.join(sorted(set(route.statuses)))}"
                                   f"); retry in {wait} s.", "server_error", "deployment_not_ready",
                              retry_after=wait)
    stream = streams and bool(body.get("stream"))
    payload, strip = prepare_body(body) if stream else (json.dumps(body).encode(), False)
    response = target = None
    for target in route.upstreams:
        try:
            response = await open_upstream(target, path, payload, stream)
            break
        except (aiohttp.ClientConnectionError, OSError, TimeoutError):
            continue  # the next replica, if any
    if response is None:
        return error_response(503, f"The deployment(s) serving {model!r} are marked ready but do not answer; "
                                   f"retry in {RETRY_AFTER_UNREACHABLE} s.", "server_error",
                              "deployment_unreachable", retry_after=RETRY_AFTER_UNREACHABLE)
    headers = {"X-Kiln-Deployment": str(target.deployment_id)}
    content_type = response.headers.get("Content-Type", "application/json")
    if stream and response.status == 200:
        headers.update({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return StreamingHttpResponse(Relay(response, target, model, caller, strip), content_type=content_type,
                                     headers=headers)
    try:
        raw = await response.read()
    except (aiohttp.ClientError, TimeoutError):
        usage.record(key_id=caller.key_id, user_id=caller.user_id, deployment_id=target.deployment_id,
                     model=model, error=True)
        return error_response(502, f"The engine serving {model!r} stopped answering; retry.", "server_error",
                              "upstream_disconnected")
    finally:
        response.close()
    prompt = completion = 0
    if response.status == 200:
        try:
            u = json.loads(raw).get("usage") or {}
            prompt, completion = int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
        except (ValueError, AttributeError, TypeError):
            pass
    usage.record(key_id=caller.key_id, user_id=caller.user_id, deployment_id=target.deployment_id, model=model,
                 prompt_tokens=prompt, completion_tokens=completion, error=response.status >= 400)
    return HttpResponse(raw, status=response.status, content_type=content_type, headers=headers)


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
    caller, info, refused = await _caller(request, count=False)
    if refused:
        return refused
    names = [n for n in await routing.served_models() if info is None or info.allows(n)]
    now = int(time.time())
    return JsonResponse({"object": "list", "data": [
        {"id": n, "object": "model", "created": now, "owned_by": "kiln"} for n in names]})


# ---------------------------------------------------------------- pages

USAGE_WINDOWS = {"1": 1, "24": 24, "168": 168}


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


@require_POST
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
def key_revoke(request, key_id):
    key = get_object_or_404(selectors.keys_for(request.user), pk=key_id)
    if keys.key_revoke(key=key, by=request.user):
        messages.success(request, f"Key {key.name} ({key.prefix}…) revoked; requests with it now get 401.")
    return redirect("gateway_keys")


def playground(request):
    deployments = selectors.ready_deployments()
    return render(request, "gateway/playground.html", {"deployments": deployments})

