"""Deployment pages and the /api/deployments/, /api/runtimes/ JSON API. Thin:
forms validate, inference.deployments.services writes, deployment_selectors reads."""
from django.conf import settings
from django.contrib import messages
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from dashboard.api import json_body, json_error
from dashboard.roles import is_operator, operator_required
from inference.deployments import selectors as sel
from inference.deployments import services as svc
from inference.deployments.forms import LaunchProfileForm, RuntimeForm
from inference.engines import InvalidLaunch
from inference.models import Deployment, EngineRuntime, LaunchProfile
from inference.preflight.services import estimate_vs_actual


def _error(code, message, status=400, problems=None):
    return json_error(code, message, status, **({"fields": problems} if problems else {}))


# --------------------------------------------------------------------------- pages


def deployments(request):
    return render(request, "inference/deployments/services.html", {
        "deployments": sel.deployment_list()[:100], "presets": sel.preset_cards(), "profiles": sel.profile_list(),
        "runtimes": sel.runtime_list(), "runtime_form": RuntimeForm(initial={"kind": "executable"}),
        "host_name": settings.HOST_NAME,
    })


def deployment_detail(request, deployment_id):
    dep = get_object_or_404(Deployment.objects.select_related("profile__runtime", "model"), pk=deployment_id)
    log, log_ends, log_offset = sel.deployment_log_with_offsets(dep, 200)
    return render(request, "inference/deployment_detail.html", {
        "dep": dep, "log": log, "log_ends": log_ends, "log_offset": log_offset, "snippets": sel.snippets(dep, is_operator(request.user)),
        "dep_json": sel.deployment_dict(dep), "capacity_rows": estimate_vs_actual(dep),
    })


@require_http_methods(["GET", "POST"])
def profile_edit(request, profile_id=None):
    profile = get_object_or_404(LaunchProfile, pk=profile_id) if profile_id else None
    if request.method == "POST":
        if not is_operator(request.user):
            return operator_required(lambda r: None)(request)
        form = LaunchProfileForm(request.POST, instance=profile)
        if form.is_valid():
            obj = form.save(commit=False)
            obj.host = obj.runtime.host
            try:
                obj = svc.profile_save(profile=obj, user=request.user)
            except InvalidLaunch as exc:
                for field, message in exc.problems.items():
                    form.add_error(field if field in form.fields else None, message)
            else:
                if "launch" in request.POST:
                    try:
                        dep = svc.deployment_launch(profile=obj, user=request.user,
                                                    override=request.POST.get("preflight_override") == "on")
                    except svc.PreflightRefused as exc:
                        messages.error(request, f"Saved {obj.name}, but did not launch it. {exc}")
                        return redirect("profile_edit", profile_id=obj.pk)
                    return redirect("deployment_detail", deployment_id=dep.pk)
                messages.success(request, f"Saved launch profile {obj.name}.")
                return redirect("deployments")
        status = 400
    else:
        initial = {"bind_host": "127.0.0.1"}
        runtime = EngineRuntime.objects.filter(host=settings.HOST_NAME).first()
        if runtime and not profile:
            initial["runtime"] = runtime.pk
        form = LaunchProfileForm(instance=profile, initial=initial)
        status = 200
    preview = ""
    if profile and not form.is_bound:
        try:
            preview = svc.command_preview(profile)
        except InvalidLaunch:
            preview = ""
    return render(request, "inference/profile_form.html", {"form": form, "profile": profile, "preview": preview},
                  status=status)


@require_POST
@operator_required
def preset_launch(request, slug):
    try:
        profile = svc.preset_profile(preset_slug=slug, user=request.user)
        dep = svc.deployment_launch(profile=profile, user=request.user)
    except svc.PreflightRefused as exc:
        # Show the profile with the live preflight panel: every finding, its fix, the override.
        messages.error(request, f"Not launched. {exc}")
        return redirect("profile_edit", profile_id=profile.pk)
    except svc.DeploymentError as exc:
        messages.error(request, str(exc))
        return redirect("deployments")
    except InvalidLaunch as exc:
        messages.error(request, f"The preset's profile cannot launch: {exc}")
        return redirect("deployments")
    return redirect("deployment_detail", deployment_id=dep.pk)


