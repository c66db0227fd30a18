"""Which engine answers a request: the ready deployments whose served model
name is the request's `model`, taken in turn (round-robin per web process)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from inference.models import Deployment

# Seconds a client should wait before retrying, by what the deployments are doing.
RETRY_AFTER_STARTING = 10
RETRY_AFTER_DOWN = 30

_turns: dict[str, itertools.count] = {}


@dataclass(frozen=True)
class Upstream:
    deployment_id: int
    name: str
    base_url: str
    api_key: str


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


async def route(model: str) -> Route:
    rows = [r async for r in Deployment.objects.filter(served_model_name=model)
            .exclude(status=Deployment.Status.STOPPED)
            .order_by("pk").values("id", "name", "status", "bind_host", "port", "api_key")]
    if not rows:
        stopped = await Deployment.objects.filter(served_model_name=model).aexists()
        return Route([], ["stopped"] if stopped else [])
    ready = [Upstream(r["id"], r["name"], _base_url(r["bind_host"], r["port"]), r["api_key"])
             for r in rows if r["status"] == Deployment.Status.READY and r["port"]]
    if ready:
        turn = next(_turns.setdefault(model, itertools.count())) % len(ready)
        ready = ready[turn:] + ready[:turn]
    return Route(ready, [r["status"] for r in rows])


def retry_after(statuses: list[str]) -> int:
    coming = {"pending", "starting", "restarting", "ready"}
    return RETRY_AFTER_STARTING if coming & set(statuses) else RETRY_AFTER_DOWN


async def served_models() -> list[str]:
    """Model names with at least one ready deployment."""
    names = Deployment.objects.filter(status=Deployment.Status.READY).exclude(served_model_name="") \
        .values_list("served_model_name", flat=True).distinct()
    return sorted({n async for n in names})
