"""A fake model hub on loopback, imitating Hugging Face and ModelScope closely
enough for the downloader and the listing adapters to be tested for real.

One `FakeHub` runs two servers on 127.0.0.1 with free ports: the "hub" (API
and resolve endpoints of both hubs) and a "CDN" (another origin, where large
files are redirected to, as huggingface.co does to its CDN). Files can be
real bytes or generated: a pseudo-random stream from a seed, produced on the
fly, so a 3 GB file costs no disk on the server side.

Fault knobs (all per file path, consumed as they fire):
  rate_limit[path] = (times, retry_after)  -> 429 with Retry-After
  server_error[path] = times               -> 503
  cut_after[path] = [nbytes, ...]          -> connection closed mid-file
  corrupt[path] = times                    -> one wrong byte in the middle
  ignore_range = {path, ...}               -> 200 with the whole file
  stall[path] = (times, seconds)           -> headers, then silence (read timeout)
  throttle_bps                             -> slow sending (for kill tests)
Counters: bytes_sent[path], requests (list of dicts with host, path, auth).

Error answers imitate the hubs: HF sends X-Error-Code RepoNotFound (401
without a token, 404 with one), GatedRepo (401/403), RevisionNotFound (404),
EntryNotFound (404); ModelScope sends HTTP 404/403 with a JSON body
{"Code": ..., "Message": ..., "Success": false}.
"""
from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

GEN_BLOCK = (1 << 20) + 4099  # not a power of two, so patterns don't align with chunks


@dataclass
class FakeFile:
    data: bytes | None = None
    size: int = 0
    seed: int = 0
    lfs: bool = True
    _sha256: str | None = None
    _block: bytes | None = None

    @classmethod
    def of_bytes(cls, data: bytes, lfs: bool = False) -> "FakeFile":
        return cls(data=data, size=len(data), lfs=lfs)

    @classmethod
    def generated(cls, size: int, seed: int = 1, lfs: bool = True) -> "FakeFile":
        return cls(data=None, size=size, seed=seed, lfs=lfs)

    def _gen(self) -> bytes:
        if self._block is None:
            block = random.Random(self.seed).randbytes(GEN_BLOCK)
            self._block = block + block  # any window of GEN_BLOCK bytes is one slice
        return self._block

    def chunks(self, start: int, end: int, step: int = 1 << 20):
        """Yield the bytes [start, end) in pieces of at most `step`."""
        pos = start
        while pos < end:
            n = min(step, end - pos)
            if self.data is not None:
                yield memoryview(self.data)[pos:pos + n]
            else:
                n = min(n, GEN_BLOCK)
                off = pos % GEN_BLOCK
                yield memoryview(self._gen())[off:off + n]
            pos += n

    def content(self) -> bytes:
        return b"".join(bytes(c) for c in self.chunks(0, self.size))

    @property
    def sha256(self) -> str:
        if self._sha256 is None:
            h = hashlib.sha256()
            for c in self.chunks(0, self.size, 8 << 20):
                h.update(c)
            self._sha256 = h.hexdigest()
        return self._sha256

    @property
    def git_sha1(self) -> str:
        h = hashlib.sha1(b"blob %d\x00" % self.size)
        for c in self.chunks(0, self.size):
            h.update(c)
        return h.hexdigest()


@dataclass
class FakeRepo:
    revisions: dict = field(default_factory=dict)  # revision -> {path: FakeFile}
    gated: bool = False
    private: bool = False
    extra_listing: list = field(default_factory=list)  # raw paths listed but not served


