"""Which engines the monitor scrapes: this host's ready deployments.

Each target is a plain dict so tests can hand the monitor a stub list.
"""
from __future__ import annotations

from django.conf import settings


def engine_targets(host: str | None = None) -> list[dict]:
    """[{deployment_id, name, engine, metrics_url, pid, api_key}] for this host's ready deployments."""
    from inference.engines import get_engine
    from inference.models import Deployment

    rows = (Deployment.objects.filter(status=Deployment.Status.READY, host=host or settings.HOST_NAME)
            .exclude(port=None).select_related("profile__runtime"))
    return [
        {
            "deployment_id": dep.pk,
            "name": dep.name,
            "engine": dep.engine,
            # The engine's own address (loopback when it listens on every interface).
            "metrics_url": get_engine(dep.engine).metrics_url(dep.bind_host, dep.port),
            "pid": dep.pid,
            # llama-server guards /metrics with its --api-key (vLLM does not): send it.
            "api_key": dep.api_key,
        }
        for dep in rows
    ]
