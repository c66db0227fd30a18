"""/v1/ answers only to the names in ALLOWED_HOSTS, like every other path:
through the key's fast path (fast.py), the Django views (/v1/models) and the
playground's session, served by a real uvicorn (ALLOWED_HOSTS at its default,
localhost, 127.0.0.1 and [::1])."""

import asyncio
import json

import httpx
import pytest
from asgiref.sync import async_to_sync

from dashboard.asgi import application
from inference.gateway import keys

CHAT = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
FOREIGN = ["evil.example", "evil.example:8000", "localhost.evil.example", "127.0.0.1.evil.example", "[::2]:8000"]
ALLOWED = ["localhost", "localhost:8000", "LOCALHOST", "127.0.0.1:8000", "[::1]", "[::1]:8000"]


def refused(response, host):
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == "disallowed_host" and error["type"] == "invalid_request_error"
    assert repr(host) in error["message"] and "ALLOWED_HOSTS" in error["message"]


def test_a_foreign_host_is_refused_with_a_key(asgi_server, operator):
    _, secret = keys.key_create(user=operator, name="ci")
    with httpx.Client(base_url=asgi_server, headers={"Authorization": f"Bearer {secret}"}) as api:
        for host in FOREIGN:
            refused(api.get("/v1/models", headers={"Host": host}), host)
            refused(api.post("/v1/chat/completions", json=CHAT, headers={"Host": host}), host)
            refused(api.post("/v1/embeddings", json={"model": "x", "input": "hi"}, headers={"Host": host}), host)
        for host in ALLOWED:
            r = api.get("/v1/models", headers={"Host": host})
            assert r.status_code == 200 and r.json()["data"] == []
            r = api.post("/v1/chat/completions", json=CHAT, headers={"Host": host})
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_a_foreign_host_is_refused_with_a_session(asgi_server, operator):
    with httpx.Client(base_url=asgi_server) as browser:
        browser.get("/login/")
        browser.post("/login/", data={"username": operator.username, "password": operator.plain_password,
                                      "csrfmiddlewaretoken": browser.cookies["csrftoken"]})
        csrf = {"X-CSRFToken": browser.cookies["csrftoken"]}
        for host in FOREIGN:
            refused(browser.post("/v1/chat/completions", json=CHAT, headers={**csrf, "Host": host}), host)
            refused(browser.get("/v1/models", headers={"Host": host}), host)
        for host in ALLOWED:
            r = browser.post("/v1/chat/completions", json=CHAT, headers={**csrf, "Host": host})
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def call(path, host, method):
    """(status, error code) of one request without a key to the ASGI app in
    this process: 400 disallowed_host, or 401 missing_api_key past the check."""
    sent, messages = [], [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the client stays until the answer is sent

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"host", host.encode())], "scheme": "http", "server": ("127.0.0.1", 8000)}
    async_to_sync(application)(scope, receive, send)
    return sent[0]["status"], json.loads(sent[1]["body"])["error"]["code"]


@pytest.mark.parametrize("path, method", [("/v1/models", "GET"), ("/v1/chat/completions", "POST")])
def test_allowed_hosts_changed_at_run_time_are_followed(path, method, settings):
    outside, inside = (400, "disallowed_host"), (401, "missing_api_key")
    assert call(path, "localhost", method) == inside
    assert call(path, "kiln.lan", method) == outside
    settings.ALLOWED_HOSTS = [".lan"]
    assert call(path, "kiln.lan", method) == inside
    assert call(path, "gpu.kiln.lan:8000", method) == inside
    assert call(path, "localhost", method) == outside
    settings.ALLOWED_HOSTS = []
    settings.DEBUG = True  # Django's development fallback: localhost names only
    assert call(path, "app.localhost:8000", method) == inside
    assert call(path, "kiln.lan", method) == outside
