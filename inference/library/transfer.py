"""HTTP GETs for file bytes: http.client reading straight into reused buffers.

The hub APIs (listings, metadata) go through httpx. The file bytes do not:
measured on loopback with a 2 GB file (bench/download.py, 2 cores), httpx
received at 0.54-0.58x the speed of ``curl -o`` once sha256 was added,
because every read is allocated fresh (1 MiB reads: page faults) and h11
copies each body byte into and out of its buffer. http.client's
``readinto`` fills a buffer we own with no copy in Python; with sha256 on a
second thread (downloader._Sink) the download now runs as fast as one sha256
stream allows (bench/results/download_*.txt). This module is
that transport: keep-alive connections per origin, redirects followed by
hand (the caller decides what headers cross origins), environment proxies
and CA settings as httpx honours them.
"""
from __future__ import annotations

import base64
import http.client
import os
import ssl
import threading
import urllib.request
from dataclasses import dataclass
from urllib.parse import unquote, urljoin, urlsplit

# What a broken or refused connection raises here; callers retry on these.
TRANSPORT_ERRORS = (OSError, http.client.HTTPException)
REDIRECTS = (301, 302, 303, 307, 308)
USER_AGENT = "kiln-downloader"


class TransferError(Exception):
    """A URL or proxy this transport cannot use; the message says why."""


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, url: str) -> "Origin":
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TransferError(f"{url!r} is not an http(s) URL")
        return cls(parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))


def _ssl_context() -> ssl.SSLContext:
    """CA certificates as httpx picks them: SSL_CERT_FILE / SSL_CERT_DIR, else certifi's."""
    cafile, capath = os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")
    if cafile or capath:
        return ssl.create_default_context(cafile=cafile or None, capath=capath or None)
    try:
        import certifi
    except ImportError:
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=certifi.where())


@dataclass
class _Conn:
    http: http.client.HTTPConnection
    absolute: bool = False  # requests name the whole URL (a plain-HTTP proxy)
    proxy_headers: dict | None = None


class Connections:
    """Idle keep-alive connections per origin, shared by the download threads."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self._idle: dict[Origin, list[_Conn]] = {}
        self._lock = threading.Lock()
        self._ssl: ssl.SSLContext | None = None
        self._proxies = urllib.request.getproxies_environment()

    def _proxy_for(self, origin: Origin) -> str | None:
        proxy = self._proxies.get(origin.scheme) or self._proxies.get("all")
        if not proxy or urllib.request.proxy_bypass_environment(origin.host, self._proxies):
            return None
        return proxy

    def _new(self, origin: Origin) -> _Conn:
        proxy = self._proxy_for(origin)
        if origin.scheme == "https" and self._ssl is None:
            self._ssl = _ssl_context()
        if proxy is None:
            if origin.scheme == "https":
                return _Conn(http.client.HTTPSConnection(origin.host, origin.port, timeout=self.timeout,
                                                         context=self._ssl))
            return _Conn(http.client.HTTPConnection(origin.host, origin.port, timeout=self.timeout))
        p = urlsplit(proxy if "://" in proxy else "http://" + proxy)
        if p.scheme != "http" or not p.hostname:
            raise TransferError(f"proxy {proxy!r}: only http:// proxies are supported for file downloads")
        auth = {}
        if p.username:
            token = base64.b64encode(f"{unquote(p.username)}:{unquote(p.password or '')}".encode()).decode()
            auth = {"Proxy-Authorization": f"Basic {token}"}
        if origin.scheme == "https":
            conn = http.client.HTTPSConnection(p.hostname, p.port or 80, timeout=self.timeout, context=self._ssl)
            conn.set_tunnel(origin.host, origin.port, headers=auth)
            return _Conn(conn)
        return _Conn(http.client.HTTPConnection(p.hostname, p.port or 80, timeout=self.timeout),
                     absolute=True, proxy_headers=auth)

    def get(self, origin: Origin) -> tuple[_Conn, bool]:
        """(connection, reused?)."""
        with self._lock:
            idle = self._idle.get(origin)
            if idle:
                return idle.pop(), True
        return self._new(origin), False

    def put(self, origin: Origin, conn: _Conn) -> None:
        with self._lock:
            self._idle.setdefault(origin, []).append(conn)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.http.close()


class Answer:
    """An open response: status, headers, and its body through readinto()."""

    def __init__(self, conns: Connections, origin: Origin, conn: _Conn,
                 response: http.client.HTTPResponse, url: str):
        self._conns, self._origin, self._conn, self.response, self.url = conns, origin, conn, response, url
        self.status = response.status
        self.headers = response.headers  # case-insensitive .get()

    def readinto(self, buffer) -> int:
        """Bytes read into `buffer`; 0 at the end. A body cut short raises (IncompleteRead)."""
        return self.response.readinto(buffer)

    def close(self) -> None:
        """Give the connection back when the body was read whole, else drop it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self.response.isclosed() and not self.response.will_close:
            self._conns.put(self._origin, conn)
        else:
            self.response.close()
            conn.http.close()


def _send(conns: Connections, url: str, headers: dict) -> Answer:
    origin = Origin.of(url)
    parts = urlsplit(url)
    for attempt in (1, 2):
        conn, reused = conns.get(origin)
        target = url if conn.absolute else (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        hdrs = {"User-Agent": USER_AGENT, **headers, **(conn.proxy_headers or {})}
        try:
            conn.http.request("GET", target, headers=hdrs)
            return Answer(conns, origin, conn, conn.http.getresponse(), url)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            conn.http.close()
            # A kept-alive connection the server had closed: nothing was
            # answered, so one more try on a fresh connection is safe.
            if not reused or attempt == 2:
                raise
        except BaseException:
            conn.http.close()
            raise
    raise AssertionError("unreachable")


def open_get(conns: Connections, url: str, headers: dict, *, max_redirects: int = 10,
             strip_on_new_origin: tuple[str, ...] = ("authorization",)) -> Answer:
    """GET `url`, following redirects by hand: headers named in
    `strip_on_new_origin` are not sent past a redirect to another origin (a
    hub token must not reach a CDN). Returns the first non-redirect answer."""
    hdrs = dict(headers)
    current = url
    for _ in range(max_redirects + 1):
        answer = _send(conns, current, hdrs)
        location = answer.headers.get("location")
        if answer.status in REDIRECTS and location:
            answer.response.read()  # a redirect's body is small; read it so the connection can be reused
            answer.close()
            nxt = urljoin(current, location)
            if Origin.of(nxt) != Origin.of(current):
                hdrs = {k: v for k, v in hdrs.items() if k.lower() not in strip_on_new_origin}
            current = nxt
            continue
        return answer
    raise TransferError(f"{url}: more than {max_redirects} redirects")
