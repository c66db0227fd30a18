"""Usage per minute, per key (or user) and deployment: counted in memory,
written about once a second.

Write load: a burst of 64 streams finishing together costs one UPDATE (or
INSERT) per (minute, key, deployment) at the next flush instead of 64
INSERTs on the request path; a request never waits for the database to
record its usage. A crash of the web process loses at most the last
second's counts.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections import defaultdict

from asgiref.sync import sync_to_async
from django.db import close_old_connections, transaction
from django.db.models import F
from django.utils import timezone

from inference.models import ApiKey, UsageRecord

log = logging.getLogger(__name__)
FLUSH_INTERVAL_S = 1.0

# (minute, key_id, user_id, deployment_id, model) -> [requests, errors, prompt, completion]
_pending: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
_last_used: dict[int, dt.datetime] = {}
_flusher: asyncio.Task | None = None


def record(*, key_id, user_id, deployment_id, model: str, prompt_tokens: int = 0, completion_tokens: int = 0,
           error: bool = False) -> None:
    """Count one request (call from the event loop; never blocks)."""
    global _flusher
    now = timezone.now()
    minute = now.replace(second=0, microsecond=0)
    counts = _pending[(minute, key_id, user_id, deployment_id, model)]
    counts[0] += 1
    counts[1] += int(bool(error))
    counts[2] += max(0, int(prompt_tokens or 0))
    counts[3] += max(0, int(completion_tokens or 0))
    if key_id:
        _last_used[key_id] = now
    if _flusher is None or _flusher.done():
        _flusher = asyncio.get_running_loop().create_task(_flush_loop())


async def _flush_loop() -> None:
    while _pending or _last_used:
        await asyncio.sleep(FLUSH_INTERVAL_S)
        await flush()


async def flush() -> None:
    batch, used = dict(_pending), dict(_last_used)
    _pending.clear()
    _last_used.clear()
    if batch or used:
        try:
            await sync_to_async(write, thread_sensitive=False)(batch, used)
        except Exception:  # the database is down: keep the counts for the next try
            log.exception("gateway usage: could not write %d buckets; retrying", len(batch))
            for bucket, counts in batch.items():
                for i, n in enumerate(counts):
                    _pending[bucket][i] += n
            for k, t in used.items():
                _last_used.setdefault(k, t)


def write(batch: dict[tuple, list[int]], used: dict[int, dt.datetime]) -> None:
    close_old_connections()
    try:
        with transaction.atomic():
            for (minute, key_id, user_id, deployment_id, model), (req, err, pt, ct) in batch.items():
                updated = UsageRecord.objects.filter(
                    minute=minute, key_id=key_id, user_id=user_id, deployment_id=deployment_id, model_name=model,
                ).update(requests=F("requests") + req, errors=F("errors") + err,
                         prompt_tokens=F("prompt_tokens") + pt, completion_tokens=F("completion_tokens") + ct)
                if not updated:
                    UsageRecord.objects.create(minute=minute, key_id=key_id, user_id=user_id,
                                               deployment_id=deployment_id, model_name=model, requests=req,
                                               errors=err, prompt_tokens=pt, completion_tokens=ct)
            for key_id, at in used.items():
                ApiKey.objects.filter(pk=key_id).update(last_used=at)
    finally:
        close_old_connections()
