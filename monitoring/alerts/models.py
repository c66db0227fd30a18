"""Alert rows (app label ``monitoring``; monitoring/models.py imports these).

An event is one row per incident opening (or its "resolved" message); each
channel a rule routes it to gets one AlertDelivery row with its status,
attempts, last response code and error, and each attempt's own record
(``attempt_log``): the alert history page reads these.
Celery carries only a delivery's id.
"""
from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext_lazy as _

from monitoring.alerts import crypto


class Severity(models.IntegerChoices):
    INFO = 10, _("info")
    WARNING = 20, _("warning")
    CRITICAL = 30, _("critical")


class AlertChannel(models.Model):
    class Kind(models.TextChoices):
        WEBHOOK = "webhook", _("Generic webhook (JSON, HMAC-SHA256 signed)")
        SLACK = "slack", _("Slack incoming webhook")
        FEISHU = "feishu", _("Feishu / Lark custom bot")
        DINGTALK = "dingtalk", _("DingTalk custom robot")
        WECOM = "wecom", _("WeCom group robot")
        EMAIL = "email", _("Email (SMTP)")

    name = models.CharField(_("name"), max_length=100, unique=True)
    kind = models.CharField(_("kind"), max_length=20, choices=Kind.choices)
    enabled = models.BooleanField(_("enabled"), default=True)
    # Encrypted (crypto.encrypt): the URL carries the bot's token, the secret signs.
    url_encrypted = models.TextField(blank=True, default="")
    secret_encrypted = models.TextField(blank=True, default="")
    # Email only: host, port, security (starttls / tls / none), username, sender,
    # recipients, verify (bool), ca_file. Nothing secret here.
    options = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        app_label = "monitoring"
        ordering = ["name"]

    def __str__(self):
        return self.name

    @property
    def url(self) -> str:
        return crypto.decrypt(self.url_encrypted)

    @url.setter
    def url(self, value: str) -> None:
        self.url_encrypted = crypto.encrypt(value)

    @property
    def secret(self) -> str:
        return crypto.decrypt(self.secret_encrypted)

    @secret.setter
    def secret(self, value: str) -> None:
        self.secret_encrypted = crypto.encrypt(value)

    def _shown(self, attr):
        try:
            return crypto.masked(getattr(self, attr))
        except crypto.SecretUnreadable:
            return str(_("unreadable: encrypted with another key"))

    @property
    def url_shown(self) -> str:
        return self._shown("url")

    @property
    def secret_shown(self) -> str:
        return self._shown("secret")


class AlertRule(models.Model):
    """Which events go to which channels."""

    name = models.CharField(_("name"), max_length=100)
    enabled = models.BooleanField(_("enabled"), default=True)
    kinds = models.JSONField(_("events"), default=list, blank=True, help_text=_("empty: every event"))
    min_severity = models.PositiveSmallIntegerField(_("minimum severity"), choices=Severity.choices,
                                                    default=Severity.WARNING)
    channels = models.ManyToManyField(AlertChannel, related_name="rules", verbose_name=_("channels"))
    host = models.CharField(_("host"), max_length=100, blank=True, help_text=_("empty: every host"))
    deployment_id = models.BigIntegerField(_("deployment"), null=True, blank=True,
                                           help_text=_("empty: every deployment"))
    cooldown_s = models.PositiveIntegerField(_("cooldown (seconds)"), default=600)
    send_resolved = models.BooleanField(_("send a message when it clears"), default=True)
    quiet_start = models.TimeField(_("quiet from"), null=True, blank=True)
    quiet_end = models.TimeField(_("quiet until"), null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "monitoring"
        ordering = ["name", "pk"]

    def __str__(self):
        return self.name


class AlertEvent(models.Model):
    """One incident opening (resolved=False) or its clearing (resolved=True).

    ``key`` scopes an incident (gpu uuid, deployment id, host, a path): while
    an event of (kind, key) is open, the same event again only counts a repeat.
    """

    kind = models.CharField(max_length=40)
    key = models.CharField(max_length=300)
    severity = models.PositiveSmallIntegerField(choices=Severity.choices)
    subject = models.CharField(max_length=500)
    link = models.CharField(max_length=500, blank=True)
    host = models.CharField(max_length=100, blank=True)
    deployment_id = models.BigIntegerField(null=True, blank=True)
    details = models.JSONField(default=dict, blank=True)
    resolved = models.BooleanField(default=False)
    is_open = models.BooleanField(default=False)
    opening = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="clearings")
    occurred = models.DateTimeField()  # when the source saw it
    created = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField(null=True, blank=True)
    repeats = models.PositiveIntegerField(default=0)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "monitoring"
        ordering = ["-created", "-pk"]
        indexes = [models.Index(fields=["kind", "key", "-created"])]
        constraints = [models.UniqueConstraint(fields=["kind", "key"], condition=Q(is_open=True),
                                               name="alert_one_open_event_per_key")]

    def __str__(self):
        return self.subject


class AlertDelivery(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", _("Pending")
        SENDING = "sending", _("Sending")
        SENT = "sent", _("Sent")
        FAILED = "failed", _("Failed")
        SUPPRESSED = "suppressed", _("Suppressed")

    event = models.ForeignKey(AlertEvent, null=True, blank=True, on_delete=models.CASCADE,
                              related_name="deliveries")
    channel = models.ForeignKey(AlertChannel, on_delete=models.CASCADE, related_name="deliveries")
    rule = models.ForeignKey(AlertRule, null=True, blank=True, on_delete=models.SET_NULL, related_name="deliveries")
    is_test = models.BooleanField(default=False)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    response_code = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    # One entry per attempt, oldest first, at most MAX_ATTEMPTS (delivery.py): {"at": ISO time,
    # "ok": bool, "code": HTTP status or SMTP reply code or None, "error": text (redacted, cut), "ms": duration}.
    attempt_log = models.JSONField(default=list, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "monitoring"
        ordering = ["-created", "-pk"]
        indexes = [models.Index(fields=["status", "next_attempt_at"])]

    @property
    def attempt_rows(self) -> list[dict]:
        """The attempt log for the page, its times as datetimes (an unreadable time shows as none)."""
        rows = []
        for n, entry in enumerate(self.attempt_log or [], start=1):
            if not isinstance(entry, dict):
                continue
            try:
                at = parse_datetime(entry["at"]) if isinstance(entry.get("at"), str) else None
            except ValueError:
                at = None
            rows.append({**entry, "n": n, "at": at})
        return rows

    @property
    def colour(self):
        return {"sent": "green", "failed": "red", "suppressed": "grey"}.get(self.status, "amber")
