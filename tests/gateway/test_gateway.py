"""The team gateway (/v1/ on the panel) served by a real uvicorn, in front of
a real llama-server with the Gemma demo and of the SSE stub."""

import json
import os
import signal
import time

import httpx
import openai
import pytest

from inference.engines import Runtime, get_engine
from inference.gateway import keys
from inference.models import ApiKey, Deployment, UsageRecord
from tests.helpers import LLAMA_WRAPPER, demo_model_path, free_port, needs_llama, wait_until
from tests.sse_stub import StubScript, running_stub

DEMO = "gemma-3-270m"
pytestmark = pytest.mark.timeout(300)


def start_llama(log_path):
    from inference.deployments import supervisor
    from inference.deployments.presets import GEMMA_DEMO

    model = demo_model_path()
    engine = get_engine("llamacpp")
    spec = GEMMA_DEMO.spec(model, extra_args=["--threads", "2"])
    started = supervisor.launch(engine, spec, Runtime("llamacpp", "executable", str(LLAMA_WRAPPER)), log_path)
    url = engine.health_url("127.0.0.1", started.port)

    def healthy():
        assert supervisor.is_running(started.handle.pid, started.handle.start_time), \
            supervisor.read_log_tail(log_path)
        return supervisor.probe_health(url, timeout=1).status == 200

    try:
        wait_until(healthy, 180, "llama-server health", interval=0.25)
    except BaseException:
        supervisor.stop(started.handle, grace_s=2)
        raise
    return started


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """One llama-server for the module (the kill test starts its own)."""
    from inference.deployments import supervisor

    started = start_llama(tmp_path_factory.mktemp("llama") / "llama.log")
    yield started
    assert supervisor.stop(started.handle, grace_s=10).survivors == []


def deployment(name, port, model=DEMO, status="ready", handle=None):
    return Deployment.objects.create(
        name=name, host="testhost", engine_name="llamacpp", status=status, port=port, served_model_name=model,
        pid=handle.pid if handle else None, pgid=handle.pgid if handle else None,
        start_time=handle.start_time if handle else None)


@pytest.fixture
def key(operator):
    _, secret = keys.key_create(user=operator, name="notebook", rate_limit=0)
    return secret


def client(base, secret, **kw):
    return openai.OpenAI(base_url=base + "/v1", api_key=secret, max_retries=0, timeout=120, **kw)


def usage_rows(**filters):
    return list(UsageRecord.objects.filter(**filters).values("requests", "errors", "prompt_tokens",
                                                             "completion_tokens", "deployment_id", "key_id"))


def wait_usage(timeout=10, **filters):
    return wait_until(lambda: usage_rows(**filters), timeout, f"usage rows for {filters}")


# --------------------------------------------------------------------- the real engine


