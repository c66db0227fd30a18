"""The sign-in throttle: failed sign-ins counted per account (from each address)
and per client address.

The counts live in Redis (settings.REDIS_URL, which every Kiln process already
uses), so every web worker sees the same numbers. Each failure adds one to the
account's count from that address and to the address's own count, and starts
that count's cool-off again (LOGIN_COOLOFF_S). Once a count reaches its limit,
sign-in to that account from that address, or anything from that address, is
refused without checking the password until the key expires. Refused attempts
are not counted. The account's count is per address so that nobody elsewhere
can keep its owner locked out: guessing from one address stops after
LOGIN_FAILURES_PER_ACCOUNT, from many after LOGIN_FAILURES_PER_ADDRESS each,
and the owner's own address is never affected by someone else's failures.
The remaining seconds are the key's time to live.

A successful sign-in clears its account's count, not its address's: otherwise
one valid (viewer) account would let an address guess other passwords forever.

When Redis does not answer, sign-in goes on unthrottled and the error is
logged: Kiln's operators must be able to sign in to see that Redis is down.
"""
import functools
import hashlib
import logging
import math
from dataclasses import dataclass

import redis
from django.conf import settings

log = logging.getLogger(__name__)

KEY = "kiln:signin:failures:{scope}:{value}"


@dataclass(frozen=True)
class Throttle:
    scope: str  # "account" or "address"
    retry_after: int  # seconds until sign-in is allowed again


def client_address(request):
    """The address a sign-in comes from: REMOTE_ADDR. Behind a reverse proxy that
    is the proxy's own address, unless the proxy is listed in TRUSTED_PROXIES:
    then the nearest X-Forwarded-For hop that is not a trusted proxy."""
    address = request.META.get("REMOTE_ADDR", "")
    trusted = settings.TRUSTED_PROXIES
    if address in trusted:
        hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
        for hop in reversed(hops):
            address = hop
            if hop not in trusted:
                break
    return address


@functools.cache
def _redis():
    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2)


def _counters(username, address):
    # Usernames differ only in case for nobody (AccountCreateForm refuses that),
    # so "Olga" and "olga" share a count; hashed to keep the key short and plain.
    account = hashlib.sha256(f"{(username or '').strip().casefold()}|{address}".encode()).hexdigest()[:32]
    return [
        (KEY.format(scope="account", value=account), settings.LOGIN_FAILURES_PER_ACCOUNT, "account"),
        (KEY.format(scope="address", value=address), settings.LOGIN_FAILURES_PER_ADDRESS, "address"),
    ]


def throttled(username, address):
    """A Throttle while sign-in is refused for this account or from this address, else None."""
    counters = _counters(username, address)
    try:
        pipe = _redis().pipeline(transaction=False)
        for key, _limit, _scope in counters:
            pipe.get(key)
            pipe.pttl(key)
        answers = pipe.execute()
    except redis.RedisError as exc:
        log.error("sign-in throttle unavailable, failed sign-ins are not limited: Redis: %s", exc)
        return None
    worst = None
    for (_key, limit, scope), count, pttl in zip(counters, answers[0::2], answers[1::2]):
        if count is None or int(count) < limit:
            continue
        seconds = math.ceil(pttl / 1000) if pttl > 0 else settings.LOGIN_COOLOFF_S
        if worst is None or seconds > worst.retry_after:
            worst = Throttle(scope, max(seconds, 1))
    return worst


def record_failure(username, address):
    """Count one failed sign-in against the account and the address; each count
    expires LOGIN_COOLOFF_S after its latest failure."""
    try:
        pipe = _redis().pipeline(transaction=True)
        for key, _limit, _scope in _counters(username, address):
            pipe.incr(key)
            pipe.expire(key, settings.LOGIN_COOLOFF_S)
        pipe.execute()
    except redis.RedisError as exc:
        log.error("sign-in throttle unavailable, failure not counted: Redis: %s", exc)


def record_success(username, address):
    try:
        _redis().delete(_counters(username, address)[0][0])
    except redis.RedisError as exc:
        log.error("sign-in throttle unavailable: Redis: %s", exc)
