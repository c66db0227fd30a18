"""Secrets at rest: webhook URLs (they carry tokens), signing secrets, SMTP passwords.

Fernet (AES-128-CBC + HMAC-SHA256, from the ``cryptography`` package) with a key
derived by HKDF from KILN_SECRET_KEY, else Django's SECRET_KEY. To rotate: set the
new key in KILN_SECRET_KEY and the old one(s) in KILN_OLD_SECRET_KEYS (comma
separated): MultiFernet reads with any of them and writes with the first, so
each secret moves to the new key the next time its channel is saved.
"""
from __future__ import annotations

import base64
import functools
import os

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

PREFIX = "fernet:"


class SecretUnreadable(Exception):
    """The stored secret was encrypted with a key this process does not have."""


def _derive(raw: str) -> Fernet:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"kiln-alerts", info=b"channel secrets").derive(
        raw.encode("utf-8"))
    return Fernet(base64.urlsafe_b64encode(key))


@functools.cache
def _fernet() -> MultiFernet:
    current = os.environ.get("KILN_SECRET_KEY") or settings.SECRET_KEY
    old = [k.strip() for k in os.environ.get("KILN_OLD_SECRET_KEYS", "").split(",") if k.strip()]
    return MultiFernet([_derive(current)] + [_derive(k) for k in old])


def encrypt(plain: str) -> str:
    if not plain:
        return ""
    return PREFIX + _fernet().encrypt(plain.encode("utf-8")).decode("ascii")


def decrypt(stored: str) -> str:
    if not stored:
        return ""
    if not stored.startswith(PREFIX):
        raise SecretUnreadable("the stored value is not an encrypted secret")
    try:
        return _fernet().decrypt(stored[len(PREFIX):].encode("ascii")).decode("utf-8")
    except InvalidToken:
        raise SecretUnreadable("the secret was encrypted with another key (was SECRET_KEY changed? "
                               "put the old one in KILN_OLD_SECRET_KEYS)") from None


def masked(plain: str) -> str:
    """What a page may show of a secret: that it is set, and its last 4 characters."""
    if not plain:
        return ""
    tail = plain[-4:] if len(plain) >= 12 else ""
    return f"•••• {tail}".strip()
