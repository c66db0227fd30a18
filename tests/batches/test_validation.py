"""Validation before anything runs: every refusal names the lines and what to fix,
and nothing is stored or queued. Large files stream in constant memory."""

import io
import itertools
import json
import tracemalloc

import httpx
import openai
import pytest
from django.core.files.uploadhandler import StopFutureHandlers  # noqa: F401 - Django's upload API in use
from django.http.multipartparser import MultiPartParser
from django.http import QueryDict

from inference.batches import services, storage
from inference.batches.validate import Checker
from inference.gateway import keys
from inference.models import Batch, BatchFile, Deployment
from tests.batches.test_api import chat_line, jsonl

pytestmark = pytest.mark.timeout(180)


def check(data: bytes) -> Checker:
    c = Checker()
    for i in range(0, len(data), 7):  # tiny chunks: lines cut anywhere
        c.feed(data[i:i + 7])
    c.finish()
    return c


def test_each_kind_of_bad_line_is_named_with_its_line_number():
    good = json.dumps(chat_line(1))
    lines = [
        good,
        "{not json",
        json.dumps({"method": "POST", "url": "/v1/chat/completions", "body": {}}),
        json.dumps(chat_line(1)),
        json.dumps(chat_line(5, url="/v1/images")),
        json.dumps({"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": [1]}),
        "[1, 2]",
        "",
        json.dumps({"custom_id": "s", "url": "/v1/completions", "body": {"model": "m", "stream": True}}),
        json.dumps({"custom_id": "n", "url": "/v1/completions", "body": {"model": "m", "temperature": 1e400}}),
    ]
    c = check("\n".join(lines).encode())
    assert not c.ok
    found = dict(c.errors)
    assert set(found) == {2, 3, 4, 5, 6, 7, 9, 10}
    assert "not valid JSON" in found[2]
    assert "custom_id" in found[3] and "missing" in found[3]
    assert "already used on line 1" in found[4]
    assert "/v1/images" in found[5] and "/v1/chat/completions" in found[5]
    assert "'body' must be a JSON object" in found[6]
    assert "not a JSON object" in found[7]
    assert "stream" in found[9]
    assert "finite" in found[10] or "too large" in found[10]
    message = c.message()
    assert message.startswith("line 2: not valid JSON")


def test_a_good_file_counts_lines_models_and_urls_and_skips_blank_lines():
    c = check(jsonl([chat_line(i, model="a" if i % 2 else "b") for i in range(10)]) + b"\n\r\n")
    assert c.ok and c.lines == 10
    assert c.models == {"a": [2, 4, 6, 8, 10], "b": [1, 3, 5, 7, 9]}
    assert list(c.urls) == ["/v1/chat/completions"]


def test_an_empty_file_and_an_overlong_line_are_refused(settings):
    settings.BATCH_LINE_MAX_BYTES = 2000
    assert "no requests" in check(b"\n\n").message()
    long = json.dumps(chat_line(2, text="x" * 5000))
    c = check((json.dumps(chat_line(1)) + "\n" + long + "\n" + json.dumps(chat_line(3))).encode())
    assert [n for n, _ in c.errors] == [2] and "longer than 2000 bytes" in c.errors[0][1]


def test_a_file_over_the_size_limit_is_refused_and_nothing_is_left_on_disk(settings, db):
    settings.BATCH_FILE_MAX_BYTES = 4096
    before = set(storage.folder().iterdir())
    with pytest.raises(services.Refused) as refused:
        services.file_from_text(jsonl([chat_line(i) for i in range(100)]).decode(), user=None)
    assert refused.value.status == 413 and "BATCH_FILE_MAX_BYTES" in refused.value.message
    assert set(storage.folder().iterdir()) == before and not BatchFile.objects.exists()


def test_a_large_upload_is_streamed_to_disk_in_constant_memory(settings, db, tmp_path):
    """~64 MB through Django's multipart parser and the batch upload handler:
    memory stays a small fraction of the file (one chunk plus one line)."""
    line = json.dumps(chat_line(0, text="y" * 900))
    n = 64_000
    boundary = "kilnboundary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.jsonl\"\r\n"
            f"Content-Type: application/jsonl\r\n\r\n").encode()
    tail = f"\r\n--{boundary}--\r\n".encode()

    class Body(io.RawIOBase):  # generated as it is read, never whole in memory
        def __init__(self):
            self.parts = itertools.chain([head], (line.replace('"req-0"', f'"req-{i}"').encode() + b"\n"
                                                  for i in range(n)), [tail])
            self.buf = b""

        def readable(self):
            return True

        def read(self, size=-1):
            while len(self.buf) < max(size, 1):
                part = next(self.parts, None)
                if part is None:
                    break
                self.buf += part
            out, self.buf = (self.buf, b"") if size < 0 else (self.buf[:size], self.buf[size:])
            return out

    size = sum(len(line) + 1 + len(str(i)) - 1 for i in range(n))  # rough: the file is ~60 MB
    handler = storage.BatchUploadHandler()
    meta = {"CONTENT_TYPE": f"multipart/form-data; boundary={boundary}", "CONTENT_LENGTH": str(10**10)}
    tracemalloc.start()
    post, files = MultiPartParser(meta, Body(), [handler], "utf-8").parse()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert post["purpose"] == "batch" and handler.incoming.checker.ok, handler.incoming.checker.message()
    row = services.file_store(handler.incoming, user=None)
    assert row.lines == n and row.bytes > 55_000_000 and size > 55_000_000
    assert peak < 12_000_000, f"peak {peak / 1e6:.1f} MB while reading a {row.bytes / 1e6:.0f} MB file"


