"""Reads for the alerts pages."""
from __future__ import annotations

from monitoring.alerts.models import AlertChannel, AlertDelivery, AlertEvent, AlertRule

HISTORY_ROWS = 100


def channels():
    return AlertChannel.objects.all()


def rules():
    return AlertRule.objects.prefetch_related("channels")


def history(limit: int = HISTORY_ROWS):
    return AlertDelivery.objects.select_related("event", "channel", "rule")[:limit]


def open_incidents():
    return AlertEvent.objects.filter(is_open=True)
