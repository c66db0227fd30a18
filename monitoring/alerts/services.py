"""Writes behind the alerts pages."""
from __future__ import annotations

import datetime as dt

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from monitoring.alerts import conf, delivery
from monitoring.alerts.models import AlertDelivery, AlertEvent, Severity


def channel_send_test(*, channel, user) -> AlertDelivery:
    """Send a test message now (in this request, so the operator sees the answer) and record it in the history."""
    with transaction.atomic():
        event = AlertEvent.objects.create(
            kind="test", key=f"test:{channel.pk}", severity=Severity.INFO,
            subject=_("Test message from Kiln, sent by %(user)s") % {"user": user.get_username()},
            link="/alerts/", details={"channel": channel.name}, occurred=timezone.now())
        row = AlertDelivery.objects.create(event=event, channel=channel, is_test=True)
    delivery.deliver(row.pk)
    row.refresh_from_db()
    return row


def prune_history(days: float | None = None) -> int:
    """Delete closed events (with their deliveries) older than ALERT_RETENTION_DAYS; returns events deleted."""
    days = conf.RETENTION_DAYS if days is None else days
    cutoff = timezone.now() - dt.timedelta(days=days)
    old = AlertEvent.objects.filter(created__lt=cutoff, is_open=False)
    return old.delete()[1].get(AlertEvent._meta.label, 0)
