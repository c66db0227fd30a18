"""Websocket consumers only join, leave and forward: the monitor process is the
one producer, so a hundred open tabs cost one sample, not a hundred."""
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from monitoring.relabel import reader_language, relabel

LIVE_GROUP = "live"
# 4401 mirrors HTTP 401 in the application range of websocket close codes.
CLOSE_NOT_AUTHENTICATED = 4401


class LiveConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_NOT_AUTHENTICATED)
            return
        # Status labels, phases and hints go out in this tab's language (producers write English).
        self.language = await database_sync_to_async(reader_language)(
            user, self.scope.get("cookies", {}), self.scope.get("headers", []))
        await self.channel_layer.group_add(LIVE_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        await self.channel_layer.group_discard(LIVE_GROUP, self.channel_name)

    async def dispatch(self, message):
        # Forwarding touches no database, so skip the per-message
        # close_old_connections() that Channels runs in a worker thread before
        # every handler: with 50 tabs that was 50 thread hops per sample
        # (bench/monitoring.py, profile of the web process).
        if message["type"] == "live.message":
            await self.live_message(message)
        else:
            await super().dispatch(message)

    async def live_message(self, event):
        # The monitor sends its message already encoded ("text"), once for all
        # tabs: fifty open tabs then cost fifty socket writes, not fifty
        # json.dumps of the same sample. Other producers send a "payload" dict.
        if "text" in event:
            await self.send(text_data=event["text"])
        else:
            await self.send_json(relabel(event["payload"], self.language))
