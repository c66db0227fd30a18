"""Batch jobs: writes (files, batches, lines, resume) -- web and worker side."""

from __future__ import annotations

import datetime as dt
import logging
import os
import uuid

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext as _

from dashboard import jobs
from dashboard.celery import host_queue
from inference.batches import storage
from inference.batches.validate import ENDPOINTS, Checker, storable
from inference.models import Batch, BatchFile, BatchLine, Deployment, new_file_id

logger = logging.getLogger(__name__)
LINES_PER_INSERT = 2000
MAX_CONCURRENCY = 256
MAX_PACING_MS = 600_000
DEFAULT_CONCURRENCY = 4
WINDOWS = {"24h": dt.timedelta(hours=24)}


class Refused(ValueError):
    """Input the panel refuses; `code` is a stable identifier, `param` the field."""

    def __init__(self, message: str, code: str = "invalid_request", param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.code, self.param, self.status = message, code, param, status


def _uid(user):
    """A user or a user id (the API's views have only the id)."""
    return user if user is None or isinstance(user, int) else user.pk


# ---------------------------------------------------------------- files
def file_store(incoming: storage.Incoming, *, user, purpose: str = "batch") -> BatchFile:
    """Keep a received file if it is whole and valid; else discard it and raise Refused."""
    try:
        if purpose != "batch":
            raise Refused(_("purpose must be \"batch\": this panel stores batch input files only."), param="purpose")
        problem = incoming.problem()
        if problem:
            raise Refused(problem, "invalid_file", "file", 413 if incoming.too_large else 400)
        file_id = new_file_id()
        path = incoming.place(f"{file_id}.jsonl")
    except BaseException:
        incoming.discard()
        raise
    checker = incoming.checker
    return BatchFile.objects.create(
        id=file_id, user_id=_uid(user), filename=incoming.filename, purpose=purpose, path=path, bytes=incoming.size,
        sha256=incoming.sha.hexdigest(), lines=checker.lines, models_seen=checker.models, urls_seen=checker.urls)


def file_from_text(text: str, *, user, filename: str = "pasted.jsonl") -> BatchFile:
    incoming = storage.Incoming(filename)
    data = text.encode("utf-8")
    for i in range(0, len(data), 1 << 20):
        incoming.write(data[i:i + (1 << 20)])
    incoming.finish()
    return file_store(incoming, user=user)


def file_delete(f: BatchFile) -> None:
    if Batch.objects.filter(Q(input_file=f) | Q(output_file=f) | Q(error_file=f), status__in=Batch.RUNNING).exists():
        raise Refused(_("This file belongs to a batch that is still running; cancel the batch first."),
                      "file_in_use", status=409)
    try:
        os.unlink(f.path)
    except FileNotFoundError:
        pass
    f.delete()


# ---------------------------------------------------------------- batches (web side)
def _known_models() -> set[str]:
    return set(Deployment.objects.exclude(served_model_name="").values_list("served_model_name", flat=True))


def _lines(numbers) -> str:
    return ", ".join(str(n) for n in numbers)


def batch_create(*, user, input_file: BatchFile, endpoint: str, completion_window: str = "24h", metadata=None,
                 key=None, deployment: Deployment | None = None, concurrency: int = DEFAULT_CONCURRENCY,
                 pacing_ms: int = 0) -> Batch:
    """Check the batch against the panel (endpoint, models) and queue it; Refused with the lines to fix."""
    if input_file.purpose != "batch":
        raise Refused(_("input_file_id must name a file uploaded with purpose \"batch\"."), param="input_file_id")
    if endpoint not in ENDPOINTS:
        raise Refused(_("endpoint must be one of %(ok)s.") % {"ok": ", ".join(ENDPOINTS)}, param="endpoint")
    if completion_window not in WINDOWS:
        raise Refused(_("completion_window must be \"24h\"."), param="completion_window")
    if metadata is not None and (not isinstance(metadata, dict) or len(metadata) > 16 or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in metadata.items())):
        raise Refused(_("metadata must be an object of at most 16 string keys (64 characters) and string values "
                        "(512 characters)."), param="metadata")
    if metadata and not all(storable(k) and storable(v) for k, v in metadata.items()):
        raise Refused(_("metadata keys and values must not hold a NUL character (\\u0000) or a lone surrogate "
                        "(\\ud800-\\udfff)."), param="metadata")
    if not 1 <= int(concurrency) <= MAX_CONCURRENCY:
        raise Refused(_("concurrency must be between 1 and %(n)d.") % {"n": MAX_CONCURRENCY}, param="concurrency")
    if not 0 <= int(pacing_ms) <= MAX_PACING_MS:
        raise Refused(_("pacing must be between 0 and %(n)d ms.") % {"n": MAX_PACING_MS}, param="pacing_ms")
    problems = []
    for url, lines in sorted(input_file.urls_seen.items()):
        if url != endpoint:
            problems.append(_("lines %(lines)s have url %(url)s, but the batch's endpoint is %(endpoint)s") % {
                "lines": _lines(lines), "url": url, "endpoint": endpoint})
    default_model = deployment.served_model_name if deployment else ""
    known = _known_models()
    for model, lines in sorted(input_file.models_seen.items()):
        if not model and not default_model:
            problems.append(_("lines %(lines)s have no body.model; name the model (or pick a deployment on the "
                              "Batches page)") % {"lines": _lines(lines)})
        elif model and model not in known:
            problems.append(_("lines %(lines)s ask for model %(model)r, which no deployment on this panel serves "
                              "(served: %(known)s)") % {"lines": _lines(lines), "model": model,
                                                       "known": ", ".join(sorted(known)) or _("none")})
        elif model and key is not None and not key.allows(model):
            problems.append(_("lines %(lines)s ask for model %(model)r, which this key may not use") % {
                "lines": _lines(lines), "model": model})
    if problems:
        raise Refused(_("The batch was not started: %(problems)s.") % {"problems": "; ".join(problems)},
                      "invalid_batch", "input_file_id")
    if deployment is None:
        names = [m for m in input_file.models_seen if m]
        deployment = (Deployment.objects.filter(served_model_name__in=names)
                      .order_by(models_ready_first(), "-pk").first())
    now = timezone.now()
    with transaction.atomic():
        batch = Batch.objects.create(
            user_id=_uid(user), key=key, endpoint=endpoint, input_file=input_file, completion_window=completion_window,
            metadata=metadata, deployment=deployment, default_model=default_model,
            host=deployment.host if deployment else settings.HOST_NAME, concurrency=int(concurrency),
            pacing_ms=int(pacing_ms), total=input_file.lines, expires_at=now + WINDOWS[completion_window])
        _enqueue(batch)
    return batch


