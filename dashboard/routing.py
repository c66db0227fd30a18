"""Websocket routes. A path that no route serves is refused at the handshake
(close code 4404) instead of raising in Channels' router, which the server
logged as an exception and answered 500."""
from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import path, re_path

from monitoring.consumers import LiveConsumer

# 4404 mirrors HTTP 404 in the application range of websocket close codes (4401: not signed in).
CLOSE_NOT_FOUND = 4404

websocket_urlpatterns = [
    path("ws/live/", LiveConsumer.as_asgi()),
]


class NoRouteConsumer(AsyncWebsocketConsumer):
    """Every path not in websocket_urlpatterns: closed before it is accepted."""

    channel_layer_alias = None  # it joins nothing: no channel of its own in Redis

    async def connect(self):
        await self.close(code=CLOSE_NOT_FOUND)


# Last in the router: matches any path.
no_route = re_path(r"", NoRouteConsumer.as_asgi())