@require_POST
@operator_required
def profile_launch(request, profile_id):
    profile = get_object_or_404(LaunchProfile, pk=profile_id)
    try:
        dep = svc.deployment_launch(profile=profile, user=request.user,
                                    override=request.POST.get("preflight_override") == "on")
    except svc.PreflightRefused as exc:
        messages.error(request, f"{profile.name} was not launched. {exc} (Open the profile to see every finding.)")
        return redirect("deployments")
    except InvalidLaunch as exc:
        messages.error(request, f"{profile.name} cannot launch: {exc}")
        return redirect("deployments")
    return redirect("deployment_detail", deployment_id=dep.pk)


@require_POST
@operator_required
def deployment_stop(request, deployment_id):
    dep = get_object_or_404(Deployment, pk=deployment_id)
    try:
        svc.deployment_stop(deployment=dep, user=request.user)
    except svc.DeploymentError as exc:
        messages.error(request, str(exc))
    return redirect("deployment_detail", deployment_id=dep.pk)


@require_POST
@operator_required
def deployment_restart(request, deployment_id):
    dep = get_object_or_404(Deployment, pk=deployment_id)
    try:
        new = svc.deployment_relaunch(deployment=dep, user=request.user)
    except (svc.DeploymentError, InvalidLaunch) as exc:
        messages.error(request, str(exc))
        return redirect("deployment_detail", deployment_id=dep.pk)
    return redirect("deployment_detail", deployment_id=new.pk)


@require_POST
@operator_required
def runtime_create(request):
    form = RuntimeForm(request.POST)
    if form.is_valid():
        try:
            rt = svc.runtime_register(host=settings.HOST_NAME, user=request.user, **form.cleaned_data)
        except svc.DeploymentError as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, f"Registered {rt.name}; detecting its version on {rt.host}…")
    else:
        messages.error(request, "Runtime not registered: " + "; ".join(
            f"{k}: {' '.join(v)}" for k, v in form.errors.items()))
    return redirect("deployments")


@require_POST
@operator_required
def runtime_detect(request, runtime_id):
    rt = get_object_or_404(EngineRuntime, pk=runtime_id)
    svc.runtime_queue_detect(runtime=rt)
    return redirect("deployments")


# --------------------------------------------------------------------------- API


@require_POST
def api_profile_preview(request):
    """The exact command for the form's current values, or the problems per field."""
    form = LaunchProfileForm(request.POST)
    if not form.is_valid():
        return JsonResponse({"command": "", "errors": {k: list(v) for k, v in form.errors.items()}})
    profile = form.profile()
    port = profile.port
    note = ""
    if not port:
        try:
            from inference.deployments.supervisor import pick_free_port

            port = pick_free_port(profile.bind_host, exclude=svc.ports_promised(profile.host))
            note = f"port {port} is free now; the launch picks again if it is taken by then"
        except Exception:
            port, note = 8000, "the port is picked at launch"
    try:
        command = svc.command_preview(profile, port=port)
    except InvalidLaunch as exc:
        return JsonResponse({"command": "", "errors": {k: [v] for k, v in exc.problems.items()}})
    return JsonResponse({"command": command, "errors": {}, "note": note})


