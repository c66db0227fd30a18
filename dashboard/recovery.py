"""Nothing queued is lost when Redis is: the database rows are the record.

When a worker starts, each area's worker_ready hook queues again what its rows
still wait for (downloads, batches, experiments, benchmark runs, launches and
stops) and marks interrupted what a dead worker left half-done. A Redis that
restarts while the worker keeps running (a crash under compose's restart
policy, an upgrade) may have lost up to the last second of its append-only file,
and what the worker held unacknowledged comes back only after an hour: the
worker notices the new Redis by its run_id and runs the same sweeps again.
Every task claims its row first, so a message sent twice does nothing.
"""
import logging
import threading

logger = logging.getLogger(__name__)

CHECK_EVERY_S = 5.0
# While the worker runs, a launch with no pid yet may be this worker's, spawning now.
SPAWNING_GRACE_S = 300.0


def sweep(host: str) -> dict:
    """The worker-start sweeps, run again (each is safe beside live runners: it
    takes over only rows whose runner is surely dead)."""
    from inference.batches import services as batches
    from inference.benchmarks import experiments
    from inference.benchmarks import services as benchmark_runs
    from inference.deployments import services as deployments
    from inference.library import services as library

    done = {}
    for name, call in (
        ("models", lambda: library.model_resume_interrupted(host=host)),
        ("batches", lambda: batches.resume_interrupted(host=host)),
        ("experiments", lambda: experiments.resume_interrupted(host=host)),
        ("benchmarks", lambda: benchmark_runs.runs_interrupted_sweep(host=host)),
        ("deployments", lambda: deployments.deployments_resume_interrupted(
            host=host, spawning_grace_s=SPAWNING_GRACE_S)),
    ):
        try:
            done[name] = call()
        except Exception:  # noqa: BLE001 - the others still run; the next restart tries again
            logger.exception("sweep of %s after a Redis restart failed", name)
    return done


def redis_run_id(client) -> str | None:
    """The Redis server's run_id (new at each start of redis-server); None while it is down."""
    try:
        return client.info("server").get("run_id")
    except Exception:  # noqa: BLE001 - down or restarting: ask again next round
        return None


class RedisRestartWatch:
    """Call `on_restart()` once each time the Redis server answering is another one than before."""

    def __init__(self, client, on_restart):
        self.client, self.on_restart = client, on_restart
        self.seen = redis_run_id(client)

    def check(self) -> bool:
        now = redis_run_id(self.client)
        if now is None:
            return False
        if self.seen is None:  # the first answer (it was down when we started)
            self.seen = now
            return False
        if now == self.seen:
            return False
        self.seen = now
        self.on_restart()
        return True


def start_watch(host: str, every: float = CHECK_EVERY_S) -> threading.Thread:
    from django.db import close_old_connections

    from dashboard.services import redis_client

    def restarted():
        close_old_connections()
        done = sweep(host)
        logger.warning("Redis restarted: queued again from the database what it may have lost: %s", done)

    def loop():
        watch = RedisRestartWatch(redis_client(), restarted)
        while True:
            threading.Event().wait(every)
            watch.check()

    thread = threading.Thread(target=loop, name="kiln-redis-restart-watch", daemon=True)
    thread.start()
    return thread
