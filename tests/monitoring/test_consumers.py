"""The live websocket: only signed-in users, fed by the channel layer (real Redis)."""
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client

from dashboard.asgi import application
from monitoring.consumers import CLOSE_NOT_AUTHENTICATED, LIVE_GROUP

ORIGIN = (b"origin", b"http://localhost")


def session_cookie(user):
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def test_anonymous_connection_is_rejected(transactional_db, redis_clean):
    async def attempt():
        communicator = WebsocketCommunicator(application, "/ws/live/", headers=[ORIGIN, (b"host", b"localhost")])
        connected, code = await communicator.connect()
        await communicator.disconnect()
        return connected, code

    connected, code = async_to_sync(attempt)()
    assert connected is False
    assert code == CLOSE_NOT_AUTHENTICATED


def test_foreign_origin_is_rejected(transactional_db, redis_clean, operator):
    cookie = session_cookie(operator)

    async def attempt():
        communicator = WebsocketCommunicator(
            application, "/ws/live/", headers=[(b"origin", b"http://evil.example"), (b"host", b"localhost"), (b"cookie", cookie)]
        )
        connected, _ = await communicator.connect()
        await communicator.disconnect()
        return connected

    assert async_to_sync(attempt)() is False


def test_signed_in_clients_receive_what_the_monitor_publishes(transactional_db, redis_clean, operator, viewer):
    cookies = [session_cookie(operator), session_cookie(viewer)]

    async def scenario():
        clients = []
        for cookie in cookies:
            communicator = WebsocketCommunicator(application, "/ws/live/", headers=[ORIGIN, (b"host", b"localhost"), (b"cookie", cookie)])
            connected, _ = await communicator.connect()
            assert connected
            clients.append(communicator)
        await get_channel_layer().group_send(
            LIVE_GROUP, {"type": "live.message", "payload": {"type": "heartbeat", "host": "testhost", "samples": 7}}
        )
        received = [await c.receive_json_from(timeout=5) for c in clients]
        for c in clients:
            await c.disconnect()
        return received

    received = async_to_sync(scenario)()
    assert received == [{"type": "heartbeat", "host": "testhost", "samples": 7}] * 2


def test_a_quiet_connection_survives_the_channel_layer_blocking_timeout(transactional_db, redis_clean, operator):
    """channels_redis blocks 5 s per BZPOPMIN; redis-py 8 reads with a 5 s timeout
    unless told otherwise, which killed consumers after 5 quiet seconds."""
    import asyncio

    cookie = session_cookie(operator)

    async def scenario():
        communicator = WebsocketCommunicator(application, "/ws/live/", headers=[ORIGIN, (b"host", b"localhost"),
                                                                                  (b"cookie", cookie)])
        assert (await communicator.connect())[0]
        await asyncio.sleep(7)  # no messages: longer than one blocking read
        await get_channel_layer().group_send(LIVE_GROUP, {"type": "live.message", "text": '{"type": "ping"}'})
        received = await communicator.receive_from(timeout=5)
        await communicator.disconnect()
        return received

    assert async_to_sync(scenario)() == '{"type": "ping"}'
