"""Websocket consumers only join, leave and forward: the monitor process is the
one producer, so a hundred open tabs cost one sample, not a hundred."""
from channels.generic.websocket import AsyncJsonWebsocketConsumer

LIVE_GROUP = "live"
# 4401 mirrors HTTP 401 in the application range of websocket close codes.
CLOSE_NOT_AUTHENTICATED = 4401


class LiveConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_NOT_AUTHENTICATED)
            return
        await self.channel_layer.group_add(LIVE_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        await self.channel_layer.group_discard(LIVE_GROUP, self.channel_name)

    async def live_message(self, event):
        await self.send_json(event["payload"])