@require_http_methods(["GET", "POST"])
def api_deployments(request):
    if request.method == "GET":
        return JsonResponse({"deployments": [sel.deployment_dict(d) for d in sel.deployment_list()[:200]]})
    if not is_operator(request.user):
        return operator_required(lambda r: None)(request)
    data = json_body(request)
    if data is None:
        return _error("bad_json", "The body must be a JSON object such as {\"preset\": \"gemma3-270m-demo-cpu\"}.")
    try:
        if data.get("preset"):
            profile = svc.preset_profile(preset_slug=str(data["preset"]), user=request.user)
        elif data.get("profile"):
            profile = LaunchProfile.objects.filter(pk=data["profile"]).first() \
                if str(data["profile"]).isdigit() else None
            if profile is None:
                return _error("not_found", f"No launch profile #{data['profile']}.", 404)
        else:
            return _error("missing", "Give {\"profile\": <id>} or {\"preset\": \"<slug>\"}.")
        dep = svc.deployment_launch(profile=profile, user=request.user, override=data.get("override") is True)
    except svc.DeploymentError as exc:
        return _error(exc.code, str(exc), 404 if exc.code == "not_found" else 409)
    except InvalidLaunch as exc:
        return _error("invalid", str(exc), 400, exc.problems)
    return JsonResponse({"deployment": sel.deployment_dict(dep)}, status=202)


@require_GET
def api_deployment(request, deployment_id):
    dep = Deployment.objects.filter(pk=deployment_id).first()
    if dep is None:
        return _error("not_found", f"No deployment #{deployment_id}.", 404)
    out = sel.deployment_dict(dep)
    if request.GET.get("log"):
        out["log"] = sel.deployment_log(dep, min(1000, int(request.GET.get("log") or 200)))
    return JsonResponse({"deployment": out})


@require_POST
@operator_required
def api_deployment_stop(request, deployment_id):
    dep = Deployment.objects.filter(pk=deployment_id).first()
    if dep is None:
        return _error("not_found", f"No deployment #{deployment_id}.", 404)
    try:
        dep = svc.deployment_stop(deployment=dep, user=request.user)
    except svc.DeploymentError as exc:
        return _error(exc.code, str(exc), 409)
    return JsonResponse({"deployment": sel.deployment_dict(dep)}, status=202)


@require_POST
@operator_required
def api_deployment_restart(request, deployment_id):
    dep = Deployment.objects.filter(pk=deployment_id).first()
    if dep is None:
        return _error("not_found", f"No deployment #{deployment_id}.", 404)
    try:
        new = svc.deployment_relaunch(deployment=dep, user=request.user)
    except svc.DeploymentError as exc:
        return _error(exc.code, str(exc), 409)
    except InvalidLaunch as exc:
        return _error("invalid", str(exc), 400, exc.problems)
    return JsonResponse({"deployment": sel.deployment_dict(new)}, status=202)


@require_http_methods(["GET", "POST"])
def api_runtimes(request):
    if request.method == "GET":
        return JsonResponse({"runtimes": [sel.runtime_dict(r) for r in sel.runtime_list()]})
    if not is_operator(request.user):
        return operator_required(lambda r: None)(request)
    data = json_body(request)
    if data is None:
        return _error("bad_json", "The body must be a JSON object.")
    missing = [k for k in ("name", "engine", "kind") if not data.get(k)]
    if missing:
        return _error("missing", f"Give {', '.join(missing)}.", 400, {k: "required" for k in missing})
    try:
        rt = svc.runtime_register(host=str(data.get("host") or settings.HOST_NAME), name=str(data["name"]),
                                  engine=str(data["engine"]), kind=str(data["kind"]), path=str(data.get("path", "")),
                                  image=str(data.get("image", "")), user=request.user)
    except svc.DeploymentError as exc:
        return _error("invalid", str(exc), 400, exc.problems)
    return JsonResponse({"runtime": sel.runtime_dict(rt)}, status=201)


@require_GET
def api_runtime(request, runtime_id):
    rt = EngineRuntime.objects.filter(pk=runtime_id).first()
    if rt is None:
        return _error("not_found", f"No runtime #{runtime_id}.", 404)
    return JsonResponse({"runtime": sel.runtime_dict(rt)})
