import os
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

# A working row whose worker has not written a heartbeat for this long is
# taken to be abandoned (worker killed, host rebooted): it may be resumed.
STALE_AFTER_S = 30


class ModelArtifact(models.Model):
    """A model on a host's disk: downloaded from a hub (verified by sha256) or imported.

    The row is the download's record too: status, progress, error; the UI
    reads it, the Celery task writes it.
    """

    class Source(models.TextChoices):
        HUGGINGFACE = "hf", "Hugging Face"
        MODELSCOPE = "modelscope", "ModelScope"
        LOCAL = "local", "Local folder or file"

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        DOWNLOADING = "downloading", "Downloading"
        VERIFYING = "verifying", "Verifying"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    class Job(models.TextChoices):
        DOWNLOAD = "download", "Download"
        VERIFY = "verify", "Re-verify"
        IMPORT = "import", "Import"

    ACTIVE = ("queued", "downloading", "verifying")

    STATUS_COLOURS = {"queued": "grey", "downloading": "blue", "verifying": "blue", "ready": "green", "failed": "red", "cancelled": "amber"}

    name = models.CharField(max_length=300)
    source = models.CharField(max_length=20, choices=Source.choices)
    repo_id = models.CharField(max_length=300, blank=True)
    revision = models.CharField(max_length=200, blank=True)
    endpoint = models.CharField(max_length=500, blank=True)
    include = models.JSONField(default=list, blank=True)
    exclude = models.JSONField(default=list, blank=True)
    host = models.CharField(max_length=100)
    path = models.CharField(max_length=1000, help_text="folder, or the .gguf file")
    # The files' relative paths (files, recorded_hashes) start here: the
    # download folder, the imported folder, or the folder holding an imported GGUF.
    folder = models.CharField(max_length=1000, blank=True)
    format = models.CharField(max_length=20, blank=True)  # safetensors, gguf, …

    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED)
    bytes_done = models.BigIntegerField(default=0)
    bytes_total = models.BigIntegerField(default=0)
    bytes_transferred = models.BigIntegerField(default=0)
    speed = models.FloatField(default=0, help_text="bytes per second")
    eta_seconds = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)
    cancel_requested = models.BooleanField(default=False)
    job = models.CharField(max_length=20, choices=Job.choices, default=Job.DOWNLOAD)
    # The claim: who works on the row now. A worker writes only while its
    # claim token is still the row's, so a resumed row cannot have two writers.
    claim = models.CharField(max_length=40, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    heartbeat = models.DateTimeField(null=True, blank=True)
    file_progress = models.JSONField(default=list, blank=True)  # per file: path, size, done, status, error
    verify_report = models.JSONField(default=dict, blank=True)  # the last re-verify: ok, checked, changed, missing, at
    # A per-download token, kept only until the download is ready (so a resume
    # after a worker restart needs nobody to type it again); never shown or logged.
    hub_token = models.CharField(max_length=500, blank=True)

    files = models.JSONField(default=list, blank=True)  # the hub's listing: path, size, sha256 / git sha1
    recorded_hashes = models.JSONField(default=dict, blank=True)  # path -> sha256, once verified
    meta = models.JSONField(default=dict, blank=True)  # config.json or GGUF metadata
    weight_bytes = models.BigIntegerField(default=0)

    created = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    verified_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)

    class Meta:
        ordering = ["-created"]

    def __str__(self):
        return self.name

    @property
    def colour(self):
        return self.STATUS_COLOURS[self.status]

    @property
    def is_active(self):
        return self.status in self.ACTIVE

    @property
    def is_stale(self):
        """Working (not queued) but no heartbeat for STALE_AFTER_S: the worker is gone."""
        if self.status not in ("downloading", "verifying"):
            return False
        return self.heartbeat is None or timezone.now() - self.heartbeat > timedelta(seconds=STALE_AFTER_S)

    def worker_gone(self):
        """Is the claiming process surely dead? (Only answerable on its own host.)"""
        if self.is_stale:
            return True
        if self.host != settings.HOST_NAME or not self.pid:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    @property
    def can_cancel(self):
        return self.job == self.Job.DOWNLOAD and self.is_active and not self.cancel_requested

    @property
    def can_resume(self):
        if self.is_stale:
            return True
        if self.status not in ("failed", "cancelled"):
            return False
        return self.source != self.Source.LOCAL or (self.job == self.Job.IMPORT and not self.recorded_hashes)

    @property
    def can_reverify(self):
        return bool(self.recorded_hashes) and self.status in ("ready", "failed")

    @property
    def can_delete(self):
        return not self.is_active or self.is_stale

    @property
    def progress_percent(self):
        if not self.bytes_total:
            return 100.0 if self.status == "ready" else 0.0
        return round(100.0 * min(self.bytes_done, self.bytes_total) / self.bytes_total, 1)

    def live_dict(self):
        """What the list and the progress bars need (also the websocket message)."""
        return {
            "id": self.pk,
            "name": self.name,
            "source": self.source,
            "source_label": self.get_source_display(),
            "repo_id": self.repo_id,
            "revision": self.revision,
            "host": self.host,
            "path": self.path,
            "format": self.format,
            "job": self.job,
            "status": self.status,
            "status_label": self.get_status_display(),
            "colour": self.colour,
            "stale": self.is_stale,
            "cancel_requested": self.cancel_requested,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "bytes_transferred": self.bytes_transferred,
            "percent": self.progress_percent,
            "speed": self.speed,
            "eta_seconds": self.eta_seconds,
            "error": self.error,
            "created": self.created.isoformat() if self.created else None,
            "finished": self.finished.isoformat() if self.finished else None,
            "verified_at": self.verified_at.isoformat() if self.verified_at else None,
            "actions": {"cancel": self.can_cancel, "resume": self.can_resume,
                        "reverify": self.can_reverify, "delete": self.can_delete},
        }

    def as_dict(self):
        """Everything about the model, for the API's detail answer. No token, ever."""
        d = self.live_dict()
        d.update({
            "endpoint": self.endpoint,
            "include": self.include,
            "exclude": self.exclude,
            "folder": self.folder,
            "files": self.files,
            "file_progress": self.file_progress,
            "recorded_hashes": self.recorded_hashes,
            "meta": self.meta,
            "weight_bytes": self.weight_bytes,
            "verify_report": self.verify_report,
            "started": self.started.isoformat() if self.started else None,
            "has_token": bool(self.hub_token),
        })
        return d
