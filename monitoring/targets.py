"""Which engines the monitor scrapes: the running deployments of this host.

The Deployment model belongs to the deployments feature (inference.models).
This module reads it only if it exists, and expects these fields:

* ``status``: scraped when 'ready' or 'running'
* ``host``: the GPU host name (settings.HOST_NAME of the monitor that scrapes it)
* ``port``: the engine's HTTP port on that host (loopback from the monitor)
* ``engine``: the engine's name ('vllm', 'llamacpp', 'sglang'), either a text
  field or a relation whose ``name`` is that text
* ``pid``: the engine's main process id (maps GPU processes to deployments)
* ``name`` (optional, else ``str(deployment)``)

Each target is a plain dict so tests can hand the monitor a stub list.
"""
from __future__ import annotations

from django.apps import apps

SCRAPED_STATUSES = ("ready", "running")
KNOWN_ENGINES = ("vllm", "llamacpp", "sglang")


def _engine_name(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        value = getattr(value, "name", None) or getattr(value, "engine", None) or str(value)
    value = value.strip().lower().replace(".", "").replace("-", "").replace("_", "")
    if value in ("llamacpp", "llamaserver", "llamacppserver"):
        return "llamacpp"
    return value if value in KNOWN_ENGINES else None


def engine_targets(host: str | None = None) -> list[dict]:
    """[{deployment_id, name, engine, metrics_url, pid}] for this host's running deployments."""
    from django.conf import settings

    try:
        Deployment = apps.get_model("inference", "Deployment")
    except LookupError:
        return []
    host = host or settings.HOST_NAME
    field_names = {f.name for f in Deployment._meta.get_fields()}
    rows = Deployment.objects.filter(status__in=SCRAPED_STATUSES)
    if "host" in field_names:
        rows = rows.filter(host=host)
    if "engine" in field_names and Deployment._meta.get_field("engine").is_relation:
        rows = rows.select_related("engine")
    targets = []
    for dep in rows:
        port = getattr(dep, "port", None)
        if not port:
            continue
        targets.append({
            "deployment_id": dep.pk,
            "name": getattr(dep, "name", None) or str(dep),
            "engine": _engine_name(getattr(dep, "engine", None)),
            "metrics_url": f"http://127.0.0.1:{int(port)}/metrics",
            "pid": getattr(dep, "pid", None),
        })
    return targets