def models_ready_first():
    from django.db.models import Case, IntegerField, Value, When

    return Case(When(status=Deployment.Status.READY, then=Value(0)), default=Value(1), output_field=IntegerField())


def _enqueue(batch: Batch) -> None:
    from inference.batches.tasks import run_batch

    jobs.enqueue(run_batch, batch.pk, queue=host_queue(batch.host), on_refused=_refused)


def _refused(batch_id, reason):
    Batch.objects.filter(pk=batch_id).update(reason=reason)


def batch_cancel(batch: Batch) -> Batch:
    """Ask the runner to stop; a batch nobody runs is cancelled here at once."""
    if batch.is_finished or batch.status == Batch.Status.CANCELLING:
        return batch
    now = timezone.now()
    Batch.objects.filter(pk=batch.pk).update(cancel_requested=True, status=Batch.Status.CANCELLING,
                                             cancelling_at=now)
    batch.refresh_from_db()
    if batch.worker_gone():
        finish_cancelled(batch.pk)
        batch.refresh_from_db()
    return batch


def finish_cancelled(batch_id) -> None:
    with transaction.atomic():
        BatchLine.objects.filter(batch_id=batch_id, status__in=(BatchLine.Status.PENDING, BatchLine.Status.SENDING)
                                 ).update(status=BatchLine.Status.CANCELLED)
        Batch.objects.filter(pk=batch_id).update(status=Batch.Status.CANCELLED, cancelled_at=timezone.now(),
                                                 claim="", pid=None)
    notify(batch_id)


