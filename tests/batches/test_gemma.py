"""The openai client end to end against the Gemma demo on a real llama-server:
50 lines uploaded with files.create, run with batches.create, read back with
files.content, and the usage recorded per key and per batch."""

import io
import json

import openai
import pytest

from inference.gateway import keys
from inference.models import Batch, UsageRecord
from tests.gateway.test_gateway import DEMO, deployment, start_llama
from tests.helpers import needs_llama, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(600)]


@needs_llama
@pytest.mark.engine
def test_openai_client_batch_of_50_lines_against_the_gemma_demo(tmp_path, asgi_server, celery_worker, operator):
    from inference.deployments import supervisor

    llama = start_llama(tmp_path / "llama.log")
    try:
        dep = deployment("gemma demo", llama.port, handle=llama.handle)
        _, secret = keys.key_create(user=operator, name="batch", rate_limit=0)
        api = openai.OpenAI(base_url=asgi_server + "/v1", api_key=secret, max_retries=0, timeout=120)
        lines = [{"custom_id": f"q-{i}", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": DEMO, "max_tokens": 8, "temperature": 0,
                           "messages": [{"role": "user", "content": f"Say the number {i}."}]}} for i in range(50)]
        data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
        f = api.files.create(file=("questions.jsonl", io.BytesIO(data)), purpose="batch")
        batch = api.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        done = wait_until(lambda: (b := api.batches.retrieve(batch.id)).status in ("completed", "failed") and b,
                          400, "the batch finished", interval=1)
        assert done.status == "completed", done
        assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (50, 50, 0)
        out = [json.loads(x) for x in api.files.content(done.output_file_id).text.splitlines()]
        assert sorted(o["custom_id"] for o in out) == sorted(f"q-{i}" for i in range(50))
        for o in out:
            body = o["response"]["body"]
            assert o["response"]["status_code"] == 200 and o["error"] is None
            assert body["choices"][0]["message"]["role"] == "assistant"
            assert 0 < body["usage"]["completion_tokens"] <= 8
        row = Batch.objects.get(pk=batch.id)
        assert row.completion_tokens == sum(o["response"]["body"]["usage"]["completion_tokens"] for o in out)
        assert row.prompt_tokens == sum(o["response"]["body"]["usage"]["prompt_tokens"] for o in out)
        key_id = keys.ApiKey.objects.get(user=operator).pk
        wait_until(lambda: sum(u.requests for u in UsageRecord.objects.filter(key_id=key_id, deployment=dep)) == 50,
                   10, "usage per key")
        assert sum(u.completion_tokens for u in UsageRecord.objects.filter(key_id=key_id)) == row.completion_tokens
    finally:
        assert supervisor.stop(llama.handle, grace_s=10).survivors == []
