"""A dependency (PostgreSQL, Redis) that stopped answering, as the long-running
processes on a GPU host see it: a cut link makes every query fail, or hang
until a timeout, for as long as it lasts. What it is worth saying: once when it
starts, once when it ends -- not a traceback per retry -- and the retries back
off instead of hammering a link that is down.
"""
import logging
import time

from django.db.utils import InterfaceError, OperationalError

log = logging.getLogger("kiln.outage")

# The database cannot be reached (or the connection broke): no row is at fault.
DB_UNREACHABLE = (OperationalError, InterfaceError)


class Outage:
    """A dependency that stopped answering: said once when it starts (and once when it
    ends), not on every retry; retries back off from 1 s to 10 s."""

    FIRST_S, MAX_S = 1.0, 10.0

    def __init__(self, what: str, meanwhile: str):
        self.what, self.meanwhile = what, meanwhile
        self.since: float | None = None
        self.failures = 0

    def failed(self, exc) -> float:
        """Record a failed try; returns the seconds to wait before the next one."""
        if self.since is None:
            self.since = time.monotonic()
            log.warning("cannot reach %s (%s); %s, retrying", self.what, str(exc).strip().splitlines()[0]
                        if str(exc).strip() else type(exc).__name__, self.meanwhile)
        self.failures += 1
        return min(self.MAX_S, self.FIRST_S * 2 ** (self.failures - 1))

    def over(self):
        if self.since is not None:
            log.warning("%s answers again after %.0f s (%d failed tries)", self.what,
                        time.monotonic() - self.since, self.failures)
            self.since, self.failures = None, 0
