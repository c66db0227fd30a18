"""/v1/files and /v1/batches through the real ASGI app and a real Celery
worker, driven by the `openai` client, against the counting stub engine."""

import io
import json
import time

import openai
import pytest

from django.db import transaction

from inference.batches import services
from inference.gateway import keys
from inference.models import Batch, BatchFile, BatchLine, Deployment, UsageRecord
from tests.batches.stub import running
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(180)


def jsonl(lines) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def chat_line(i, model="stub", text=None, url="/v1/chat/completions"):
    return {"custom_id": f"req-{i}", "method": "POST", "url": url,
            "body": {"model": model, "messages": [{"role": "user", "content": text or f"line {i}"}],
                     "max_tokens": 8}}


@pytest.fixture
def key(operator):
    _, secret = keys.key_create(user=operator, name="batch", rate_limit=0)
    return secret


@pytest.fixture
def stub():
    with running(delay=0.01) as s:
        yield s


def deployment(port, model="stub", name="stub engine"):
    return Deployment.objects.create(name=name, host="testhost", engine_name="vllm", status="ready", port=port,
                                     served_model_name=model)


def client(base, secret):
    return openai.OpenAI(base_url=base + "/v1", api_key=secret, max_retries=0, timeout=60)


def test_openai_client_runs_a_batch_end_to_end(asgi_server, celery_worker, key, stub, operator):
    dep = deployment(stub.port)
    api = client(asgi_server, key)
    lines = [chat_line(i) for i in range(30)] + [chat_line(30, text="flaky-2 retried")]
    f = api.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    assert f.purpose == "batch" and f.bytes == len(jsonl(lines))
    assert api.files.retrieve(f.id).filename == "in.jsonl"
    batch = api.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                               metadata={"job": "test"})
    assert batch.status == "validating" and batch.metadata == {"job": "test"}
    done = wait_until(lambda: (b := api.batches.retrieve(batch.id)).status == "completed" and b, 60,
                      "batch completed")
    assert done.request_counts.total == 31 and done.request_counts.completed == 31 and done.request_counts.failed == 0
    out = [json.loads(x) for x in api.files.content(done.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in out) == sorted(f"req-{i}" for i in range(31))
    for o in out:
        assert o["id"].startswith("batch_req_") and o["error"] is None
        assert o["response"]["status_code"] == 200 and o["response"]["request_id"]
        assert o["response"]["body"]["choices"][0]["message"]["content"].startswith("echo: ")
    assert api.files.content(done.error_file_id).text == ""
    # every line sent once, the flaky one three times (two 503s, then an answer)
    assert stub.seen["flaky-2 retried"] == 3
    assert all(stub.seen[f"line {i}"] == 1 for i in range(30))
    assert BatchLine.objects.get(custom_id="req-30").attempts == 3
    row = Batch.objects.get(pk=batch.id)
    assert row.prompt_tokens == 2 * 30 + 2 and row.completion_tokens == 31 * 3
    # usage recorded per key, like any gateway call
    key_id = keys.ApiKey.objects.get(user=operator).pk
    wait_until(lambda: sum(u.requests for u in UsageRecord.objects.filter(key_id=key_id, deployment=dep)) == 33,
               10, "usage rows")
    assert [b.id for b in api.batches.list()] == [batch.id]


def completion_line(i):
    return {"custom_id": f"cmp-{i}", "method": "POST", "url": "/v1/completions",
            "body": {"model": "stub", "prompt": f"complete {i}", "max_tokens": 8}}


def embedding_line(i):
    return {"custom_id": f"emb-{i}", "method": "POST", "url": "/v1/embeddings",
            "body": {"model": "stub", "input": f"embed {i}"}}


def test_completions_and_embeddings_batches_run_end_to_end(asgi_server, celery_worker, key, stub):
    deployment(stub.port)
    api = client(asgi_server, key)
    finished = {}
    for endpoint, make in (("/v1/completions", completion_line), ("/v1/embeddings", embedding_line)):
        f = api.files.create(file=("in.jsonl", io.BytesIO(jsonl([make(i) for i in range(12)]))), purpose="batch")
        batch = api.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window="24h")
        finished[endpoint] = batch.id
    for endpoint, batch_id in finished.items():
        done = wait_until(lambda: (b := api.batches.retrieve(batch_id)).status == "completed" and b, 60,
                          f"{endpoint} batch completed")
        assert done.endpoint == endpoint
        assert (done.request_counts.completed, done.request_counts.failed) == (12, 0)
        assert api.files.content(done.error_file_id).text == ""
        out = {o["custom_id"]: o for o in map(json.loads, api.files.content(done.output_file_id).text.splitlines())}
        finished[endpoint] = (out, Batch.objects.get(pk=batch_id))

    out, row = finished["/v1/completions"]
    assert sorted(out) == sorted(f"cmp-{i}" for i in range(12))
    for i in range(12):
        o = out[f"cmp-{i}"]
        assert o["error"] is None and o["response"]["status_code"] == 200
        body = o["response"]["body"]
        assert body["object"] == "text_completion" and body["model"] == "stub"
        [choice] = body["choices"]
        assert choice["text"] == f"echo: complete {i}" and "message" not in choice
        assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    assert (row.prompt_tokens, row.completion_tokens) == (2 * 12, 3 * 12)

    out, row = finished["/v1/embeddings"]
    assert sorted(out) == sorted(f"emb-{i}" for i in range(12))
    for o in out.values():
        assert o["error"] is None and o["response"]["status_code"] == 200
        body = o["response"]["body"]
        assert body["object"] == "list" and body["model"] == "stub" and "choices" not in body
        [item] = body["data"]
        assert item["object"] == "embedding" and item["index"] == 0
        assert item["embedding"] and all(isinstance(x, float) for x in item["embedding"])
        assert body["usage"] == {"prompt_tokens": 2, "total_tokens": 2}
    assert (row.prompt_tokens, row.completion_tokens) == (2 * 12, 0)
    # each line reached the engine once, on its endpoint (the stub answers by path)
    assert all(stub.seen[f"complete {i}"] == 1 and stub.seen[f"embed {i}"] == 1 for i in range(12))
    assert stub.requests == 24


