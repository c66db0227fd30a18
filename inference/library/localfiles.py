"""Model files already on this host: re-verify a download, import a local folder or GGUF.

Both hash files in place (nothing is copied). An import never follows a link
out of the folder it imports, never reads /proc, /sys or /dev, and keeps to
IMPORT_ROOTS when that is set; every file is opened from the folder's
descriptor with O_NOFOLLOW, so a file swapped for a link after the check is
refused, not read. Plain Python, like the downloader it shares hashing with.
"""
from __future__ import annotations

import errno
import os
import stat
import threading
from dataclasses import dataclass, field
from typing import Callable, Sequence

from inference.library.downloader import PART_SUFFIX, VERIFIED_MANIFEST, DownloadError, hash_stream
from inference.library.hubs.base import safe_relative_path


@dataclass
class VerifyReport:
    ok: bool
    checked: int
    changed: list[dict] = field(default_factory=list)  # {path, expected, actual}
    missing: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if self.ok:
            return f"All {self.checked} files match their recorded sha256."
        parts = [f"{c['path']} changed (expected {c['expected']}, now {c['actual']})"
                 for c in self.changed] + [f"{m} is missing" for m in self.missing]
        return "; ".join(parts)


def verify_folder(dest_dir: str, recorded: dict[str, str], *,
                  cancel: threading.Event | None = None,
                  on_bytes: Callable[[int], None] | None = None) -> VerifyReport:
    """Re-hash every recorded file (path -> sha256) and report what changed.

    Like an import, it opens each file from the folder's descriptor one name at a
    time without following links: a file that became a link (or anything but a
    regular file) is reported as changed and never read, so no sha256 of a file
    outside the folder can reach the report."""
    report = VerifyReport(ok=True, checked=0)
    try:
        root_fd = os.open(dest_dir, os.O_RDONLY | _NOFOLLOW | _DIRECTORY)
    except OSError:
        report.missing.extend(sorted(recorded))
        report.ok = False
        return report
    try:
        for rel, expected in sorted(recorded.items()):
            safe_relative_path(rel)  # refuses "..", absolute and other unsafe names (links are met below)
            try:
                fd = _open_beneath(root_fd, rel)
            except OSError as exc:
                if exc.errno in _LINK_ERRNOS:
                    report.changed.append({"path": rel, "expected": expected.lower(),
                                           "actual": "a link now (not followed)"})
                else:
                    report.missing.append(rel)
                continue
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    report.changed.append({"path": rel, "expected": expected.lower(),
                                           "actual": "not a regular file now"})
                    continue
                actual = _hash_opened(fd, rel, cancel, on_bytes).sha256
            finally:
                os.close(fd)
            report.checked += 1
            if actual != expected.lower():
                report.changed.append({"path": rel, "expected": expected.lower(), "actual": actual})
    finally:
        os.close(root_fd)
    report.ok = not report.changed and not report.missing
    return report


@dataclass
class LocalFile:
    path: str  # relative to the imported folder (or the file name for a GGUF)
    size: int
    sha256: str


@dataclass
class LocalLink:
    """A symlink inside an imported folder that points inside the same folder:
    recorded as a link, never followed, hashed or counted as a weight."""
    path: str  # relative to the folder
    target: str  # where it points, relative to the folder


@dataclass
class LocalModel:
    root: str  # the folder, or the GGUF file itself (its real path)
    kind: str  # "folder" or "gguf"
    files: list[LocalFile]
    links: list[LocalLink] = field(default_factory=list)

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def recorded_hashes(self) -> dict[str, str]:
        return {f.path: f.sha256 for f in self.files}


_SKIP_NAMES = {VERIFIED_MANIFEST, ".DS_Store"}
# Never imported from, whatever IMPORT_ROOTS says: what is there is the host's
# and the panel's own state (/proc/self/environ), never a model.
REFUSED_TREES = ("/proc", "/sys", "/dev")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO swapped in must not hang the open
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_LINK_ERRNOS = {errno.ELOOP, errno.ENOTDIR, getattr(errno, "EMLINK", errno.ELOOP)}


def N_(message: str) -> str:
    """Marks a message for translation (`makemessages -k N_`); the web side
    translates it with the exception's params (inference.library.services)."""
    return message


class ImportRefused(DownloadError):
    """A path a local import may not read, or a folder it may not import.

    `code` says why and `rel` names the entry inside the folder (relative to
    it) when there is one. `template % params` is the message. Messages never
    say where a link points or give a resolved path nobody typed (/proc/self
    resolves to the process id), and a path outside the roots is refused with
    the same words whether or not it exists.
    """

    def __init__(self, template: str, code: str, **params):
        self.template = template
        self.code = code
        self.params = params
        self.rel = params.get("rel", "")
        super().__init__(template % params)


