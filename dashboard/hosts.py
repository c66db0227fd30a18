"""Host and Origin checks for the two doors that skip Django's middleware.

Pages and /api/ get Django's Host check from request.get_host(). /v1/ is
served without the page middleware (inference/gateway/asgi.py) and a websocket
is no Django request at all, so both are checked here, from the ASGI scope,
with Django's own host validation (split_domain_port, validate_host) and the
same settings: ALLOWED_HOSTS for the Host header (USE_X_FORWARDED_HOST and
SECURE_PROXY_SSL_HEADER read as Django reads them), CSRF_TRUSTED_ORIGINS for
origins other than the panel's own.

Websockets: channels' AllowedHostsOriginValidator compares only the Origin's
host name, so a page on another port of the same host (any local web app) could
open the live feed with the user's cookie. SameOriginValidator accepts an Origin
only when scheme, host and port all equal the request's own (or a trusted
origin's), and only when the Host itself is allowed: a page on a rebinding
domain is same-origin with itself but its Host is not in ALLOWED_HOSTS.

A handshake without an Origin is let through to the consumers, which still
require the session cookie. Browsers always send Origin on a websocket
handshake (RFC 6455 4.1; it cannot be suppressed by a page), so a request
without one is from a program that holds the cookie itself and could read the
same data over HTTP; the Origin check guards against a foreign page borrowing
a browser's cookie, which cannot happen without an Origin.
"""

import logging
from urllib.parse import urlsplit

from django.conf import settings
from django.core.signals import setting_changed
from django.http.request import is_same_domain, split_domain_port, validate_host

security_log = logging.getLogger("django.security.DisallowedHost")

# Close code of a refused handshake (before accept a browser sees HTTP 403).
CLOSE_FORBIDDEN_ORIGIN = 4403
DEFAULT_PORTS = {"http": 80, "https": 443}


class _Rules:
    """The settings the checks need, parsed once. Rebuilt when a setting changes
    (override_settings) or ALLOWED_HOSTS is replaced (Django's test set-up
    assigns it without a signal)."""

    REMEMBERED = 256  # Host values whose verdict is kept; bounded, the header is the client's

    def __init__(self):
        self.source = settings.ALLOWED_HOSTS
        self.allowed_hosts = self.source
        if settings.DEBUG and not self.source:  # as HttpRequest.get_host
            self.allowed_hosts = [".localhost", "127.0.0.1", "[::1]"]
        self.forwarded_host = b"x-forwarded-host" if settings.USE_X_FORWARDED_HOST else None
        self.proxy_ssl = None
        if settings.SECURE_PROXY_SSL_HEADER:
            meta_name, self.proxy_ssl_value = settings.SECURE_PROXY_SSL_HEADER
            self.proxy_ssl = meta_name.removeprefix("HTTP_").lower().replace("_", "-").encode("latin-1")
        self.trusted = set()  # (scheme, host, port)
        self.trusted_subdomains = {}  # scheme -> [".example.com", ...], as CsrfViewMiddleware
        for origin in settings.CSRF_TRUSTED_ORIGINS:
            if "*" in origin:
                parts = urlsplit(origin)
                self.trusted_subdomains.setdefault(parts.scheme, []).append(parts.netloc.lstrip("*"))
            elif (normal := normal_origin(origin)) is not None:
                self.trusted.add(normal)
        self.verdicts: dict[str, bool] = {}

    def host_allowed(self, host: str) -> bool:
        verdict = self.verdicts.get(host)
        if verdict is None:
            domain, _ = split_domain_port(host)
            verdict = bool(domain) and validate_host(domain, self.allowed_hosts)
            if len(self.verdicts) >= self.REMEMBERED:
                self.verdicts.clear()
            self.verdicts[host] = verdict
        return verdict


_rules: _Rules | None = None


def rules() -> _Rules:
    global _rules
    if _rules is None or _rules.source is not settings.ALLOWED_HOSTS:
        _rules = _Rules()
    return _rules