def batch_resume(batch: Batch) -> Batch:
    """Run again the lines a cancelled (or stuck) batch did not send; lines with a result are never sent again."""
    if batch.status not in (Batch.Status.CANCELLED, Batch.Status.PAUSED, Batch.Status.IN_PROGRESS,
                            Batch.Status.FAILED):
        raise Refused(_("Only a cancelled, failed or paused batch can be resumed."), "not_resumable", status=409)
    if batch.status != Batch.Status.CANCELLED and not batch.worker_gone():
        return batch  # its runner is alive and resumes by itself
    with transaction.atomic():
        BatchLine.objects.filter(batch=batch, status=BatchLine.Status.CANCELLED).update(
            status=BatchLine.Status.PENDING)
        Batch.objects.filter(pk=batch.pk).update(
            status=Batch.Status.IN_PROGRESS if batch.in_progress_at else Batch.Status.VALIDATING,
            cancel_requested=False, cancelled_at=None, cancelling_at=None, completed_at=None, reason="",
            claim="", pid=None)
        batch.refresh_from_db()
        _enqueue(batch)
    return batch


def resume_interrupted(*, host) -> int:
    """At worker start: queue again the batches of this host whose runner died."""
    count = 0
    for batch in Batch.objects.filter(host=host, status__in=Batch.RUNNING):
        if batch.claim and not batch.worker_gone():
            continue
        if batch.claim and not Batch.objects.filter(pk=batch.pk, claim=batch.claim).update(claim="", pid=None):
            continue
        logger.info("resuming batch %s, abandoned by %s", batch.pk, batch.worker or "nobody")
        _enqueue(batch)
        count += 1
    return count


# ---------------------------------------------------------------- worker side
def claim_batch(batch_id, worker: str) -> str | None:
    """Take the batch for this process; None when it is finished or another live runner has it."""
    batch = Batch.objects.filter(pk=batch_id).first()
    if batch is None or batch.is_finished:
        return None
    if batch.claim and not batch.worker_gone():
        return None
    token = uuid.uuid4().hex
    taken = jobs.claim(Batch.objects.filter(pk=batch.pk, claim=batch.claim, status=batch.status),
                       claim=token, worker=worker, pid=os.getpid(), heartbeat=timezone.now())
    return token if taken else None


def prepare_lines(batch: Batch) -> None:
    """validating -> in_progress: one BatchLine per request line (offsets, never the text), the output files."""
    BatchLine.objects.filter(batch=batch).delete()  # a validation cut short by a crash starts over
    path = batch.input_file.path
    checker = Checker()
    rows, offset, number = [], 0, 0
    with open(path, "rb") as f:
        for raw in f:
            number += 1
            start, offset = offset, offset + len(raw)
            text = raw.rstrip(b"\r\n")
            if not text.strip():
                continue
            found = _custom_id(text)
            rows.append(BatchLine(batch=batch, line=number, custom_id=found, offset=start, length=len(text)))
            if len(rows) >= LINES_PER_INSERT:
                BatchLine.objects.bulk_create(rows)
                rows = []
    if rows:
        BatchLine.objects.bulk_create(rows)
    del checker
    out = BatchFile.objects.create(user=batch.user, filename=f"{batch.pk}_output.jsonl",
                                   purpose=BatchFile.Purpose.OUTPUT, path="")
    err = BatchFile.objects.create(user=batch.user, filename=f"{batch.pk}_error.jsonl",
                                   purpose=BatchFile.Purpose.OUTPUT, path="")
    for f in (out, err):
        f.path = str(storage.folder() / f"{f.id}.jsonl")
        open(f.path, "wb").close()
        f.save(update_fields=["path"])
    total = BatchLine.objects.filter(batch=batch).count()
    Batch.objects.filter(pk=batch.pk).update(status=Batch.Status.IN_PROGRESS, in_progress_at=timezone.now(),
                                             total=total, output_file=out, error_file=err, output_size=0,
                                             error_size=0)


def _custom_id(text: bytes) -> str:
    import json

    return json.loads(text)["custom_id"]


def recover(batch: Batch) -> None:
    """Before a run: cut the output files back to their committed size (bytes of
    lines whose result was not recorded) and put lines that were being sent back
    to pending (they have no recorded result, so sending them again is right)."""
    for f, size in ((batch.output_file, batch.output_size), (batch.error_file, batch.error_size)):
        if f is not None and os.path.exists(f.path) and os.path.getsize(f.path) != size:
            with open(f.path, "r+b") as handle:
                handle.truncate(size)
                os.fsync(handle.fileno())
    BatchLine.objects.filter(batch=batch, status=BatchLine.Status.SENDING).update(status=BatchLine.Status.PENDING)