def _within(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip(os.sep) + os.sep)


def _check_allowed(real: str, roots: Sequence[str], shown: str) -> None:
    """Refused trees on the real path and on `shown` (the path as given); the
    roots on the real path only. Messages name `shown`, never `real`."""
    if any(_within(p, t) for p in (real, shown) for t in REFUSED_TREES):
        raise ImportRefused(N_("Imports never read from /proc, /sys or /dev."), "system_path")
    if roots and not any(_within(real, os.path.realpath(r)) for r in roots):
        raise ImportRefused(N_("%(path)s is outside the folders that imports may come from: %(roots)s "
                               "(IMPORT_ROOTS)."), "outside_roots", path=shown, roots=", ".join(roots))


def import_path_allowed(path: str, roots: Sequence[str] = ()) -> str:
    """The real path (links resolved) of `path` when a local import may read it.

    Refused: anything in /proc, /sys or /dev, as typed or once resolved, and,
    when `roots` are given, anything whose real path is outside them. Only
    names are resolved, nothing is opened: the answer is the same whether or
    not the path exists.
    """
    try:
        typed = os.path.normpath(os.path.abspath(os.path.expanduser(path)))
        real = os.path.realpath(typed)
    except (ValueError, OSError):  # a NUL byte, a name too long
        raise ImportRefused(N_("That is not a usable path on this host."), "bad_path") from None
    _check_allowed(real, roots, typed)
    return real


def _check_opened(fd: int, roots: Sequence[str], shown: str) -> None:
    """Where an opened file really is (Linux: /proc/self/fd), checked again: a
    parent folder swapped for a link between the check and the open is caught."""
    try:
        where = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return  # no /proc here: the O_NOFOLLOW opens below the folder are the guard
    if where.startswith("/"):
        _check_allowed(where.removesuffix(" (deleted)"), roots, shown)


def _open_beneath(root_fd: int, rel: str, *, directory: bool = False) -> int:
    """Open `rel` one name at a time from the folder's descriptor, never through
    a link (O_NOFOLLOW on every step), so nothing outside the folder is reached."""
    fd = root_fd
    parts = rel.split("/")
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = os.O_RDONLY | _NOFOLLOW | _NONBLOCK | (_DIRECTORY if directory or not last else 0)
            nxt = os.open(part, flags, dir_fd=fd)
            if fd != root_fd:
                os.close(fd)
            fd = nxt
    except BaseException:
        if fd != root_fd:
            os.close(fd)
        raise
    return fd


def _unreadable(rel: str, exc: OSError) -> ImportRefused:
    if exc.errno in _LINK_ERRNOS:
        return ImportRefused(N_("%(rel)s turned into a link while the import ran (an import never follows "
                                "links); check the folder and import again."), "link_changed", rel=rel)
    if exc.errno == errno.ENOENT:
        return ImportRefused(N_("%(rel)s disappeared while the import ran; import again."), "changed", rel=rel)
    return ImportRefused(N_("%(rel)s cannot be read by the panel's user (%(reason)s)."), "unreadable",
                         rel=rel, reason=exc.strerror or "error")


def _link_record(root: str, rel: str) -> LocalLink:
    """A link inside the folder, if it points inside it (only names are resolved);
    refused, naming the link, if it leads out."""
    target = os.path.realpath(os.path.join(root, *rel.split("/")))
    if _within(target, root):
        return LocalLink(rel, os.path.relpath(target, root).replace(os.sep, "/"))
    raise ImportRefused(N_("%(rel)s is a link that leads out of the folder; an import never follows links "
                           "out of its folder. Copy the file into the folder (or remove the link) and "
                           "import again."), "link_outside", rel=rel)


