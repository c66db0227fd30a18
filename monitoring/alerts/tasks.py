"""Celery tasks: take a delivery id, call the service."""
from celery import shared_task
from celery.signals import worker_ready

from monitoring.alerts import delivery


@shared_task(name="monitoring.alerts.deliver")
def deliver(delivery_id):
    return delivery.deliver(delivery_id)


def _watch_monitors():
    """The worker's share of the host checks: notice a silent monitor even on a one-host install."""
    import logging
    import time

    from django.db import close_old_connections
    from redis.exceptions import RedisError

    from dashboard.outage import DB_UNREACHABLE, Outage
    from dashboard.services import redis_client
    from monitoring.alerts import checks, conf

    outage = Outage("Redis or the database (monitor check)", "the check waits")
    while True:
        time.sleep(conf.HOST_CHECK_EVERY_S)
        close_old_connections()
        try:
            checks.check_monitors(redis_client())
            outage.over()
        except (RedisError, OSError, *DB_UNREACHABLE) as exc:  # this host cut off: said once, not every round
            outage.failed(exc)
        except Exception:  # noqa: BLE001 - try again next round
            logging.getLogger("kiln.alerts").exception("monitor check failed")


@worker_ready.connect
def start_monitor_watch(sender=None, **kwargs):
    import threading

    threading.Thread(target=_watch_monitors, name="kiln-alert-monitor-watch", daemon=True).start()
