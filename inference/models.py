import os
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _
from django.utils.text import slugify
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
        LOCAL = "local", _("Local folder or file")

    class Status(models.TextChoices):
        QUEUED = "queued", _("Queued")
        DOWNLOADING = "downloading", _("Downloading")
        VERIFYING = "verifying", _("Verifying")
        READY = "ready", _("Ready")
        FAILED = "failed", _("Failed")
        CANCELLED = "cancelled", _("Cancelled")

    class Job(models.TextChoices):
        DOWNLOAD = "download", _("Download")
        VERIFY = "verify", _("Re-verify")
        IMPORT = "import", _("Import")

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


class EngineRuntime(models.Model):
    """An engine installation on a host (inference.engines.Runtime): a vLLM or
    SGLang executable/virtualenv, a llama-server binary, or a Docker image.
    The version (and torch's CUDA build and archs) is detected by a task on
    the host's queue and stored here."""

    class Engine(models.TextChoices):
        VLLM = "vllm", "vLLM"
        SGLANG = "sglang", "SGLang"
        LLAMACPP = "llamacpp", "llama.cpp"

    class Kind(models.TextChoices):
        EXECUTABLE = "executable", _("Executable")
        VENV = "venv", _("Virtualenv")
        DOCKER = "docker", _("Docker image")

    class DetectStatus(models.TextChoices):
        PENDING = "pending", _("Detecting")
        OK = "ok", _("Detected")
        FAILED = "failed", _("Not detected")

    DETECT_COLOURS = {"pending": "blue", "ok": "green", "failed": "red"}

    name = models.CharField(max_length=200)
    host = models.CharField(max_length=100)
    engine = models.CharField(max_length=20, choices=Engine.choices)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    path = models.CharField(max_length=1000, blank=True)
    image = models.CharField(max_length=300, blank=True)

    version = models.CharField(max_length=100, blank=True)
    torch_cuda = models.CharField(max_length=40, blank=True)
    cuda_archs = models.JSONField(default=list, blank=True)
    detect_status = models.CharField(max_length=20, choices=DetectStatus.choices, default=DetectStatus.PENDING)
    detect_detail = models.TextField(blank=True)
    detected_at = models.DateTimeField(null=True, blank=True)

    # A managed runtime: Kiln installed it from the engine catalog into
    # DATA_DIR/engines/<name> (inference/deployments/runtimes.py); the row is the install job.
    class InstallStatus(models.TextChoices):
        NONE = "", _("Registered")
        QUEUED = "queued", _("Queued")
        INSTALLING = "installing", _("Installing")
        INSTALLED = "installed", _("Installed")
        FAILED = "failed", _("Install failed")
        UNINSTALLING = "uninstalling", _("Uninstalling")

    INSTALL_COLOURS = {"": "grey", "queued": "grey", "installing": "blue", "installed": "green", "failed": "red",
                       "uninstalling": "amber"}

    catalog_key = models.CharField(max_length=100, blank=True)
    install_status = models.CharField(max_length=20, choices=InstallStatus.choices, default="", blank=True)
    install_step = models.CharField(max_length=300, blank=True)
    install_progress = models.FloatField(default=0.0)  # 0..1
    install_log = models.TextField(blank=True)  # the last lines of pip's output
    install_error = models.TextField(blank=True)
    install_started = models.DateTimeField(null=True, blank=True)
    install_finished = models.DateTimeField(null=True, blank=True)
    install_bytes = models.BigIntegerField(null=True, blank=True)  # size on disk once installed

    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        ordering = ["host", "name"]

    @property
    def managed(self):
        return bool(self.catalog_key)

    @property
    def install_colour(self):
        return self.INSTALL_COLOURS.get(self.install_status, "grey")

    def __str__(self):
        return f"{self.name} ({self.get_engine_display()} on {self.host})"

    @property
    def colour(self):
        return self.DETECT_COLOURS.get(self.detect_status, "grey")

    def as_runtime(self):
        from inference.engines import Runtime

        env, cpu_only = {}, "+cpu" in (self.version or "")
        if self.catalog_key:  # a catalog build's launch defaults (e.g. VLLM_CPU_KVCACHE_SPACE)
            from inference.deployments.runtimes import catalog

            build = catalog().get(self.catalog_key)
            env = dict(build.env) if build else {}
            cpu_only = cpu_only or bool(build and build.hardware == "cpu")
        return Runtime(engine=self.engine, kind=self.kind, path=self.path, image=self.image, env=env,
                       cpu_only=cpu_only)