def _scan_folder(root_fd: int, root: str) -> tuple[list[LocalFile], list[LocalLink]]:
    """Every regular file (size, no hash yet) and link below the folder, without
    following any link. Hidden names, `.part` leftovers, FIFOs, sockets and
    device nodes are skipped."""
    files, links = [], []
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        try:
            dir_fd = root_fd if not rel_dir else _open_beneath(root_fd, rel_dir, directory=True)
        except OSError as exc:
            raise _unreadable(rel_dir, exc) from None
        try:
            with os.scandir(dir_fd) as it:
                names = sorted(e.name for e in it)
        except OSError as exc:
            raise _unreadable(rel_dir or ".", exc) from None
        try:
            for name in names:
                if name.startswith(".") or name in _SKIP_NAMES or name.endswith(PART_SUFFIX):
                    continue
                rel = f"{rel_dir}/{name}" if rel_dir else name
                try:
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue  # gone meanwhile
                except OSError as exc:
                    raise _unreadable(rel, exc) from None
                if stat.S_ISLNK(st.st_mode):
                    links.append(_link_record(root, rel))
                elif stat.S_ISDIR(st.st_mode):
                    if not any(_within(os.path.join(root, rel), t) for t in REFUSED_TREES):
                        pending.append(rel)
                elif stat.S_ISREG(st.st_mode):
                    files.append(LocalFile(rel, st.st_size, ""))
        finally:
            if dir_fd != root_fd:
                os.close(dir_fd)
    files.sort(key=lambda f: f.path)
    links.sort(key=lambda link: link.path)
    return files, links


def _scan(path: str, roots: Sequence[str]) -> tuple[LocalModel, int]:
    """The checked model (no hashes yet) and an open descriptor of its root."""
    real = import_path_allowed(path, roots)
    try:
        fd = os.open(real, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS - {errno.ENOTDIR}:
            raise ImportRefused(N_("%(path)s changed while it was being checked; import again."), "changed",
                                path=path) from None
        raise ImportRefused(N_("%(path)s does not exist on this host (or the panel's user cannot read it)."),
                            "not_found", path=path) from None
    try:
        _check_opened(fd, roots, path)
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            if os.pread(fd, 4, 0) != b"GGUF":
                raise ImportRefused(N_("%(path)s is not a GGUF file (it does not start with 'GGUF'). Import a "
                                       "GGUF file or a model folder with config.json."), "not_a_model", path=path)
            return LocalModel(real, "gguf", [LocalFile(os.path.basename(real), st.st_size, "")]), fd
        if not stat.S_ISDIR(st.st_mode):
            raise ImportRefused(N_("%(path)s is neither a GGUF file nor a model folder."), "not_a_model", path=path)
        files, links = _scan_folder(fd, real)
        if not any(f.path == "config.json" or ("/" not in f.path and f.path.endswith((".gguf", ".safetensors")))
                   for f in files):
            raise ImportRefused(N_("%(path)s holds no config.json, .safetensors or .gguf file at its top level; "
                                   "it does not look like a model folder."), "not_a_model", path=path)
        return LocalModel(real, "folder", files, links), fd
    except BaseException:
        os.close(fd)
        raise


def scan_local(path: str, *, roots: Sequence[str] = ()) -> LocalModel:
    """What `import_local` would hash (sizes, links), without reading any file:
    the web's check at request time. The worker checks it all again."""
    model, fd = _scan(path, roots)
    os.close(fd)
    return model


def _hash_opened(fd: int, rel: str, cancel, on_bytes) -> LocalFile:
    size = os.fstat(fd).st_size
    try:
        with open(fd, "rb", closefd=False) as fh:
            os.lseek(fd, 0, os.SEEK_SET)
            sha = hash_stream(fh, cancel=cancel, on_bytes=on_bytes)
    except OSError as exc:
        raise _unreadable(rel, exc) from None
    return LocalFile(rel, size, sha)


def import_local(path: str, *, roots: Sequence[str] = (), cancel: threading.Event | None = None,
                 on_bytes: Callable[[int], None] | None = None) -> LocalModel:
    """Hash a local model folder or a single GGUF file in place (no copy).

    The path is resolved and checked (`import_path_allowed`). Links inside the
    folder are never followed: one that points inside it is recorded as a link
    (not hashed, not counted), one that leads out refuses the import before
    any byte is read. Each file is opened from the folder's descriptor one
    name at a time with O_NOFOLLOW, so a file turned into a link after the
    check is refused, not read. `.part` leftovers and hidden files are skipped.
    """
    model, fd = _scan(path, roots)
    try:
        if model.kind == "gguf":
            return LocalModel(model.root, "gguf", [_hash_opened(fd, model.files[0].path, cancel, on_bytes)])
        files = []
        for f in model.files:
            try:
                file_fd = _open_beneath(fd, f.path)
            except OSError as exc:
                raise _unreadable(f.path, exc) from None
            try:
                if not stat.S_ISREG(os.fstat(file_fd).st_mode):
                    raise ImportRefused(N_("%(rel)s is no longer a regular file; import again."), "changed",
                                        rel=f.path)
                files.append(_hash_opened(file_fd, f.path, cancel, on_bytes))
            finally:
                os.close(file_fd)
        return LocalModel(model.root, "folder", files, model.links)
    finally:
        os.close(fd)
