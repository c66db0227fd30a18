"""What the model library's JSON API takes and returns."""
from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import Field

from dashboard.api import Count, Schema, Text


class HubRequest(Schema):
    """A repository on a hub, and which of its files: the download form and its preview.
    Text is at most as long as the row's column that keeps it."""

    hub: Optional[Text] = Field(None, max_length=20)
    source: Optional[Text] = Field(None, max_length=20)  # the older name of `hub`
    repo_id: Optional[Text] = Field(None, max_length=300)
    revision: Optional[Text] = Field(None, max_length=200)
    include: Union[Text, list[Text], None] = None
    exclude: Union[Text, list[Text], None] = None
    endpoint: Optional[Text] = Field(None, max_length=500)
    token: Optional[Text] = Field(None, max_length=500)


class ImportRequest(Schema):
    path: Text = Field("", max_length=1000)
    name: Text = Field("", max_length=300)


class ActionRequest(Schema):
    token: Text = Field("", max_length=500)  # resume: a hub token for a gated model, kept until the download is ready


class Actions(Schema):
    cancel: bool
    resume: bool
    reverify: bool
    delete: bool


class ModelRow(Schema):
    """A model on the list (and in its websocket message)."""

    id: int
    name: str
    source: str
    source_label: str
    repo_id: str
    revision: str
    host: str
    path: str
    format: str
    job: str
    status: str
    status_label: str
    colour: str
    stale: bool
    cancel_requested: bool
    bytes_done: int
    bytes_total: int
    bytes_transferred: int
    percent: Optional[float]
    speed: float
    eta_seconds: Optional[float]
    error: str
    created: Optional[str]
    finished: Optional[str]
    verified_at: Optional[str]
    actions: Actions


class ModelDetail(ModelRow):
    """Everything about a model. No token, ever."""

    endpoint: str
    include: list[str]
    exclude: list[str]
    folder: str
    files: list[Any]  # JSON the row stores as it came; the page skips entries that are not objects
    file_progress: list[Any]
    recorded_hashes: dict[str, str]
    meta: dict[str, Any]
    weight_bytes: Optional[int]
    verify_report: dict[str, Any]
    started: Optional[str]
    has_token: bool


class Disk(Schema):
    folder: str
    free: Count
    total: Count


class ModelList(Schema):
    models: list[ModelRow]
    disk: Disk


class ModelOut(Schema):
    model: ModelDetail


class PreviewFile(Schema):
    path: str
    size: int
    sha256: Optional[str]
    git_sha1: Optional[str]


class Preview(Schema):
    """What a download would fetch, and whether it fits on the disk."""

    source: str
    repo_id: str
    revision: str
    endpoint: str
    folder: str
    files: list[PreviewFile]
    total_size: int
    space: dict[str, Any]
    fits: bool
    message: str


class PreviewOut(Schema):
    preview: Preview


class Deleted(Schema):
    deleted: int
    files_removed: int
