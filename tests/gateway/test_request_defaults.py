"""A preset's request defaults (the Gemma demo's stop at the next "User:" turn):
added by the gateway where a chat request leaves them out, never to a benchmark's
ignore_eos request, never over a client's own stop, and only for deployments of
that preset. Fast: no engine (the SSE stub stands in where a server is needed)."""

import asyncio
import json

import httpx
import pytest

from inference.deployments.presets import CHAT_COMPLETIONS, GEMMA_DEMO, QWEN_AWQ_TP2, request_additions
from inference.gateway import clients, keys, proxy, routing, views
from inference.gateway.routing import Upstream
from inference.models import Deployment, EngineRuntime, LaunchProfile
from tests.sse_stub import running_stub

DEMO_STOP = GEMMA_DEMO.request_defaults[CHAT_COMPLETIONS]["stop"]
DEMO = Upstream(1, "demo", "http://127.0.0.1:1", "", GEMMA_DEMO.request_defaults)
PLAIN = Upstream(2, "plain", "http://127.0.0.1:2", "")
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def sent(target, raw, path=CHAT_COMPLETIONS, with_body=True):
    body = json.loads(raw) if with_body else None
    return proxy.with_request_defaults(target, path, raw, body)


def test_the_demo_stops_at_the_next_user_turn_of_its_transcript_template():
    assert "\nUser:" in DEMO_STOP and "User:" in DEMO_STOP
    template = GEMMA_DEMO.model_args[GEMMA_DEMO.model_args.index("--chat-template-file") + 1]
    assert "User: " in open(template).read()


@pytest.mark.parametrize("body, added", [
    ({"messages": MESSAGES}, {"stop": DEMO_STOP}),
    ({"messages": MESSAGES, "stop": None}, {"stop": DEMO_STOP}),  # null is "not set", as in OpenAI's API
    ({"messages": MESSAGES, "ignore_eos": False}, {"stop": DEMO_STOP}),
    ({"messages": MESSAGES, "ignore_eos": True}, {}),  # a benchmark: exactly max_tokens
    ({"messages": MESSAGES, "stop": ["\n"]}, {}),  # the client's own stop wins
    ({"messages": MESSAGES, "stop": "."}, {}),
    ({"messages": MESSAGES, "stop": []}, {}),  # "no stop at all" is the client's choice too
])
def test_which_requests_get_the_demo_stop(body, added):
    assert request_additions(GEMMA_DEMO.request_defaults[CHAT_COMPLETIONS], body) == added


def test_other_presets_and_endpoints_add_nothing():
    assert request_additions(QWEN_AWQ_TP2.request_defaults.get(CHAT_COMPLETIONS), {"messages": MESSAGES}) == {}
    raw = b'{"model":"m","prompt":"User: hi\\nAssistant:"}'
    assert sent(DEMO, raw, "/v1/completions") is raw  # the client wrote that prompt itself
    assert sent(DEMO, b'{"model":"m","input":"x"}', "/v1/embeddings") == b'{"model":"m","input":"x"}'


def test_the_engine_gets_the_clients_bytes_plus_the_stop():
    raw = b'{"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":60}'
    payload = sent(DEMO, raw)
    assert payload.startswith(raw[:-1]) and json.loads(payload) == dict(json.loads(raw), stop=DEMO_STOP)
    # Without the parsed body (the batch runner's call), the same bytes.
    assert sent(DEMO, raw, with_body=False) == payload
    for untouched in (b'{"model":"m","messages":[],"ignore_eos":true,"max_tokens":16}',
                      b'{"model":"m","messages":[],"stop":["Paris"]}'):
        assert sent(DEMO, untouched) is untouched
        assert sent(DEMO, untouched, with_body=False) is untouched
    # An explicit "stop": null is replaced, not followed by a second "stop" key.
    payload = sent(DEMO, b'{"model":"m","messages":[],"stop":null}')
    assert payload.count(b'"stop"') == 1 and json.loads(payload)["stop"] == DEMO_STOP
    # A streamed request keeps what usage counting added.
    body = {"model": "m", "messages": [], "stream": True}
    streamed, strip = proxy.prepare_body(body, json.dumps(body).encode())
    payload = proxy.with_request_defaults(DEMO, CHAT_COMPLETIONS, streamed, body)
    assert strip and json.loads(payload) == dict(body, stream_options={"include_usage": True}, stop=DEMO_STOP)
    # UTF-16 (no byte splice possible) is re-encoded with the stop.
    raw = '{"model":"m","messages":[{"role":"user","content":"\u4e2d"}]}'.encode("utf-16")
    assert json.loads(sent(DEMO, raw)) == dict(json.loads(raw), stop=DEMO_STOP)


def test_a_deployment_without_defaults_sends_its_payload_unparsed(monkeypatch):
    def no_parsing(*args, **kwargs):
        raise AssertionError("the payload of a deployment without defaults was parsed")

    monkeypatch.setattr(proxy.json, "loads", no_parsing)
    raw = b'{"model":"m","messages":[]}'
    assert proxy.with_request_defaults(PLAIN, CHAT_COMPLETIONS, raw) is raw
    assert proxy.with_request_defaults(PLAIN, CHAT_COMPLETIONS, raw, {"model": "m", "messages": []}) is raw


