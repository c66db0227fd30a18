"""What every hub adapter shares: the file record, the error type, path safety,
include/exclude filtering and one small retrying GET for listing calls.

A hub adapter only lists files (with size and hash) and says where to fetch
them; inference/library/downloader.py does the fetching for every hub alike.
"""
from __future__ import annotations

import email.utils
import fnmatch
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable

import httpx
from django.utils.translation import gettext


@dataclass(frozen=True)
class RemoteFile:
    """One file of a model repository, known before any byte is downloaded.

    `path` is relative to the model's folder, always with forward slashes.
    Large (LFS) files carry `sha256`; small files kept in git itself carry
    only their git blob sha1 (`git_sha1`). A file may carry neither when the
    hub did not say (then only its size can be checked).
    """

    path: str
    size: int
    url: str
    sha256: str | None = None
    git_sha1: str | None = None

    @property
    def expected_hash(self) -> tuple[str, str] | None:
        """("sha256", hex) or ("git-sha1", hex): what the download must match."""
        if self.sha256:
            return ("sha256", self.sha256.lower())
        if self.git_sha1:
            return ("git-sha1", self.git_sha1.lower())
        return None

    def to_dict(self) -> dict:
        return {"path": self.path, "size": self.size, "url": self.url,
                "sha256": self.sha256, "git_sha1": self.git_sha1}

    @classmethod
    def from_dict(cls, d: dict) -> "RemoteFile":
        return cls(path=d["path"], size=int(d["size"]), url=d["url"],
                   sha256=d.get("sha256"), git_sha1=d.get("git_sha1"))


class HubError(Exception):
    """A hub refused or failed a request.

    `code` is the hub's own error code where it gives one (Hugging Face's
    X-Error-Code such as "GatedRepo", ModelScope's numeric `Code`), else a
    short word of ours ("HTTP503", "UnsafePath"). `str(err)` is the message
    to show the user: what went wrong and what to do about it.
    """

    def __init__(self, message: str, *, hub: str = "", code: str = "",
                 status: int | None = None):
        super().__init__(message)
        self.message = message
        self.hub = hub
        self.code = code
        self.status = status


class UnsafePathError(HubError):
    """A listed path would land outside the model's folder."""

    def __init__(self, path: str, hub: str = ""):
        super().__init__(
            gettext("Refusing file path %(path)r: it would be written outside the model's folder (absolute path, "
                    "'..', or a backslash/drive trick). The repository listing is not trustworthy; nothing was "
                    "downloaded.") % {"path": path},
            hub=hub, code="UnsafePath")
        self.path = path


_DRIVE = re.compile(r"^[A-Za-z]:")


def safe_relative_path(path: str, hub: str = "") -> str:
    """Return `path` if it is a plain relative path inside a folder, else raise.

    Backslashes are refused outright rather than interpreted: on Windows (or a
    Samba share) they are separators, so `..\\..\\x` would climb out.
    """
    if not isinstance(path, str) or not path or "\x00" in path or "\\" in path:
        raise UnsafePathError(str(path), hub)
    if path.startswith("/") or path.startswith("~") or _DRIVE.match(path):
        raise UnsafePathError(path, hub)
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafePathError(path, hub)
    return path


def filter_files(files: Iterable[RemoteFile], include: Iterable[str] | None = None,
                 exclude: Iterable[str] | None = None) -> list[RemoteFile]:
    """Keep files matching any include pattern and no exclude pattern.

    Patterns are shell globs matched against the whole relative path and
    against the file name, so `*.safetensors` and `Q4_K_M/*.gguf` both work.
    No include patterns means "everything".
    """
    include = [p for p in (include or []) if p]
    exclude = [p for p in (exclude or []) if p]

    def matches(f: RemoteFile, patterns: list[str]) -> bool:
        name = f.path.rsplit("/", 1)[-1]
        return any(fnmatch.fnmatchcase(f.path, p) or fnmatch.fnmatchcase(name, p)
                   for p in patterns)

    return [f for f in files
            if (not include or matches(f, include)) and not matches(f, exclude)]


_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def check_repo_id(repo_id: str, hub: str) -> str:
    repo_id = (repo_id or "").strip()
    if not _REPO_ID.match(repo_id) or ".." in repo_id:
        raise HubError(
            gettext("%(repo)r is not a model id. Paste it as owner/name, for example Qwen/Qwen3-8B.")
            % {"repo": repo_id}, hub=hub, code="BadRepoId")
    return repo_id


def retry_after_seconds(value: str | None) -> float | None:
    """Parse a Retry-After header (seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclass
class RetryPolicy:
    """How often and how long to wait on 429/5xx/timeouts."""

    attempts: int = 6
    base_delay: float = 1.0
    max_delay: float = 60.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            # The server said when; waiting less only earns another 429.
            return min(retry_after, 300.0)
        return min(self.max_delay, self.base_delay * (2 ** attempt))


def is_transient_status(status: int) -> bool:
    return status == 429 or status == 408 or 500 <= status < 600


def get_with_retries(client: httpx.Client, url: str, *, headers: dict, hub: str,
                     retry: RetryPolicy, cancel: threading.Event | None = None,
                     params: dict | None = None) -> httpx.Response:
    """GET for listing calls: retries 429/5xx/timeouts, returns any other answer."""
    last = ""
    for attempt in range(retry.attempts):
        wait = None
        try:
            resp = client.get(url, headers=headers, params=params)
        except httpx.TransportError as e:
            last = f"{type(e).__name__}: {e}"
        else:
            if not is_transient_status(resp.status_code):
                return resp
            last = f"HTTP {resp.status_code}"
            wait = retry_after_seconds(resp.headers.get("Retry-After"))
        if attempt + 1 < retry.attempts:
            delay = retry.delay(attempt, wait)
            if cancel is not None:
                if cancel.wait(delay):
                    break
            else:
                time.sleep(delay)
    from inference.library.hubs.preference import unreachable_advice  # reads settings; imported when needed

    raise HubError(gettext("The hub at %(url)s did not answer properly after %(tries)s tries (%(last)s). Try again "
                           "later or check the endpoint setting.") % {"url": url, "tries": retry.attempts, "last": last}
                   + f" {unreachable_advice(hub, url)}", hub=hub, code="Unavailable")


@dataclass
class Listing:
    """The answer to "what would I download": files, total size, which repo."""

    hub: str
    repo_id: str
    revision: str
    files: list[RemoteFile] = field(default_factory=list)
    headers: dict = field(default_factory=dict)  # auth headers the downloads need

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)
