"""The calls other areas make (one line each): what their state changes mean as alerts."""
from __future__ import annotations

import time

from django.urls import reverse
from django.utils.translation import gettext as _

from monitoring.alerts import conf
from monitoring.alerts.events import raise_event, raise_event_nowait

# deployment id -> monotonic time its health checks started failing (state across ticks)
_unhealthy_since: dict[int, float] = {}


def _deployment_link(dep_id) -> str:
    return reverse("deployment_detail", args=[dep_id])


def deployment_actions(dep, actions) -> None:
    """From the monitor's watch loop (inference/deployments/watch.py), as soon as a tick of one
    deployment decided its actions (before the row is written: every millisecond counts here).

    Non-blocking: the events are written on the alerts thread."""
    base = {"host": dep.host, "deployment": dep.pk, "link": _deployment_link(dep.pk)}
    for a in actions:
        if a.kind == "crashed":
            raise_event_nowait("engine_crashed", severity="critical", **base,
                               subject=_("Engine of “%(name)s” crashed") % {"name": dep.name},
                               details={"reason": a.reason, "hint": a.hint, "restart_in_s": a.delay_s})
        elif a.kind == "failed":
            raise_event_nowait("engine_failed", severity="critical", **base,
                               subject=_("“%(name)s” failed: %(reason)s") % {"name": dep.name, "reason": a.reason},
                               details={"reason": a.reason, "hint": a.hint})
        elif a.kind == "ready":
            for kind in ("engine_crashed", "engine_failed", "deployment_unhealthy"):
                raise_event_nowait(kind, resolved=True, **base,
                                   subject=_("“%(name)s” is ready again") % {"name": dep.name})


def deployment_watched(dep, state, actions) -> None:
    """From the watch loop after a deployment's tick is written (``dep`` re-read): conditions
    that last (unhealthy for N s) and a restart that itself failed. Non-blocking."""
    base = {"host": dep.host, "deployment": dep.pk, "link": _deployment_link(dep.pk)}
    if dep.status == "failed" and not any(a.kind == "failed" for a in actions):
        # The restart itself failed (its port taken, the binary gone): no "failed" action says so.
        raise_event_nowait("engine_failed", severity="critical", **base,
                           subject=_("“%(name)s” failed: %(reason)s") % {"name": dep.name, "reason": dep.failure},
                           details={"reason": dep.failure, "hint": dep.hint})
    now = time.monotonic()
    # From the first failed health check (or crash) until it is ready and healthy again.
    failing = ((state.status == "ready" and state.unhealthy_ticks > 0) or state.status == "restarting"
               or (state.status == "starting" and dep.pk in _unhealthy_since))
    if failing:
        since = _unhealthy_since.setdefault(dep.pk, now)
        if now - since >= conf.UNHEALTHY_S:
            raise_event_nowait("deployment_unhealthy", severity="warning", **base,
                               subject=_("“%(name)s” has been unhealthy for %(s)d s") % {
                                   "name": dep.name, "s": now - since},
                               details={"status": state.status, "failed_health_checks": state.unhealthy_ticks})
    elif state.status == "ready":
        if _unhealthy_since.pop(dep.pk, None) is not None:
            raise_event_nowait("deployment_unhealthy", resolved=True, **base,
                               subject=_("“%(name)s” answers its health check again") % {"name": dep.name})


def artifact_failed(artifact_id: int) -> None:
    """From the library's worker runs when a download, import or re-verify ends failed."""
    from inference.models import ModelArtifact

    artifact = ModelArtifact.objects.filter(pk=artifact_id).first()
    if artifact is None:
        return
    report = artifact.verify_report or {}
    error = (artifact.error or "").lower()
    # A re-verify that found changed or missing files, or a download whose bytes did not match the hub's hash.
    verification = bool(report.get("changed") or report.get("missing")) or "match the hub's hash" in error \
        or "sha256" in error
    kind = "verify_failed" if verification else "download_failed"
    subject = (_("A file of “%(name)s” failed verification") if verification
               else _("Download of “%(name)s” failed")) % {"name": str(artifact)}
    raise_event(kind, subject=subject, link=reverse("model_detail", args=[artifact.pk]), host=artifact.host,
                details={"artifact_id": artifact.pk, "error": (artifact.error or "")[:500],
                         "finished_at": time.strftime("%Y-%m-%d %H:%M:%S")})


def experiment_finished(experiment, *, failed: bool, link: str = "", error: str = "") -> None:
    """For experiments (benchmarks) when one ends: one line at the end of the runner."""
    name = getattr(experiment, "name", "") or f"#{experiment.pk}"
    raise_event("experiment_failed" if failed else "experiment_finished",
                subject=(_("Experiment %(name)s failed") if failed else _("Experiment %(name)s finished")) % {
                    "name": name},
                link=link, details={"experiment_id": experiment.pk, "error": error[:500]})