# ---------------------------------------------------------------- through the API


@pytest.fixture
def api(asgi_server, operator):
    _, secret = keys.key_create(user=operator, name="batch", rate_limit=0)
    return openai.OpenAI(base_url=asgi_server + "/v1", api_key=secret, max_retries=0, timeout=60)


def test_the_api_refuses_a_bad_file_with_line_numbers_and_stores_nothing(api):
    bad = jsonl([chat_line(0), chat_line(0)]) + b"{oops\n"
    with pytest.raises(openai.BadRequestError) as refused:
        api.files.create(file=("bad.jsonl", io.BytesIO(bad)), purpose="batch")
    err = refused.value.body
    assert err["code"] == "invalid_file" and err["param"] == "file"
    assert "line 2: custom_id 'req-0' is already used on line 1" in err["message"]
    assert "line 3: not valid JSON" in err["message"]
    assert not BatchFile.objects.exists()
    with pytest.raises(openai.BadRequestError) as refused:
        api.files.create(file=("a.jsonl", io.BytesIO(jsonl([chat_line(0)]))), purpose="fine-tune")
    assert refused.value.body["param"] == "purpose"


def test_the_api_refuses_a_batch_with_an_unknown_model_or_another_endpoint(api):
    Deployment.objects.create(name="stub", host="testhost", engine_name="vllm", status="ready", port=1,
                              served_model_name="stub")
    f = api.files.create(file=("in.jsonl", io.BytesIO(jsonl(
        [chat_line(0), chat_line(1, model="nope"), chat_line(2, model="nope")]))), purpose="batch")
    with pytest.raises(openai.BadRequestError) as refused:
        api.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert "lines 2, 3 ask for model 'nope'" in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError) as refused:
        api.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
    assert "lines 1, 2, 3 have url /v1/chat/completions" in refused.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        api.batches.create(input_file_id="file-nothere", endpoint="/v1/chat/completions", completion_window="24h")
    assert not Batch.objects.exists()


