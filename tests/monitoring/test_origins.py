"""Websocket handshakes: the Origin must be the panel's own -- scheme, host and
port -- or a CSRF_TRUSTED_ORIGINS entry, and the Host an allowed one."""
import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.test import Client

from dashboard.asgi import application
from dashboard.hosts import CLOSE_FORBIDDEN_ORIGIN


@pytest.fixture
def cookie(transactional_db, redis_clean, operator):
    client = Client()
    client.force_login(operator)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def handshakes(cookie, attempts, extra=()):
    """[(connected, close code or None)] for each (host, origin, scheme) attempt
    on /ws/live/ with a signed-in session; origin None sends no Origin header."""

    async def run():
        results = []
        for host, origin, scheme in attempts:
            headers = [(b"host", host.encode()), (b"cookie", cookie), *extra]
            if origin is not None:
                headers.append((b"origin", origin.encode()))
            communicator = WebsocketCommunicator(application, "/ws/live/", headers=headers)
            communicator.scope["scheme"] = scheme
            connected, code = await communicator.connect(timeout=10)
            await communicator.disconnect()
            results.append((connected, None if connected else code))
        return results

    return async_to_sync(run)()


REFUSED = (False, CLOSE_FORBIDDEN_ORIGIN)
ACCEPTED = (True, None)


def test_a_page_on_another_port_of_the_same_host_is_refused(cookie):
    assert handshakes(cookie, [
        ("localhost:8000", "http://localhost:3000", "ws"),
        ("localhost:8000", "http://localhost", "ws"),  # port 80
        ("localhost", "http://localhost:8080", "ws"),
        ("127.0.0.1:8000", "http://127.0.0.1:8001", "ws"),
        ("[::1]:8000", "http://[::1]:9000", "ws"),
    ]) == [REFUSED] * 5


def test_another_scheme_is_refused(cookie):
    assert handshakes(cookie, [
        ("localhost:8000", "https://localhost:8000", "ws"),
        ("localhost", "https://localhost", "ws"),
        ("localhost", "http://localhost", "wss"),
        ("localhost", "file://localhost", "ws"),
        ("localhost", "null", "ws"),  # sandboxed frames, file pages
    ]) == [REFUSED] * 5


def test_the_panels_own_origin_is_accepted(cookie):
    assert handshakes(cookie, [
        ("localhost:8000", "http://localhost:8000", "ws"),
        ("localhost", "http://localhost", "ws"),
        ("localhost", "http://localhost:80", "ws"),  # default ports are the same origin
        ("localhost:443", "https://localhost", "wss"),
        ("LOCALHOST:8000", "http://localhost:8000", "ws"),  # host names are case-blind
        ("127.0.0.1:8000", "http://127.0.0.1:8000", "ws"),
        ("[::1]:8000", "http://[::1]:8000", "ws"),
    ]) == [ACCEPTED] * 7


def test_a_host_not_in_allowed_hosts_is_refused_even_from_its_own_origin(cookie):
    # DNS rebinding: a page on evil.example whose name now points at the panel.
    assert handshakes(cookie, [("evil.example", "http://evil.example", "ws"),
                               ("evil.example:8000", None, "ws")]) == [REFUSED] * 2


def test_no_origin_header_is_a_program_not_a_page_and_still_needs_the_session(cookie):
    assert handshakes(cookie, [("localhost:8000", None, "ws")]) == [ACCEPTED]
    assert handshakes(b"sessionid=nobody", [("localhost:8000", None, "ws")])[0][0] is False


def test_a_csrf_trusted_origin_is_accepted(cookie, settings):
    # Behind a TLS proxy: the browser is on https://kiln.example.com, the panel sees Host localhost:8000.
    settings.CSRF_TRUSTED_ORIGINS = ["https://kiln.example.com", "https://*.lab.example"]
    assert handshakes(cookie, [
        ("localhost:8000", "https://kiln.example.com", "ws"),
        ("localhost:8000", "https://kiln.example.com:443", "ws"),
        ("localhost:8000", "https://gpu1.lab.example", "ws"),
    ]) == [ACCEPTED] * 3
    assert handshakes(cookie, [
        ("localhost:8000", "http://kiln.example.com", "ws"),
        ("localhost:8000", "https://kiln.example.com:8443", "ws"),
        ("localhost:8000", "https://other.example.com", "ws"),
        ("localhost:8000", "http://gpu1.lab.example", "ws"),
    ]) == [REFUSED] * 4


def test_behind_a_tls_proxy_the_scheme_is_the_one_django_sees(cookie, settings):
    # KILN_TLS: the proxy speaks https to the browser and plain ws to the panel.
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    proxied = [(b"x-forwarded-proto", b"https")]
    assert handshakes(cookie, [("localhost", "https://localhost", "ws")], proxied) == [ACCEPTED]
    assert handshakes(cookie, [("localhost", "http://localhost", "ws")], proxied) == [REFUSED]
