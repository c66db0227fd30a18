from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _


class Account(models.Model):
    """What Kiln keeps about a user beyond Django's User."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="account")
    # Set when an operator (or the first-run step) handed out a one-time password.
    must_change_password = models.BooleanField(default=False)
    # The language the user chose in the top bar ("" = follow the browser): kept
    # here so it follows them to every browser and session.
    language = models.CharField(max_length=10, blank=True, default="", choices=settings.LANGUAGES)

    def __str__(self):
        return f"account of {self.user}"


class Job(models.Model):
    """A background job the UI can follow: status, times, error, result.

    Celery's result backend is not the record; this row is. Feature areas keep
    their own rows (downloads, deployments, benchmark runs) with the same shape.
    """

    class Status(models.TextChoices):
        PENDING = "pending", _("Pending")
        RUNNING = "running", _("Running")
        SUCCEEDED = "succeeded", _("Succeeded")
        FAILED = "failed", _("Failed")

    STATUS_COLOURS = {"pending": "grey", "running": "blue", "succeeded": "green", "failed": "red"}

    class Kind(models.TextChoices):
        WORKER_CHECK = "worker-check", _("Worker check")

    kind = models.CharField(max_length=40, choices=Kind.choices)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    created = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    worker = models.CharField(max_length=200, blank=True)
    result = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self):
        return f"{self.get_kind_display()} #{self.pk} ({self.status})"

    @property
    def colour(self):
        return self.STATUS_COLOURS[self.status]

    def as_dict(self):
        return {
            "id": self.pk,
            "kind": self.kind,
            "status": self.status,
            "created": self.created.isoformat() if self.created else None,
            "started": self.started.isoformat() if self.started else None,
            "finished": self.finished.isoformat() if self.finished else None,
            "worker": self.worker,
            "result": self.result,
            "error": self.error,
        }


class AuditEntry(models.Model):
    """One operator action: who, when, from where, what, on which object, result.

    Written by dashboard.audit (a middleware for every state-changing request and
    the sign-in signals), never by the views themselves. The user is kept as id
    and name, not a foreign key, so deleting an account keeps its trail. The
    request body is never stored: it may hold hub tokens or passwords.
    """

    class Result(models.TextChoices):
        OK = "ok", _("ok")
        REFUSED = "refused", _("refused")
        FAILED = "failed", _("failed")

    RESULT_COLOURS = {"ok": "green", "refused": "grey", "failed": "red"}

    created = models.DateTimeField(db_index=True)
    user_id = models.BigIntegerField(null=True, blank=True)
    username = models.CharField(max_length=150, blank=True)
    address = models.GenericIPAddressField(null=True, blank=True)
    action = models.CharField(max_length=80, db_index=True)
    method = models.CharField(max_length=10, blank=True)
    path = models.CharField(max_length=500, blank=True)
    object_type = models.CharField(max_length=40, blank=True)
    object_id = models.CharField(max_length=100, blank=True)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    result = models.CharField(max_length=10, choices=Result.choices)
    error_code = models.CharField(max_length=60, blank=True)

    class Meta:
        ordering = ["-created", "-pk"]

    def __str__(self):
        return f"{self.created:%Y-%m-%d %H:%M:%S} {self.username or '-'} {self.action} {self.result}"

    @property
    def colour(self):
        return self.RESULT_COLOURS.get(self.result, "grey")

    @property
    def target(self):
        """"deployment #3", "preset qwen-7b", "model" or ""."""
        if self.object_id:
            sep = " #" if self.object_id.isdigit() else " "
            return f"{self.object_type or 'object'}{sep}{self.object_id}"
        return self.object_type
