"""ModelScope (modelscope.cn, or another endpoint).

Listing: GET {endpoint}/api/v1/models/{id}/repo/files?Revision=..&Recursive=True
answers {"Code": 200, "Success": true, "Data": {"Files": [{"Path", "Name",
"Size", "Sha256", "Type": "blob"|"tree", "Revision", ...}]}, "Message", ...}.
A failure is either an HTTP 4xx or a body whose `Code` is not 200 with a
`Message`. Download: {endpoint}/api/v1/models/{id}/repo?Revision=..&FilePath=..
"""
from __future__ import annotations

import threading
from urllib.parse import urlencode

import httpx
from django.utils.translation import gettext as _

from .base import (HubError, Listing, RemoteFile, RetryPolicy, check_repo_id,
                   filter_files, get_with_retries, safe_relative_path)

HUB = "modelscope"
DEFAULT_ENDPOINT = "https://www.modelscope.cn"
DEFAULT_REVISION = "master"  # ModelScope's default branch is master, not main


class ModelScopeHub:
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
        query = urlencode({"Revision": revision, "FilePath": path})
        return f"{self.endpoint}/api/v1/models/{repo_id}/repo?{query}"

    def list_files(self, repo_id: str, revision: str = DEFAULT_REVISION, *,
                   include: list[str] | None = None, exclude: list[str] | None = None,
                   cancel: threading.Event | None = None) -> Listing:
        repo_id = check_repo_id(repo_id, HUB)
        revision = (revision or DEFAULT_REVISION).strip()
        url = f"{self.endpoint}/api/v1/models/{repo_id}/repo/files"
        with httpx.Client(timeout=self.timeout, follow_redirects=True) as client:
            resp = get_with_retries(client, url, headers=self.auth_headers(),
                                    params={"Revision": revision, "Recursive": "True"},
                                    hub=HUB, retry=self.retry, cancel=cancel)
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code != 200 or not isinstance(body, dict) or body.get("Code") != 200:
            raise ms_error(resp, body, repo_id, revision, has_token=bool(self.token))
        entries = (body.get("Data") or {}).get("Files")
        if not isinstance(entries, list):
            raise HubError(_("%(endpoint)s answered the file listing of %(repo)s without a file list. Is the "
                             "endpoint a ModelScope hub?") % {"endpoint": self.endpoint, "repo": repo_id},
                           hub=HUB, code="BadListing")
        files = []
        for entry in entries:
            if not isinstance(entry, dict) or entry.get("Type") == "tree":
                continue
            path = safe_relative_path(entry.get("Path") or entry.get("Name"), HUB)
            try:
                size = int(entry.get("Size"))
            except (TypeError, ValueError):
                raise HubError(_("The listing of %(repo)s gives no size for %(path)s.") % {"repo": repo_id,
                                                                                           "path": path},
                               hub=HUB, code="BadListing")
            files.append(RemoteFile(path=path, size=size,
                                    url=self.file_url(repo_id, revision, path),
                                    sha256=(entry.get("Sha256") or None)))
        return Listing(hub=HUB, repo_id=repo_id, revision=revision,
                       files=filter_files(files, include, exclude),
                       headers=self.auth_headers())


def ms_error(resp: httpx.Response, body, repo_id: str, revision: str, *,
             has_token: bool) -> HubError:
    """Turn a ModelScope error answer into a message a user can act on."""
    status = resp.status_code
    code = str(body.get("Code")) if isinstance(body, dict) and body.get("Code") else f"HTTP{status}"
    server_msg = (body.get("Message") if isinstance(body, dict) else "") or ""
    if "revision" in server_msg.lower() or "branch" in server_msg.lower():
        msg = _("Revision %(revision)r does not exist in %(repo)s on ModelScope (the hub said: %(detail)s). "
                "The default branch there is 'master'.") % {"revision": revision, "repo": repo_id, "detail": server_msg}
    elif status in (401, 403):
        msg = (_("ModelScope refused access to %(repo)s%(detail)s: the token given has no access to it.") if has_token
               else _("ModelScope refused access to %(repo)s%(detail)s: it may be private; set a ModelScope access "
                      "token.")) % {"repo": repo_id, "detail": f" ({server_msg})" if server_msg else ""}
    elif status == 404:
        msg = _("Model %(repo)s does not exist on ModelScope%(detail)s. Check the spelling of the id.") % {
            "repo": repo_id, "detail": f" ({server_msg})" if server_msg else ""}
    else:
        msg = _("ModelScope answered the listing of %(repo)s with an error (HTTP %(status)s, code %(code)s): "
                "%(detail)s") % {"repo": repo_id, "status": status, "code": code, "detail": server_msg or resp.text[:200]}
    return HubError(msg, hub=HUB, code=code, status=status)
