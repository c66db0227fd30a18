"""Per-line retries through the real runner (the Celery task's body, run in this
process so that the per-request timeout and the backoff can be short), against
the counting stub engine: a timeout and a dropped connection are retried with
backoff and then succeed; lines that keep failing (503, timeout, dropped)
end in the error file with the reason; the other lines succeed, each sent once,
and the batch is never paused for one line's trouble."""

import json

import pytest

from inference.batches import services, tasks
from inference.batches.runner import Runner
from inference.models import Batch, BatchLine
from tests.batches.stub import running
from tests.batches.test_api import chat_line, deployment, jsonl

pytestmark = pytest.mark.timeout(120)
# BATCH_REQUEST_TIMEOUT_S applies to every line: an ordinary 10 ms answer must never reach it, even on
# a loaded 2-core CI machine (at 0.5 s one did, and was retried); the stub's slow answers take SLOW_S.
TIMEOUT_S = 2.5
SLOW_S = 15.0
BACKOFF_S = 0.2  # BATCH_BACKOFF_S: waits of 0.2, 0.4, 0.8 s, each times 0.5 to 1 (jitter)
ATTEMPTS = 4


@pytest.fixture
def quick_retries(settings):
    settings.BATCH_REQUEST_TIMEOUT_S = TIMEOUT_S
    settings.BATCH_BACKOFF_S = BACKOFF_S
    settings.BATCH_MAX_ATTEMPTS = ATTEMPTS


@pytest.fixture
def pauses(monkeypatch):
    """Every reason the runner paused the batch for."""
    seen = []
    original = Runner._set_paused

    def record(self, reason):
        seen.append(reason)
        return original(self, reason)

    monkeypatch.setattr(Runner, "_set_paused", record)
    return seen


def gaps(times):
    return [b - a for a, b in zip(times, times[1:])]


def lines_of(f):
    with open(f.path) as handle:
        return [json.loads(x) for x in handle.read().splitlines()]


def test_timeouts_and_dropped_connections_are_retried_with_backoff_and_lines_that_keep_failing_go_to_the_error_file(
        transactional_db, redis_clean, operator, quick_retries, pauses):
    texts = {f"req-{i}": f"line {i}" for i in range(8)}
    texts.update({
        "timed-out-twice": "slow-2 answers the third time",
        "dropped-twice": "drop-2 answers the third time",
        "always-busy": "flaky-99 never answers",
        "always-slow": "slow-99 never answers",
        "always-dropped": "drop-99 never answers",
    })
    with running(delay=0.01, slow=SLOW_S) as stub:
        deployment(stub.port)
        f = services.file_from_text(jsonl([dict(chat_line(0, text=text), custom_id=cid)
                                           for cid, text in texts.items()]).decode(), user=operator)
        batch = services.batch_create(user=operator, input_file=f, endpoint="/v1/chat/completions")
        tasks.run_batch(batch.pk)  # what the worker runs: claim, lines, runner, finish

        done = Batch.objects.get(pk=batch.pk)
        assert done.status == "completed", done.reason
        assert (done.completed, done.failed) == (10, 3)
        assert pauses == [], "one line's timeout or dropped connection paused the whole batch"
        line = {x.custom_id: x for x in BatchLine.objects.filter(batch=done)}

        # other lines: answered the first time, sent once
        for cid, text in texts.items():
            if cid.startswith("req-"):
                assert stub.seen[text] == 1 and line[cid].attempts == 1 and line[cid].status == "done", cid

        # a timeout: the request is abandoned after BATCH_REQUEST_TIMEOUT_S and sent again after a backoff
        slow = stub.arrivals["slow-2 answers the third time"]
        assert len(slow) == 3 and line["timed-out-twice"].attempts == 3
        assert line["timed-out-twice"].status == "done"
        for k, gap in enumerate(gaps(slow), start=1):
            assert gap >= TIMEOUT_S + 0.5 * BACKOFF_S * 2 ** (k - 1) - 0.02, (k, gap)
            assert gap < SLOW_S, "the runner waited for the slow answer instead of timing out"

        # a dropped connection: the gateway's pool sends once more on a fresh connection at once
        # (a closed keep-alive connection), then the runner retries the line after a backoff
        dropped = stub.arrivals["drop-2 answers the third time"]
        assert len(dropped) == 3 and line["dropped-twice"].attempts == 2
        assert line["dropped-twice"].status == "done"
        assert gaps(dropped)[1] >= 0.5 * BACKOFF_S - 0.02

        # a line that keeps failing is tried BATCH_MAX_ATTEMPTS times, waits doubling each time
        busy = stub.arrivals["flaky-99 never answers"]
        assert len(busy) == ATTEMPTS and line["always-busy"].attempts == ATTEMPTS
        for k, gap in enumerate(gaps(busy), start=1):
            assert 0.5 * BACKOFF_S * 2 ** (k - 1) - 0.02 <= gap, (k, gap)
        assert gaps(busy)[-1] >= 2 * BACKOFF_S - 0.02  # doubled: the first wait is at most BACKOFF_S
        assert len(stub.arrivals["slow-99 never answers"]) == ATTEMPTS
        assert len(stub.arrivals["drop-99 never answers"]) == 2 * ATTEMPTS  # each attempt: the pool's one resend

        # the error file: the failed lines, each with the reason
        errors = {e["custom_id"]: e for e in lines_of(done.error_file)}
        assert sorted(errors) == ["always-busy", "always-dropped", "always-slow"]
        busy_line = errors["always-busy"]
        assert busy_line["response"]["status_code"] == 503
        assert busy_line["response"]["body"]["error"]["message"] == "busy, try later"
        assert line["always-busy"].error == "HTTP 503: busy, try later"
        slow_line = errors["always-slow"]
        assert slow_line["response"] is None and slow_line["error"]["code"] == "timeout"
        assert f"{TIMEOUT_S:g} s" in slow_line["error"]["message"]
        dropped_line = errors["always-dropped"]
        assert dropped_line["response"] is None and dropped_line["error"]["code"] == "connection_error"
        assert line["always-dropped"].error.startswith("connection_error: ")
        for cid in errors:
            assert line[cid].status == "failed" and line[cid].attempts == ATTEMPTS

        # the output file: every line that succeeded, once
        out = lines_of(done.output_file)
        assert sorted(o["custom_id"] for o in out) == sorted(set(texts) - set(errors))
        assert all(o["response"]["status_code"] == 200 and o["error"] is None for o in out)
