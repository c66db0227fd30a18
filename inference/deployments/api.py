"""The deployments JSON API: /api/deployments/, /api/runtimes/, /api/launch-profiles/preview.
Thin: schemas check the input, services write, selectors read."""
from django.conf import settings
from django.utils.translation import gettext as _
from ninja import Query, Status

from dashboard.api import ApiError, ErrorOut, RowId, operator, router
from inference.deployments import selectors, services
from inference.deployments.forms import LaunchProfileForm
from inference.deployments.schemas import (CatalogOut, CommandPreview, DeploymentDetailOut, DeploymentList,
                                           DeploymentOut, LaunchRequest, LogQuery, ProfileFields,
                                           RuntimeInstallRequest, RuntimeList, RuntimeOut, RuntimeRequest)
from inference.deployments.supervisor import pick_free_port
from inference.engines import InvalidLaunch

api = router("deployments")
REFUSED = {400: ErrorOut, 404: ErrorOut, 409: ErrorOut}
LOG_LINES_MAX = 1000


def invalid(exc: InvalidLaunch) -> ApiError:
    return ApiError("invalid", str(exc), 400, **({"fields": exc.problems} if exc.problems else {}))


@api.get("deployments/", response=DeploymentList, url_name="api_deployments")
def deployment_list(request):
    rows = selectors.mark_reachability(selectors.deployment_list()[:200])
    return {"deployments": [selectors.deployment_dict(d) for d in rows]}


@api.post("deployments/", response={202: DeploymentOut, **REFUSED}, auth=operator, url_name="api_deployments_launch")
def deployment_launch(request, body: LaunchRequest = None):
    """Launch a saved profile ({"profile": id}) or a preset ({"preset": slug}); preflight errors
    refuse it (409) unless "override" is true."""
    body = body or LaunchRequest()
    try:
        if body.preset:
            profile = services.preset_profile(preset_slug=body.preset, user=request.user)
        elif body.profile:
            profile = selectors.profile_get_or_404(body.profile)
        else:
            raise ApiError("missing", _("Give {\"profile\": <id>} or {\"preset\": \"<slug>\"}."))
        dep = services.deployment_launch(profile=profile, user=request.user, override=body.override)
    except services.DeploymentError as exc:
        raise ApiError(exc.code, str(exc), 404 if exc.code == "not_found" else 409) from exc
    except InvalidLaunch as exc:
        raise invalid(exc) from exc
    return Status(202, {"deployment": selectors.deployment_dict(dep)})


@api.get("deployments/{deployment_id}", response={200: DeploymentDetailOut, 400: ErrorOut, 404: ErrorOut},
         url_name="api_deployment", exclude_unset=True)
def deployment_detail(request, deployment_id: RowId, query: Query[LogQuery]):
    """A deployment; with ?log=N also the last N lines of its log (at most 1000)."""
    dep = selectors.deployment_get_or_404(deployment_id)
    out = selectors.deployment_dict(dep)
    if query.log is not None:
        out["log"] = selectors.deployment_log(dep, min(LOG_LINES_MAX, query.log)) if query.log else []
    return {"deployment": out}


@api.post("deployments/{deployment_id}/stop", response={202: DeploymentOut, **REFUSED}, auth=operator,
          url_name="api_deployment_stop")
def deployment_stop(request, deployment_id: RowId):
    """Stop the engine (its whole process group, gently first)."""
    dep = selectors.deployment_get_or_404(deployment_id)
    try:
        dep = services.deployment_stop(deployment=dep, user=request.user)
    except services.DeploymentError as exc:
        raise ApiError(exc.code, str(exc), 409) from exc
    return Status(202, {"deployment": selectors.deployment_dict(dep)})


@api.post("deployments/{deployment_id}/restart", response={202: DeploymentOut, **REFUSED}, auth=operator,
          url_name="api_deployment_restart")
def deployment_restart(request, deployment_id: RowId):
    """Launch the deployment's profile again as a new deployment (the old one is stopped first)."""
    dep = selectors.deployment_get_or_404(deployment_id)
    try:
        new = services.deployment_relaunch(deployment=dep, user=request.user)
    except services.DeploymentError as exc:
        raise ApiError(exc.code, str(exc), 409) from exc
    except InvalidLaunch as exc:
        raise invalid(exc) from exc
    return Status(202, {"deployment": selectors.deployment_dict(new)})


@api.post("launch-profiles/preview", response={200: CommandPreview, 400: ErrorOut}, url_name="api_profile_preview",
          exclude_unset=True)
