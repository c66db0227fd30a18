"""Which engine answers a request: the ready deployments whose served model
name is the request's `model`, taken in turn (round-robin per web process).

The table of deployments is read from the database at most once a second per
web process (and at once when a model is not in it), not once per request: a
query is a hop to a worker thread, which costs milliseconds of time to first
token on a busy host. A deployment that stopped less than a second ago may
still be tried; its refused connection sends the request to the next replica
or, with none left, to a 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async

from inference.deployments.presets import request_defaults_for
from inference.models import Deployment
from monitoring.liveness import offline_hosts

# Seconds a client should wait before retrying, by what the deployments are doing.
RETRY_AFTER_STARTING = 10
RETRY_AFTER_DOWN = 30
TABLE_TTL_S = 1.0
MISS_REFRESH_S = 0.25  # an unknown model re-reads the table at most this often
UNREACHABLE = Deployment.UNREACHABLE  # the status of a ready deployment whose host is offline


@dataclass(frozen=True)
class Upstream:
    deployment_id: int
    name: str
    base_url: str
    api_key: str
    # Request fields by endpoint path that the deployment's preset adds where a
    # request leaves them out (proxy.with_request_defaults); read, never changed.
    request_defaults: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Route:
    upstreams: list[Upstream]  # in the order to try: the round-robin pick first
    statuses: list[str]  # of every deployment with that model name (empty: unknown model)


def _base_url(bind_host: str, port: int) -> str:
    h = bind_host or "127.0.0.1"
    h = "127.0.0.1" if h == "0.0.0.0" else ("::1" if h == "::" else h)
    if ":" in h:
        h = f"[{h}]"
    return f"http://{h}:{port}"


def _remote(bind_host: str) -> bool:
    """Reached across the network: an engine of another host (engine_endpoint binds it to its
    host's address). One on loopback or every interface answers, or refuses, at once."""
    return (bind_host or "127.0.0.1") not in ("127.0.0.1", "0.0.0.0", "::", "::1", "localhost")


@dataclass
class Table:
    ready: dict[str, list[Upstream]]
    statuses: dict[str, list[str]]
    loaded_at: float


def _read_table() -> Table:
    from django.db import close_old_connections

    close_old_connections()
    try:
        ready: dict[str, list[Upstream]] = defaultdict(list)
        statuses: dict[str, list[str]] = defaultdict(list)
        rows = list(Deployment.objects.exclude(served_model_name="").order_by("pk").values(
            "id", "name", "status", "host", "bind_host", "port", "api_key", "served_model_name", "profile__preset"))
        remote = {r["host"] for r in rows if r["status"] == Deployment.Status.READY and _remote(r["bind_host"])}
        offline = offline_hosts(remote) if remote else set()
        for r in rows:
            model = r["served_model_name"]
            if r["host"] in offline and _remote(r["bind_host"]):
                # Its host's monitor is silent (a cut link, a host down): a connection to it
                # would hang for the connect timeout, so it is not tried until the host beats again.
                statuses[model].append(UNREACHABLE)
                continue
            statuses[model].append(r["status"])
            if r["status"] == Deployment.Status.READY and r["port"]:
                ready[model].append(Upstream(r["id"], r["name"], _base_url(r["bind_host"], r["port"]), r["api_key"],
                                             request_defaults_for(r["profile__preset"] or "")))
        return Table(dict(ready), dict(statuses), time.monotonic())
    finally:
        close_old_connections()


_table: Table | None = None
_loading: asyncio.Future | None = None
_turns: dict[str, itertools.count] = {}


async def table(max_age: float = TABLE_TTL_S) -> Table:
    global _table, _loading
    if _table is not None and time.monotonic() - _table.loaded_at < max_age:
        return _table
    if _loading is None or _loading.done() or _loading.get_loop() is not asyncio.get_running_loop():
        _loading = asyncio.ensure_future(sync_to_async(_read_table, thread_sensitive=False)())
    loading = _loading
    _table = await asyncio.shield(loading)
    return _table


def forget() -> None:
    global _table
    _table = None


async def route(model: str) -> Route:
    t = await table()
    if model not in t.statuses and time.monotonic() - t.loaded_at >= MISS_REFRESH_S:
        t = await table(max_age=MISS_REFRESH_S)
    ready = list(t.ready.get(model, ()))
    if len(ready) > 1:
        turn = next(_turns.setdefault(model, itertools.count())) % len(ready)
        ready = ready[turn:] + ready[:turn]
    statuses = [s for s in t.statuses.get(model, ()) if s != Deployment.Status.STOPPED] or \
        (["stopped"] if model in t.statuses else [])
    return Route(ready, statuses)


def retry_after(statuses: list[str]) -> int:
    coming = {"pending", "starting", "restarting", "ready"}
    return RETRY_AFTER_STARTING if coming & set(statuses) else RETRY_AFTER_DOWN


async def served_models() -> list[str]:
    """Model names with at least one ready deployment."""
    return sorted((await table()).ready)