@needs_llama
@pytest.mark.engine
def test_openai_client_streams_through_the_gateway_and_usage_is_recorded(llama, asgi_server, operator, key):
    dep = deployment("gemma demo", llama.port, handle=llama.handle)
    api = client(asgi_server, key)
    assert [m.id for m in api.models.list()] == [DEMO]

    arrivals, text = [], ""
    stream = api.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "Tell me about kilns."}],
                                         max_tokens=24, temperature=0, stream=True)
    for chunk in stream:
        arrivals.append(time.monotonic())
        assert chunk.choices, "the usage chunk the gateway asked for must not reach a client that did not ask"
        text += chunk.choices[0].delta.content or ""
    assert text.strip()
    # Streamed as generated, not buffered: ~24 tokens on a CPU take a while,
    # and they arrived spread over that time.
    assert len(arrivals) >= 10 and arrivals[-1] - arrivals[0] > 0.1

    # A client that asks for usage gets the engine's usage chunk.
    chunks = list(api.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=8, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8

    answer = api.completions.create(model=DEMO, prompt="The kiln", max_tokens=5, temperature=0)
    assert answer.usage.completion_tokens == 5

    def all_three():
        rows = usage_rows(deployment_id=dep.pk)
        return sum(r["requests"] for r in rows) == 3 and rows
    rows = wait_until(all_three, 10, "three requests counted")
    assert sum(r["completion_tokens"] for r in rows) == 24 + 8 + 5
    assert all(r["prompt_tokens"] > 0 for r in rows) and sum(r["errors"] for r in rows) == 0
    key_row = ApiKey.objects.get(user=operator)
    assert {r["key_id"] for r in rows} == {key_row.pk}
    wait_until(lambda: ApiKey.objects.get(pk=key_row.pk).last_used, 5, "last_used set")


# An answer holding a turn label ran on into a turn the base model invented.
TURN_JUNK = ("User:", "Assistant:", "<|im_", "<start_of_turn>", "<end_of_turn>")


def demo_preset_deployment(port, handle):
    """A ready deployment launched from the demo preset (its profile names it)."""
    from inference.deployments.presets import GEMMA_DEMO
    from inference.models import EngineRuntime, LaunchProfile

    runtime = EngineRuntime.objects.create(name="llama.cpp", host="testhost", engine="llamacpp", kind="executable",
                                           path=str(LLAMA_WRAPPER), detect_status="ok")
    profile = LaunchProfile.objects.create(name="demo", host="testhost", runtime=runtime, model_path="/m.gguf",
                                           preset=GEMMA_DEMO.slug, served_model_name=DEMO, gpus=[])
    dep = deployment("gemma demo preset", port, handle=handle)
    Deployment.objects.filter(pk=dep.pk).update(profile=profile)
    return dep


@needs_llama
@pytest.mark.engine
def test_the_demo_answers_its_turn_and_stops_through_the_gateway_and_the_playground_path(
        llama, asgi_server, operator, key):
    """The base demo model wrote invented "User:/Assistant:" turns up to max_tokens; the
    gateway now adds the preset's stop to its chat requests (not to a benchmark's)."""
    demo_preset_deployment(llama.port, llama.handle)
    api = client(asgi_server, key)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    reply = api.chat.completions.create(model=DEMO, messages=question, max_tokens=60, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and reply.usage.completion_tokens < 60, reply
    assert "Paris" in choice.message.content and not any(j in choice.message.content for j in TURN_JUNK), reply

    text, finish = "", None
    for chunk in api.chat.completions.create(model=DEMO, messages=question, max_tokens=60, temperature=0,
                                             stream=True):
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop" and "Paris" in text and not any(j in text for j in TURN_JUNK), (finish, text)

    # A benchmark's request (ignore_eos) gets every token it asked for.
    bench = api.chat.completions.create(model=DEMO, messages=question, max_tokens=40, temperature=0,
                                        extra_body={"ignore_eos": True})
    assert bench.usage.completion_tokens == 40 and bench.choices[0].finish_reason == "length", bench

    # The Playground's request: the signed-in session, streamed with usage, as static/gateway/playground.js sends it.
    with httpx.Client(base_url=asgi_server, timeout=120) as browser:
        browser.get("/login/")
        browser.post("/login/", data={"username": operator.username, "password": operator.plain_password,
                                      "csrfmiddlewaretoken": browser.cookies["csrftoken"]})
        r = browser.post("/v1/chat/completions", headers={"X-CSRFToken": browser.cookies["csrftoken"]},
                         json={"model": DEMO, "messages": question, "stream": True, "temperature": 0,
                               "stream_options": {"include_usage": True}, "max_tokens": 60})
    assert r.status_code == 200, r.text
    events = [json.loads(e) for e in sse_events(r.text) if e != "[DONE]"]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    finishes = [e["choices"][0]["finish_reason"] for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert finishes == ["stop"] and "Paris" in text and not any(j in text for j in TURN_JUNK), (finishes, text)
    assert events[-1]["usage"]["completion_tokens"] < 60


@needs_llama
@pytest.mark.engine
def test_a_key_revoked_mid_use_is_refused_on_its_next_request(llama, asgi_server, operator, key):
    deployment("gemma demo", llama.port, handle=llama.handle)
    api = client(asgi_server, key)
    stream = api.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "Count to twenty."}],
                                         max_tokens=20, stream=True)
    first = next(iter(stream))
    assert first.choices
    keys.key_revoke(key=ApiKey.objects.get(user=operator), by=operator)
    # The answer already under way finishes; the key is checked per request.
    rest = list(stream)
    assert rest
    with pytest.raises(openai.AuthenticationError) as exc:
        api.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert exc.value.status_code == 401 and exc.value.code == "invalid_api_key"
    assert "revoked" in exc.value.message


