"""Loopback receivers for the alert channels: an HTTP server that records each
request (path, query, headers, raw body, arrival time) and answers as the
platform would, and an SMTP server (aiosmtpd) with STARTTLS / implicit TLS and
a login, using a self-signed certificate made at test time."""
from __future__ import annotations

import datetime as dt
import ipaddress
import json
import queue
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Received:
    path: str
    query: dict
    headers: dict
    body: bytes
    at: float  # time.time() on arrival
    raw_query: str = ""  # the query string as it came, before any decoding

    def json(self):
        return json.loads(self.body)


@dataclass
class Receiver:
    """A loopback HTTP receiver. ``answer`` is (status, body) or a callable(Received) -> (status, body);
    ``delay_s`` makes it slow."""

    answer: object = (200, b'{"errcode":0,"errmsg":"ok"}')
    delay_s: float = 0.0
    received: "queue.Queue[Received]" = field(default_factory=queue.Queue)
    all: list = field(default_factory=list)

    def start(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                parsed = urllib.parse.urlsplit(self.path)
                item = Received(parsed.path, urllib.parse.parse_qs(parsed.query, keep_blank_values=True),
                                {k.lower(): v for k, v in self.headers.items()}, body, time.time(),
                                raw_query=parsed.query)
                if receiver.delay_s:
                    time.sleep(receiver.delay_s)
                status, out = receiver.answer(item) if callable(receiver.answer) else receiver.answer
                receiver.all.append(item)
                receiver.received.put(item)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except OSError:
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def get(self, timeout=10.0) -> Received:
        return self.received.get(timeout=timeout)

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 / localhost and its key, written as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class SmtpReceiver:
    """aiosmtpd on 127.0.0.1 with a login (user / password) and STARTTLS or implicit TLS."""

    def __init__(self, folder: Path, *, implicit_tls=False, user="kiln", password="s3cret-pass"):
        from aiosmtpd.controller import Controller
        from aiosmtpd.smtp import AuthResult, LoginPassword

        self.cert, self.key = self_signed_cert(folder)
        self.messages: "queue.Queue" = queue.Queue()
        self.logins: list = []
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        outer = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
                outer.messages.put(envelope)
                return "250 OK"

        def authenticator(server, session, envelope, mechanism, auth_data):
            ok = isinstance(auth_data, LoginPassword) and auth_data.login.decode() == user \
                and auth_data.password.decode() == password
            outer.logins.append((auth_data.login.decode(), ok))
            return AuthResult(success=ok, handled=False)

        from tests.helpers import free_port

        self.port = free_port()
        kwargs = dict(hostname="127.0.0.1", port=self.port, authenticator=authenticator, auth_require_tls=True)
        if implicit_tls:
            # aiosmtpd does not count an implicit-TLS connection as TLS for auth_require_tls;
            # the whole connection is TLS anyway.
            kwargs.update(ssl_context=context, auth_require_tls=False)
        else:
            kwargs.update(tls_context=context, require_starttls=True)
        self.controller = Controller(Handler(), **kwargs)

    def start(self):
        self.controller.start()
        return self

    def stop(self):
        self.controller.stop()