def test_files_list_retrieve_delete_and_refusals_are_openai_style(api, asgi_server, viewer):
    f = api.files.create(file=("in.jsonl", io.BytesIO(jsonl([chat_line(0)]))), purpose="batch")
    assert [x.id for x in api.files.list()] == [f.id]
    assert api.files.content(f.id).content == jsonl([chat_line(0)])
    assert api.files.delete(f.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        api.files.retrieve(f.id)
    # another user's key sees nothing of it
    _, other = keys.key_create(user=viewer, name="v", rate_limit=0)
    assert httpx.get(asgi_server + "/v1/batches", headers={"Authorization": f"Bearer {other}"}).json()["data"] == []
    answer = httpx.get(asgi_server + "/v1/files")
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "missing_api_key"
    answer = httpx.post(asgi_server + "/v1/batches", headers={"Authorization": f"Bearer {other}"}, content=b"[1]")
    assert answer.status_code == 400 and answer.json()["error"]["message"]
    answer = httpx.post(asgi_server + "/v1/files", headers={"Authorization": f"Bearer {other}"},
                        json={"file": "x"})
    assert answer.status_code == 400 and "multipart" in answer.json()["error"]["message"]


# ---------------------------------------------------------------- who may change things through /v1/


def _upload(client, **headers):
    return client.post("/v1/files", {"purpose": "batch", "file": io.BytesIO(jsonl([chat_line(0)]))}, **headers)


@pytest.fixture
def opened(monkeypatch):
    """Every upload file the multipart parser opens (storage.Incoming), recorded."""
    seen = []
    real = storage.Incoming

    class Recorded(real):
        def __init__(self, *args, **kwargs):
            seen.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(storage, "Incoming", Recorded)
    return seen


def test_an_anonymous_upload_is_refused_before_its_body_is_read(transactional_db, opened):
    from django.test import Client

    answer = _upload(Client())
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "missing_api_key"
    assert opened == [], "the anonymous upload's file part was parsed and written before the 401"
    assert not BatchFile.objects.exists()


def test_a_viewers_session_may_read_but_not_change_files_or_batches(transactional_db, viewer, operator, opened):
    from django.test import Client

    mine = services.file_from_text(jsonl([chat_line(0)]).decode(), user=viewer)
    batch = Batch.objects.create(user=viewer, endpoint="/v1/chat/completions", input_file=mine, host="testhost",
                                 status="in_progress", total=1)
    opened.clear()
    client = Client()
    client.force_login(viewer)
    assert client.get("/v1/files").json()["data"][0]["id"] == mine.pk  # reading stays open
    answers = [_upload(client),
               client.post("/v1/batches", {"input_file_id": mine.pk, "endpoint": "/v1/chat/completions"},
                           content_type="application/json"),
               client.post(f"/v1/batches/{batch.pk}/cancel"),
               client.delete(f"/v1/files/{mine.pk}")]
    for answer in answers:
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden", answer.content
    assert opened == [], "the viewer's upload was parsed"
    assert list(BatchFile.objects.values_list("pk", flat=True)) == [mine.pk]
    assert Batch.objects.get().status == "in_progress" and Batch.objects.count() == 1
    client.force_login(operator)  # an operator's session uploads
    answer = _upload(client)
    assert answer.status_code == 200 and answer.json()["object"] == "file", answer.content


def test_a_deeply_nested_batch_body_is_a_400_not_a_500(transactional_db, operator):
    from django.test import Client

    client = Client(raise_request_exception=False)
    client.force_login(operator)
    answer = client.post("/v1/batches", "[" * 100000, content_type="application/json")
    assert answer.status_code == 400 and "JSON object" in answer.json()["error"]["message"]


def test_a_downloaded_files_name_is_quoted_in_content_disposition(transactional_db, operator):
    from django.test import Client
    from django.utils.http import content_disposition_header

    client = Client()
    client.force_login(operator)
    name = 'my "batch"; v=1 é.jsonl'
    upload = io.BytesIO(jsonl([chat_line(0)]))
    upload.name = name
    answer = client.post("/v1/files", {"purpose": "batch", "file": upload})
    assert answer.status_code == 200, answer.content
    stored = answer.json()["filename"]
    assert '"' in stored and "é" in stored
    answer = client.get(f"/v1/files/{answer.json()['id']}/content")
    assert answer["Content-Disposition"] == content_disposition_header(True, stored)


# ---------------------------------------------------------------- text a database cannot keep
# PostgreSQL refuses NUL in text and in JSON; a lone surrogate is not UTF-8 for either database.
# JSON's \u escapes let a line carry both: refused at upload on both databases, never a 500 later.

def test_a_nul_or_a_lone_surrogate_in_custom_id_or_model_is_refused_at_upload():
    lines = [
        json.dumps(chat_line(1)),
        json.dumps({**chat_line(2), "custom_id": "req\u00002"}),
        json.dumps(chat_line(3, model="stub\u0000")),
        json.dumps({**chat_line(4), "custom_id": "req-\ud8004"}),
        json.dumps(chat_line(5, model="stub\udc00")),
    ]
    c = check("\n".join(lines).encode())
    found = dict(c.errors)
    assert set(found) == {2, 3, 4, 5}
    assert found[2].startswith("'custom_id' holds a NUL character") and found[4] == found[2]
    assert found[3].startswith("'body.model' holds a NUL character") and found[5] == found[3]
    assert set(c.models) == {"stub"} and c.lines == 5


def test_the_api_refuses_nul_and_surrogates_with_a_400_and_stores_nothing(transactional_db, redis_clean, operator):
    from django.test import Client

    client = Client(raise_request_exception=False)
    client.force_login(operator)
    for raw in (b'{"custom_id": "a\\u0000", "url": "/v1/chat/completions", "body": {"model": "m", "messages": []}}',
                b'{"custom_id": "a", "url": "/v1/chat/completions", "body": {"model": "m\\ud800", "messages": []}}'):
        upload = io.BytesIO(raw + b"\n")
        upload.name = "in.jsonl"
        answer = client.post("/v1/files", {"purpose": "batch", "file": upload})
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_file", answer.content
        assert "line 1: " in answer.json()["error"]["message"]
    assert not BatchFile.objects.exists()
    Deployment.objects.create(name="stub", host="testhost", engine_name="vllm", status="ready", port=1,
                              served_model_name="stub")
    f = services.file_from_text(json.dumps(chat_line(0)) + "\n", user=operator)
    for metadata in ({"job": "a\u0000"}, {"job\u0000": "a"}, {"job": "\udfff"}):
        answer = client.post("/v1/batches", json.dumps({"input_file_id": f.id, "endpoint": "/v1/chat/completions",
                                                        "metadata": metadata}), content_type="application/json")
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "metadata", answer.content
        assert "NUL character" in answer.json()["error"]["message"]
    answer = client.post("/v1/batches", json.dumps({"input_file_id": f.id + "\u0000",
                                                    "endpoint": "/v1/chat/completions"}),
                         content_type="application/json")
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "file_not_found", answer.content
    assert not Batch.objects.exists()
