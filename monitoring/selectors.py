"""Reads for the monitoring pages."""
from __future__ import annotations

import datetime as dt

import redis
from django.utils import timezone
from django.utils.translation import gettext as _

from dashboard import services
from monitoring import history
from monitoring.models import Gpu, XidEvent


class BadRange(ValueError):
    """The history range in the request cannot be used; the message says why."""


def monitor_states() -> tuple[list[dict], str | None]:
    """(heartbeats of the running monitors with what NVML found, Redis problem or None)."""
    try:
        return services.monitor_heartbeats(), None
    except (redis.RedisError, OSError) as exc:
        return [], _("Redis is not reachable, so live data cannot arrive (%(error)s).") % {"error": exc}


def recent_xid_events(limit: int = 20):
    return XidEvent.objects.select_related("gpu")[:limit]


def known_gpus():
    return Gpu.objects.filter(present=True)


def _parse_time(name: str, raw: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(raw)
    except ValueError:
        raise BadRange(_("%(name)s=%(raw)r is not a date and time: use e.g. 2026-01-31T14:00.") % {"name": name, "raw": raw}) from None
    if timezone.is_naive(value):
        value = timezone.make_aware(value)
    return value


def history_window(params, now: dt.datetime | None = None) -> dict:
    """From request parameters (range=1h, or start=...&end=...) to start, end, tier, label."""
    now = now or timezone.now()
    start_raw, end_raw = (params.get("start") or "").strip(), (params.get("end") or "").strip()
    if start_raw or end_raw:
        if not start_raw:
            raise BadRange(_("A custom range needs a start: give start=... (and end=..., or leave it for 'now')."))
        start = _parse_time("start", start_raw)
        end = _parse_time("end", end_raw) if end_raw else now
        if end <= start:
            raise BadRange(_("The range ends (%(end)s) before it starts (%(start)s).") % {
                "end": f"{end:%Y-%m-%d %H:%M}", "start": f"{start:%Y-%m-%d %H:%M}"})
        name, label = "custom", _("%(start)s to %(end)s") % {"start": f"{start:%Y-%m-%d %H:%M}", "end": f"{end:%Y-%m-%d %H:%M}"}
    else:
        name = params.get("range") or "1h"
        if name not in history.RANGES:
            raise BadRange(_("range=%(name)r is not one Kiln offers: use one of %(ranges)s.") % {"name": name, "ranges": ", ".join(history.RANGES)})
        seconds, label = history.RANGES[name]
        start, end = now - dt.timedelta(seconds=seconds), now
    tier = history.pick_tier(start, end, now)
    return {"range": name, "label": label, "start": start, "end": end, "tier": int(tier),
            "tier_label": history.Tier(tier).label}