class LaunchProfile(models.Model):
    """The launch form's values, one field per LaunchSpec field."""

    name = models.CharField(max_length=200)
    host = models.CharField(max_length=100)
    runtime = models.ForeignKey(EngineRuntime, on_delete=models.PROTECT, related_name="profiles")
    model = models.ForeignKey(ModelArtifact, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="launch_profiles")
    # The path (or repo id) given to the engine; filled from `model` when set.
    model_path = models.CharField(max_length=1000)
    preset = models.CharField(max_length=100, blank=True)

    served_model_name = models.CharField(max_length=200, blank=True)
    gpus = models.JSONField(default=list, blank=True)
    tensor_parallel_size = models.PositiveIntegerField(default=1)
    dtype = models.CharField(max_length=20, blank=True)
    quantization = models.CharField(max_length=50, blank=True)
    max_model_len = models.PositiveIntegerField(null=True, blank=True)
    gpu_memory_utilization = models.FloatField(null=True, blank=True)
    swap_space_gb = models.FloatField(null=True, blank=True)
    cpu_offload_gb = models.FloatField(null=True, blank=True)
    kv_cache_dtype = models.CharField(max_length=20, blank=True)
    attention_backend = models.CharField(max_length=50, blank=True)
    enable_prefix_caching = models.BooleanField(null=True, blank=True)
    max_num_seqs = models.PositiveIntegerField(null=True, blank=True)
    speculative_config = models.JSONField(default=dict, blank=True)
    bind_host = models.CharField(max_length=255, default="127.0.0.1")
    port = models.PositiveIntegerField(null=True, blank=True, help_text="empty = pick a free one")
    api_key = models.CharField(max_length=200, blank=True)
    env = models.JSONField(default=dict, blank=True)
    extra_args = models.JSONField(default=list, blank=True)
    trust_remote_code = models.BooleanField(default=False)

    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    @property
    def engine(self) -> str:
        return self.runtime.engine

    def as_spec(self, port=None):
        from inference.engines import LaunchSpec

        return LaunchSpec(
            model=self.model_path, served_model_name=self.served_model_name, gpus=list(self.gpus or []),
            tensor_parallel_size=self.tensor_parallel_size, dtype=self.dtype, quantization=self.quantization,
            max_model_len=self.max_model_len, gpu_memory_utilization=self.gpu_memory_utilization,
            swap_space_gb=self.swap_space_gb, cpu_offload_gb=self.cpu_offload_gb,
            kv_cache_dtype=self.kv_cache_dtype, attention_backend=self.attention_backend,
            enable_prefix_caching=self.enable_prefix_caching, max_num_seqs=self.max_num_seqs,
            speculative_config=dict(self.speculative_config or {}), host=self.bind_host,
            port=port if port is not None else self.port, api_key=self.api_key, env=dict(self.env or {}),
            extra_args=list(self.extra_args or []), trust_remote_code=self.trust_remote_code,
            # The spec's name becomes a Docker container name: no spaces.
            name=slugify(self.name)[:50] or f"profile-{self.pk}",
        )


