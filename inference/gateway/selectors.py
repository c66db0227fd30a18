"""Reads for the keys and usage pages."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from django.db.models import Max, Sum
from django.utils import timezone
from django.utils.translation import gettext as _

from dashboard.roles import is_operator
from inference.models import ApiKey, Deployment, UsageRecord

SUMS = dict(requests=Sum("requests"), errors=Sum("errors"), prompt_tokens=Sum("prompt_tokens"),
            completion_tokens=Sum("completion_tokens"))


def keys_for(user):
    qs = ApiKey.objects.select_related("user", "revoked_by")
    return qs if is_operator(user) else qs.filter(user=user)


def _usage_for(user, since):
    qs = UsageRecord.objects.filter(minute__gte=since)
    return qs if is_operator(user) else qs.filter(user=user) | qs.filter(key__user=user)


def _label_key(row) -> str:
    if row["key_id"]:
        return f"{row['key__name']} ({row['key__prefix']}…)"
    return _("playground (%(user)s)") % {"user": row["user__username"] or _("deleted user")}


def usage_by_key(user, since: dt.datetime) -> list[dict]:
    rows = (_usage_for(user, since).values("key_id", "key__name", "key__prefix", "user__username")
            .annotate(**SUMS, last=Max("minute")).order_by("-requests"))
    merged: dict[str, dict] = {}
    for r in rows:  # playground rows group by user; key rows by key
        label = _label_key(r)
        m = merged.setdefault(label, {"label": label, "requests": 0, "errors": 0, "prompt_tokens": 0,
                                      "completion_tokens": 0})
        for f in ("requests", "errors", "prompt_tokens", "completion_tokens"):
            m[f] += r[f] or 0
    return sorted(merged.values(), key=lambda m: -m["requests"])


def _label_deployment(row) -> str:
    if row["deployment_id"]:
        return f"{row['deployment__name']} #{row['deployment_id']}"
    return _("%(model)s (deployment deleted)") % {"model": row["model_name"]}


def usage_by_deployment(user, since: dt.datetime) -> list[dict]:
    rows = (UsageRecord.objects.filter(minute__gte=since)
            .values("deployment_id", "deployment__name", "model_name").annotate(**SUMS).order_by("-requests"))
    return [dict(r, label=_label_deployment(r)) for r in rows]


def usage_series(user, since: dt.datetime) -> dict:
    """Tokens per minute, one trace per key and one per deployment, for Plotly."""
    by_key: dict[str, dict] = defaultdict(lambda: defaultdict(int))
    by_dep: dict[str, dict] = defaultdict(lambda: defaultdict(int))
    rows = _usage_for(user, since).values(
        "minute", "key_id", "key__name", "key__prefix", "user__username", "deployment_id", "deployment__name",
        "model_name", "prompt_tokens", "completion_tokens")
    for r in rows:
        t = timezone.localtime(r["minute"]).strftime("%Y-%m-%d %H:%M")
        tokens = (r["prompt_tokens"] or 0) + (r["completion_tokens"] or 0)
        by_key[_label_key(r)][t] += tokens
        by_dep[_label_deployment(r)][t] += tokens

    def traces(groups):
        return [{"name": name, "x": sorted(points), "y": [points[t] for t in sorted(points)]}
                for name, points in sorted(groups.items())]

    return {"keys": traces(by_key), "deployments": traces(by_dep)}


def model_choices() -> list[str]:
    return sorted(set(Deployment.objects.exclude(served_model_name="").values_list("served_model_name", flat=True)))


def ready_deployments():
    return Deployment.objects.filter(status=Deployment.Status.READY).exclude(served_model_name="").order_by("name")
