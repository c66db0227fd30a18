"""A request body the gateway cannot use is an OpenAI-style 400 naming the field, never a 500.

Both ways into /v1/ are driven on a real uvicorn: a call with an API key (answered
from ASGI messages, inference/gateway/fast.py) and a signed-in call from the
playground (Django's handler, inference/gateway/views.py). Nothing refused
reaches the engine.
"""
import json

import httpx
import pytest
from django.test import Client

from inference.gateway import keys
from inference.gateway.proxy import BadBody, read_body
from inference.models import Deployment
from tests.sse_stub import running_stub

CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 4}


def chat(**fields) -> bytes:
    return json.dumps({**CHAT, **fields}).encode()


# (raw body, the field named in the error's `param`, a word the message must hold)
BAD = [
    (b"[1, 2]", None, "JSON object"),
    (b'"text"', None, "JSON object"),
    (b"null", None, "JSON object"),
    (b"7", None, "JSON object"),
    (b"{not json", None, "not valid JSON"),
    (b"\xff\xfe\xff", None, "not valid JSON"),
    (b"[" * 100_000, None, "not valid JSON"),  # deeper than Python's stack
    (b'{"model": "stub-model", "temperature": Infinity}', None, "Infinity"),
    (b'{"model": "stub-model", "temperature": NaN}', None, "NaN"),
    (b'{"model": "stub-model", "temperature": 1e400}', None, "finite"),
    (b'{"model": "stub-model", "max_tokens": ' + b"9" * 5000 + b"}", None, "not valid JSON"),  # past int()'s limit
    (chat(stream=True, stream_options=[1]), "stream_options", "object"),
    (chat(stream=True, stream_options="include_usage"), "stream_options", "object"),
    (chat(stream_options=5), "stream_options", "object"),
    (chat(model=5), "model", "string"),
    (chat(model=["stub-model"]), "model", "string"),
    (chat(model={"name": "stub-model"}), "model", "string"),
    (chat(messages="Hi"), "messages", "list"),
    (chat(messages={"role": "user", "content": "Hi"}), "messages", "list"),
    (chat(messages=["Hi"]), "messages", "list"),
    (chat(stream="yes"), "stream", "true or false"),
    (chat(stream=1), "stream", "true or false"),
    (chat(max_tokens="4"), "max_tokens", "whole number"),
    (chat(max_tokens=4.5), "max_tokens", "whole number"),
    (chat(max_tokens=True), "max_tokens", "whole number"),
    (chat(max_tokens=-1), "max_tokens", "whole number"),
    (chat(max_tokens=2**64), "max_tokens", "whole number"),
    (chat(max_completion_tokens=[4]), "max_completion_tokens", "whole number"),
]


@pytest.mark.parametrize("raw, param, words", BAD)
def test_each_unusable_body_is_refused_naming_the_field(raw, param, words):
    with pytest.raises(BadBody) as refused:
        read_body(raw, "/v1/chat/completions")
    assert refused.value.param == param
    assert words in refused.value.message


@pytest.mark.parametrize("raw", [
    chat(), chat(stream=True), chat(stream=None, stream_options=None, max_tokens=None),
    chat(stream=True, stream_options={"include_usage": True}), chat(max_tokens=0, max_completion_tokens=2**63 - 1),
    chat(temperature=0.7, top_p=1e-3), chat(messages=[]), b"", b'{"model": "stub-model", "prompt": "x"}',
    '{"model": "stub-model", "messages": [{"role": "user", "content": "\u00e9"}]}'.encode("utf-16"),
])
def test_usable_bodies_pass_unchanged(raw):
    assert read_body(raw, "/v1/chat/completions") == (json.loads(raw) if raw else {})


def test_messages_are_only_checked_where_they_belong():
    assert read_body(json.dumps({"model": "m", "messages": "x"}).encode(), "/v1/embeddings")["messages"] == "x"


def test_a_signed_in_call_through_djangos_own_stack_is_refused_the_same_way(operator):
    """The normal middleware stack (runserver, Django's test client) runs the same views."""
    c = Client(enforce_csrf_checks=True)
    c.force_login(operator)
    c.cookies["csrftoken"] = token = "a" * 32
    for raw, param, words in BAD:
        r = c.post("/v1/chat/completions", raw, content_type="application/json", HTTP_X_CSRFTOKEN=token)
        assert r.status_code == 400, (raw[:80], r.content[:300])
        assert r["Content-Type"] == "application/json"
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param and words in error["message"]
    # A form post is read as its bytes too, not left for the CSRF check to consume (was a 500).
    r = c.post("/v1/chat/completions", {"model": "stub-model", "csrfmiddlewaretoken": token})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]


def test_both_ways_into_the_gateway_answer_bad_bodies_with_a_400_and_nothing_reaches_the_engine(
        asgi_server, operator, settings):
    _, secret = keys.key_create(user=operator, name="fuzz", rate_limit=0)
    with running_stub() as stub:
        Deployment.objects.create(name="stub", host="testhost", engine_name="llamacpp", status="ready",
                                  port=stub.port, served_model_name="stub-model")
        with httpx.Client(base_url=asgi_server, timeout=30) as browser:
            c = Client()
            c.force_login(operator)
            browser.cookies.set("sessionid", c.cookies["sessionid"].value)
            browser.cookies.set("csrftoken", "a" * 32)
            ways = {"key (fast path)": {"Authorization": f"Bearer {secret}"},
                    "session (Django handler)": {"X-CSRFToken": "a" * 32}}
            for way, headers in ways.items():
                for raw, param, words in BAD:
                    r = browser.post("/v1/chat/completions", content=raw,
                                     headers={**headers, "Content-Type": "application/json"})
                    assert r.status_code == 400, (way, raw[:80], r.text[:300])
                    assert r.headers["content-type"] == "application/json", (way, raw[:80])
                    error = r.json()["error"]
                    assert error["param"] == param and words in error["message"], (way, raw[:80], error)
                r = browser.post("/v1/chat/completions", content=b"x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1),
                                 headers=headers)
                assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", (way, r.text)
                assert stub.requests == [], way
                # The same caller with a good body is answered by the engine.
                r = browser.post("/v1/chat/completions", json=dict(CHAT, stream=True), headers=headers)
                assert r.status_code == 200 and "data: [DONE]" in r.text, (way, r.text[:300])
                assert len(stub.requests) == 1
                stub.requests.clear()


def test_an_unknown_v1_path_answers_json(client, operator):
    client.force_login(operator)
    response = client.get("/v1/nothing-here")
    assert response.status_code == 404 and response["Content-Type"].startswith("application/json")
