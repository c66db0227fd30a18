"""API keys: create (the secret is returned once), revoke, authenticate.

Authentication runs on every gateway request, so it reads a Redis copy of the
key's row (kiln:gw:key:<sha256>, 60 s), filled from the database on a miss;
revoking deletes that copy, so the next request anywhere sees the revocation.

`vouched` lets the gateway overlap that Redis round trip with opening the
engine's request, for keys this process has just seen valid and under their
limit (see views._proxy). Redis still decides every request.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from inference.gateway import ratelimit
from inference.gateway.resp import Script
from inference.models import ApiKey

KEY_PREFIX = "kiln-"
CACHE_TTL_S = 60
MAX_RATE_LIMIT = 1_000_000  # requests per minute; far above any engine, and within a 32-bit column

logger = logging.getLogger(__name__)


class KeyFormError(ValueError):
    pass


@dataclass
class _Seen:
    info: "KeyInfo"
    window: int  # the rate-limit window of `count`
    count: int  # the key's requests in that window, as of this process's last check
    at: float


# Per process, by hashed key: what the last Redis check said.
_seen: dict[str, _Seen] = {}
SEEN_MAX = 10_000
VOUCH_FOR_S = 10.0


@dataclass(frozen=True)
class KeyInfo:
    id: int
    user_id: int
    allowed_models: tuple[str, ...]
    rate_limit: int

    def allows(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def cache_key(hashed: str) -> str:
    return f"kiln:gw:key:{hashed}"


# ---------------------------------------------------------------- services


def key_create(*, user, name: str, allowed_models=(), rate_limit: int = 60) -> tuple[ApiKey, str]:
    """Create a key for `user`; returns the row and the secret (never stored)."""
    name = (name or "").strip()
    if not name:
        raise KeyFormError(_("Give the key a name, e.g. the tool or person that will use it."))
    if len(name) > 100:
        raise KeyFormError(_("The key's name is longer than %(max)s characters; shorten it.") % {"max": 100})
    if "\x00" in name:
        raise KeyFormError(_("The key's name must not contain a NUL character (\\x00)."))
    if rate_limit is None or int(rate_limit) < 0:
        raise KeyFormError(_("The rate limit is requests per minute: 0 (unlimited) or more."))
    if int(rate_limit) > MAX_RATE_LIMIT:  # PostgreSQL's integer column refuses more than 2**31 - 1
        raise KeyFormError(_("The rate limit is at most %(max)s requests per minute (0 = unlimited).")
                           % {"max": f"{MAX_RATE_LIMIT:,}"})
    models = sorted({m.strip() for m in allowed_models if m and m.strip()})
    if any("\x00" in m for m in models):
        raise KeyFormError(_("A model name must not contain a NUL character (\\x00)."))
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(user=user, name=name, prefix=secret[:12], hashed_key=hash_key(secret),
                                allowed_models=models, rate_limit=int(rate_limit))
    return key, secret


def key_revoke(*, key: ApiKey, by) -> bool:
    """Revoke `key` (False if it already was). The Redis copy goes at commit."""
    updated = ApiKey.objects.filter(pk=key.pk, revoked__isnull=True).update(revoked=timezone.now(), revoked_by=by)
    _drop_copies([key.hashed_key], quiet=False)
    return bool(updated)


def forget_user_keys(user) -> None:
    """Drop the Redis copies of a user's keys at commit (their account was disabled or
    enabled): the next request with one reads the database, which refuses an inactive owner."""
    _drop_copies(list(ApiKey.objects.filter(user=user).values_list("hashed_key", flat=True)), quiet=True)


def _drop_copies(hashes: list[str], *, quiet: bool) -> None:
    """Forget these keys' vouches in this process now, and their Redis copies at commit."""
    for hashed in hashes:
        _seen.pop(hashed, None)
    transaction.on_commit(lambda: [forget(hashed, quiet=quiet) for hashed in hashes])


def forget(hashed: str, quiet: bool = False) -> None:
    """Delete the key's Redis copy. `quiet`: a Redis that does not answer is logged,
    not raised (its copy expires by itself; the database already says no)."""
    import redis as redis_lib
    from django.conf import settings

    try:
        redis_lib.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=3).delete(cache_key(hashed))
    except redis_lib.RedisError as exc:
        if not quiet:
            raise
        logger.warning("could not drop a key's cached copy (it expires by itself): %s", exc)


