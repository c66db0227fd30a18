"""The Batches pages: a batch started from the browser (file upload), its live
progress, search over its lines, the downloads; paste through the form; roles."""

import json

import pytest

from inference.models import Batch, BatchLine
from tests.batches.stub import running
from tests.batches.test_api import chat_line, deployment, jsonl
from tests.helpers import REPO, wait_until

ARTIFACTS = REPO / "test-artifacts"
pytestmark = pytest.mark.timeout(240)


def sign_in(page, base, user):
    page.goto(base + "/login/")
    page.fill("input[name=username]", user.username)
    page.fill("input[name=password]", user.plain_password)
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")


def test_paste_starts_a_batch_and_errors_come_back_with_line_numbers(client, operator, viewer, redis_clean):
    dep = deployment(9, model="stub")
    client.force_login(operator)
    text = jsonl([{"custom_id": "a", "url": "/v1/chat/completions",
                   "body": {"messages": [{"role": "user", "content": "hi"}]}}]).decode()
    answer = client.post("/batches/new", {"text": text, "endpoint": "/v1/chat/completions", "deployment": dep.pk,
                                          "concurrency": 2, "pacing_ms": 100})
    batch = Batch.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"/batches/{batch.pk}/"
    assert (batch.concurrency, batch.pacing_ms, batch.default_model) == (2, 100, "stub")
    bad = client.post("/batches/new", {"text": "{\"custom_id\": \"a\"}\nnope\n", "endpoint": "/v1/chat/completions",
                                       "deployment": dep.pk, "concurrency": 4}, follow=True)
    page = bad.content.decode()
    assert "line 1: &#x27;url&#x27; is null" in page and "line 2: not valid JSON" in page
    assert Batch.objects.count() == 1
    client.force_login(viewer)
    assert client.post("/batches/new", {"text": text}).status_code == 403
    page = client.get(f"/batches/{batch.pk}/").content.decode()
    assert batch.pk in page and "/cancel" not in page


def test_a_batch_from_the_browser_runs_live_and_its_lines_can_be_searched(
        asgi_server, celery_worker, browser, operator, tmp_path):
    with running(delay=0.05) as stub:
        dep = deployment(stub.port)
        source = tmp_path / "docs.jsonl"
        lines = [chat_line(i) for i in range(40)]
        for line in lines:
            del line["body"]["model"]  # the page's deployment fills it in
        source.write_bytes(jsonl(lines))
        page = browser.new_page()
        page.set_viewport_size({"width": 1400, "height": 900})
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: msg.type == "error" and "favicon" not in msg.text and errors.append(msg.text))
        sign_in(page, asgi_server, operator)
        page.goto(asgi_server + "/batches/")
        errors.clear()  # only this area's pages count
        page.set_input_files("input[name=file]", str(source))
        page.select_option("select[name=deployment]", str(dep.pk))
        page.fill("input[name=concurrency]", "2")
        page.click("#new-batch button")
        page.wait_for_url(asgi_server + "/batches/batch_*/")
        batch = Batch.objects.get()
        assert batch.concurrency == 2
        # live: the counters move without a reload, then the page shows the finished batch
        try:
            page.wait_for_function("() => Number(document.getElementById('batch-done').textContent) > 0",
                                   timeout=30000)
        finally:
            assert not errors, errors
        page.wait_for_function("() => document.getElementById('batch-remaining').textContent === '0'",
                               timeout=60000)
        wait_until(lambda: Batch.objects.get().status == "completed", 30, "completed")
        page.reload()
        assert "completed" in page.inner_text("#batch-status")
        page.fill("input[name=q]", "req-3")
        page.click("#line-search button")
        rows = page.inner_text("#lines-table tbody")
        assert "req-3" in rows and "req-30" in rows and "req-4\t" not in rows
        with page.expect_download() as download:
            page.click("#download-output")
        out = [json.loads(x) for x in open(download.value.path()).read().splitlines()]
        assert len(out) == 40 and {o["response"]["status_code"] for o in out} == {200}
        assert stub.peak <= 2
        assert BatchLine.objects.filter(status="done").count() == 40
        ARTIFACTS.mkdir(exist_ok=True)
        page.goto(asgi_server + f"/batches/{batch.pk}/")
        page.screenshot(path=str(ARTIFACTS / "batch_detail_1400.png"), full_page=True)
        page.goto(asgi_server + "/batches/")
        page.screenshot(path=str(ARTIFACTS / "batches_1400.png"), full_page=True)
        page.set_viewport_size({"width": 420, "height": 900})
        page.screenshot(path=str(ARTIFACTS / "batches_420.png"), full_page=True)
        page.goto(asgi_server + f"/batches/{batch.pk}/")
        page.screenshot(path=str(ARTIFACTS / "batch_detail_420.png"), full_page=True)


def test_only_the_owner_and_operators_see_a_batchs_files_and_lines(client, operator, viewer):
    from dashboard import services as accounts
    from inference.batches import services

    other, _ = accounts.account_create(username="vera", role="viewer")
    accounts.account_password_changed(user=other)
    f = services.file_from_text(jsonl([chat_line(0)]).decode(), user=other)
    batch = Batch.objects.create(user=other, endpoint="/v1/chat/completions", input_file=f, host="testhost",
                                 status="in_progress", total=1)
    BatchLine.objects.create(batch=batch, line=1, custom_id="secret-prompt-id", offset=0, length=1)
    client.force_login(viewer)
    answer = client.get(f"/batches/{batch.pk}/download/input")
    assert answer.status_code == 403
    page = client.get(f"/batches/{batch.pk}/").content.decode()
    assert batch.pk in page and "secret-prompt-id" not in page and "/download/" not in page
    for user in (other, operator):
        client.force_login(user)
        answer = client.get(f"/batches/{batch.pk}/download/input")
        assert answer.status_code == 200 and b"".join(answer.streaming_content) == jsonl([chat_line(0)])
        assert "secret-prompt-id" in client.get(f"/batches/{batch.pk}/").content.decode()
