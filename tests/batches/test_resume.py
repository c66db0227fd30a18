"""Nothing lost, nothing twice: a worker killed with SIGKILL mid-batch, a
deployment that crashes mid-batch, and a cancelled batch resumed with the
page's Resume button, against the counting stub engine."""

import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import openai
import pytest
from django.conf import settings
from django.test import Client

from inference.batches import services
from inference.gateway import keys
from inference.models import Batch, BatchLine
from tests.batches.stub import running
from tests.batches.test_api import chat_line, deployment, jsonl
from tests.helpers import REPO, child_env, stop_group, wait_until

pytestmark = pytest.mark.timeout(240)
CONCURRENCY = 4


def start_worker(log):
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "dashboard", "worker", "-Q", f"default,host.{settings.HOST_NAME}",
         "-n", f"again@{settings.HOST_NAME}", "--pool", "solo", "--without-mingle", "--without-gossip", "-l", "INFO"],
        cwd=REPO, env=child_env(), stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    wait_until(lambda: b" ready." in log.read_bytes() or process.poll() is not None, 60, "worker start")
    assert process.poll() is None, log.read_text()
    return process


@pytest.fixture
def api(asgi_server, operator):
    _, secret = keys.key_create(user=operator, name="batch", rate_limit=0)
    return openai.OpenAI(base_url=asgi_server + "/v1", api_key=secret, max_retries=0, timeout=60)


def outputs(api, batch):
    return [json.loads(x) for x in api.files.content(batch.output_file_id).text.splitlines()]


def test_sigkill_of_the_worker_mid_batch_loses_nothing_and_sends_no_recorded_line_again(
        api, celery_worker, tmp_path):
    n = 300  # 300 lines at 0.08 s and concurrency 4: 6 s, so the kill lands mid-batch on a slow machine
    with running(delay=0.08) as stub:
        deployment(stub.port)
        f = api.files.create(file=("in.jsonl", io.BytesIO(jsonl([chat_line(i) for i in range(n)]))),
                             purpose="batch")
        batch = api.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        wait_until(lambda: Batch.objects.get(pk=batch.id).completed >= 60, 60, "a part done")
        os.killpg(celery_worker.pid, signal.SIGKILL)
        celery_worker.wait()
        sent_before = stub.requests
        recorded = set(BatchLine.objects.filter(batch_id=batch.id, status="done").values_list("custom_id", flat=True))
        assert 60 <= len(recorded) < n
        assert Batch.objects.get(pk=batch.id).status == "in_progress"  # nobody is running it now

        worker = start_worker(tmp_path / "worker2.log")  # the restarted panel's worker resumes it
        try:
            done = wait_until(lambda: (b := api.batches.retrieve(batch.id)).status == "completed" and b, 90,
                              "resumed batch completed")
        finally:
            stop_group(worker)
        assert "resuming batch" in (tmp_path / "worker2.log").read_text()

        ids = [o["custom_id"] for o in outputs(api, done)]
        assert sorted(ids) == sorted(f"req-{i}" for i in range(n))  # every line once: none lost, none twice
        assert done.request_counts.completed == n and done.request_counts.failed == 0
        for i in range(n):  # a line whose result was recorded was never sent again
            if f"req-{i}" in recorded:
                assert stub.seen[f"line {i}"] == 1, i
            else:
                assert stub.seen[f"line {i}"] in (1, 2), i
        # only lines in flight (or answered but not yet recorded) at the kill reached the engine twice
        twice = [i for i in range(n) if stub.seen[f"line {i}"] == 2]
        assert len(twice) == stub.requests - n
        assert len(twice) <= sent_before - len(recorded)
        assert stub.peak <= CONCURRENCY


