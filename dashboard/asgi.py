"""ASGI entry point: HTTP through Django, websockets through Channels.

Websockets pass the same two gates as pages: the Host must be allowed and the
Origin the panel's own, scheme, host and port, or a CSRF_TRUSTED_ORIGINS entry
(dashboard.hosts.SameOriginValidator), and the session must belong to a user
(each consumer refuses anonymous ones).
A path no route serves is closed with 4404 (dashboard.routing.no_route).
At start-up the server's lifespan call is refused when the database has
unapplied migrations (dashboard.migrations_check): uvicorn prints why and exits
instead of serving (under gunicorn, dashboard.workers checks once, before it
forks a worker). Then every page and API route is imported, before the first
connection (load_every_route).
"""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django_asgi_app = get_asgi_application()  # sets Django up before the routing imports models

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from dashboard.hosts import SameOriginValidator  # noqa: E402
from dashboard.migrations_check import lifespan as checked_lifespan  # noqa: E402
from dashboard.routing import no_route, websocket_urlpatterns  # noqa: E402
from inference.gateway.asgi import with_gateway  # noqa: E402


def load_every_route():
    """Import the URLconf and every view and API schema it names (about 23 MiB), at start-up
    instead of on the first page or /api/ request. A worker that served only /v1/ and
    websockets (neither needs the URLconf) otherwise grew by that much the first time a page
    reached it, minutes or hours later (seen as a step in bench/soak.py's web worker RSS), and
    that first request waited a second or two for the imports; an import error now stops the
    start instead of answering 500."""
    from django.urls import get_resolver

    def walk(patterns):
        for pattern in patterns:
            if hasattr(pattern, "url_patterns"):
                walk(pattern.url_patterns)

    walk(get_resolver().url_patterns)


async def lifespan(scope, receive, send):
    await checked_lifespan(scope, receive, send, then=load_every_route)


application = ProtocolTypeRouter(
    {
        "http": with_gateway(django_asgi_app),  # /v1/ skips the page middleware
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter([*websocket_urlpatterns, no_route]))),
        "lifespan": lifespan,
    }
)
