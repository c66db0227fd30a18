"""Long-running processes refuse to start on a database that is not migrated.

The web app, the Celery worker, the monitor and runserver read and write the
tables of this release's models. Started on a database from an earlier
release (or an empty one), they would come up and then fail on the first
query that touches a new table or column, in the middle of a request, a task
or a tick, with "no such column" in a log. Refusing at start says what is
wrong and what to do once, before anything else runs.

Commands that fix or inspect the database (migrate, showmigrations,
makemigrations, check, shell, standalone, which migrates itself) are not
checked, and neither is the test suite: only the entry points call this.
"""
import logging
import os
import sys

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

log = logging.getLogger(__name__)

SHOWN = 5  # migration names listed before "and N more"


class UnappliedMigrations(SystemExit):
    """Raised by `refuse_if_unmigrated`: exits with status 1, the message on stderr, no traceback."""


def database_label():
    """The database as an operator would find it: the SQLite file, or name@host:port (never the password)."""
    db = settings.DATABASES["default"]
    if "sqlite" in db["ENGINE"]:
        return f"SQLite database {db['NAME']}"
    where = db.get("HOST") or "localhost"
    if db.get("PORT"):
        where = f"{where}:{db['PORT']}"
    vendor = db["ENGINE"].rsplit(".", 1)[-1]
    return f"{vendor} database {db.get('NAME')!r} on {where}"


def unapplied_migrations():
    """The migrations this code has and the database has not applied, in the order migrate would apply them."""
    executor = MigrationExecutor(connections["default"])
    targets = executor.loader.graph.leaf_nodes()
    return [f"{migration.app_label}.{migration.name}"
            for migration, backwards in executor.migration_plan(targets) if not backwards]


def unmigrated_message(what):
    """Why `what` (e.g. "the monitor") must not start, or None when the database is up to date.

    A database that cannot be reached is not this check's business: the process
    starts as it always did and reports that in its own way (a worker retries,
    a page says the database is down)."""
    try:
        names = unapplied_migrations()
    except DatabaseError as exc:
        log.warning("could not check %s for unapplied migrations: %s", database_label(), exc)
        return None
    finally:
        # Opened for this check, before the worker forks its pool: children must not share it.
        if not connections["default"].in_atomic_block:
            connections["default"].close()
    if not names:
        return None
    listed = ", ".join(names[:SHOWN])
    if len(names) > SHOWN:
        listed += f" and {len(names) - SHOWN} more"
    count = f"{len(names)} unapplied migration{'s' if len(names) != 1 else ''}"
    return (f"kiln: {what} will not start: the {database_label()} has {count} ({listed}). "
            f"This code needs tables and columns that are not there yet. Run `python3 manage.py migrate` "
            f"first (or `python3 manage.py standalone`, which migrates itself), then start it again.")


def refuse_if_unmigrated(what):
    """Exit with status 1 and the message (no traceback) when the database has unapplied migrations."""
    message = unmigrated_message(what)
    if message:
        raise UnappliedMigrations(message)


async def lifespan(scope, receive, send, *, what="the web server", then=None):
    """The ASGI lifespan protocol: the server (uvicorn, gunicorn's uvicorn worker)
    asks at start-up, and a refusal makes it log the message and exit before it
    accepts a connection. Checked here rather than when dashboard.asgi is
    imported, so that the tests (and anything else importing the app) are not
    refused by the database of a process that serves nothing. `then` (sync) runs
    after a passed check, before the server accepts its first connection."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            problem = await sync_to_async(unmigrated_message, thread_sensitive=True)(what)
            if problem:
                await send({"type": "lifespan.startup.failed", "message": problem})
                return
            if then is not None:
                await sync_to_async(then, thread_sensitive=True)()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def main(argv):
    """`python -m dashboard.migrations_check WHAT`: the check as a process of its own, for
    a parent that must not load Django itself (gunicorn's master, dashboard.workers)."""
    import django

    from dashboard.env import ConfigError

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    try:
        django.setup()
    except ConfigError as exc:
        raise SystemExit(f"kiln: configuration error: {exc}") from None
    refuse_if_unmigrated(argv[1] if len(argv) > 1 else "Kiln")


if __name__ == "__main__":
    main(sys.argv)