def test_lines_fail_alone_and_go_to_the_error_file(asgi_server, celery_worker, key, stub, operator):
    deployment(stub.port)
    gone = deployment(1, model="gone", name="removed later")
    api = client(asgi_server, key)
    lines = [chat_line(0), chat_line(1, model="gone"), chat_line(2)]
    f = api.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    with transaction.atomic():  # the task is queued when this commits: the model is gone by then
        batch = services.batch_create(user=operator, input_file=BatchFile.objects.get(pk=f.id),
                                      endpoint="/v1/chat/completions")
        gone.delete()
    done = wait_until(lambda: (b := api.batches.retrieve(batch.id)).status == "completed" and b, 60, "completed")
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)
    [err] = [json.loads(x) for x in api.files.content(done.error_file_id).text.splitlines()]
    assert err["custom_id"] == "req-1" and err["response"] is None
    assert err["error"]["code"] == "model_not_found" and "'gone'" in err["error"]["message"]


def test_cancel_stops_the_batch_and_keeps_what_is_done(asgi_server, celery_worker, key):
    with running(delay=0.3) as slow:
        deployment(slow.port)
        api = client(asgi_server, key)
        f = api.files.create(file=("in.jsonl", io.BytesIO(jsonl([chat_line(i) for i in range(200)]))),
                             purpose="batch")
        batch = api.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        wait_until(lambda: api.batches.retrieve(batch.id).request_counts.completed >= 4, 60, "some done")
        assert api.batches.cancel(batch.id).status in ("cancelling", "cancelled")
        done = wait_until(lambda: (b := api.batches.retrieve(batch.id)).status == "cancelled" and b, 30, "cancelled")
        kept = api.files.content(done.output_file_id).text.splitlines()
        assert len(kept) == done.request_counts.completed < 200
        assert slow.requests < 200
        assert BatchLine.objects.filter(batch_id=batch.id, status="cancelled").count() == 200 - len(kept)


def test_revoking_the_key_stops_its_running_batch_with_the_reason(asgi_server, celery_worker, operator):
    row, secret = keys.key_create(user=operator, name="batch", rate_limit=0)
    with running(delay=0.3) as slow:
        deployment(slow.port)
        api = client(asgi_server, secret)
        f = api.files.create(file=("in.jsonl", io.BytesIO(jsonl([chat_line(i) for i in range(200)]))),
                             purpose="batch")
        batch = api.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        wait_until(lambda: Batch.objects.get(pk=batch.id).completed >= 4, 60, "some done")
        keys.key_revoke(key=row, by=operator)
        stopped = wait_until(lambda: (b := Batch.objects.get(pk=batch.id)).status == "failed" and b, 30, "failed")
        assert "key" in stopped.reason and "revoked" in stopped.reason
        assert stopped.errors["data"][0]["message"] == stopped.reason
        sent = slow.requests
        assert sent < 200 and BatchLine.objects.filter(batch_id=batch.id, status="pending").exists()
        time.sleep(1)
        assert slow.requests == sent, "lines were still sent after the batch stopped"


def test_a_disabled_users_queued_batch_is_not_run(asgi_server, celery_worker, stub):
    from dashboard import services as accounts

    owner, _ = accounts.account_create(username="dora", role="operator")
    deployment(stub.port)
    f = services.file_from_text(jsonl([chat_line(i) for i in range(3)]).decode(), user=owner)
    with transaction.atomic():  # the task is queued when this commits: the user is disabled by then
        batch = services.batch_create(user=owner, input_file=f, endpoint="/v1/chat/completions")
        accounts.account_set_active(user=owner, active=False)
    stopped = wait_until(lambda: (b := Batch.objects.get(pk=batch.pk)).status == "failed" and b, 60, "failed")
    assert "disabled" in stopped.reason and stopped.errors["data"][0]["code"] == "owner_not_allowed"
    assert stub.requests == 0