def _forget(setting, **kwargs):
    global _rules
    if setting in ("ALLOWED_HOSTS", "DEBUG", "USE_X_FORWARDED_HOST", "SECURE_PROXY_SSL_HEADER",
                   "CSRF_TRUSTED_ORIGINS"):
        _rules = None


setting_changed.connect(_forget)


def request_host(scope, checks: _Rules | None = None) -> str:
    """The Host of an ASGI request as HttpRequest._get_raw_host finds it."""
    checks = checks or rules()
    host = forwarded = None
    for name, value in scope["headers"]:
        if name == b"host":
            # Repeated headers are joined with "," as ASGIRequest does, which no host matches.
            host = value.decode("latin-1") if host is None else f"{host},{value.decode('latin-1')}"
        elif name == checks.forwarded_host and forwarded is None:
            forwarded = value.decode("latin-1")
    if forwarded is not None:
        return forwarded
    if host is not None:
        return host
    server = scope.get("server")  # no Host header: PEP 333's reconstruction, as Django
    if not server:
        return "unknown"
    name, port = server[0], str(server[1] or "")
    default = "443" if scope.get("scheme") in ("https", "wss") else "80"
    return name if port in ("", default) else f"{name}:{port}"


def host_allowed(scope) -> tuple[bool, str]:
    """(whether the request's Host is in ALLOWED_HOSTS, that Host)."""
    checks = rules()
    host = request_host(scope, checks)
    return checks.host_allowed(host), host


def disallowed_host_message(host: str) -> str:
    shown = host if len(host) <= 100 else host[:100] + "…"
    return f"Invalid Host header {shown!r}: this server does not answer to that name (see ALLOWED_HOSTS)."


def normal_origin(origin: str) -> tuple[str, str, int] | None:
    """("https", "host", 443) for "https://host"; None for anything that is not
    a bare scheme://host[:port] origin ("null", paths, user info, bad ports)."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/") or parts.query \
            or parts.fragment or "@" in parts.netloc:
        return None
    return scheme, parts.hostname.lower().removesuffix("."), port or DEFAULT_PORTS[scheme]


def _header(scope, wanted: bytes) -> bytes | None:
    for name, value in scope["headers"]:
        if name == wanted:
            return value
    return None


def request_scheme(scope, checks: _Rules) -> str:
    """http or https, as HttpRequest.scheme (SECURE_PROXY_SSL_HEADER first)."""
    if checks.proxy_ssl is not None:
        value = _header(scope, checks.proxy_ssl)
        if value is not None:
            return "https" if value.decode("latin-1").split(",", 1)[0].strip() == checks.proxy_ssl_value else "http"
    return "https" if scope.get("scheme") in ("https", "wss") else "http"


def origin_allowed(scope) -> bool:
    """Whether a websocket handshake may go on: an allowed Host, and an Origin
    that is the request's own (scheme, host, port) or a trusted one."""
    checks = rules()
    host = request_host(scope, checks)
    if not checks.host_allowed(host):
        return False
    raw = _header(scope, b"origin")
    if raw is None:
        return True  # not a browser (see the module docstring); the consumer still wants the session
    origin = raw.decode("latin-1")
    theirs = normal_origin(origin)
    if theirs is None:
        return False
    if theirs == normal_origin(f"{request_scheme(scope, checks)}://{host}") or theirs in checks.trusted:
        return True
    netloc = urlsplit(origin).netloc
    return any(is_same_domain(netloc, pattern) for pattern in checks.trusted_subdomains.get(theirs[0], ()))


class SameOriginValidator:
    """ASGI middleware for websockets: refuse, before accept, a handshake whose
    Host or Origin fails origin_allowed."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            raise ValueError("SameOriginValidator only guards websockets")
        if origin_allowed(scope):
            return await self.application(scope, receive, send)
        message = await receive()
        if message["type"] == "websocket.connect":
            await send({"type": "websocket.close", "code": CLOSE_FORBIDDEN_ORIGIN})