class FakeHub:
    def __init__(self, token: str = "hf_good_token"):
        self.token = token
        self.repos: dict[str, FakeRepo] = {}
        self.rate_limit: dict[str, tuple[int, str]] = {}
        self.server_error: dict[str, int] = {}
        self.cut_after: dict[str, list[int]] = {}
        self.corrupt: dict[str, int] = {}
        self.ignore_range: set[str] = set()
        self.stall: dict[str, tuple[int, float]] = {}
        self.throttle_bps: int = 0
        self.page_size: int = 0  # HF tree pagination; 0 = one page
        self.bytes_sent: dict[str, int] = {}
        self.blobs: dict[str, tuple[str, FakeFile]] = {}  # CDN id -> (path, file)
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self._hub = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, "hub"))
        self._cdn = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, "cdn"))
        for s in (self._hub, self._cdn):
            s.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._hub.server_address[1]}"
        self.cdn_url = f"http://127.0.0.1:{self._cdn.server_address[1]}"
        self._threads = []

    # -- set-up -------------------------------------------------------------
    def add_repo(self, repo_id: str, files: dict[str, FakeFile], *,
                 revision: str = "main", gated: bool = False, private: bool = False,
                 extra_listing: list | None = None) -> FakeRepo:
        repo = self.repos.setdefault(repo_id, FakeRepo())
        repo.revisions[revision] = dict(files)
        repo.gated, repo.private = gated, private
        repo.extra_listing = list(extra_listing or [])
        return repo

    def start(self) -> "FakeHub":
        for s in (self._hub, self._cdn):
            t = threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.1},
                                 daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        for s in (self._hub, self._cdn):
            s.shutdown()
            s.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def total_sent(self) -> int:
        with self.lock:
            return sum(self.bytes_sent.values())

    # -- fault bookkeeping ---------------------------------------------------
    def _take(self, table: dict, path: str):
        """Consume one firing of a per-path fault; returns its value or None."""
        with self.lock:
            v = table.get(path)
            if v is None:
                return None
            if isinstance(v, list):
                if not v:
                    return None
                return v.pop(0)
            if isinstance(v, tuple):
                times, arg = v
                if times <= 0:
                    return None
                table[path] = (times - 1, arg)
                return arg
            if v <= 0:
                return None
            table[path] = v - 1
            return True


