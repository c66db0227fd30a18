"""Deployment pages (their JSON API is inference.deployments.api). Thin: forms validate,
inference.deployments.services writes, inference.deployments.selectors reads."""
from django.conf import settings
from django.contrib import messages
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from dashboard.roles import is_operator, operator_required
from inference.deployments import installs
from inference.deployments import selectors as sel
from inference.deployments import services as svc
from inference.deployments.forms import LaunchProfileForm, RuntimeForm
from inference.engines import InvalidLaunch
from inference.models import EngineRuntime
from inference.preflight.services import estimate_vs_actual


# --------------------------------------------------------------------------- pages


@require_GET
def deployments(request):
    return render(request, "deployments/deployments.html", {
        "deployments": sel.mark_reachability(sel.deployment_list()[:100]), "presets": sel.preset_cards(), "profiles": sel.profile_list(),
        "runtimes": sel.runtime_list(), "runtime_form": RuntimeForm(initial={"kind": "executable"}),
        "host_name": settings.HOST_NAME,
    })


@require_GET
def deployment_detail(request, deployment_id):
    dep = sel.deployment_get_or_404(deployment_id)
    log, log_ends, log_offset = sel.deployment_log_with_offsets(dep, 200)
    return render(request, "deployments/deployment_detail.html", {
        "dep": dep, "log": log, "log_ends": log_ends, "log_offset": log_offset, "snippets": sel.snippets(dep, is_operator(request.user)),
        "dep_json": sel.deployment_dict(dep), "capacity_rows": estimate_vs_actual(dep),
    })


@require_http_methods(["GET", "POST"])
def profile_edit(request, profile_id=None):
    profile = sel.profile_get_or_404(profile_id) if profile_id else None
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
                        messages.error(request, _("Saved %(name)s, but did not launch it. %(reason)s") % {"name": obj.name, "reason": exc})
                        return redirect("profile_edit", profile_id=obj.pk)
                    return redirect("deployment_detail", deployment_id=dep.pk)
                messages.success(request, _("Saved launch profile %(name)s.") % {"name": obj.name})
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
    return render(request, "deployments/profile_form.html", {"form": form, "profile": profile, "preview": preview},
                  status=status)


@require_POST
@operator_required
def preset_launch(request, slug):
    try:
        profile = svc.preset_profile(preset_slug=slug, user=request.user)
        dep = svc.deployment_launch(profile=profile, user=request.user)
    except svc.PreflightRefused as exc:
        # Show the profile with the live preflight panel: every finding, its fix, the override.
        messages.error(request, _("Not launched. %(reason)s") % {"reason": exc})
        return redirect("profile_edit", profile_id=profile.pk)
    except svc.DeploymentError as exc:
        messages.error(request, str(exc))
        return redirect("deployments")
    except InvalidLaunch as exc:
        messages.error(request, _("The preset’s profile cannot launch: %(reason)s") % {"reason": exc})
        return redirect("deployments")
    return redirect("deployment_detail", deployment_id=dep.pk)


@require_POST
@operator_required
def profile_launch(request, profile_id):
    profile = sel.profile_get_or_404(profile_id)
    try:
        dep = svc.deployment_launch(profile=profile, user=request.user,
                                    override=request.POST.get("preflight_override") == "on")
    except svc.PreflightRefused as exc:
        messages.error(request, _("%(name)s was not launched. %(reason)s (Open the profile to see every finding.)") % {"name": profile.name, "reason": exc})
        return redirect("deployments")
    except InvalidLaunch as exc:
        messages.error(request, _("%(name)s cannot launch: %(reason)s") % {"name": profile.name, "reason": exc})
        return redirect("deployments")
    return redirect("deployment_detail", deployment_id=dep.pk)


@require_POST
@operator_required
def deployment_stop(request, deployment_id):
    dep = sel.deployment_get_or_404(deployment_id)
    try:
        svc.deployment_stop(deployment=dep, user=request.user)
    except svc.DeploymentError as exc:
        messages.error(request, str(exc))
    return redirect("deployment_detail", deployment_id=dep.pk)


@require_POST
@operator_required
def deployment_restart(request, deployment_id):
    dep = sel.deployment_get_or_404(deployment_id)
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
            messages.success(request, _("Registered %(name)s; detecting its version on %(host)s…") % {"name": rt.name, "host": rt.host})
    else:
        messages.error(request, _("Runtime not registered: ") + "; ".join(
            f"{k}: {' '.join(v)}" for k, v in form.errors.items()))
    return redirect("runtimes" if request.POST.get("from") == "runtimes" else "deployments")


@require_POST
@operator_required
def runtime_detect(request, runtime_id):
    rt = sel.runtime_get_or_404(runtime_id)
    svc.runtime_queue_detect(runtime=rt)
    return redirect("runtimes" if request.POST.get("from") == "runtimes" else "deployments")


# --------------------------------------------------------------------------- runtimes page


@require_GET
def runtimes(request):
    """Engine runtimes: the catalog of known-good builds (Install), what is installed or registered here."""
    return render(request, "deployments/runtimes.html", {
        "runtimes": sel.runtime_list(), "catalog": sel.catalog_rows(),
        "runtime_form": RuntimeForm(initial={"kind": "venv"}), "host_name": settings.HOST_NAME,
        "wanted": request.GET.get("build", ""),
    })


@require_POST
@operator_required
def runtime_install(request):
    try:
        row = installs.runtime_install(build_key=request.POST.get("build", ""), name=request.POST.get("name", ""),
                                       user=request.user)
    except svc.DeploymentError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, _("Installing %(name)s on %(host)s; progress shows below.")
                         % {"name": row.name, "host": row.host})
    return redirect("runtimes")


@require_POST
@operator_required
def runtime_uninstall(request, runtime_id):
    row = sel.runtime_get_or_404(runtime_id)
    try:
        installs.runtime_uninstall(runtime=row, user=request.user)
    except svc.DeploymentError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, _("Removing %(name)s from %(host)s.") % {"name": row.name, "host": row.host})
    return redirect("runtimes")


@require_POST
@operator_required
def deployment_relaunch_max_len(request, deployment_id):
    """Relaunch with the max model length vLLM estimated would fit (offered on a failed deployment)."""
    dep = sel.deployment_get_or_404(deployment_id)
    try:
        new = svc.deployment_relaunch_with_max_len(deployment=dep, max_model_len=int(request.POST.get("max_model_len", "")),
                                                   user=request.user)
    except ValueError:
        messages.error(request, _("max model len must be a whole number of tokens."))
        return redirect("deployment_detail", deployment_id=dep.pk)
    except (svc.DeploymentError, InvalidLaunch, svc.PreflightRefused) as exc:
        messages.error(request, str(exc))
        return redirect("deployment_detail", deployment_id=dep.pk)
    return redirect("deployment_detail", deployment_id=new.pk)
