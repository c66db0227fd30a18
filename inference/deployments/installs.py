"""Writes for managed runtimes: the install and uninstall jobs.

The EngineRuntime row is the job (install_status, install_step,
install_progress, install_log, install_started, install_finished,
install_error). The web request creates or claims the row and queues the task
on the host's queue; the task (inference/deployments/tasks.py) calls
`runtime_install_run` / `runtime_uninstall_run`, which claim the row before any
work, so a double click queues one install.
"""
from __future__ import annotations

import time
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from dashboard import jobs
from dashboard.celery import host_queue
from inference.deployments import runtimes
from inference.deployments.services import DeploymentError, launches_waiting_on, runtime_detect
from inference.deployments.tasks import install_runtime, uninstall_runtime
from inference.models import EngineRuntime

Status = EngineRuntime.InstallStatus


def engines_dir() -> Path:
    return Path(settings.DATA_DIR) / "engines"


def install_log_path(runtime_id) -> Path:
    return Path(settings.DATA_DIR) / "logs" / "runtimes" / f"runtime-{runtime_id}-install.log"


def runtime_install(*, build_key: str, name: str = "", host=None, user=None) -> EngineRuntime:
    """Create the runtime row for a catalog build and queue its install on the host."""
    host = host or settings.HOST_NAME
    try:
        build = runtimes.get_build(build_key)
    except KeyError as exc:
        raise DeploymentError(exc.args[0], code="not_found") from None
    if not build.installable:
        raise DeploymentError(_("%(label)s is not installed by Kiln: %(notes)s")
                              % {"label": build.label, "notes": build.notes}, code="not_installable")
    name = (name or build.key).strip()
    if not runtimes.RUNTIME_NAME.fullmatch(name):
        raise DeploymentError(_("A runtime name is letters, digits, dots, dashes and underscores (at most 80), "
                                "starting with a letter or digit."), problems={"name": "invalid"})
    path = engines_dir() / name
    with transaction.atomic():
        if EngineRuntime.objects.filter(host=host, path=str(path)).exists() or path.exists():
            raise DeploymentError(_("%(path)s is already there; uninstall it first or choose another name.")
                                  % {"path": path}, code="exists", problems={"name": "taken"})
        row = EngineRuntime.objects.create(
            host=host, name=name, engine=build.engine, kind="venv", path=str(path), catalog_key=build.key,
            install_status=Status.QUEUED, install_step=_("waiting for the worker on %(host)s") % {"host": host},
            detect_status=EngineRuntime.DetectStatus.PENDING, created_by=user)
        jobs.enqueue(install_runtime, row.pk, queue=host_queue(host), on_refused=_install_not_queued)
    return row


def _install_not_queued(runtime_id, message):
    EngineRuntime.objects.filter(pk=runtime_id, install_status=Status.QUEUED).update(
        install_status=Status.FAILED, install_error=message, install_finished=timezone.now())