# ---------------------------------------------------------------- authentication


def parse_bearer(header: str) -> str | None:
    """The key in an ``Authorization: Bearer …`` header value; None if there is none."""
    if header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    return None


def bearer(request) -> str | None:
    return parse_bearer(request.headers.get("Authorization", ""))


def _well_formed(secret: str) -> bool:
    return secret.startswith(KEY_PREFIX) and len(secret) <= 200


def _load(hashed: str) -> dict:
    from django.db import close_old_connections

    close_old_connections()
    row = (ApiKey.objects.filter(hashed_key=hashed)
           .values("id", "user_id", "allowed_models", "rate_limit", "revoked", "user__is_active").first())
    if row is None or row["revoked"] is not None or not row["user__is_active"]:
        return {"active": False}
    return {"active": True, "id": row["id"], "user_id": row["user_id"],
            "allowed": list(row["allowed_models"] or []), "limit": row["rate_limit"]}


# One round trip, one command: read the key's copy and, for a known key,
# count the request in its rate-limit window (a pipeline of GET, INCR and
# EXPIRE costs three commands' worth of client CPU).
_AUTH_SCRIPT = """
local info = redis.call('GET', KEYS[1])
if info and ARGV[1] == '1' then
  local n = redis.call('INCR', KEYS[2])
  if n == 1 then redis.call('EXPIRE', KEYS[2], ARGV[2]) end
  return {info, n}
end
return {info, 0}
"""
_script = {}
_AUTH = Script(_AUTH_SCRIPT)


async def authenticate(secret: str, count: bool = True, hashed: str | None = None
                       ) -> tuple[KeyInfo | None, int | None]:
    """The active key for `secret` (None: unknown, revoked, or its user
    disabled) and, if it is over its rate limit, the seconds to wait.
    `hashed` is hash_key(secret), where the caller has it already."""
    from inference.gateway.clients import lean, redis

    if not _well_formed(secret):
        return None, None
    hashed = hashed or hash_key(secret)
    now = time.time()
    counter = ratelimit.counter_name(hashed, now)
    keys_, args = [cache_key(hashed), counter], ["1" if count else "0", ratelimit.WINDOW_S * 2]
    fast = lean()
    if fast is not None:
        raw, n = await fast.evalsha(_AUTH, keys_, args)
    else:
        client = redis()
        script = _script.get(id(client))
        if script is None:
            script = _script[id(client)] = client.register_script(_AUTH_SCRIPT)
        raw, n = await script(keys=keys_, args=args)
    if raw is None:  # not cached: read the database, cache, count
        client = redis()
        data = await sync_to_async(_load, thread_sensitive=False)(hashed)
        pipe = client.pipeline(transaction=False)
        pipe.set(cache_key(hashed), json.dumps(data), ex=CACHE_TTL_S)
        if count:
            pipe.incr(counter)
            pipe.expire(counter, ratelimit.WINDOW_S * 2)
        n = (await pipe.execute() + [0])[1]
    else:
        data = json.loads(raw)
    if not data.get("active"):
        _seen.pop(hashed, None)
        return None, None
    info = KeyInfo(data["id"], data["user_id"], tuple(data["allowed"]), int(data["limit"]))
    if count:
        if len(_seen) >= SEEN_MAX:
            _seen.clear()
        _seen[hashed] = _Seen(info, ratelimit.window(now), n, time.monotonic())
    return info, ratelimit.retry_after(n, info.rate_limit, now) if count else None


def vouched(secret: str, hashed: str | None = None) -> KeyInfo | None:
    """The key's info if this process checked it in Redis less than VOUCH_FOR_S
    ago, found it active, and its next request stays under its rate limit
    (with one request to spare for other web processes); otherwise None.

    Only a hint: a request with a vouched key may be sent to the engine while
    `authenticate` runs, and authenticate's answer still decides what the
    client gets. A key never seen valid (a guessed or mistyped one) is not
    vouched for, so it cannot reach an engine at all.
    """
    if not _well_formed(secret):
        return None
    seen = _seen.get(hashed or hash_key(secret))
    if seen is None or time.monotonic() - seen.at > VOUCH_FOR_S:
        return None
    limit = seen.info.rate_limit
    if limit and seen.window == ratelimit.window(time.time()) and seen.count + 2 > limit:
        return None
    return seen.info
