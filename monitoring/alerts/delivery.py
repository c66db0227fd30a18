"""Deliver: claim a delivery row, send it, record the attempt, retry with backoff.

Celery carries only the delivery's id (``monitoring.alerts.deliver``). A failed
attempt is retried after 5 s, 10 s, 20 s ... (doubling, at most 10 min) up to
MAX_ATTEMPTS, through a Celery countdown; ``deliver_due`` is the backstop that
every monitor runs on its own thread (not the sampling loop) every few
seconds: it sends whatever is due and unclaimed, so alerts still go out when no
worker runs (the "no worker" alert itself) or Redis lost a message. The claim
(a conditional update) makes sure each attempt is made once.
"""
from __future__ import annotations

import datetime as dt
import logging
import queue as queue_module
import time

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from monitoring.alerts import channels
from monitoring.alerts.models import AlertDelivery

log = logging.getLogger("kiln.alerts")

MAX_ATTEMPTS = 6
BASE_DELAY_S = 5.0
MAX_DELAY_S = 600.0
# A "sending" claim older than this belongs to a process that died mid-send.
STALE_CLAIM_S = 60.0
# The backstop leaves a fresh delivery to the worker for this long first.
BACKSTOP_AFTER_S = 5.0
# Each attempt's error in the attempt log is cut to this (the row's last error keeps more).
ATTEMPT_ERROR_CHARS = 300


def backoff_s(attempts: int) -> float:
    return min(MAX_DELAY_S, BASE_DELAY_S * 2 ** max(0, attempts - 1))


_local: "queue_module.SimpleQueue | None" = None


def listen_locally() -> "queue_module.SimpleQueue":
    """In the monitor: new delivery ids also go to this queue, which the monitor's alert
    thread reads to send at once (one hop less than a worker; whoever claims first sends)."""
    global _local
    if _local is None:
        _local = queue_module.SimpleQueue()
    return _local


def queue(ids, countdown: float | None = None) -> None:
    """Send each delivery id to a worker. A broker that does not answer is only
    logged: the rows stay pending and the monitors' backstop sends them."""
    from dashboard import jobs
    from monitoring.alerts.tasks import deliver

    if _local is not None and not countdown:
        # This monitor's alert thread sends now; the worker gets the id a little later, as a
        # safety net should this process die first (by then the claim makes it a no-op).
        _local.put(list(ids))
        countdown = BACKSTOP_AFTER_S

    for pk in ids:
        if countdown:
            try:
                deliver.apply_async((pk,), queue=settings.CELERY_TASK_DEFAULT_QUEUE, countdown=countdown)
            except jobs.BROKER_ERRORS as exc:
                log.warning("alert delivery %s not queued (%s); the backstop will send it", pk, exc)
        else:
            jobs.send(deliver, pk, queue=settings.CELERY_TASK_DEFAULT_QUEUE,
                      on_refused=lambda row_id, why: log.warning("alert delivery %s: %s", row_id, why))