def profile(preset, runtime):
    return LaunchProfile.objects.create(name=preset or "custom", host="testhost", runtime=runtime,
                                        model_path="/m.gguf", preset=preset, served_model_name="m", gpus=[])


def ready(name, port, model, profile=None):
    return Deployment.objects.create(name=name, host="testhost", engine_name="llamacpp", status="ready", port=port,
                                     served_model_name=model, profile=profile)


@pytest.fixture
def runtime(db):
    return EngineRuntime.objects.create(name="llama.cpp", host="testhost", engine="llamacpp", kind="executable",
                                        path="/opt/bin/llama-server", detect_status="ok")


@pytest.mark.django_db(transaction=True)  # the table read closes old connections
def test_only_deployments_of_the_preset_carry_its_defaults(runtime):
    demo = ready("demo", 8001, "gemma-3-270m", profile(GEMMA_DEMO.slug, runtime))
    other = ready("awq", 8002, "qwen", profile(QWEN_AWQ_TP2.slug, runtime))
    custom = ready("custom", 8003, "custom", profile("", runtime))
    bare = ready("bare", 8004, "bare")
    gone = ready("old preset", 8005, "old", profile("a-preset-since-removed", runtime))
    table = routing._read_table()
    by_id = {u.deployment_id: u for ups in table.ready.values() for u in ups}
    assert by_id[demo.pk].request_defaults == GEMMA_DEMO.request_defaults
    assert all(by_id[d.pk].request_defaults == {} for d in (other, custom, bare, gone))


def test_every_engine_request_gets_its_replicas_own_defaults():
    """proxy.open_upstream is what the gateway's both doors (views._open_first, with
    the parsed body) and the batch runner (the payload alone) send through."""
    with running_stub() as stub:
        demo = Upstream(1, "demo", f"http://127.0.0.1:{stub.port}", "", GEMMA_DEMO.request_defaults)
        plain = Upstream(2, "plain", f"http://127.0.0.1:{stub.port}", "")
        body = {"model": "stub-model", "messages": MESSAGES, "max_tokens": 4}
        raw = json.dumps(body).encode()

        async def send_all():
            try:
                opened = [await views._open_first([demo, plain][i:], CHAT_COMPLETIONS, raw, False, body)
                          for i in (0, 1)]
                opened += [(await proxy.open_upstream(t, CHAT_COMPLETIONS, raw, False), t) for t in (demo, plain)]
                for response, _target in opened:
                    await response.read()
                    response.close()
            finally:
                await clients.upstream().close()
        asyncio.run(send_all())
        assert [r.get("stop") for r in stub.requests] == [DEMO_STOP, None, DEMO_STOP, None]


def test_both_gateway_doors_add_the_stop_for_the_demo_only(asgi_server, runtime, operator):
    """An API key's call (the raw ASGI fast path) and a signed-in session's call (the
    Django view, as the Playground sends it) to a demo deployment get the stop;
    a benchmark's ignore_eos call and another deployment's calls do not."""
    _, secret = keys.key_create(user=operator, name="notebook", rate_limit=0)
    bearer = {"Authorization": f"Bearer {secret}"}
    with running_stub() as demo_engine, running_stub() as other_engine:
        ready("demo", demo_engine.port, "gemma-3-270m", profile(GEMMA_DEMO.slug, runtime))
        ready("other", other_engine.port, "stub-model")
        chat = {"model": "gemma-3-270m", "messages": MESSAGES, "max_tokens": 4}
        url = asgi_server + CHAT_COMPLETIONS
        assert httpx.post(url, json=chat, headers=bearer, timeout=30).status_code == 200
        assert httpx.post(url, json=dict(chat, stream=True), headers=bearer, timeout=30).status_code == 200
        assert httpx.post(url, json=dict(chat, ignore_eos=True), headers=bearer, timeout=30).status_code == 200
        assert httpx.post(url, json=dict(chat, stop=["."]), headers=bearer, timeout=30).status_code == 200
        assert httpx.post(url, json=dict(chat, model="stub-model"), headers=bearer, timeout=30).status_code == 200
        with httpx.Client(base_url=asgi_server) as browser:
            browser.get("/login/")
            browser.post("/login/", data={"username": operator.username, "password": operator.plain_password,
                                          "csrfmiddlewaretoken": browser.cookies["csrftoken"]})
            r = browser.post(CHAT_COMPLETIONS, headers={"X-CSRFToken": browser.cookies["csrftoken"]},
                             json=dict(chat, stream=True, stream_options={"include_usage": True}, temperature=0))
            assert r.status_code == 200, r.text
        stops = [body.get("stop") for body in demo_engine.requests]
        assert stops == [DEMO_STOP, DEMO_STOP, None, ["."], DEMO_STOP]
        assert demo_engine.requests[-1]["stream_options"] == {"include_usage": True}
        assert "stop" not in other_engine.requests[0]
