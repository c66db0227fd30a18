"""``raise_event``: the one way any part of Kiln says "something broke" (or cleared).

    from monitoring.alerts.events import raise_event
    raise_event("engine_crashed", severity="critical", subject="...", link="/deployments/3/",
                host="gpu1", deployment=3)
    raise_event("engine_crashed", resolved=True, subject="...", deployment=3)

It writes an event row and one delivery row per channel the rules route it to,
and queues each delivery (Celery carries only its id) once the transaction
commits. It never sends anything itself, never raises (a failure is logged),
and costs a few database writes. Code on a latency path (the monitor's
sampling loop) calls ``raise_event_nowait``, which hands the same call to one
background thread and returns at once.

Incidents: an event is keyed by (kind, key); the key defaults to the scope
(GPU uuid from details, deployment id, host). While an event of that key is
open, raising it again counts a repeat and sends nothing; ``resolved=True``
closes it and sends a "resolved" message where the opening went. Kinds that
never clear (an Xid, a finished batch) are never open; the same
one again within a minute only counts a repeat, and a rule's cooldown keeps
them to one message per incident.
"""
from __future__ import annotations

import datetime as dt
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from django.db import IntegrityError, OperationalError, close_old_connections, transaction
from django.db.models import F
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from monitoring.alerts.models import AlertDelivery, AlertEvent, AlertRule, Severity

log = logging.getLogger("kiln.alerts")


@dataclass(frozen=True)
class Kind:
    label: object
    severity: int
    clears: bool  # has a "resolved" state (else closed at once; cooldown dedups)


KINDS: dict[str, Kind] = {
    "engine_crashed": Kind(_("Engine crashed"), Severity.CRITICAL, True),
    "engine_failed": Kind(_("Engine failed to start or crash loop"), Severity.CRITICAL, True),
    "deployment_unhealthy": Kind(_("Deployment unhealthy"), Severity.WARNING, True),
    "gpu_xid": Kind(_("GPU Xid error"), Severity.CRITICAL, False),
    "gpu_slowdown": Kind(_("GPU thermal or hardware slowdown"), Severity.WARNING, True),
    "gpu_pcie_downgraded": Kind(_("PCIe link below its maximum"), Severity.WARNING, True),
    "gpu_ecc": Kind(_("Uncorrectable ECC error or row remapping pending"), Severity.CRITICAL, True),
    "gpu_memory_full": Kind(_("GPU memory nearly full"), Severity.WARNING, True),
    "disk_low": Kind(_("Free disk space low"), Severity.WARNING, True),
    "download_failed": Kind(_("Download failed"), Severity.WARNING, False),
    "verify_failed": Kind(_("File failed verification"), Severity.CRITICAL, False),
    "batch_finished": Kind(_("Batch finished"), Severity.INFO, False),
    "batch_failed": Kind(_("Batch failed"), Severity.WARNING, False),
    # Its deployment went away; it resumes when that is ready again (its own kind: a pause is no failure).
    "batch_paused": Kind(_("Batch paused"), Severity.WARNING, False),
    "experiment_finished": Kind(_("Experiment finished"), Severity.INFO, False),
    "experiment_failed": Kind(_("Experiment failed"), Severity.WARNING, False),
    "host_offline": Kind(_("Host monitor silent (host offline)"), Severity.CRITICAL, True),
    "no_worker": Kind(_("No worker for a host's queue"), Severity.CRITICAL, True),
    "test": Kind(_("Test message"), Severity.INFO, False),
}
# The same one-shot event (kind and scope) again within this many seconds counts a repeat, no new row.
ONE_SHOT_MERGE_S = 60
SEVERITY_NAMES = {"info": Severity.INFO, "warning": Severity.WARNING, "critical": Severity.CRITICAL}


def kind_choices():
    return [(k, v.label) for k, v in KINDS.items() if k != "test"]


def _severity(value) -> int:
    if value is None:
        return None
    if isinstance(value, str):
        return int(SEVERITY_NAMES[value.lower()])
    return int(value)


def scope_key(*, host=None, deployment=None, details=None) -> str:
    details = details or {}
    for name in ("uuid", "path", "artifact_id", "batch_id", "experiment_id", "queue"):
        if details.get(name) not in (None, ""):
            return f"{name}:{details[name]}"
    if deployment is not None:
        return f"deployment:{deployment}"
    return f"host:{host or ''}"


def raise_event(kind: str, *, severity=None, subject: str = "", link: str = "", host: str | None = None,
                deployment: int | None = None, details: dict | None = None, resolved: bool = False,
                key: str | None = None, when: dt.datetime | None = None) -> AlertEvent | None:
    """Record an event and queue its deliveries. Returns the new event row, or
    None when nothing new was recorded (a repeat of an open incident, nothing
    open to resolve, or an error, which is logged)."""
    for attempt in range(4):
        try:
            return _raise(kind, severity=severity, subject=subject, link=link, host=host, deployment=deployment,
                          details=details, resolved=resolved, key=key, when=when)
        except OperationalError as exc:  # SQLite busy with the history writer: try again shortly
            if attempt == 3:
                log.error("alert %s (%s) not recorded: %s", kind, subject, exc)
                return None
            time.sleep(0.1 * 2 ** attempt)
        except Exception:  # noqa: BLE001 - an alert must never break the code that raised it
            log.exception("alert %s (%s) not recorded", kind, subject)
            return None


_executor: ThreadPoolExecutor | None = None


def raise_event_nowait(kind: str, **fields) -> Future:
    """``raise_event`` on a background thread: returns at once (for the sampling loop)."""
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(1, thread_name_prefix="kiln-alerts")

    def call():
        close_old_connections()
        try:
            return raise_event(kind, **fields)
        finally:
            close_old_connections()

    return _executor.submit(call)