def claim(delivery_id: int) -> "dt.datetime | None":
    """Take the row for one attempt; returns this claim's time (None when not taken), which the
    attempt's final update checks: a claim taken over as stale is no longer this sender's."""
    now = timezone.now()
    due = Q(status=AlertDelivery.Status.PENDING) & (Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
    stale = Q(status=AlertDelivery.Status.SENDING, claimed_at__lt=now - dt.timedelta(seconds=STALE_CLAIM_S))
    # A row whose attempts are used up (e.g. a worker died mid-send each time) fails instead of retrying forever.
    AlertDelivery.objects.filter(due | stale, pk=delivery_id, attempts__gte=MAX_ATTEMPTS).update(
        status=AlertDelivery.Status.FAILED, claimed_at=None, next_attempt_at=None)
    taken = AlertDelivery.objects.filter(due | stale, pk=delivery_id).update(
        status=AlertDelivery.Status.SENDING, claimed_at=now, attempts=F("attempts") + 1) > 0
    return now if taken else None


def deliver(delivery_id: int) -> str | None:
    """One attempt at one delivery. Returns its new status (None when not claimed, or when
    another sender took the claim over meanwhile)."""
    claimed_at = claim(delivery_id)
    if claimed_at is None:
        return None
    row = AlertDelivery.objects.select_related("channel", "event").get(pk=delivery_id)
    message = channels.message_for(row.event, test=row.is_test)
    started_at, started = timezone.now(), time.monotonic()
    outcome = channels.send(row.channel, message)
    now = timezone.now()
    log_entries = _attempt_log(row, started_at, outcome, time.monotonic() - started)
    fields = {"response_code": outcome.status, "error": outcome.error[:2000], "claimed_at": None,
              "attempt_log": log_entries}
    retry_in = None
    if outcome.ok:
        fields.update(status=AlertDelivery.Status.SENT, sent_at=now, next_attempt_at=None)
    elif row.attempts >= MAX_ATTEMPTS or row.is_test:
        fields.update(status=AlertDelivery.Status.FAILED, next_attempt_at=None)
    else:
        retry_in = backoff_s(row.attempts)
        fields.update(status=AlertDelivery.Status.PENDING, next_attempt_at=now + dt.timedelta(seconds=retry_in))
    # A send slower than STALE_CLAIM_S lets another sender reclaim the row; its record wins over ours.
    if not AlertDelivery.objects.filter(pk=row.pk, status=AlertDelivery.Status.SENDING,
                                        claimed_at=claimed_at).update(**fields):
        log.warning("alert delivery %s: taken over by another sender during a %.0f s send; this attempt "
                    "(%s) is not recorded", row.pk, time.monotonic() - started, "ok" if outcome.ok else outcome.error)
        return None
    if retry_in is not None:
        log.info("alert delivery %s to %s failed (%s); retry %s in %g s", row.pk, row.channel, outcome.error,
                 row.attempts + 1, retry_in)
        queue([row.pk], countdown=retry_in)
    return fields["status"]


def _attempt_log(row, started_at, outcome, took_s: float) -> list[dict]:
    """The row's attempt log with this attempt added. Attempts counted by a claim whose process
    died before recording (a worker killed mid-send) get an entry saying so, so the log and
    the attempt count agree. A row without any log (its attempts made before the log existed)
    gets no filler: its earlier attempts were not lost, only never logged."""
    entries = [e for e in (row.attempt_log or []) if isinstance(e, dict)]
    while entries and len(entries) < row.attempts - 1:
        entries.append({"at": None, "ok": False, "code": None, "error": "", "ms": None, "lost": True})
    entries.append({"at": started_at.isoformat(), "ok": outcome.ok, "code": outcome.status,
                    "error": outcome.error[:ATTEMPT_ERROR_CHARS], "ms": round(took_s * 1000)})
    return entries[-MAX_ATTEMPTS:]


def due_ids(limit: int = 20, *, grace_s: float = BACKSTOP_AFTER_S) -> list[int]:
    now = timezone.now()
    fresh_enough = now - dt.timedelta(seconds=grace_s)
    pending = Q(status=AlertDelivery.Status.PENDING) & (
        Q(next_attempt_at__isnull=True, created__lte=fresh_enough)
        | Q(next_attempt_at__lte=now - dt.timedelta(seconds=grace_s)))
    stale = Q(status=AlertDelivery.Status.SENDING, claimed_at__lt=now - dt.timedelta(seconds=STALE_CLAIM_S))
    return list(AlertDelivery.objects.filter(pending | stale).order_by("pk").values_list("pk", flat=True)[:limit])


def deliver_due(limit: int = 20, *, grace_s: float = BACKSTOP_AFTER_S, stop=None) -> int:
    """Send what is due and was not picked up by a worker; returns attempts made.
    ``stop`` (a threading.Event) ends the round between two deliveries."""
    made = 0
    for pk in due_ids(limit, grace_s=grace_s):
        if stop is not None and stop.is_set():
            break
        try:
            if deliver(pk) is not None:
                made += 1
        except Exception:  # noqa: BLE001 - one bad row must not stop the rest
            log.exception("alert delivery %s failed", pk)
    return made
