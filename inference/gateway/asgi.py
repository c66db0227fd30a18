"""Serve /v1/ with Django's ASGI handler minus the page middleware.

Measured (bench/gateway.py): under Django's full middleware stack every
request to an async view is handed to a worker thread and back about twenty
times (each sync-style middleware's process_request/process_response), which
added ~16 ms to the median time to first token on a busy 2-core host. The
gateway's views need none of that middleware -- they authenticate with the
Bearer key (or read the session themselves for the playground), are exempt
from CSRF and the login redirect, and answer JSON -- so requests under /v1/
go to this handler: same URLconf, same views, no middleware chain. Served
through the normal stack (runserver, tests with Django's client) the same
views work unchanged.

API calls with a key skip even that handler: inference/gateway/fast.py
answers them from ASGI messages with the same checks and relay code.

Without the page middleware nothing calls request.get_host(), so with_gateway
checks the Host header against ALLOWED_HOSTS for both (dashboard/hosts.py,
Django's own validation, verdicts cached per Host value).

GatewayHandler also skips Django's per-request thread hand-offs (see its
docstring). The views themselves keep sync work off the request path: the key and the
rate-limit counter are one Redis round trip, the routing table is cached
in the process for a second, usage is counted in memory.
"""

import asyncio

from django.conf import settings
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.exceptions import RequestAborted
from django.urls import Resolver404, get_resolver, set_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.utils import translation
from django.utils.translation import trans_real

from dashboard import hosts
from dashboard.middleware import nul_in_address
from inference.gateway.errors import error_response

PREFIX = "/v1/"


class GatewayHandler(ASGIHandler):
    """ASGIHandler.handle (Django 5.2) without the per-request thread hops.

    Django opens a ThreadSensitiveContext per request (a new thread for the
    request's first sync call) and sends request_started, then closes the
    response, through sync_to_async: hand-offs to a worker thread that cost
    ~0.1 ms each on an idle host and several ms on a busy one. Their work
    (closing stale database connections) does not apply here: the gateway's
    views touch the database only from their own executor calls, which close
    their connections themselves. Everything else is Django's: reading the
    body, the request object, URL resolution, the view, sending (streaming)
    responses, and cancelling the view when the client disconnects.

    The few /v1/ paths are also looked up in a dict instead of walking the
    whole URLconf (measured with py-spy: URL resolution was 14% of the
    gateway's CPU per request); their ResolverMatch is Django's own, resolved
    once on first use.
    """

    _routes: dict | None = None

    async def __call__(self, scope, receive, send):
        await self.handle(scope, receive, send)

    async def handle(self, scope, receive, send):
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
            return

        async def process_request():
            response = await self.run_get_response(request)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client disconnected while we were sending

        tasks = [asyncio.create_task(self.listen_for_disconnect(receive)), asyncio.create_task(process_request())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass
            else:
                task.cancel()  # a disconnect cancels the view (and its upstream request)
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        body_file.close()

    def resolve_request(self, request):
        if self._routes is None:
            self._routes = self._gateway_routes()
        match = self._routes.get(request.path_info)
        if match is None:
            return super().resolve_request(request)
        request.resolver_match = match
        return match.func, match.args, match.kwargs

    @staticmethod
    def _gateway_routes() -> dict:
        from inference.gateway.urls import urlpatterns

        routes = {}
        for pattern in urlpatterns:
            path = "/" + str(pattern.pattern)
            if path.startswith(PREFIX) and "<" not in path:
                try:
                    routes[path] = get_resolver().resolve(path)
                except Resolver404:  # not mounted at the root of the URLconf: resolve per request
                    pass
        return routes

    def load_middleware(self, is_async=False):
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        self._middleware_chain = convert_exception_to_response(self._get_response_async)


def request_language(scope) -> str:
    """The supported language the caller's Accept-Language asks for first, else the default."""
    header = dict(scope.get("headers") or []).get(b"accept-language", b"").decode("latin-1")
    for code, _quality in trans_real.parse_accept_lang_header(header):
        if code == "*":
            break
        try:
            return translation.get_supported_language_variant(code)
        except LookupError:
            continue
    return settings.LANGUAGE_CODE


def with_gateway(django_app):
    """Wrap the panel's ASGI app: /v1/ to the gateway handler, the rest unchanged."""
    from inference.gateway import fast  # needs Django set up, as the caller has

    gateway = GatewayHandler()

    async def app(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(PREFIX):
            # Django's Host check (request.get_host() in the page middleware) for both
            # doors below, neither of which runs that middleware.
            allowed, host = hosts.host_allowed(scope)
            if not allowed:
                return await refuse_host(host, send)
            # Neither door runs LocaleMiddleware: error messages follow Accept-Language here.
            with translation.override(request_language(scope)):
                # Neither runs NulCharacterMiddleware either: %00 in an id would reach a lookup.
                nul = nul_in_address(scope["path"], scope.get("query_string", b"").decode("latin-1"))
                if nul is not None:
                    from inference.gateway.errors import bad_request
                    from inference.gateway.fast import _send_response

                    return await _send_response(send, bad_request(nul))
                secret = fast.takes(scope)
                if secret is not None:
                    return await fast.handle(scope, receive, send, secret)
                return await gateway(scope, receive, send)
        return await django_app(scope, receive, send)

    return app


async def refuse_host(host: str, send) -> None:
    """A Host not in ALLOWED_HOSTS: 400, as Django answers DisallowedHost, in
    the gateway's JSON error shape, logged to the same logger."""
    from inference.gateway.fast import _send_response

    message = hosts.disallowed_host_message(host)
    hosts.security_log.warning(message)
    await _send_response(send, error_response(400, message, "invalid_request_error", "disallowed_host"))