def _handler(hub: FakeHub, role: str):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like the real hubs

        def log_message(self, *args):  # keep test output clean
            pass

        def do_HEAD(self):
            self._route(head=True)

        def do_GET(self):
            self._route(head=False)

        # -- plumbing ---------------------------------------------------------
        def _auth(self) -> str | None:
            a = self.headers.get("Authorization", "")
            return a[len("Bearer "):] if a.startswith("Bearer ") else None

        def _send(self, status: int, body: bytes = b"", headers: dict | None = None,
                  ctype: str = "application/json"):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if body and self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status, obj, headers=None):
            self._send(status, json.dumps(obj).encode(), headers)

        def _hf_error(self, status, code, message):
            h = {"X-Error-Message": message}
            if code:
                h["X-Error-Code"] = code
            self._json(status, {"error": message}, h)

        def _ms_error(self, status, code, message):
            self._json(status, {"Code": code, "Message": message, "RequestId": "fake",
                                "Success": False})

        def _route(self, head: bool):
            u = urlsplit(self.path)
            path, query = unquote(u.path), parse_qs(u.query)
            with hub.lock:
                hub.requests.append({"role": role, "path": self.path,
                                     "auth": self.headers.get("Authorization"),
                                     "range": self.headers.get("Range")})
            try:
                if role == "cdn":
                    return self._cdn(path, query)
                if path == "/_stats":  # for bench/download.py, which runs us in a process
                    with hub.lock:
                        return self._json(200, {"bytes_sent": dict(hub.bytes_sent)})
                if path.startswith("/api/models/") and "/tree/" in path:
                    return self._hf_tree(path, query)
                if path.startswith("/api/v1/models/") and path.endswith("/repo/files"):
                    return self._ms_files(path, query)
                if path.startswith("/api/v1/models/") and path.endswith("/repo"):
                    return self._ms_download(path, query)
                if "/resolve/" in path:
                    return self._hf_resolve(path)
                self._send(404, b"not found", ctype="text/plain")
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        # -- repo lookup with the hubs' access rules -----------------------------
        def _hf_repo(self, repo_id, revision):
            """Return the file table, or send HF's error answer and return None."""
            token = self._auth()
            if token is not None and token != hub.token:
                self._hf_error(401, None, "Invalid credentials in Authorization header")
                return None
            repo = hub.repos.get(repo_id)
            if repo is None or (repo.private and token is None):
                # HF answers 401 to anonymous callers so as not to reveal private repos.
                self._hf_error(401 if token is None else 404, "RepoNotFound",
                               "Repository not found")
                return None
            if repo.gated and token is None:
                self._hf_error(401, "GatedRepo", "Access to model is restricted. You must "
                               "have access to it and be authenticated to access it.")
                return None
            if repo.gated and token == hub.token and repo_id.endswith("-not-accepted"):
                self._hf_error(403, "GatedRepo", "Access to model is restricted and you "
                               "are not in the authorized list.")
                return None
            if revision not in repo.revisions:
                self._hf_error(404, "RevisionNotFound", "Invalid rev id: " + revision)
                return None
            return repo, repo.revisions[revision]

        def _ms_repo(self, repo_id, revision):
            token = self._auth()
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._ms_error(404, 10010205001, f"model {repo_id} not found")
                return None
            if (repo.private or repo.gated) and token != hub.token:
                self._ms_error(403 if token else 401, 10010101004,
                               "get model info failed, err: unauthorized permission")
                return None
            if revision not in repo.revisions:
                self._ms_error(404, 10010205002, f"revision {revision} not found")
                return None
            return repo, repo.revisions[revision]

        # -- Hugging Face --------------------------------------------------------
        def _hf_tree(self, path, query):
            head, rest = path[len("/api/models/"):].split("/tree/", 1)
            repo_id, revision = head, rest.split("/", 1)[0]
            if self._fault_before_answer("__listing__"):
                return
            found = self._hf_repo(repo_id, revision)
            if found is None:
                return
            repo, files = found
            entries = []
            for p, f in sorted(files.items()):
                e = {"type": "file", "oid": f.git_sha1, "size": f.size, "path": p}
                if f.lfs:
                    e["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
                entries.append(e)
            dirs = sorted({p.rsplit("/", 1)[0] for p in files if "/" in p})
            entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d}
                        for d in dirs]
            for raw in repo.extra_listing:
                entries.append({"type": "file", "oid": "0" * 40, "size": 1, "path": raw})
            headers = {}
            if hub.page_size:
                start = int(query.get("cursor", ["0"])[0])
                page = entries[start:start + hub.page_size]
                if start + hub.page_size < len(entries):
                    nxt = (f"{hub.url}/api/models/{repo_id}/tree/{quote(revision, safe='')}"
                           f"?recursive=true&cursor={start + hub.page_size}")
                    headers["Link"] = f'<{nxt}>; rel="next"'
                entries = page
            self._json(200, entries, headers)

        def _hf_resolve(self, path):
            repo_part, rest = path.lstrip("/").split("/resolve/", 1)
            revision, _, file_path = rest.partition("/")
            found = self._hf_repo(repo_part, revision)
            if found is None:
                return
            f = found[1].get(file_path)
            if f is None:
                return self._hf_error(404, "EntryNotFound", f"{file_path} does not exist")
            if f.lfs:
                # Large files live on the CDN; HF answers 302 with the target.
                blob = hashlib.sha1(f"{repo_part}\0{revision}\0{file_path}".encode()).hexdigest()
                with hub.lock:
                    hub.blobs[blob] = (file_path, f)
                loc = f"{hub.cdn_url}/blobs/{blob}?sig=fake"
                return self._send(302, b"", {"Location": loc, "X-Linked-Size": str(f.size),
                                             "X-Linked-Etag": f'"{f.sha256}"'})
            self._serve(file_path, f)

        def _cdn(self, path, query):
            # /blobs/{id}: only blobs the hub redirected to exist here.
            with hub.lock:
                found = hub.blobs.get(path[len("/blobs/"):])
            if found is None:
                return self._send(404, b"no such blob", ctype="text/plain")
            self._serve(*found)

        # -- ModelScope ----------------------------------------------------------
        def _ms_files(self, path, query):
            repo_id = path[len("/api/v1/models/"):-len("/repo/files")]
            revision = query.get("Revision", ["master"])[0]
            if self._fault_before_answer("__listing__"):
                return
            found = self._ms_repo(repo_id, revision)
            if found is None:
                return
            repo, files = found
            out = []
            for p, f in sorted(files.items()):
                out.append({"Name": p.rsplit("/", 1)[-1], "Path": p, "Size": f.size,
                            "Sha256": f.sha256, "Type": "blob", "Revision": revision,
                            "IsLFS": f.lfs, "Mode": "33188", "Id": f.git_sha1})
            for d in sorted({p.rsplit("/", 1)[0] for p in files if "/" in p}):
                out.append({"Name": d, "Path": d, "Size": 0, "Sha256": "", "Type": "tree"})
            for raw in repo.extra_listing:
                out.append({"Name": raw, "Path": raw, "Size": 1, "Sha256": "0" * 64,
                            "Type": "blob"})
            self._json(200, {"Code": 200, "Data": {"Files": out}, "Message": "success",
                             "RequestId": "fake", "Success": True})

        def _ms_download(self, path, query):
            repo_id = path[len("/api/v1/models/"):-len("/repo")]
            revision = query.get("Revision", ["master"])[0]
            file_path = query.get("FilePath", [""])[0]
            found = self._ms_repo(repo_id, revision)
            if found is None:
                return
            f = found[1].get(file_path)
            if f is None:
                return self._ms_error(404, 10010205003, f"file {file_path} not found")
            self._serve(file_path, f)

        # -- bytes -----------------------------------------------------------------
        def _fault_before_answer(self, key) -> bool:
            retry_after = hub._take(hub.rate_limit, key)
            if retry_after is not None:
                self._json(429, {"error": "rate limited"}, {"Retry-After": retry_after})
                return True
            if hub._take(hub.server_error, key):
                self._json(503, {"error": "unavailable"})
                return True
            return False

        def _serve(self, key, f: FakeFile):
            if self._fault_before_answer(key):
                return
            start, end, status = 0, f.size, 200
            rng = self.headers.get("Range")
            if rng and key not in hub.ignore_range and rng.startswith("bytes="):
                a, _, b = rng[len("bytes="):].partition("-")
                start = int(a or 0)
                end = min(f.size, int(b) + 1) if b else f.size
                if start >= f.size:
                    return self._send(416, b"", {"Content-Range": f"bytes */{f.size}"})
                status = 206
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{f.sha256 if f.lfs else f.git_sha1}"')
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{f.size}")
            self.end_headers()
            if self.command == "HEAD":
                return
            stall = hub._take(hub.stall, key)
            if stall:
                time.sleep(stall)
            cut = hub._take(hub.cut_after, key)
            wrong_at = f.size // 2 if hub._take(hub.corrupt, key) else None
            pos = start
            t0 = time.monotonic()
            step = 64 << 10 if hub.throttle_bps else 1 << 20
            for chunk in f.chunks(start, end, step):
                if cut is not None and pos + len(chunk) > cut:
                    chunk = chunk[:max(0, cut - pos)]
                if wrong_at is not None and pos <= wrong_at < pos + len(chunk):
                    b = bytearray(chunk)
                    b[wrong_at - pos] ^= 0xFF
                    chunk = memoryview(bytes(b))
                self.wfile.write(chunk)
                with hub.lock:
                    hub.bytes_sent[key] = hub.bytes_sent.get(key, 0) + len(chunk)
                pos += len(chunk)
                if cut is not None and pos >= cut:
                    # Drop the connection with the body unfinished, like a flaky proxy.
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if hub.throttle_bps:
                    ahead = (pos - start) / hub.throttle_bps - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)

    return Handler


def main():
    """Run a fake hub from the command line (used by bench/download.py)."""
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    hub = FakeHub()
    hub.add_repo("bench/big", {"model.bin": FakeFile.generated(args.size, args.seed)})
    hub.start()
    print(json.dumps({"url": hub.url, "cdn_url": hub.cdn_url}), flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
