"""Files on disk: an upload streamed to a temp file next to its final place
(sha256 and line checks as the bytes arrive), renamed into place only when it
is whole and valid; output and error files appended as lines complete."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler
from django.utils.translation import gettext as _

from inference.batches.validate import Checker, file_max_bytes


def folder() -> Path:
    path = Path(settings.DATA_DIR) / "batches"
    path.mkdir(parents=True, exist_ok=True)
    return path


class Incoming:
    """A file being received: temp file, sha256, size and the line checker."""

    def __init__(self, filename: str = "input.jsonl"):
        self.filename = (filename or "input.jsonl")[:255]
        fd, self.temp = tempfile.mkstemp(prefix=".upload-", suffix=".part", dir=folder())
        self.fd = fd
        self.sha = hashlib.sha256()
        self.checker = Checker()
        self.max_bytes = file_max_bytes()
        self.too_large = False
        self.closed = False

    @property
    def size(self) -> int:
        return self.checker.size

    def write(self, chunk: bytes) -> None:
        if self.too_large or not chunk:
            return
        if self.checker.size + len(chunk) > self.max_bytes:
            self.too_large = True
            self.checker.size += len(chunk)
            return
        self.sha.update(chunk)
        self.checker.feed(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(self.fd, view):]

    def finish(self) -> None:
        if not self.too_large:
            self.checker.finish()
        os.fsync(self.fd)
        os.close(self.fd)
        self.closed = True

    def problem(self) -> str | None:
        if self.too_large:
            return _("The file is larger than %(n)d bytes (BATCH_FILE_MAX_BYTES); split it into smaller "
                     "batches.") % {"n": self.max_bytes}
        if not self.checker.ok:
            return _("The file has errors, nothing was stored: %(errors)s") % {"errors": self.checker.message()}
        return None

    def place(self, name: str) -> str:
        """Rename into place (atomic on one file system); the final path."""
        final = folder() / name
        os.replace(self.temp, final)
        dir_fd = os.open(folder(), os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return str(final)

    def discard(self) -> None:
        if not self.closed:
            os.close(self.fd)
            self.closed = True
        try:
            os.unlink(self.temp)
        except FileNotFoundError:
            pass


class BatchUploadHandler(FileUploadHandler):
    """Django upload handler: the multipart field "file" goes straight into an
    Incoming (checked and hashed per chunk), never into memory."""

    chunk_size = 1024 * 1024

    def __init__(self, request=None):
        super().__init__(request)
        self.incoming: Incoming | None = None

    def new_file(self, field_name, file_name, *args, **kwargs):
        super().new_file(field_name, file_name, *args, **kwargs)
        if field_name != "file" or self.incoming is not None:
            return  # any other file part is dropped
        self.incoming = Incoming(file_name)

    def receive_data_chunk(self, raw_data, start):
        if self.field_name == "file" and self.incoming is not None and not self.incoming.closed:
            self.incoming.write(raw_data)
        return None

    def file_complete(self, file_size):
        if self.field_name != "file" or self.incoming is None or self.incoming.closed:
            return None
        self.incoming.finish()
        return UploadedFile(file=None, name=self.file_name, size=file_size)

    def upload_interrupted(self):
        if self.incoming is not None:
            self.incoming.discard()
