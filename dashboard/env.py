"""Strict readers for settings that come from the environment.

A bad value is a start-up error that names the variable and says what would be
accepted, so nobody has to read a traceback to learn that DEBUG=maybe is wrong.
These helpers import nothing from Django: settings.py and the standalone runner
(which runs before Django is configured) share them.
"""
import os
import secrets
from pathlib import Path
from urllib.parse import urlsplit


class ConfigError(Exception):
    """A setting from the environment has a value Kiln cannot use."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def envbool(name, default):
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a yes/no value: use one of 1, 0, true, false, yes, no.")


def envchoice(name, default, choices):
    """One word out of `choices` (case does not matter); unset or empty gives `default`."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise ConfigError(f"{name}={raw!r} is not one of: {', '.join(choices)}.")
    return value


def envint(name, default, *, minimum=None, maximum=None):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number.") from None
    if minimum is not None and value < minimum or maximum is not None and value > maximum:
        raise ConfigError(f"{name}={value} is out of range: it must be between {minimum} and {maximum}.")
    return value


def envfloat(name, default, *, minimum=None, maximum=None):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number.") from None
    if minimum is not None and value < minimum or maximum is not None and value > maximum:
        raise ConfigError(f"{name}={value} is out of range: it must be between {minimum} and {maximum}.")
    return value


def envlist(name, default, *, allow_empty=False):
    """A comma-separated list. Set but empty is an error unless `allow_empty` (for lists
    that may well be empty, which docker compose passes as NAME= when .env leaves them out)."""
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    items = [item.strip() for item in raw.split(",") if item.strip()]
    if not items and not allow_empty:
        raise ConfigError(f"{name} is set but empty: give a comma-separated list, or unset it.")
    return items


def envpath(name, default):
    raw = os.environ.get(name)
    path = Path(raw).expanduser() if raw else Path(default)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{name}={str(path)!r} cannot be created: {exc.strerror}.") from None
    if not os.access(path, os.W_OK):
        raise ConfigError(f"{name}={str(path)!r} is not writable by this user.")
    return path.resolve()


def envurl(name, default, *, schemes):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    parts = urlsplit(raw.strip())
    if parts.scheme not in schemes:
        wanted = ", ".join(f"{s}://" for s in schemes)
        raise ConfigError(f"{name}={raw!r} must start with {wanted}.")
    if parts.scheme not in ("unix", "sqlite") and not parts.hostname:
        raise ConfigError(f"{name}={raw!r} has no host name.")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise ConfigError(f"{name}={raw!r} has a port that is not a number.") from None
    return raw.strip()


def envaddress(name, default):
    """An IP address (v4 or v6, no port, no name: another host must reach it as it is)."""
    import ipaddress

    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().strip("[]")
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an IP address: give this host's address on the network "
                          "the other Kiln hosts share, e.g. 10.0.0.12.") from None
    if address.is_unspecified:
        raise ConfigError(f"{name}={raw!r} is the wildcard address: give the address other hosts reach "
                          "this host at, e.g. 10.0.0.12.")
    return str(address)


def secret_key(data_dir):
    """SECRET_KEY from the environment, else one generated once and kept in DATA_DIR."""
    raw = os.environ.get("SECRET_KEY")
    if raw is not None:
        if len(raw) < 32:
            raise ConfigError("SECRET_KEY is shorter than 32 characters: use a long random value, or unset it.")
        return raw
    path = Path(data_dir) / "secret_key"
    if path.exists():
        return path.read_text().strip()
    key = secrets.token_urlsafe(50)
    # Write to a private temporary file first so a crash never leaves an empty key.
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key)
    os.replace(tmp, path)
    return key
