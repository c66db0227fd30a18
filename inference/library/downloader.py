"""Download model files and prove them complete.

Each file streams into `<file>.part`, hashed while it is written (the bytes
are never read back), resumes with a Range request after a crash, a killed
worker or a panel restart, and is renamed to its final name only once its
hash matches the listing. Plain Python: the Django task calls `download()`
with a progress callback and a cancel event.

    listing = HuggingFaceHub(token=...).list_files("Qwen/Qwen3-8B", include=["*.safetensors"])
    check_disk_space(listing.files, dest)
    result = download(listing.files, dest, headers=listing.headers,
                      progress=on_progress, cancel=cancel_event)
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

from django.utils.translation import gettext

from inference.library import transfer
from inference.library.hubs.base import (RemoteFile, RetryPolicy, UnsafePathError,
                                 is_transient_status, retry_after_seconds,
                                 safe_relative_path)

RECV_BUFFER = 1 << 20  # bytes per readinto(); RECV_BUFFERS of them circulate
RECV_BUFFERS = 4
THREADED_FROM = 8 << 20  # files this big may hash and write on a second thread


def hash_thread_wanted() -> bool:
    """sha256 on a second thread, beside the socket reads (KILN_HASH_THREAD=off
    hashes in the reading thread instead). bench/download.py measures both
    (bench/results/download_*.txt): 3 GB on 2 shared cores, 1.48x curl's
    speed against 0.70x inline; on a 16-core host 0.72x against 0.52x, where
    sha256 alone allows at most 0.723x."""
    return os.environ.get("KILN_HASH_THREAD", "on").strip().lower() not in ("off", "0", "no", "false")


READ_BLOCK = 8 << 20  # for hashing files already on disk
PART_SUFFIX = ".part"
VERIFIED_MANIFEST = ".kiln-verified.json"
MAX_TRIES_PER_FILE = 200  # progress-making retries reset the count; this bounds the rest


# --------------------------------------------------------------------------- errors
class DownloadError(Exception):
    """A download could not finish; the message says which file and why."""


class DownloadCancelled(DownloadError):
    """The user cancelled; `.part` files stay for a later resume."""


class HashMismatchError(DownloadError):
    def __init__(self, path: str, algorithm: str, expected: str, actual: str):
        super().__init__(
            f"{path}: the downloaded bytes do not match the hub's hash twice in a row "
            f"(expected {algorithm} {expected}, got {actual}). The file was deleted. "
            "The hub or a proxy between is serving corrupt data; try another endpoint.")
        self.path, self.algorithm, self.expected, self.actual = path, algorithm, expected, actual


class NotEnoughDiskSpace(DownloadError):
    def __init__(self, check: "SpaceCheck"):
        sizes = {"folder": check.folder, "needed": _gib(check.still_needed), "total": _gib(check.total),
                 "on_disk": _gib(check.already_on_disk), "free": _gib(check.free), "reserve": _gib(check.reserve)}
        super().__init__((gettext(
            "Not enough disk space in %(folder)s: the download needs %(needed)s more (total %(total)s, %(on_disk)s "
            "already on disk) but only %(free)s is free after keeping %(reserve)s in reserve. Free some space or "
            "choose fewer files.") if check.reserve else gettext(
            "Not enough disk space in %(folder)s: the download needs %(needed)s more (total %(total)s, %(on_disk)s "
            "already on disk) but only %(free)s is free. Free some space or choose fewer files.")) % sizes)
        self.check = check


class DownloadFailed(DownloadError):
    def __init__(self, errors: dict[str, str]):
        lines = "; ".join(f"{msg}" for msg in errors.values())
        super().__init__(f"{len(errors)} file(s) failed: {lines}")
        self.errors = errors


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


# --------------------------------------------------------------------------- progress
@dataclass
class FileProgress:
    path: str
    size: int
    done: int = 0
    status: str = "waiting"  # waiting, hashing, downloading, verifying, done, failed, cancelled
    error: str = ""


@dataclass
class DownloadProgress:
    """What the progress callback receives (a snapshot; safe to keep)."""

    bytes_done: int
    bytes_total: int
    bytes_transferred: int  # over the network in this run (resumes show the saving)
    speed: float  # bytes per second over the last few seconds
    eta_seconds: float | None
    files: list[FileProgress]

    def to_dict(self) -> dict:
        return asdict(self)


ProgressCallback = Callable[[DownloadProgress], None]


class _Tracker:
    """Per-file counters under one lock; calls the callback at most every `interval`."""

    def __init__(self, files: list[RemoteFile], callback: ProgressCallback | None,
                 interval: float):
        self.files = {f.path: FileProgress(f.path, f.size) for f in files}
        self.total = sum(f.size for f in files)
        self.transferred = 0
        self.callback = callback
        self.interval = interval
        self.lock = threading.Lock()
        self.samples: list[tuple[float, int]] = [(time.monotonic(), 0)]
        self.last_emit = 0.0

    def set(self, path: str, *, status: str | None = None, done: int | None = None,
            error: str | None = None) -> None:
        with self.lock:
            fp = self.files[path]
            if status is not None:
                fp.status = status
            if done is not None:
                fp.done = done
            if error is not None:
                fp.error = error
        self.emit(force=status is not None)

    def add(self, path: str, n: int, transferred: bool) -> None:
        with self.lock:
            self.files[path].done += n
            if transferred:
                self.transferred += n
        self.emit()

    def snapshot(self) -> DownloadProgress:
        with self.lock:
            now = time.monotonic()
            self.samples.append((now, self.transferred))
            # Speed over roughly the last 5 s, so the ETA follows the link, not history.
            while len(self.samples) > 2 and now - self.samples[1][0] > 5.0:
                self.samples.pop(0)
            t0, b0 = self.samples[0]
            speed = (self.transferred - b0) / (now - t0) if now > t0 else 0.0
            done = sum(f.done for f in self.files.values())
            eta = (self.total - done) / speed if speed > 0 else None
            files = [FileProgress(**asdict(f)) for f in self.files.values()]
        return DownloadProgress(done, self.total, self.transferred, speed, eta, files)

    def emit(self, force: bool = False) -> None:
        if self.callback is None:
            return
        now = time.monotonic()
        if not force and now - self.last_emit < self.interval:
            return
        self.last_emit = now
        try:
            self.callback(self.snapshot())
        except Exception:  # a failing progress sink must not kill a 50 GB download
            pass


# --------------------------------------------------------------------------- hashing
class _Hashes:
    """sha256 always (recorded for Re-verify); git blob sha1 too when that is
    the only hash the hub gave."""

    def __init__(self, f: RemoteFile):
        self.sha256 = hashlib.sha256()
        self.git = None
        if f.expected_hash and f.expected_hash[0] == "git-sha1":
            self.git = hashlib.sha1(b"blob %d\x00" % f.size)

    def update(self, data) -> None:
        self.sha256.update(data)
        if self.git is not None:
            self.git.update(data)

    def actual(self, algorithm: str) -> str:
        return (self.git if algorithm == "git-sha1" else self.sha256).hexdigest()


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class DiskWriteError(DownloadError):
    """Writing the .part file failed (disk full, I/O error): not retried."""


class _Sink:
    """Writes received buffers and hashes them, sha256 on a second thread for big files.

    The socket is read into RECV_BUFFERS reused buffers (no allocation, no
    copy in Python) and each is written in the reading thread; sha256, the
    slowest step (~1.3 GB/s), runs on a second thread (hashlib releases the
    GIL) while the next buffer fills. Measured on a 16-core host, 3 GB:
    read+write 1.2 s, sha256 alone 2.3 s, both in one thread 4.0 s, with the
    hash on its own thread 2.5 s (curl -o without hashing: 2.1-2.3 s).
    finish() returns once every submitted byte is hashed, so the caller's
    offset is then exact.
    """

    def __init__(self, fd: int, hashes: "_Hashes", threaded: bool):
        self.fd, self.hashes = fd, hashes
        self.buffers = [bytearray(RECV_BUFFER) for _ in range(RECV_BUFFERS if threaded else 1)]
        self.error: BaseException | None = None
        self.thread = None
        if threaded:
            import queue

            self.free: queue.SimpleQueue = queue.SimpleQueue()
            self.full: queue.SimpleQueue = queue.SimpleQueue()
            for b in self.buffers:
                self.free.put(b)
            self.thread = threading.Thread(target=self._run, name="kiln-sha256", daemon=True)
            self.thread.start()

    def buffer(self) -> bytearray:
        if self.thread is None:
            return self.buffers[0]
        b = self.free.get()
        if self.error is not None:
            raise self.error
        return b

    def submit(self, buffer: bytearray, n: int) -> None:
        view = memoryview(buffer)[:n]
        try:
            _write_all(self.fd, view)
        except OSError as e:
            raise DiskWriteError(f"cannot write the download to disk: {e}") from e
        if self.thread is None:
            self.hashes.update(view)
        else:
            self.full.put((buffer, n))

    def _run(self) -> None:
        while True:
            item = self.full.get()
            if item is None:
                return
            buffer, n = item
            if self.error is None:
                try:
                    self.hashes.update(memoryview(buffer)[:n])
                except BaseException as e:  # handed to the reading thread
                    self.error = e
            self.free.put(buffer)

    def finish(self) -> None:
        if self.thread is not None:
            self.full.put(None)
            self.thread.join()
        if self.error is not None:
            raise self.error


def hash_file(path: str, *, limit: int | None = None, hashes: _Hashes | None = None,
              on_bytes: Callable[[int], None] | None = None,
              cancel: threading.Event | None = None) -> str:
    """sha256 of a file on disk (or of its first `limit` bytes)."""
    with open(path, "rb") as fh:
        return hash_stream(fh, limit=limit, hashes=hashes, on_bytes=on_bytes, cancel=cancel)


def hash_stream(fh, *, limit: int | None = None, hashes: _Hashes | None = None,
                 on_bytes: Callable[[int], None] | None = None,
                 cancel: threading.Event | None = None) -> str:
    h = hashes or _Hashes(RemoteFile(path="", size=0, url=""))
    left = limit
    while left is None or left > 0:
        if cancel is not None and cancel.is_set():
            raise DownloadCancelled("cancelled while hashing")
        data = fh.read(READ_BLOCK if left is None else min(READ_BLOCK, left))
        if not data:
            break
        h.update(data)
        if left is not None:
            left -= len(data)
        if on_bytes:
            on_bytes(len(data))
    return h.sha256.hexdigest()


# --------------------------------------------------------------------------- paths
def target_path(dest_dir: str, rel_path: str) -> str:
    """Where `rel_path` goes inside `dest_dir`; refuses anything that lands outside
    (checked again at write time: the listing check is not the only guard)."""
    safe_relative_path(rel_path)
    root = os.path.realpath(dest_dir)
    full = os.path.realpath(os.path.join(root, *rel_path.split("/")))
    if os.path.commonpath([root, full]) != root or full == root:
        raise UnsafePathError(rel_path)
    return full


# --------------------------------------------------------------------------- disk space
@dataclass
class SpaceCheck:
    folder: str
    total: int
    already_on_disk: int
    still_needed: int
    free: int
    reserve: int = 0

    @property
    def fits(self) -> bool:
        return self.still_needed + self.reserve <= self.free


def _existing_parent(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def check_disk_space(files: Iterable[RemoteFile], dest_dir: str, *, reserve_bytes: int = 0,
                     raise_if_short: bool = True) -> SpaceCheck:
    """Compare the bytes still to download with the free space of dest_dir's disk.

    Finished files of the right size and `.part` prefixes count as already on
    disk, so resuming a nearly complete download is not refused.
    """
    files = list(files)
    total = sum(f.size for f in files)
    have = 0
    for f in files:
        try:
            final = target_path(dest_dir, f.path)
        except UnsafePathError:
            continue
        if os.path.isfile(final) and os.path.getsize(final) == f.size:
            have += f.size
        elif os.path.isfile(final + PART_SUFFIX):
            have += min(f.size, os.path.getsize(final + PART_SUFFIX))
    free = shutil.disk_usage(_existing_parent(dest_dir)).free
    check = SpaceCheck(os.path.abspath(dest_dir), total, have, total - have, free, reserve_bytes)
    if raise_if_short and not check.fits:
        raise NotEnoughDiskSpace(check)
    return check


# --------------------------------------------------------------------------- manifest
class _VerifiedManifest:
    """Remembers files this downloader verified (size + mtime + sha256), so a
    resumed download does not re-read finished multi-GB files."""

    def __init__(self, dest_dir: str):
        self.path = os.path.join(dest_dir, VERIFIED_MANIFEST)
        self.lock = threading.Lock()
        try:
            with open(self.path) as fh:
                self.entries = json.load(fh)
            if not isinstance(self.entries, dict):
                self.entries = {}
        except (OSError, ValueError):
            self.entries = {}

    def trusted(self, rel: str, full: str, f: RemoteFile) -> str | None:
        e = self.entries.get(rel)
        try:
            st = os.stat(full)
        except OSError:
            return None
        if (isinstance(e, dict) and e.get("size") == f.size == st.st_size
                and e.get("mtime_ns") == st.st_mtime_ns and e.get("expected") == _expected_str(f)):
            return e.get("sha256")
        return None

    def record(self, rel: str, full: str, f: RemoteFile, sha256: str) -> None:
        st = os.stat(full)
        with self.lock:
            self.entries[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                 "sha256": sha256, "expected": _expected_str(f)}
            tmp = self.path + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(self.entries, fh, indent=1, sort_keys=True)
            os.replace(tmp, self.path)


def _expected_str(f: RemoteFile) -> str:
    return ":".join(f.expected_hash) if f.expected_hash else f"size:{f.size}"


# --------------------------------------------------------------------------- download
@dataclass
class DownloadedFile:
    path: str
    size: int
    sha256: str
    verified_by: str  # "sha256", "git-sha1" or "size" (the hub gave no hash)


@dataclass
class DownloadResult:
    files: list[DownloadedFile] = field(default_factory=list)
    bytes_transferred: int = 0
    seconds: float = 0.0

    @property
    def recorded_hashes(self) -> dict[str, str]:
        """path -> sha256, to store and later pass to verify_folder()."""
        return {f.path: f.sha256 for f in self.files}


class _Retry(Exception):
    def __init__(self, why: str, retry_after: float | None = None):
        super().__init__(why)
        self.retry_after = retry_after


def _open_stream(conns: transfer.Connections, url: str, headers: dict, offset: int) -> transfer.Answer:
    """GET with Range from `offset`, following redirects by hand so that the
    Authorization header never leaves the origin it was meant for."""
    hdrs = dict(headers)
    if offset:
        hdrs["Range"] = f"bytes={offset}-"
    try:
        return transfer.open_get(conns, url, hdrs)
    except transfer.TransferError as e:
        raise DownloadError(str(e)) from e


class _Job:
    def __init__(self, f: RemoteFile, dest_dir: str, client: transfer.Connections, headers: dict,
                 tracker: _Tracker, manifest: _VerifiedManifest, retry: RetryPolicy,
                 cancel: threading.Event, fsync: bool = False):
        self.f, self.client, self.headers, self.fsync = f, client, headers, fsync
        self.tracker, self.manifest, self.retry, self.cancel = tracker, manifest, retry, cancel
        self.final = target_path(dest_dir, f.path)
        self.part = self.final + PART_SUFFIX

    def run(self) -> DownloadedFile:
        f = self.f
        expected = f.expected_hash
        trusted = self.manifest.trusted(f.path, self.final, f)
        if trusted:
            self.tracker.set(f.path, status="done", done=f.size)
            return DownloadedFile(f.path, f.size, trusted, expected[0] if expected else "size")
        if os.path.isfile(self.final):
            # A file we did not verify ourselves: adopt it only if it matches.
            self.tracker.set(f.path, status="hashing", done=0)
            hashes = _Hashes(f)
            if os.path.getsize(self.final) == f.size:
                hash_file(self.final, hashes=hashes, cancel=self.cancel)
                if expected is None or hashes.actual(expected[0]) == expected[1]:
                    return self._finish(hashes, rename=False)
            os.remove(self.final)
        os.makedirs(os.path.dirname(self.final), exist_ok=True)
        for attempt in (1, 2):
            hashes = self._transfer()
            self.tracker.set(f.path, status="verifying")
            if expected is None or hashes.actual(expected[0]) == expected[1]:
                return self._finish(hashes, rename=True)
            actual = hashes.actual(expected[0])
            # Corrupt bytes are worthless for a resume: delete, then one fresh try.
            os.remove(self.part)
            self.tracker.set(f.path, done=0)
            if attempt == 2:
                raise HashMismatchError(f.path, expected[0], expected[1], actual)
        raise AssertionError("unreachable")

    def _finish(self, hashes: _Hashes, rename: bool) -> DownloadedFile:
        f = self.f
        if rename:
            os.replace(self.part, self.final)
        sha = hashes.sha256.hexdigest()
        self.manifest.record(f.path, self.final, f, sha)
        self.tracker.set(f.path, status="done", done=f.size)
        return DownloadedFile(f.path, f.size, sha, f.expected_hash[0] if f.expected_hash else "size")

    def _transfer(self) -> _Hashes:
        """Bring `<file>.part` to the full size; returns the hashes of its bytes."""
        f = self.f
        self.hashes = hashes = _Hashes(f)
        offset = os.path.getsize(self.part) if os.path.isfile(self.part) else 0
        if offset > f.size:
            offset = 0  # longer than the file can be: not a prefix of it
        fd = os.open(self.part, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != offset:
                # Only when there is something to cut: ext4 flushes a file that
                # was truncated as soon as it is closed (auto_da_alloc), which
                # made a fresh 3 GB download ~1 s slower.
                os.ftruncate(fd, offset)
            if offset:
                # Re-hash the prefix once, so the final hash covers every byte.
                self.tracker.set(f.path, status="hashing", done=0)
                hash_file(self.part, limit=offset, hashes=hashes, cancel=self.cancel,
                          on_bytes=lambda n: self.tracker.add(f.path, n, transferred=False))
            os.lseek(fd, offset, os.SEEK_SET)
            self.offset = offset
            fails = tries = 0
            while self.offset < f.size:
                tries += 1
                if self.cancel.is_set():
                    raise DownloadCancelled(f"{f.path}: cancelled")
                self.tracker.set(f.path, status="downloading", done=self.offset)
                start = self.offset
                try:
                    self._stream_once(fd)
                    if self.offset < f.size:
                        raise _Retry("the server ended the answer early")
                except (*transfer.TRANSPORT_ERRORS, _Retry) as e:
                    fails = 0 if self.offset > start else fails + 1
                    if fails >= self.retry.attempts or tries >= MAX_TRIES_PER_FILE:
                        raise DownloadError(f"{f.path}: gave up after {tries} tries "
                                            f"({type(e).__name__}: {e})") from e
                    wait = self.retry.delay(fails, getattr(e, "retry_after", None))
                    if self.cancel.wait(wait):
                        raise DownloadCancelled(f"{f.path}: cancelled")
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        return self.hashes

    def _stream_once(self, fd: int) -> None:
        """One request from self.offset on; advances self.offset and self.hashes
        by what arrived, even when the connection breaks."""
        f = self.f
        offset = self.offset
        resp = _open_stream(self.client, f.url, self.headers, offset)
        try:
            status = resp.status
            if status == 206:
                cr = resp.headers.get("content-range", "")
                if not cr.startswith(f"bytes {offset}-"):
                    raise _Retry(f"server sent range {cr!r}, wanted bytes {offset}-")
            elif status == 200:
                if offset:
                    # The server ignores Range: start over cleanly from byte 0.
                    self.offset = offset = 0
                    os.ftruncate(fd, 0)
                    os.lseek(fd, 0, os.SEEK_SET)
                    self.hashes = _Hashes(f)
                    self.tracker.set(f.path, done=0)
            elif status == 416 and offset == f.size:
                return
            elif is_transient_status(status):
                raise _Retry(f"HTTP {status}", retry_after_seconds(resp.headers.get("retry-after")))
            else:
                code = resp.headers.get("x-error-code", "")
                raise DownloadError(
                    f"{f.path}: the server answered HTTP {status}"
                    + (f" ({code})" if code else "")
                    + {401: ": a token is needed (gated or private model).",
                       403: ": access denied; check the token's access to this model.",
                       404: ": not found; the file or revision may have been removed.",
                       416: ": the server refused the resume range."}.get(status, "."))
            sink = _Sink(fd, self.hashes, threaded=f.size - offset >= THREADED_FROM and hash_thread_wanted())
            try:
                while True:
                    buffer = sink.buffer()
                    n = resp.readinto(buffer)
                    if not n:
                        break
                    if offset + n > f.size:
                        raise DownloadError(f"{f.path}: the server sent more than the "
                                            f"listed {f.size} bytes; the listing is stale.")
                    sink.submit(buffer, n)
                    self.offset = offset = offset + n
                    self.tracker.add(f.path, n, transferred=True)
                    if self.cancel.is_set():
                        break
            finally:
                sink.finish()  # every counted byte is hashed and on disk
        finally:
            resp.close()
        if self.cancel.is_set():
            raise DownloadCancelled(f"{f.path}: cancelled")


def download(files: Iterable[RemoteFile], dest_dir: str, *, headers: dict | None = None,
             token: str | None = None, concurrency: int = 4,
             progress: ProgressCallback | None = None, cancel: threading.Event | None = None,
             retry: RetryPolicy | None = None, timeout: float = 60.0,
             progress_interval: float = 0.5, fsync: bool = False) -> DownloadResult:
    """Download `files` into `dest_dir`, verified, resumable, in parallel.

    No fsync by default: a killed process or a restarted panel keeps every
    written byte (the page cache survives them) and waiting for a slow disk
    to flush would halve the speed on some hosts. After a power cut, run
    verify_folder() (the "Re-verify" action); `fsync=True` trades speed for
    certainty instead.

    Raises DownloadCancelled (parts kept), DownloadFailed (per-file messages,
    including HashMismatchError text), or UnsafePathError before anything is
    written when a path would land outside `dest_dir`.
    """
    files = list(files)
    headers = dict(headers or {})
    if token:
        headers["Authorization"] = f"Bearer {token}"
    cancel = cancel or threading.Event()
    retry = retry or RetryPolicy()
    os.makedirs(dest_dir, exist_ok=True)
    for f in files:
        target_path(dest_dir, f.path)  # refuse the whole set before writing anything
    if len({f.path for f in files}) != len(files):
        raise DownloadError("the file list names the same path twice")
    tracker = _Tracker(files, progress, progress_interval)
    manifest = _VerifiedManifest(dest_dir)
    result = DownloadResult()
    t0 = time.monotonic()
    errors: dict[str, str] = {}
    client = transfer.Connections(timeout)
    try:

        def one(f: RemoteFile):
            try:
                return _Job(f, dest_dir, client, headers, tracker, manifest, retry,
                            cancel, fsync).run()
            except DownloadCancelled:
                tracker.set(f.path, status="cancelled")
                raise
            except Exception as e:
                msg = str(e) if isinstance(e, DownloadError) else f"{f.path}: {type(e).__name__}: {e}"
                tracker.set(f.path, status="failed", error=msg)
                errors[f.path] = msg
                return None

        # Big files first, so the longest transfer starts at once and small
        # files fill the other slots.
        order = sorted(files, key=lambda f: -f.size)
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            futures = [pool.submit(one, f) for f in order]
            cancelled = False
            for fut in futures:
                try:
                    done = fut.result()
                except DownloadCancelled:
                    cancelled = True
                    continue
                if done is not None:
                    result.files.append(done)
    finally:
        client.close()
    result.bytes_transferred = tracker.transferred
    result.seconds = time.monotonic() - t0
    tracker.emit(force=True)
    if cancelled or cancel.is_set():
        raise DownloadCancelled("download cancelled; finished files and .part files are kept "
                                "for a resume")
    if errors:
        raise DownloadFailed(errors)
    result.files.sort(key=lambda d: d.path)
    return result


# --------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    """`python -m inference.library.downloader MANIFEST.json DEST` — MANIFEST is a JSON
    list of RemoteFile dicts. Used to run a download in its own process (tests
    kill it mid-file; bench/download.py times it)."""
    import argparse
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("manifest")
    ap.add_argument("dest")
    ap.add_argument("--token")
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args(argv)
    with open(args.manifest) as fh:
        files = [RemoteFile.from_dict(d) for d in json.load(fh)]
    try:
        res = download(files, args.dest, token=args.token, concurrency=args.concurrency)
    except DownloadError as e:
        print(json.dumps({"error": str(e)}), flush=True)
        return 1
    print(json.dumps({"files": [asdict(f) for f in res.files],
                      "bytes_transferred": res.bytes_transferred,
                      "seconds": res.seconds}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