def test_a_deployment_that_crashes_mid_batch_pauses_it_with_the_reason_and_it_resumes(api, celery_worker, tmp_path):
    # 120 lines at 0.2 s and concurrency 4 take 6 s: the runner records results about once a second, so
    # the crash lands with most lines still to go even on a slow machine (at 0.03 s the whole batch could
    # finish before the first flush showed 20 done, and nothing was left to pause).
    n = 120
    with running(delay=0.2) as stub:
        deployment(stub.port)
        f = api.files.create(file=("in.jsonl", io.BytesIO(jsonl([chat_line(i) for i in range(n)]))),
                             purpose="batch")
        batch = api.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        wait_until(lambda: Batch.objects.get(pk=batch.id).completed >= 20, 60, "a part done")
        stub.crash()
        try:
            paused = wait_until(lambda: (b := Batch.objects.get(pk=batch.id)).status == "paused" and b, 60, "paused")
        except AssertionError:
            raise AssertionError((tmp_path / "worker.log").read_text()[-2500:]) from None
        assert "do not answer" in paused.reason or "ready" in paused.reason
        assert api.batches.retrieve(batch.id).status == "paused"
        stub.revive()
        done = wait_until(lambda: (b := api.batches.retrieve(batch.id)).status == "completed" and b, 60,
                          "resumed after the engine came back")
        assert sorted(o["custom_id"] for o in outputs(api, done)) == sorted(f"req-{i}" for i in range(n))
        assert done.request_counts.failed == 0


def resume_form(page: str, batch_id: str):
    """The Resume button's form on a batch page: (action, CSRF token), or None when the page has none."""
    form = re.search(r'<form method="post" action="([^"]*/resume)"[^>]*>\s*<input type="hidden" '
                     r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    if form is None:
        return None
    assert form.group(1) == f"/batches/{batch_id}/resume"
    return form.group(1), form.group(2)


def test_the_resume_button_sends_the_rest_of_a_cancelled_batch_once_and_only_operators_may_press_it(
        celery_worker, operator, viewer):
    n = 100  # 100 lines at 0.3 s and concurrency 4: 7.5 s, so the cancel lands mid-batch
    with running(delay=0.3) as stub:
        deployment(stub.port)
        f = services.file_from_text(jsonl([chat_line(i) for i in range(n)]).decode(), user=operator)
        batch = services.batch_create(user=operator, input_file=f, endpoint="/v1/chat/completions")
        wait_until(lambda: Batch.objects.get(pk=batch.pk).completed >= 4, 60, "a part done")
        services.batch_cancel(Batch.objects.get(pk=batch.pk))
        cancelled = wait_until(lambda: (b := Batch.objects.get(pk=batch.pk)).status == "cancelled" and b, 30,
                               "cancelled")
        kept = cancelled.completed
        assert 4 <= kept < n and BatchLine.objects.filter(batch=cancelled, status="cancelled").count() == n - kept
        sent = stub.requests

        browser = Client(enforce_csrf_checks=True)  # the page's own form, CSRF token and all
        browser.force_login(viewer)
        page = browser.get(f"/batches/{batch.pk}/").content.decode()
        assert "cancelled" in page.lower() and resume_form(page, batch.pk) is None  # no button for a viewer
        token = browser.get("/batches/").cookies["csrftoken"].value
        refused = browser.post(f"/batches/{batch.pk}/resume", {"csrfmiddlewaretoken": token})
        assert refused.status_code == 403
        assert "needs the operator role" in refused.content.decode()  # the role's refusal, not a CSRF failure
        time.sleep(1.5)  # a resume the viewer's POST queued would be running by now
        assert Batch.objects.get(pk=batch.pk).status == "cancelled" and stub.requests == sent

        browser.force_login(operator)
        action, token = resume_form(browser.get(f"/batches/{batch.pk}/").content.decode(), batch.pk)
        answer = browser.post(action, {"csrfmiddlewaretoken": token}, follow=True)
        assert answer.status_code == 200 and "Resumed" in answer.content.decode()
        done = wait_until(lambda: (b := Batch.objects.get(pk=batch.pk)).status == "completed" and b, 60,
                          "resumed batch completed")
        assert (done.completed, done.failed, done.total) == (n, 0, n)
        with open(done.output_file.path) as out:
            ids = [json.loads(x)["custom_id"] for x in out.read().splitlines()]
        assert sorted(ids) == sorted(f"req-{i}" for i in range(n))  # every line once
        assert BatchLine.objects.filter(batch=done).exclude(status="done").count() == 0
        # the lines answered before the cancel were not sent again; the others were sent once
        assert stub.requests == n and all(stub.seen[f"line {i}"] == 1 for i in range(n))
        assert stub.peak <= CONCURRENCY
