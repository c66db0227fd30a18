"""Requests per minute per key: a fixed one-minute window counted in Redis
(INCR + EXPIRE in one round trip). A fixed window may let up to twice the
limit through across a window edge; for a team panel that is fine and costs
one Redis call per request."""

from __future__ import annotations

import math
import time

from inference.gateway.clients import redis

WINDOW_S = 60


async def hit(key_id: int, limit: int, now: float | None = None) -> int | None:
    """Count one request; None if allowed, else the seconds until the window resets."""
    if not limit:
        return None
    now = time.time() if now is None else now
    window = int(now // WINDOW_S)
    name = f"kiln:gw:rl:{key_id}:{window}"
    pipe = redis().pipeline(transaction=False)
    pipe.incr(name)
    pipe.expire(name, WINDOW_S * 2)
    count, _ = await pipe.execute()
    if count > limit:
        return max(1, math.ceil((window + 1) * WINDOW_S - now))
    return None