def drain(timeout: float = 30.0) -> None:
    """Wait until every event handed to raise_event_nowait so far is written (tests, shutdown)."""
    if _executor is not None:
        _executor.submit(lambda: None).result(timeout=timeout)


def _raise(kind, *, severity, subject, link, host, deployment, details, resolved, key, when):
    if kind not in KINDS:
        raise ValueError(f"unknown alert kind {kind!r}: use one of {sorted(KINDS)}")
    spec = KINDS[kind]
    details = dict(details or {})
    key = key or scope_key(host=host, deployment=deployment, details=details)
    now = timezone.now()
    when = when or now
    if resolved:
        return _resolve(kind, key, subject, link, when, now)
    severity = _severity(severity) or spec.severity
    with transaction.atomic():
        if spec.clears:
            updated = AlertEvent.objects.filter(kind=kind, key=key, is_open=True).update(last_seen=now)
            if updated:
                _count_repeat(kind, key)
                return None
        else:
            # A storm of the same one-shot event (an Xid every tick) is one row with a repeat count.
            recent = AlertEvent.objects.filter(kind=kind, key=key, resolved=False,
                                               created__gte=now - dt.timedelta(seconds=ONE_SHOT_MERGE_S))
            if recent.update(last_seen=now, repeats=F("repeats") + 1):
                return None
        try:
            with transaction.atomic():
                event = AlertEvent.objects.create(
                    kind=kind, key=key, severity=severity, subject=subject[:500] or str(spec.label),
                    link=link[:500], host=host or "", deployment_id=deployment, details=details,
                    is_open=spec.clears, occurred=when, last_seen=now)
        except IntegrityError:  # another process opened the same incident just now
            _count_repeat(kind, key)
            return None
        _route(event, now)
    return event


def _count_repeat(kind, key):
    AlertEvent.objects.filter(kind=kind, key=key, is_open=True).update(repeats=F("repeats") + 1)


def _resolve(kind, key, subject, link, when, now):
    with transaction.atomic():
        opening = AlertEvent.objects.select_for_update().filter(kind=kind, key=key, is_open=True).first()
        if opening is None:
            return None
        AlertEvent.objects.filter(pk=opening.pk).update(is_open=False, resolved_at=now)
        event = AlertEvent.objects.create(
            kind=kind, key=key, severity=opening.severity, resolved=True, opening=opening,
            subject=(subject or str(_("Resolved: %(subject)s") % {"subject": opening.subject}))[:500],
            link=(link or opening.link)[:500], host=opening.host, deployment_id=opening.deployment_id,
            details=opening.details, occurred=when, last_seen=now)
        # "Resolved" goes where the opening went (rules that want it), nowhere else.
        went = (AlertDelivery.objects.filter(event=opening, rule__send_resolved=True)
                .exclude(status=AlertDelivery.Status.SUPPRESSED).select_related("rule", "channel"))
        rows = [AlertDelivery(event=event, channel=d.channel, rule=d.rule) for d in went if d.channel.enabled]
        _queue(AlertDelivery.objects.bulk_create(rows))
    return event


def rule_matches(rule: AlertRule, event: AlertEvent) -> bool:
    if not rule.enabled or event.severity < rule.min_severity:
        return False
    if rule.kinds and event.kind not in rule.kinds:
        return False
    if rule.host and rule.host != event.host:
        return False
    if rule.deployment_id is not None and rule.deployment_id != event.deployment_id:
        return False
    return True


def in_quiet_window(rule: AlertRule, moment: dt.datetime) -> bool:
    if rule.quiet_start is None or rule.quiet_end is None or rule.quiet_start == rule.quiet_end:
        return False
    t = timezone.localtime(moment).time()
    if rule.quiet_start < rule.quiet_end:
        return rule.quiet_start <= t < rule.quiet_end
    return t >= rule.quiet_start or t < rule.quiet_end  # a window over midnight


def _route(event: AlertEvent, now):
    """One delivery row per (rule, channel); a channel that two rules name gets one."""
    rows: dict[int, AlertDelivery] = {}
    for rule in AlertRule.objects.filter(enabled=True).prefetch_related("channels"):
        if not rule_matches(rule, event):
            continue
        suppressed = ""
        if in_quiet_window(rule, now) and event.severity < Severity.CRITICAL:
            suppressed = str(_("quiet window of rule “%(rule)s” (only critical events go out)") % {"rule": rule.name})
        else:
            since = now - dt.timedelta(seconds=rule.cooldown_s)
            recent = AlertDelivery.objects.filter(
                rule=rule, event__kind=event.kind, event__key=event.key, event__resolved=False,
                created__gte=since).exclude(event=event).exclude(status=AlertDelivery.Status.SUPPRESSED)
            if rule.cooldown_s and recent.exists():
                suppressed = str(_("cooldown of rule “%(rule)s”: the same incident was sent less than "
                                   "%(seconds)s s ago") % {"rule": rule.name, "seconds": rule.cooldown_s})
        for channel in rule.channels.all():
            if not channel.enabled:
                continue
            row = rows.get(channel.pk)
            if row is not None and (row.status != AlertDelivery.Status.SUPPRESSED or suppressed):
                continue
            rows[channel.pk] = AlertDelivery(
                event=event, channel=channel, rule=rule,
                status=AlertDelivery.Status.SUPPRESSED if suppressed else AlertDelivery.Status.PENDING,
                error=suppressed)
    created = AlertDelivery.objects.bulk_create(rows.values())
    _queue([d for d in created if d.status == AlertDelivery.Status.PENDING])


def _queue(deliveries):
    if not deliveries:
        return
    from monitoring.alerts import delivery

    ids = [d.pk for d in deliveries]
    transaction.on_commit(lambda: delivery.queue(ids))