def profile_preview(request, body: ProfileFields = None):
    """The exact command for the launch form's current values, or the problems per field.
    Nothing is saved."""
    form = LaunchProfileForm((body or ProfileFields()).form_data())
    if not form.is_valid():
        return {"command": "", "errors": {k: list(v) for k, v in form.errors.items()}}
    profile = form.profile()
    port, note = profile.port, ""
    if not port:
        try:
            port = pick_free_port(profile.bind_host, exclude=services.ports_promised(profile.host))
            note = _("port %(port)s is free now; the launch picks again if it is taken by then") % {"port": port}
        except Exception:  # no free port now, or the host cannot be bound from here: the launch picks
            port, note = 8000, _("the port is picked at launch")
    try:
        command = services.command_preview(profile, port=port)
    except InvalidLaunch as exc:
        return {"command": "", "errors": {k: [v] for k, v in exc.problems.items()}}
    return {"command": command, "errors": {}, "note": note}


@api.get("runtimes/", response=RuntimeList, url_name="api_runtimes")
def runtime_list(request):
    return {"runtimes": [selectors.runtime_dict(r) for r in selectors.runtime_list()]}


@api.post("runtimes/", response={201: RuntimeOut, 400: ErrorOut}, auth=operator, url_name="api_runtimes_register")
def runtime_register(request, body: RuntimeRequest = None):
    """Register an engine installation (its version is then detected on its host)."""
    body = body or RuntimeRequest()
    missing = [k for k in ("name", "engine", "kind") if not getattr(body, k)]
    if missing:
        raise ApiError("missing", _("Give %(fields)s.") % {"fields": ", ".join(missing)}, 400,
                       fields={k: _("required") for k in missing})
    try:
        runtime = services.runtime_register(host=body.host or settings.HOST_NAME, name=body.name,
                                            engine=body.engine, kind=body.kind, path=body.path, image=body.image,
                                            user=request.user)
    except services.DeploymentError as exc:
        raise ApiError("invalid", str(exc), 400, **({"fields": exc.problems} if exc.problems else {})) from exc
    return Status(201, {"runtime": selectors.runtime_dict(runtime)})


@api.get("runtimes/{runtime_id}", response={200: RuntimeOut, 400: ErrorOut, 404: ErrorOut}, url_name="api_runtime")
def runtime_detail(request, runtime_id: RowId):
    return {"runtime": selectors.runtime_dict(selectors.runtime_get_or_404(runtime_id))}


@api.get("engine-catalog", response=CatalogOut, url_name="api_engine_catalog")
def engine_catalog(request):
    """Known-good engine builds per kind of hardware (inference/deployments/engine_catalog.toml)."""
    from dataclasses import asdict

    from inference.deployments.runtimes import catalog

    return {"builds": [{**asdict(b), "packages": list(b.packages)} for b in catalog().values()]}


@api.post("runtime-installs", response={202: RuntimeOut, **REFUSED}, auth=operator, url_name="api_runtime_install")
def runtime_install(request, body: RuntimeInstallRequest = None):
    """Install a catalog build into a virtualenv Kiln owns; follow it on GET /api/runtimes/{id}."""
    from inference.deployments import installs

    body = body or RuntimeInstallRequest()
    if not body.build:
        raise ApiError("missing", _("Give {\"build\": \"<catalog key>\"} (GET /api/engine-catalog lists them)."), 400,
                       fields={"build": _("required")})
    try:
        row = installs.runtime_install(build_key=body.build, name=body.name, user=request.user)
    except services.DeploymentError as exc:
        status = {"not_found": 404, "exists": 409}.get(exc.code, 400)
        raise ApiError(exc.code, str(exc), status, **({"fields": exc.problems} if exc.problems else {})) from exc
    return Status(202, {"runtime": selectors.runtime_dict(row)})


@api.post("runtimes/{runtime_id}/uninstall", response={202: RuntimeOut, **REFUSED}, auth=operator,
          url_name="api_runtime_uninstall")
def runtime_uninstall(request, runtime_id: RowId):
    """Remove a runtime Kiln installed (its folder, then its row)."""
    from inference.deployments import installs

    row = selectors.runtime_get_or_404(runtime_id)
    try:
        row = installs.runtime_uninstall(runtime=row, user=request.user)
    except services.DeploymentError as exc:
        raise ApiError(exc.code, str(exc), 409) from exc
    return Status(202, {"runtime": selectors.runtime_dict(row)})