def finish(batch_id) -> None:
    """After a run: completed when every line has a result, cancelled when asked."""
    batch = Batch.objects.get(pk=batch_id)
    if batch.cancel_requested:
        finish_cancelled(batch_id)
        return
    left = BatchLine.objects.filter(batch_id=batch_id, status__in=(BatchLine.Status.PENDING,
                                                                    BatchLine.Status.SENDING)).exists()
    if left:
        return
    now = timezone.now()
    Batch.objects.filter(pk=batch_id).update(status=Batch.Status.COMPLETED, finalizing_at=now, completed_at=now,
                                             reason="", claim="", pid=None)
    notify(batch_id)


def owner_stop_reason(user_id, key_id, *, had_user: bool = False, had_key: bool = False) -> str | None:
    """Why a batch may not go on for its owner: its API key revoked or deleted, its
    user disabled or deleted (`had_user`/`had_key`: the run started with one that
    the row no longer names). None when it may go on."""
    from django.contrib.auth import get_user_model

    from inference.models import ApiKey

    if key_id is not None:
        key = ApiKey.objects.filter(pk=key_id).values("revoked").first()
        if key is None or key["revoked"] is not None:
            return _("The API key that started this batch was revoked; the batch was stopped.")
    elif had_key:
        return _("The API key that started this batch was deleted; the batch was stopped.")
    if user_id is not None:
        user = get_user_model().objects.filter(pk=user_id).values("is_active").first()
        if user is None:
            return _("The user who started this batch was deleted; the batch was stopped.")
        if not user["is_active"]:
            return _("The user who started this batch was disabled; the batch was stopped.")
    elif had_user:
        return _("The user who started this batch was deleted; the batch was stopped.")
    return None


def stop_for_owner(batch_id, reason: str) -> None:
    """Fail the batch with `reason` (also in OpenAI's `errors`); lines without a result are not sent."""
    Batch.objects.filter(pk=batch_id).update(
        errors={"object": "list", "data": [{"code": "owner_not_allowed", "message": str(reason), "param": None,
                                            "line": None}]})
    fail(batch_id, str(reason))


def fail(batch_id, reason: str) -> None:
    Batch.objects.filter(pk=batch_id).update(status=Batch.Status.FAILED, failed_at=timezone.now(), reason=reason,
                                             claim="", pid=None)
    notify(batch_id)


def notify(batch_id) -> None:
    """Tell open pages (and alerts, where that module exists) how the batch ended or paused."""
    batch = Batch.objects.filter(pk=batch_id).first()
    if batch is None:
        return
    from inference.batches.schemas import batch_progress

    jobs.publish({"type": "batch", **batch_progress(batch)})
    raise_alert(batch)


def raise_alert(batch: Batch) -> None:
    """One alert when a batch ends or pauses (monitoring/alerts; never breaks the batch)."""
    from monitoring.alerts import events

    # A pause (its deployment went away; it resumes by itself) is not a failure: as "failed" it
    # misread, and a real failure within a minute was merged into it as a repeat and never sent.
    kind = {"completed": "batch_finished", "cancelled": "batch_finished", "paused": "batch_paused",
            "failed": "batch_failed", "expired": "batch_failed"}.get(batch.status)
    if kind is None:
        return
    subjects = {
        "completed": _("Batch %(id)s completed: %(completed)d of %(total)d requests succeeded"),
        "cancelled": _("Batch %(id)s was cancelled"),
        "paused": _("Batch %(id)s paused: %(reason)s"),
        "failed": _("Batch %(id)s failed: %(reason)s"),
        "expired": _("Batch %(id)s expired before it finished"),
    }
    subject = subjects[batch.status] % {"id": batch.pk, "completed": batch.completed, "total": batch.total,
                                        "reason": batch.reason or "-"}
    events.raise_event(kind, subject=subject, link=f"/batches/{batch.pk}/",
                       host=batch.host, details={"batch_id": batch.pk, "status": batch.status,
                                                 "reason": batch.reason, "completed": batch.completed,
                                                 "failed": batch.failed, "total": batch.total})
