"""Which GPU hosts are online: the one rule the pages, the API and the gateway share.

A host is offline when its monitor was seen (it is in the known-hosts hash,
which every monitor heartbeat refreshes) and its heartbeat key has expired:
the monitor, or the host, or the network between it and Redis is gone. A host
whose monitor was never seen is not "offline": it is simply not watched (a
panel run without a monitor, most tests), and nothing about it changes.

Nothing is written to the database: a deployment on an offline host keeps
the status its host last recorded, and is *shown* as unreachable until its
monitor beats again (inference.models.Deployment.shown_status).

Plain Redis reads, no Django models: the gateway's routing table calls it
once a second, the deployment pages and API once per answer.
"""
from __future__ import annotations

import logging

from django.conf import settings

log = logging.getLogger(__name__)

# The same keys as dashboard.services (the heartbeat) and monitoring.alerts.checks (known hosts).
MONITOR_HEARTBEAT_KEY = "kiln:monitor:{host}"
KNOWN_HOSTS_KEY = "kiln:alerts:hosts"  # host -> last time its monitor was seen (Redis hash)

_client = None


def _redis():
    global _client
    if _client is None:
        import redis

        # Short timeouts: a page or the gateway's table must not wait on a Redis that is away.
        _client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
    return _client


def offline_hosts(hosts=None, client=None) -> set[str]:
    """The hosts (of `hosts`, or all known ones) whose monitor was seen but beats no more.
    Redis not answering gives the empty set: no news is not taken for an outage."""
    try:
        client = client or _redis()
        if hosts is None:
            hosts = [h.decode() if isinstance(h, bytes) else h for h in client.hkeys(KNOWN_HOSTS_KEY)]
        hosts = sorted(set(hosts))
        if not hosts:
            return set()
        pipe = client.pipeline(transaction=False)
        pipe.hmget(KNOWN_HOSTS_KEY, hosts)
        for h in hosts:
            pipe.exists(MONITOR_HEARTBEAT_KEY.format(host=h))
        known, *beating = pipe.execute()
    except Exception as exc:  # noqa: BLE001 - Redis away: said on the status page, not here
        log.debug("cannot tell which hosts are online: %s", exc)
        return set()
    return {h for h, seen, beats in zip(hosts, known, beating) if seen is not None and not beats}
