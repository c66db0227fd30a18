"""Events raised by the code that sees them, not by calling raise_event here: the library's
download run (a file the hub does not have, bytes that do not match the hub's hash) and the
batch service (finish, fail) and runner (pause). Each event has its severity and link, and a
rule routes it to a channel whose receiver gets it."""
import pytest
from django.conf import settings

from monitoring.alerts import delivery
from monitoring.alerts.models import AlertChannel, AlertDelivery, AlertEvent, AlertRule, Severity
from tests.fakehub import FakeFile, FakeHub

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def queued(monkeypatch):
    """The ids raise_event queues (no Redis here); the test delivers them itself."""
    ids = []
    monkeypatch.setattr("monitoring.alerts.delivery.queue", lambda pks, countdown=None: ids.extend(pks))
    return ids


@pytest.fixture
def routed(receiver):
    """A webhook channel to the loopback receiver and a rule that sends it every event from info up."""
    channel = AlertChannel(name="ops", kind="webhook")
    channel.url = receiver.url + "/hook"
    channel.save()
    rule = AlertRule.objects.create(name="everything", min_severity=Severity.INFO, cooldown_s=600)
    rule.channels.set([channel])
    return channel


def sent_to(receiver, event, channel):
    """Deliver the event's one delivery to the channel; returns the body the receiver got."""
    d = AlertDelivery.objects.get(event=event)
    assert d.channel_id == channel.pk and d.status == "pending"
    assert delivery.deliver(d.pk) == "sent"
    body = receiver.get().json()
    assert body["event_id"] == event.pk and body["kind"] == event.kind
    return body


# ------------------------------------------------------------------ library


@pytest.fixture
def hub():
    h = FakeHub()
    h.add_repo("org/Small", {"model.safetensors": FakeFile.of_bytes(bytes(range(256)) * 512)})
    with h:
        yield h


def download_row(hub, tmp_path, path, **file_fields):
    from inference.models import ModelArtifact

    served = hub.repos["org/Small"].revisions["main"].get(path)
    files = [{"path": path, "size": served.size if served else 10,
              "url": f"{hub.url}/org/Small/resolve/main/{path}",
              "sha256": served.sha256 if served else None, "git_sha1": None, **file_fields}]
    return ModelArtifact.objects.create(
        name="org/Small", source="hf", repo_id="org/Small", revision="main", endpoint=hub.url,
        host=settings.HOST_NAME, folder=str(tmp_path / "small"), path=str(tmp_path / "small"),
        status="queued", job="download", files=files)


def test_a_download_that_fails_raises_download_failed_to_the_rules_channel(hub, tmp_path, routed, receiver):
    from inference.library import services

    artifact = download_row(hub, tmp_path, "gone.bin")  # listed, but the hub has no such file
    services.model_download_run(artifact_id=artifact.pk, worker="test")
    artifact.refresh_from_db()
    assert artifact.status == "failed" and "404" in artifact.error
    event = AlertEvent.objects.get()
    assert event.kind == "download_failed" and event.severity == Severity.WARNING
    assert event.link == f"/models/{artifact.pk}/" and "org/Small" in event.subject
    assert event.host == settings.HOST_NAME and event.details["artifact_id"] == artifact.pk
    assert "404" in event.details["error"]
    body = sent_to(receiver, event, routed)
    assert body["severity"] == "warning" and body["link"] == f"/models/{artifact.pk}/"


def test_downloaded_bytes_that_do_not_match_the_hubs_hash_raise_verify_failed(hub, tmp_path, routed, receiver):
    from inference.library import services

    hub.corrupt["model.safetensors"] = 2  # one wrong byte, both tries
    artifact = download_row(hub, tmp_path, "model.safetensors")
    services.model_download_run(artifact_id=artifact.pk, worker="test")
    artifact.refresh_from_db()
    assert artifact.status == "failed" and "do not match the hub's hash" in artifact.error
    event = AlertEvent.objects.get()
    assert event.kind == "verify_failed" and event.severity == Severity.CRITICAL
    assert event.link == f"/models/{artifact.pk}/" and "failed verification" in event.subject
    body = sent_to(receiver, event, routed)
    assert body["severity"] == "critical"


# ------------------------------------------------------------------ batches


@pytest.fixture
def batch(operator, tmp_path):
    from inference.batches import services
    from inference.models import Batch, BatchFile

    line = '{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"hi"}]}}\n'
    source = services.file_from_text(line, user=operator)
    out, err = (BatchFile.objects.create(user=operator, filename=n, purpose=BatchFile.Purpose.OUTPUT,
                                         path=str(tmp_path / n)) for n in ("out.jsonl", "err.jsonl"))
    return Batch.objects.create(user=operator, endpoint="/v1/chat/completions", input_file=source, output_file=out,
                                error_file=err, host=settings.HOST_NAME, status="in_progress", total=1,
                                claim="mine")


def pause(batch, reason="deployment “m” is no longer ready"):
    """The runner's own pause (what it does when the deployment goes away mid-batch)."""
    from inference.batches.runner import Runner

    runner = Runner(batch)
    try:
        runner._set_paused(reason)
    finally:
        runner.db.shutdown(wait=True)


def test_a_finished_batch_raises_batch_finished(batch, routed, receiver):
    from inference.batches import services

    services.finish(batch.pk)  # no line left without a result: completed
    batch.refresh_from_db()
    assert batch.status == "completed"
    event = AlertEvent.objects.get()
    assert event.kind == "batch_finished" and event.severity == Severity.INFO
    assert event.link == f"/batches/{batch.pk}/" and batch.pk in event.subject
    assert event.details["batch_id"] == batch.pk and event.details["status"] == "completed"
    assert sent_to(receiver, event, routed)["severity"] == "info"


def test_a_failed_batch_raises_batch_failed_with_the_reason(batch, routed, receiver):
    from inference.batches import services

    services.fail(batch.pk, "the input file is gone")
    event = AlertEvent.objects.get()
    assert event.kind == "batch_failed" and event.severity == Severity.WARNING
    assert event.link == f"/batches/{batch.pk}/" and event.details["reason"] == "the input file is gone"
    assert sent_to(receiver, event, routed)["severity"] == "warning"


def test_a_pause_is_not_a_failure_and_a_real_failure_after_it_is_sent(batch, routed, receiver):
    from inference.batches import services

    pause(batch)
    paused = AlertEvent.objects.get()
    assert paused.kind == "batch_paused" and paused.link == f"/batches/{batch.pk}/"
    assert "no longer ready" in paused.details["reason"]
    sent_to(receiver, paused, routed)
    # Failing a few seconds later is its own event (it was merged into the pause as a repeat), and it is sent.
    services.fail(batch.pk, "the owner's API key was revoked")
    failed = AlertEvent.objects.exclude(pk=paused.pk).get()
    assert failed.kind == "batch_failed" and failed.details["reason"] == "the owner's API key was revoked"
    sent_to(receiver, failed, routed)


def test_a_paused_batch_that_completes_reads_as_finished_not_failed(batch, routed, receiver):
    from inference.batches import services
    from inference.models import Batch

    pause(batch)
    Batch.objects.filter(pk=batch.pk).update(status="in_progress", reason="")  # its deployment is back
    services.finish(batch.pk)
    assert list(AlertEvent.objects.order_by("pk").values_list("kind", flat=True)) == ["batch_paused",
                                                                                      "batch_finished"]
    finished = AlertEvent.objects.get(kind="batch_finished")
    assert AlertDelivery.objects.get(event=finished).status == "pending"  # not held back by the pause