@needs_llama
@pytest.mark.engine
def test_an_engine_killed_mid_stream_ends_the_stream_with_an_error_event(tmp_path, asgi_server, key):
    from inference.deployments import supervisor

    doomed = start_llama(tmp_path / "doomed.log")
    try:
        dep = deployment("doomed", doomed.port, handle=doomed.handle)
        api = client(asgi_server, key)
        stream = api.chat.completions.create(
            model=DEMO, messages=[{"role": "user", "content": "Write a very long story about a potter."}],
            max_tokens=2000, stream=True, extra_body={"ignore_eos": True})
        received = 0
        with pytest.raises(openai.APIError) as exc:
            for chunk in stream:
                received += 1
                if received == 5:
                    os.killpg(doomed.handle.pgid, signal.SIGKILL)
        assert received >= 5
        assert "stopped answering mid-stream" in exc.value.message
        assert exc.value.code == "upstream_disconnected"
    finally:
        supervisor.stop(doomed.handle, grace_s=1)
    # The panel is still up, and a request for the dead engine gets a clear 503.
    assert httpx.get(asgi_server + "/healthz").status_code == 200
    r = httpx.post(asgi_server + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": DEMO, "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 503 and int(r.headers["Retry-After"]) > 0
    assert r.json()["error"]["code"] == "deployment_unreachable"
    rows = wait_usage(deployment_id=dep.pk)
    assert rows[0]["errors"] == 1


# --------------------------------------------------------------------- errors, limits, routing (SSE stub)


def post(base, secret, body, path="/v1/chat/completions"):
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    return httpx.post(base + path, headers=headers, json=body, timeout=30)


CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 4}


def test_errors_are_openai_style_json(asgi_server, key):
    with running_stub() as stub:
        deployment("starting one", stub.port, model="warming-up", status="starting")
        deployment("stopped one", stub.port, model="gone-model", status="stopped")
        deployment("stub", stub.port, model="stub-model")

        r = post(asgi_server, key, dict(CHAT, model="no-such-model"))
        assert r.status_code == 404
        err = r.json()["error"]
        assert err["code"] == "model_not_found" and "stub-model" in err["message"]

        r = post(asgi_server, key, dict(CHAT, model="warming-up"))
        assert r.status_code == 503 and r.headers["Retry-After"] == "10"
        assert r.json()["error"]["code"] == "deployment_not_ready" and "starting" in r.json()["error"]["message"]
        r = post(asgi_server, key, dict(CHAT, model="gone-model"))
        assert r.status_code == 503 and r.headers["Retry-After"] == "30"

        for bad in ("kiln-not-a-real-key", "sk-something-else"):
            r = post(asgi_server, bad, CHAT)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = post(asgi_server, None, CHAT)
        assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
        with pytest.raises(openai.AuthenticationError):
            client(asgi_server, "kiln-wrong").chat.completions.create(**CHAT)
        with pytest.raises(openai.NotFoundError):
            client(asgi_server, key).chat.completions.create(**dict(CHAT, model="nope"))

        r = httpx.post(asgi_server + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                       content=b"{not json")
        assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
        r = post(asgi_server, key, {"messages": []})
        assert r.status_code == 400 and r.json()["error"]["param"] == "model"
        assert len(stub.requests) == 0  # nothing reached the engine
        assert post(asgi_server, key, CHAT).status_code == 200


def test_rate_limit_and_allowed_models_per_key(asgi_server, operator):
    _, limited = keys.key_create(user=operator, name="ci", rate_limit=3, allowed_models=["stub-model"])
    with running_stub() as stub:
        deployment("stub", stub.port, model="stub-model")
        deployment("other", stub.port, model="other-model")
        assert post(asgi_server, limited, dict(CHAT, model="other-model")).status_code == 403
        models = httpx.get(asgi_server + "/v1/models", headers={"Authorization": f"Bearer {limited}"}).json()
        assert [m["id"] for m in models["data"]] == ["stub-model"]
        # Every request counts, refused ones too: 1 (the 403 above) + 2 = the limit of 3.
        for _ in range(2):
            assert post(asgi_server, limited, CHAT).status_code == 200
        r = post(asgi_server, limited, CHAT)
        assert r.status_code == 429
        assert r.json()["error"]["code"] == "rate_limit_exceeded" and 1 <= int(r.headers["Retry-After"]) <= 60
        with pytest.raises(openai.RateLimitError):
            client(asgi_server, limited).chat.completions.create(**CHAT)