def runtime_install_run(*, runtime_id, base_python: str | None = None) -> EngineRuntime | None:
    """The install task's work: claim queued -> installing, run the catalog
    build's steps with progress on the row, detect the version."""
    if not jobs.claim(EngineRuntime.objects.filter(pk=runtime_id, install_status=Status.QUEUED),
                      install_status=Status.INSTALLING, install_started=timezone.now(), install_progress=0.0,
                      install_error="", install_log=""):
        return None
    row = EngineRuntime.objects.get(pk=runtime_id)
    build = runtimes.get_build(row.catalog_key)
    venv = Path(row.path)
    log_path = install_log_path(row.pk)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    progress = runtimes.Progress()

    def push():
        EngineRuntime.objects.filter(pk=row.pk, install_status=Status.INSTALLING).update(
            install_step=progress.step[:300], install_progress=round(progress.fraction, 4),
            install_log="\n".join(list(progress.lines)[-40:]))
        jobs.publish({"type": "runtime", "id": row.pk, "install_status": Status.INSTALLING,
                      "install_step": progress.step, "install_progress": progress.fraction,
                      "step_index": progress.step_index, "steps": progress.steps,
                      "lines": list(progress.lines)[-5:]})

    t0 = time.monotonic()
    try:
        version = jobs.run_with_progress(
            lambda: runtimes.run_steps(build, venv, progress, log_path=log_path, base_python=base_python),
            push=push, every=1.0, name=f"install-runtime-{row.pk}")
    except Exception as exc:  # noqa: BLE001 - recorded on the row for the user, with the step and pip's last lines
        EngineRuntime.objects.filter(pk=row.pk).update(
            install_status=Status.FAILED, install_error=str(exc)[-3000:], install_finished=timezone.now(),
            install_log="\n".join(list(progress.lines)[-40:]), detect_status=EngineRuntime.DetectStatus.FAILED,
            detect_detail=_("the install did not finish"))
        _publish_done(row.pk)
        launches_waiting_on(row.pk)  # they fail with the reason
        return EngineRuntime.objects.get(pk=row.pk)
    EngineRuntime.objects.filter(pk=row.pk).update(
        install_status=Status.INSTALLED, install_progress=1.0, install_finished=timezone.now(),
        install_step=_("installed %(version)s in %(seconds)d s") % {"version": version,
                                                                   "seconds": time.monotonic() - t0},
        install_log="\n".join(list(progress.lines)[-40:]), install_bytes=runtimes.dir_size(venv))
    row = runtime_detect(runtime_id=row.pk)
    _publish_done(row.pk)
    launches_waiting_on(row.pk)  # a demo launch pressed during the build starts now
    return row


def _publish_done(runtime_id):
    row = EngineRuntime.objects.get(pk=runtime_id)
    jobs.publish({"type": "runtime", "id": row.pk, "install_status": row.install_status,
                  "install_step": row.install_step, "install_progress": row.install_progress,
                  "version": row.version, "detect_status": row.detect_status, "lines": []})


def runtime_uninstall(*, runtime: EngineRuntime, user=None) -> EngineRuntime:
    """Queue the removal of a managed runtime's virtualenv (and then its row)."""
    if not runtime.managed:
        raise DeploymentError(_("%(name)s was registered by hand; Kiln only removes runtimes it installed.")
                              % {"name": runtime.name}, code="not_managed")
    if runtime.profiles.exists():
        raise DeploymentError(_("Launch profiles still use %(name)s (%(profiles)s); delete them or switch them "
                                "to another runtime first.")
                              % {"name": runtime.name,
                                 "profiles": ", ".join(runtime.profiles.values_list("name", flat=True)[:5])},
                              code="in_use")
    busy = (Status.QUEUED, Status.INSTALLING, Status.UNINSTALLING)
    if not jobs.claim(EngineRuntime.objects.filter(pk=runtime.pk).exclude(install_status__in=busy),
                      install_status=Status.UNINSTALLING, install_step=_("removing %(path)s") % {"path": runtime.path}):
        raise DeploymentError(_("%(name)s is busy (%(status)s); wait until it finishes.")
                              % {"name": runtime.name, "status": runtime.get_install_status_display()},
                              code="busy")
    jobs.enqueue(uninstall_runtime, runtime.pk, queue=host_queue(runtime.host), on_refused=_uninstall_not_queued)
    runtime.refresh_from_db()
    return runtime


def _uninstall_not_queued(runtime_id, message):
    EngineRuntime.objects.filter(pk=runtime_id, install_status=Status.UNINSTALLING).update(
        install_status=Status.FAILED, install_error=message)


def runtime_uninstall_run(*, runtime_id) -> bool:
    """The uninstall task's work: remove the virtualenv, then the row. True when removed."""
    row = EngineRuntime.objects.filter(pk=runtime_id, install_status=Status.UNINSTALLING).first()
    if row is None:
        return False
    try:
        runtimes.remove_venv(Path(row.path), engines_dir())
    except (OSError, ValueError) as exc:
        EngineRuntime.objects.filter(pk=row.pk).update(install_status=Status.FAILED,
                                                       install_error=_("Could not remove it: %(e)s") % {"e": exc})
        return False
    install_log_path(row.pk).unlink(missing_ok=True)
    row.delete()
    jobs.publish({"type": "runtime", "id": runtime_id, "install_status": "removed", "lines": []})
    return True
