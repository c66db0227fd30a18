from django.conf import settings
from django.db import models


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
    format = models.CharField(max_length=20, blank=True)  # safetensors, gguf, …

    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED)
    bytes_done = models.BigIntegerField(default=0)
    bytes_total = models.BigIntegerField(default=0)
    bytes_transferred = models.BigIntegerField(default=0)
    speed = models.FloatField(default=0, help_text="bytes per second")
    eta_seconds = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)
    cancel_requested = models.BooleanField(default=False)

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
