"""Hugging Face (or an HF_ENDPOINT-style mirror such as hf-mirror.com).

Listing: GET {endpoint}/api/models/{repo}/tree/{revision}?recursive=true,
paginated through the `Link: <...>; rel="next"` header. Each file entry has
`path`, `size`, `oid` (git blob sha1) and, for LFS files, `lfs.oid` (sha256).
Download: {endpoint}/{repo}/resolve/{revision}/{path} (LFS files redirect to
a CDN host; Range works there).
Errors come as 401/403/404 with an `X-Error-Code` header: RepoNotFound,
GatedRepo, RevisionNotFound, EntryNotFound.
"""
from __future__ import annotations

import threading
from urllib.parse import quote

import httpx
from django.utils.translation import gettext as _

from .base import (HubError, Listing, RemoteFile, RetryPolicy, check_repo_id,
                   filter_files, get_with_retries, safe_relative_path)

HUB = "huggingface"
DEFAULT_ENDPOINT = "https://huggingface.co"
MAX_PAGES = 1000  # a repo with 1000 pages of files is not a model; stop anyway


class HuggingFaceHub:
    name = HUB

    def __init__(self, endpoint: str | None = None, token: str | None = None, *,
                 timeout: float = 30.0, retry: RetryPolicy | None = None):
        self.endpoint = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
        self.token = (token or "").strip() or None
        self.timeout = timeout
        self.retry = retry or RetryPolicy()

    def auth_headers(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def file_url(self, repo_id: str, revision: str, path: str) -> str:
        return (f"{self.endpoint}/{repo_id}/resolve/{quote(revision, safe='')}/"
                f"{quote(path)}")

    def list_files(self, repo_id: str, revision: str = "main", *,
                   include: list[str] | None = None, exclude: list[str] | None = None,
                   cancel: threading.Event | None = None) -> Listing:
        repo_id = check_repo_id(repo_id, HUB)
        revision = (revision or "main").strip()
        url: str | None = (f"{self.endpoint}/api/models/{repo_id}/tree/"
                           f"{quote(revision, safe='')}")
        params: dict | None = {"recursive": "true"}
        files: list[RemoteFile] = []
        with httpx.Client(timeout=self.timeout, follow_redirects=True) as client:
            for _page in range(MAX_PAGES):
                if url is None:
                    break
                resp = get_with_retries(client, url, headers=self.auth_headers(),
                                        params=params, hub=HUB, retry=self.retry,
                                        cancel=cancel)
                if resp.status_code != 200:
                    raise self._error(resp, repo_id, revision)
                try:
                    entries = resp.json()
                except ValueError:
                    entries = None
                if not isinstance(entries, list):
                    raise HubError(_("%(endpoint)s answered the file listing of %(repo)s with something that is "
                                     "not a file list. Is the endpoint a Hugging Face hub or mirror?")
                                   % {"endpoint": self.endpoint, "repo": repo_id}, hub=HUB, code="BadListing")
                for entry in entries:
                    if not isinstance(entry, dict) or entry.get("type") != "file":
                        continue
                    files.append(self._file(repo_id, revision, entry))
                # The next page's URL already carries the cursor and recursive flag.
                url = resp.links.get("next", {}).get("url")
                params = None
        return Listing(hub=HUB, repo_id=repo_id, revision=revision,
                       files=filter_files(files, include, exclude),
                       headers=self.auth_headers())

    def _file(self, repo_id: str, revision: str, entry: dict) -> RemoteFile:
        path = safe_relative_path(entry.get("path"), HUB)
        lfs = entry.get("lfs") or {}
        sha256 = lfs.get("oid") or lfs.get("sha256")
        try:
            size = int(lfs.get("size", entry.get("size")))
        except (TypeError, ValueError):
            raise HubError(_("The listing of %(repo)s gives no size for %(path)s.") % {"repo": repo_id, "path": path},
                           hub=HUB, code="BadListing")
        return RemoteFile(path=path, size=size,
                          url=self.file_url(repo_id, revision, path),
                          sha256=sha256 or None,
                          git_sha1=None if sha256 else (entry.get("oid") or None))

    def _error(self, resp: httpx.Response, repo_id: str, revision: str) -> HubError:
        return hf_error(resp, repo_id, revision, has_token=bool(self.token))


def hf_error(resp: httpx.Response, repo_id: str, revision: str, *,
             has_token: bool) -> HubError:
    """Turn a Hugging Face error answer into a message a user can act on."""
    code = resp.headers.get("X-Error-Code", "")
    server_msg = resp.headers.get("X-Error-Message", "")
    status = resp.status_code
    if code == "GatedRepo":
        msg = ((_("%(repo)s is a gated model: open its page on Hugging Face, accept the conditions with your "
                  "account, then set a token of that account (the token given has no access yet).") if has_token
                else _("%(repo)s is a gated model: open its page on Hugging Face, accept the conditions with your "
                       "account, then set a token of that account.")) % {"repo": repo_id})
    elif code == "RevisionNotFound":
        msg = _("Revision %(revision)r does not exist in %(repo)s. Use a branch, tag or commit that exists "
                "(usually 'main').") % {"revision": revision, "repo": repo_id}
    elif code == "EntryNotFound":
        msg = _("A file of %(repo)s at %(revision)r was not found on the hub.") % {"repo": repo_id, "revision": revision}
    elif status == 401 and "Invalid credentials" in server_msg:
        code = code or "InvalidToken"
        msg = _("The Hugging Face token was refused as invalid. Create a new read token "
                "at huggingface.co/settings/tokens and save it again.")
    elif code == "RepoNotFound" or status in (401, 404):
        code = code or "RepoNotFound"
        msg = _("Model %(repo)s was not found. Check the spelling; if it is private, "
                "set a token that can read it.") % {"repo": repo_id}
    elif status == 403:
        code = code or "Forbidden"
        msg = _("Access to %(repo)s is forbidden%(detail)s. Check that your token has read access.") % {
            "repo": repo_id, "detail": f" ({server_msg})" if server_msg else ""}
    else:
        code = code or f"HTTP{status}"
        msg = _("The hub answered HTTP %(status)s for %(repo)s: %(detail)s") % {
            "status": status, "repo": repo_id, "detail": server_msg or resp.text[:200]}
    return HubError(msg, hub=HUB, code=code, status=status)