class Deployment(models.Model):
    """One run of a launch profile: the engine process and what the monitor
    knows about it. Launch/stop tasks and the monitor's watch loop write it;
    the pages read it."""

    class Status(models.TextChoices):
        PENDING = "pending", _("Pending")
        STARTING = "starting", _("Starting")
        READY = "ready", _("Ready")
        RESTARTING = "restarting", _("Restarting")
        STOPPING = "stopping", _("Stopping")
        STOPPED = "stopped", _("Stopped")
        FAILED = "failed", _("Failed")

    STATUS_COLOURS = {"pending": "grey", "starting": "blue", "ready": "green", "restarting": "amber",
                      "stopping": "amber", "stopped": "grey", "failed": "red"}
    # Statuses in which an engine process exists (or is about to).
    ACTIVE = ("pending", "starting", "ready", "restarting", "stopping")
    WATCHED = ("starting", "ready", "restarting")

    name = models.CharField(max_length=200)
    host = models.CharField(max_length=100)
    profile = models.ForeignKey(LaunchProfile, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="deployments")
    model = models.ForeignKey(ModelArtifact, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="deployments")
    engine_name = models.CharField(max_length=20, blank=True)

    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    phase = models.CharField(max_length=40, blank=True)
    phases = models.JSONField(default=list, blank=True)  # [{"phase", "at"}], the timeline

    pid = models.IntegerField(null=True, blank=True)
    start_time = models.BigIntegerField(null=True, blank=True)  # /proc/<pid>/stat starttime
    pgid = models.IntegerField(null=True, blank=True)
    port = models.PositiveIntegerField(null=True, blank=True)
    bind_host = models.CharField(max_length=255, default="127.0.0.1")
    served_model_name = models.CharField(max_length=200, blank=True)
    api_key = models.CharField(max_length=200, blank=True)

    argv = models.JSONField(default=list, blank=True)
    command = models.TextField(blank=True)  # the copyable preview, secrets hidden
    log_path = models.CharField(max_length=1000, blank=True)
    log_offset = models.BigIntegerField(default=0)
    watch_state = models.JSONField(default=dict, blank=True)
    restarts = models.PositiveIntegerField(default=0)

    failure = models.TextField(blank=True)
    hint = models.TextField(blank=True)
    log_tail = models.TextField(blank=True)
    stop_requested = models.BooleanField(default=False)

    # What preflight said at launch (inference.preflight.services): findings, whether an
    # operator launched over errors, the fit estimate, and vLLM's own figures after start.
    preflight = models.JSONField(default=dict, blank=True)  # {"findings": [...], "has_errors": bool}
    preflight_overridden = models.BooleanField(default=False)
    fit_estimate = models.JSONField(default=dict, blank=True)  # fit.FitReport.as_dict()
    capacity = models.JSONField(default=dict, blank=True)  # preflight.capacity.parse_vllm_capacity()

    created = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    stopped = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        ordering = ["-created"]

    def __str__(self):
        return f"{self.name} #{self.pk} ({self.status})"

    # Set by the selectors that show a row (inference.deployments.selectors.mark_reachability)
    # when its host's monitor has stopped beating; never stored.
    host_offline = False
    UNREACHABLE = "unreachable"

    @property
    def unreachable(self) -> bool:
        """Its host is offline while it should be running: what it does now is unknown.
        Shown, never written as failed: the host re-adopts the engine when it is back."""
        return self.host_offline and self.status in self.ACTIVE

    @property
    def shown_status(self) -> str:
        return self.UNREACHABLE if self.unreachable else self.status

    @property
    def shown_status_label(self) -> str:
        return _("Unreachable") if self.unreachable else self.get_status_display()

    @property
    def colour(self):
        return "amber" if self.unreachable else self.STATUS_COLOURS.get(self.status, "grey")

    @property
    def engine(self) -> str:
        """The engine's name (vllm, llamacpp, sglang)."""
        if self.engine_name:
            return self.engine_name
        return self.profile.runtime.engine if self.profile_id else ""

    @property
    def base_url(self) -> str:
        """Where the engine answers, e.g. http://127.0.0.1:8000 ("" before a port is chosen)."""
        if not self.port:
            return ""
        h = self.bind_host or "127.0.0.1"
        h = "127.0.0.1" if h == "0.0.0.0" else ("::1" if h == "::" else h)
        if ":" in h:
            h = f"[{h}]"
        return f"http://{h}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.base_url}/v1" if self.port else ""

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE


class BenchmarkRun(models.Model):
    """One benchmark: a Kiln run against a deployment (Celery task on the
    deployment's host) or a result imported from `vllm bench serve
    --save-result` / guidellm. The row is the record: status, progress,
    per-step results and the snapshot of what was measured (profile, argv,
    engine version, model hashes, GPU, /metrics deltas)."""

    class Status(models.TextChoices):
        QUEUED = "queued", _("Queued")
        RUNNING = "running", _("Running")
        SUCCEEDED = "succeeded", _("Succeeded")
        FAILED = "failed", _("Failed")
        CANCELLED = "cancelled", _("Cancelled")

    class Source(models.TextChoices):
        KILN = "kiln", "Kiln"
        VLLM_BENCH = "vllm-bench", "vllm bench serve"
        GUIDELLM = "guidellm", "guidellm"

    STATUS_COLOURS = {"queued": "grey", "running": "blue", "succeeded": "green", "failed": "red",
                      "cancelled": "amber"}
    FINISHED = ("succeeded", "failed", "cancelled")

    deployment = models.ForeignKey(Deployment, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="benchmark_runs")
    scenario = models.CharField(max_length=100, blank=True)
    label = models.CharField(max_length=200, blank=True)
    source = models.CharField(max_length=20, choices=Source.choices, default=Source.KILN)
    config = models.JSONField(default=dict, blank=True)  # the scenario as run (overrides applied)

    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED)
    progress = models.JSONField(default=dict, blank=True)
    cancel_requested = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    worker = models.CharField(max_length=200, blank=True)

    result = models.JSONField(default=list, blank=True)  # one vllm-bench-shaped dict per sweep step
    snapshot = models.JSONField(default=dict, blank=True)

    # Denormalised for the history filters (imported runs have no deployment).
    model_name = models.CharField(max_length=300, blank=True)
    engine = models.CharField(max_length=40, blank=True)
    gpu_name = models.CharField(max_length=200, blank=True)

    created = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        ordering = ["-created"]

    def __str__(self):
        return f"benchmark #{self.pk} {self.title} ({self.status})"

    @property
    def colour(self):
        return self.STATUS_COLOURS.get(self.status, "grey")

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED

    @property
    def title(self) -> str:
        return self.label or self.scenario or f"{self.get_source_display()} result"

    @property
    def headline(self) -> dict:
        """The step the list shows: the one with the highest output throughput."""
        steps = [s for s in (self.result or []) if isinstance(s, dict)]
        if not steps:
            return {}
        return max(steps, key=lambda s: s.get("output_throughput") or 0)