def test_a_key_this_process_vouches_for_is_still_checked_in_redis(asgi_server, operator):
    # After one good request the web process "vouches" for the key and opens
    # the engine's request while Redis checks it. Revoked here (another
    # process, as from the Keys page), the key must still get 401, and the
    # engine's request opened for it must be dropped and not counted.
    row, secret = keys.key_create(user=operator, name="soon revoked", rate_limit=0)
    with running_stub(StubScript(tokens=4, first_delay=0.3)) as stub:
        dep = deployment("stub", stub.port, model="stub-model")
        assert post(asgi_server, secret, dict(CHAT, stream=True)).status_code == 200
        keys.key_revoke(key=row, by=operator)
        r = post(asgi_server, secret, dict(CHAT, stream=True))
        assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]
        reached = len(stub.requests)
        assert reached in (1, 2)  # the refused one may have been opened upstream, then dropped
        # Now not vouched for: checked first, nothing reaches the engine; a
        # bad body still answers 401, not a hint about the body.
        r = httpx.post(asgi_server + "/v1/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                       content=b"{not json")
        assert r.status_code == 401
        assert post(asgi_server, secret, CHAT).status_code == 401
        assert len(stub.requests) == reached
        time.sleep(1.5)  # usage is written about once a second
        assert sum(r["requests"] for r in usage_rows(deployment_id=dep.pk)) == 1


def test_a_vouched_key_with_a_bad_body_gets_the_body_error(asgi_server, key):
    with running_stub() as stub:
        deployment("stub", stub.port, model="stub-model")
        assert post(asgi_server, key, CHAT).status_code == 200
        r = httpx.post(asgi_server + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                       content=b"[1, 2]")
        assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
        assert post(asgi_server, key, dict(CHAT, model="nope")).status_code == 404
        assert len(stub.requests) == 1


def test_round_robin_across_two_ready_replicas(asgi_server, key):
    with running_stub() as a, running_stub() as b:
        da, db_ = deployment("replica a", a.port, model="stub-model"), deployment("replica b", b.port,
                                                                                   model="stub-model")
        deployment("not ready", a.port, model="stub-model", status="starting")
        served = [post(asgi_server, key, CHAT).headers["X-Kiln-Deployment"] for _ in range(6)]
        assert sorted(served) == sorted([str(da.pk), str(db_.pk)] * 3)
        assert all(x != y for x, y in zip(served, served[1:]))  # alternating
        assert len(a.requests) == 3 and len(b.requests) == 3


def test_a_dead_replica_is_skipped(asgi_server, key):
    with running_stub() as alive:
        deployment("dead replica", free_port(), model="stub-model")
        live = deployment("live replica", alive.port, model="stub-model")
        for _ in range(4):
            r = post(asgi_server, key, CHAT)
            assert r.status_code == 200 and r.headers["X-Kiln-Deployment"] == str(live.pk)


def sse_events(response_text):
    return [e[len("data: "):] for e in response_text.split("\n\n") if e.startswith("data: ")]


def test_usage_chunk_added_for_counting_is_removed_unless_asked_and_counted_exactly(asgi_server, key):
    with running_stub(StubScript(tokens=7)) as stub:
        dep = deployment("stub", stub.port, model="stub-model")
        r = post(asgi_server, key, dict(CHAT, stream=True))
        events = sse_events(r.text)
        assert r.headers["content-type"].startswith("text/event-stream")
        assert events[-1] == "[DONE]" and not any('"usage"' in e for e in events)
        assert stub.requests[-1]["stream_options"] == {"include_usage": True}  # the gateway asked

        r = post(asgi_server, key, dict(CHAT, stream=True, stream_options={"include_usage": True}))
        usage_events = [json.loads(e) for e in sse_events(r.text) if '"usage"' in e]
        assert usage_events[-1]["usage"]["completion_tokens"] == 7

        post(asgi_server, key, CHAT)  # not streamed
        wait_until(lambda: sum(r["requests"] for r in usage_rows(deployment_id=dep.pk)) == 3, 10, "3 counted")
        rows = usage_rows(deployment_id=dep.pk)
        assert sum(r["prompt_tokens"] for r in rows) == 3 * 3  # "one two three", the stub counts words
        assert sum(r["completion_tokens"] for r in rows) == 3 * 7


def test_a_stream_cut_by_the_engine_ends_with_an_error_event(asgi_server, key):
    with running_stub(StubScript(tokens=50, fail_after_chunks=3, token_delay=0.01)) as stub:
        dep = deployment("flaky", stub.port, model="stub-model")
        r = post(asgi_server, key, dict(CHAT, stream=True, max_tokens=50))
        events = sse_events(r.text)
        assert r.status_code == 200
        error = json.loads(events[-1])["error"]
        assert error["code"] == "upstream_disconnected" and "flaky" in error["message"]
        contents = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]]
        assert [c for c in contents if c] == ["tok "] * 3
        assert wait_usage(deployment_id=dep.pk)[0]["errors"] == 1
        assert httpx.get(asgi_server + "/healthz").status_code == 200


