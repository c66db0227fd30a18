"""The one job runner shared by every area: downloads, launches and stops,
benchmarks, and whatever later runs in a worker.

A job is a row the UI reads (status, progress, started, finished, error); the
Celery task only carries the row's id. Three steps are the same for every kind
of row, so they are written here once:

- `enqueue`: send the task once the transaction that wrote the row commits (a
  worker must never look for a row it cannot see yet); when the broker does
  not answer, the row's own failure writer records why, and nothing is raised
  to the web request.
- `claim`: before any work, a conditional update takes the row; zero rows
  updated means it was cancelled meanwhile or another worker has it.
- `run_with_progress` and `publish`: the work runs in a thread of its own while
  the task's thread (which owns the database connection) writes progress to
  the row and pushes it to open pages every few seconds.

Which fields a row has and what its statuses are stays with its area; these
functions take querysets and callables, never a particular model.
"""
import logging
import threading

import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from kombu.exceptions import OperationalError as BrokerError

from monitoring.consumers import LIVE_GROUP

logger = logging.getLogger(__name__)

# What sending a task raises when Redis is down or refuses the connection.
BROKER_ERRORS = (BrokerError, redis.RedisError, OSError)


def enqueue(task, row_id, *, queue, on_refused):
    """Queue `task(row_id)` on `queue` after the current transaction commits
    (at once outside a transaction). When the broker does not answer,
    `on_refused(row_id, reason)` writes the reason on the row instead of the
    request failing with a 500."""
    transaction.on_commit(lambda: send(task, row_id, queue=queue, on_refused=on_refused))


def send(task, row_id, *, queue, on_refused):
    """Queue `task(row_id)` now; False (after `on_refused`) when the broker did not answer."""
    try:
        task.apply_async((row_id,), queue=queue)
    except BROKER_ERRORS as exc:
        logger.warning("%s #%s not queued: %s", task.name, row_id, exc)
        on_refused(row_id, f"Could not queue the job: Redis at {settings.REDIS_URL} did not answer ({exc}).")
        return False
    return True


def claim(queryset, **fields):
    """Claim before work: update the rows `queryset` selects (one row, in the
    state a worker may take it from) with `fields`. True when this caller got
    it; False when the row was cancelled, deleted, or claimed by someone else."""
    return queryset.update(**fields) > 0


def publish(payload):
    """One message to every open page (consumers only forward it). The row is
    the record, so a channel layer that is down is logged, never raised: a
    missed message only delays a progress bar until the next one or the page's
    backup poll."""
    try:
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(LIVE_GROUP, {"type": "live.message", "payload": payload})
    except Exception as exc:  # noqa: BLE001 - see above
        logger.warning("live %s message not sent: %s", payload.get("type", "job"), exc)


def run_with_progress(work, *, push, every, name):
    """Run `work()` in a daemon thread while this thread calls `push()` every
    `every` seconds (and once more after the work ends). Returns what `work`
    returned, or raises what it raised.

    The work runs elsewhere because it may own an event loop (where the ORM
    may not be called) or block in I/O for minutes; `push` stays on the task's
    thread, writes progress to the row, publishes it, and sets the work's
    cancel Event when the row asks to stop (the work polls that Event)."""
    box = {}

    def target():
        try:
            box["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(every)
        push()
    if "error" in box:
        raise box["error"]
    return box.get("value")