class ApiKey(models.Model):
    """A user's key for the OpenAI-compatible gateway (/v1/ on the panel).

    Only the sha256 of the key is stored. A slow password hash buys nothing
    here: the key is 256 random bits (secrets.token_urlsafe(32)), so a leaked
    hash cannot be brute-forced anyway, and a fast hash lets every request be
    looked up by an index in microseconds instead of adding milliseconds of
    PBKDF2 to each answer's time to first token.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="the first characters of the key, shown in the UI")
    hashed_key = models.CharField(max_length=64, unique=True)  # sha256 hex
    allowed_models = models.JSONField(default=list, blank=True, help_text="served model names; empty = all")
    rate_limit = models.PositiveIntegerField(default=60, help_text="requests per minute; 0 = unlimited")
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        ordering = ["-created"]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked is None

    def allows(self, model_name: str) -> bool:
        return not self.allowed_models or model_name in self.allowed_models


class UsageRecord(models.Model):
    """Gateway usage per minute, per key (or per user for the playground) and
    per deployment. The web process adds up requests in memory and writes one
    increment per (minute, key, deployment) about once a second, so a burst of
    requests costs a few UPDATEs, not one INSERT each. Concurrent writers may
    leave two rows for one bucket; readers always sum."""

    minute = models.DateTimeField(db_index=True)
    key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="usage")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="+")
    deployment = models.ForeignKey(Deployment, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="usage")
    model_name = models.CharField(max_length=200, blank=True)
    requests = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["-minute"]
        indexes = [models.Index(fields=["key", "minute"]), models.Index(fields=["deployment", "minute"])]


# ---------------------------------------------------------------- batch jobs (OpenAI Batch API)
def _public_id(prefix):
    import secrets

    return lambda: f"{prefix}{secrets.token_hex(12)}"


def new_file_id():
    return _public_id("file-")()


def new_batch_id():
    return _public_id("batch_")()


class BatchFile(models.Model):
    """A file of the /v1/files API: an uploaded batch input (validated line by
    line while it streamed to disk), or a batch's output or error file (grows
    as lines complete; `bytes` is what has been committed)."""

    class Purpose(models.TextChoices):
        BATCH = "batch", _("batch input")
        OUTPUT = "batch_output", _("batch output")

    id = models.CharField(primary_key=True, max_length=40, default=new_file_id, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="+")
    filename = models.CharField(max_length=255)
    purpose = models.CharField(max_length=20, choices=Purpose.choices, default=Purpose.BATCH)
    path = models.CharField(max_length=1000)
    bytes = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    lines = models.PositiveIntegerField(default=0)
    models_seen = models.JSONField(default=dict, blank=True)  # model -> first line numbers (up to 5)
    urls_seen = models.JSONField(default=dict, blank=True)  # url -> first line numbers (up to 5)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self):
        return f"{self.id} {self.filename}"


class Batch(models.Model):
    """One batch job: every line of an input file sent to its model, results
    written to an output and an error file in OpenAI's format. The row is the
    record (Celery carries only the id); lines are BatchLine rows."""

    class Status(models.TextChoices):
        VALIDATING = "validating", _("validating")
        IN_PROGRESS = "in_progress", _("in progress")
        PAUSED = "paused", _("paused")
        FINALIZING = "finalizing", _("finalizing")
        COMPLETED = "completed", _("completed")
        FAILED = "failed", _("failed")
        EXPIRED = "expired", _("expired")
        CANCELLING = "cancelling", _("cancelling")
        CANCELLED = "cancelled", _("cancelled")

    FINISHED = ("completed", "failed", "expired", "cancelled")
    RUNNING = ("validating", "in_progress", "paused", "finalizing", "cancelling")

    id = models.CharField(primary_key=True, max_length=40, default=new_batch_id, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="+")
    key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    endpoint = models.CharField(max_length=40)
    input_file = models.ForeignKey(BatchFile, null=True, on_delete=models.SET_NULL, related_name="batches")
    output_file = models.ForeignKey(BatchFile, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    error_file = models.ForeignKey(BatchFile, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    completion_window = models.CharField(max_length=10, default="24h")
    metadata = models.JSONField(null=True, blank=True)
    deployment = models.ForeignKey(Deployment, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    default_model = models.CharField(max_length=200, blank=True)  # for lines without "model" (the UI's pick)
    host = models.CharField(max_length=100)
    concurrency = models.PositiveIntegerField(default=4)
    pacing_ms = models.PositiveIntegerField(default=0)  # minimum gap between two requests

    status = models.CharField(max_length=20, choices=Status.choices, default=Status.VALIDATING)
    reason = models.TextField(blank=True)  # why it is paused or failed
    errors = models.JSONField(null=True, blank=True)  # OpenAI's {"object": "list", "data": [...]}
    total = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    output_size = models.BigIntegerField(default=0)  # committed bytes of the output file
    error_size = models.BigIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)

    claim = models.CharField(max_length=40, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    heartbeat = models.DateTimeField(null=True, blank=True)
    run_started = models.DateTimeField(null=True, blank=True)  # this run's start, for the rate
    run_base = models.PositiveIntegerField(default=0)  # lines finished before this run

    created = models.DateTimeField(auto_now_add=True)
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]
        verbose_name_plural = "batches"

    def __str__(self):
        return f"{self.id} ({self.status})"

    @property
    def is_finished(self):
        return self.status in self.FINISHED

    def worker_gone(self):
        """Is the runner that claimed this batch surely dead? (Answerable on its own host.)"""
        if not self.claim:
            return True
        if self.heartbeat is None or timezone.now() - self.heartbeat > timedelta(seconds=STALE_AFTER_S):
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


class BatchLine(models.Model):
    """One line of a batch's input: where it is in the file (never loaded
    whole), and its state. A line's result is recorded once: claimed
    (pending -> sending) by a conditional update before it is sent, and
    done/failed only in the transaction that commits its output bytes."""

    class Status(models.TextChoices):
        PENDING = "pending", _("pending")
        SENDING = "sending", _("sending")
        DONE = "done", _("done")
        FAILED = "failed", _("failed")
        CANCELLED = "cancelled", _("cancelled")

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="lines")
    line = models.PositiveIntegerField()  # 1-based line number in the input file
    custom_id = models.CharField(max_length=500)
    offset = models.BigIntegerField()
    length = models.PositiveIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    tokens = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["line"]
        constraints = [models.UniqueConstraint(fields=["batch", "custom_id"], name="batchline_unique_custom_id")]
        indexes = [models.Index(fields=["batch", "status", "line"])]


class Experiment(models.Model):
    """"Is B really faster than A?": two or more configurations (launch
    profiles or running deployments), one workload, R repetitions, run
    unattended on one host in a fair order. Each launch, measurement and
    stop is an ExperimentStep row; each measurement is a BenchmarkRun in the
    history. The runner (Celery, host queue) claims the row with a token and
    beats a heartbeat; a restarted worker resumes at the first step not done."""

    class Status(models.TextChoices):
        QUEUED = "queued", _("Queued")
        RUNNING = "running", _("Running")
        SUCCEEDED = "succeeded", _("Succeeded")
        FAILED = "failed", _("Failed")
        CANCELLED = "cancelled", _("Cancelled")

    class Order(models.TextChoices):
        INTERLEAVED = "interleaved", _("Interleaved (A B A B, all configurations up at once)")
        ALTERNATING = "alternating", _("Alternating blocks (A, B, A, B; relaunched each repetition)")
        BLOCKS = "blocks", _("Blocks (A A A, then B B B; one configuration up at a time)")

    STATUS_COLOURS = BenchmarkRun.STATUS_COLOURS
    FINISHED = ("succeeded", "failed", "cancelled")

    name = models.CharField(max_length=200)
    host = models.CharField(max_length=100)
    preset = models.CharField(max_length=100, blank=True)
    # [{"label": "A", "profile": id|None, "deployment": id|None, "name": "..."}]; the first is the baseline.
    configurations = models.JSONField(default=list)
    scenario = models.CharField(max_length=100)
    workload = models.JSONField(default=dict, blank=True)  # the scenario as run (overrides applied)
    concurrency_levels = models.JSONField(default=list, blank=True)  # [] = the scenario's own
    prompt_lengths = models.JSONField(default=list, blank=True)  # [] = the scenario's own
    repetitions = models.PositiveSmallIntegerField(default=3)
    order = models.CharField(max_length=20, choices=Order.choices, default=Order.INTERLEAVED)
    slo_decode_tok_s = models.FloatField(null=True, blank=True)  # per-stream SLO for the sweet-spot preset

    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED)
    progress = models.JSONField(default=dict, blank=True)
    cancel_requested = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    worker = models.CharField(max_length=200, blank=True)
    claim = models.CharField(max_length=64, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    heartbeat = models.DateTimeField(null=True, blank=True)
    state = models.JSONField(default=dict, blank=True)  # {"deployments": {config index: deployment id}}

    created = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        ordering = ["-created"]

    def __str__(self):
        return f"experiment #{self.pk} {self.name} ({self.status})"

    @property
    def colour(self):
        return self.STATUS_COLOURS.get(self.status, "grey")

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED

    @property
    def labels(self) -> list[str]:
        return [c.get("label") or chr(ord("A") + i) for i, c in enumerate(self.configurations or [])]

    def worker_gone(self) -> bool:
        """No heartbeat for STALE_AFTER_S (killed worker, rebooted host)."""
        return self.heartbeat is None or timezone.now() - self.heartbeat > timedelta(seconds=STALE_AFTER_S)


class ExperimentStep(models.Model):
    """One step of an experiment, in the order it runs: launch a
    configuration (and wait for Ready), measure it once (one repetition at
    one sweep point: a BenchmarkRun), or stop it."""

    class Kind(models.TextChoices):
        LAUNCH = "launch", _("Launch")
        MEASURE = "measure", _("Measure")
        STOP = "stop", _("Stop")

    class Status(models.TextChoices):
        PENDING = "pending", _("Pending")
        RUNNING = "running", _("Running")
        DONE = "done", _("Done")
        FAILED = "failed", _("Failed")
        SKIPPED = "skipped", _("Skipped")
        CANCELLED = "cancelled", _("Cancelled")

    STATUS_COLOURS = {"pending": "grey", "running": "blue", "done": "green", "failed": "red", "skipped": "grey",
                      "cancelled": "amber"}

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="steps")
    index = models.PositiveIntegerField()
    kind = models.CharField(max_length=10, choices=Kind.choices)
    configuration = models.PositiveSmallIntegerField()
    repetition = models.PositiveSmallIntegerField(null=True, blank=True)
    scenario = models.CharField(max_length=100, blank=True)  # a workload of the experiment's; "" = its main one
    concurrency = models.PositiveIntegerField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    deployment = models.ForeignKey(Deployment, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    run = models.ForeignKey(BenchmarkRun, null=True, blank=True, on_delete=models.SET_NULL,
                            related_name="experiment_steps")
    note = models.TextField(blank=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["experiment", "index"]
        constraints = [models.UniqueConstraint(fields=["experiment", "index"], name="experimentstep_unique_index")]

    @property
    def colour(self):
        return self.STATUS_COLOURS.get(self.status, "grey")