def test_the_session_works_for_the_playground_but_needs_the_csrf_token(asgi_server, operator):
    with running_stub() as stub:
        deployment("stub", stub.port, model="stub-model")
        with httpx.Client(base_url=asgi_server) as browser:
            page = browser.get("/login/")
            token = browser.cookies["csrftoken"]
            browser.post("/login/", data={"username": operator.username, "password": operator.plain_password,
                                          "csrfmiddlewaretoken": token})
            assert browser.post("/v1/chat/completions", json=CHAT).status_code == 403
            token = browser.cookies["csrftoken"]
            r = browser.post("/v1/chat/completions", json=CHAT, headers={"X-CSRFToken": token})
            assert r.status_code == 200, r.text
            assert page.status_code == 200
        rows = wait_usage(user_id=operator.pk)
        assert rows[0]["key_id"] is None and rows[0]["requests"] == 1


def test_client_going_away_mid_stream_closes_the_engine_request(asgi_server, key):
    with running_stub(StubScript(tokens=200, token_delay=0.02)) as stub:
        dep = deployment("stub", stub.port, model="stub-model")
        with httpx.stream("POST", asgi_server + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                          json=dict(CHAT, stream=True, max_tokens=200), timeout=30) as r:
            for i, _ in enumerate(r.iter_raw()):
                if i == 3:
                    break
        # The engine's answer takes 4 s; the gateway dropped it at once (and
        # counted the request as broken) instead of reading it to the end.
        rows = wait_usage(timeout=2.5, deployment_id=dep.pk)
        assert rows[0]["requests"] == 1 and rows[0]["errors"] == 1
        assert httpx.get(asgi_server + "/healthz").status_code == 200


@pytest.mark.parametrize("raw, sent, strip", [
    # The client's bytes go through untouched, or with stream_options appended.
    (b'{"model":"m","stream":true}', {"model": "m", "stream": True, "stream_options": {"include_usage": True}}, True),
    (b' {\n "model" : "m", "stream": true }\n', {"model": "m", "stream": True,
                                                  "stream_options": {"include_usage": True}}, True),
    (b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}', None, False),
    (b'{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true}}',
     {"model": "m", "stream": True, "stream_options": {"continuous_usage_stats": True, "include_usage": True}}, True),
    (b'{"model":"m","stream":false}', None, False),
    ('{"model":"m","stream":true,"prompt":"\u00e9\u4e2d"}'.encode("utf-16"),
     {"model": "m", "stream": True, "prompt": "\u00e9\u4e2d", "stream_options": {"include_usage": True}}, True),
])
def test_the_engine_gets_the_clients_bytes_plus_what_usage_needs(raw, sent, strip):
    from inference.gateway.proxy import prepare_body

    payload, stripped = prepare_body(json.loads(raw), raw)
    assert stripped is strip
    if sent is None:
        assert payload is raw
    else:
        assert json.loads(payload) == sent


def test_redis_down_while_checking_a_key_is_a_503_not_a_500(monkeypatch):
    import asyncio

    import redis.exceptions

    from inference.gateway import views

    async def unreachable(*args, **kwargs):
        raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    monkeypatch.setattr(keys, "authenticate", unreachable)
    caller, info, refused = asyncio.run(views.key_caller("kiln-whatever"))
    assert caller is None and info is None
    assert refused.status_code == 503 and int(refused["Retry-After"]) > 0
    error = json.loads(refused.content)["error"]
    assert error["code"] == "auth_unavailable" and "Redis" in error["message"]
