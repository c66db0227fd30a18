"""Requests per minute per key: a fixed one-minute window counted in Redis.

The counter is INCRemented in the same Redis round trip that reads the key
(keys.authenticate), named by the key's hash and the window's number, and
expires after two windows. A fixed window may let up to twice the limit
through across a window's edge; for a team panel that is fine, and it costs
nothing beyond the round trip authentication makes anyway.
"""

from __future__ import annotations

import math

WINDOW_S = 60


def window(now: float) -> int:
    return int(now // WINDOW_S)


def counter_name(hashed: str, now: float) -> str:
    return f"kiln:gw:rl:{hashed}:{window(now)}"


def retry_after(count: int, limit: int, now: float) -> int | None:
    """None if the request is within the limit, else seconds until the window resets."""
    if not limit or count <= limit:
        return None
    return max(1, math.ceil((int(now // WINDOW_S) + 1) * WINDOW_S - now))
