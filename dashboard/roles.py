"""Two roles: operators change things, viewers look.

An operator is a superuser or a member of the "operator" group; every other
active user is a viewer. Keeping the role in a group means Django's own admin
tools and `manage.py` can change it without any Kiln code.
"""
from functools import wraps

from django.contrib.auth.models import Group
from django.http import JsonResponse
from django.shortcuts import render
from django.utils.translation import gettext_lazy as _

OPERATOR_GROUP = "operator"
OPERATOR_ONLY = _("This needs the operator role; you are signed in as a viewer. Ask an operator to change your role.")
ROLES = (("operator", _("Operator — may change things")), ("viewer", _("Viewer — read-only")))


def is_operator(user):
    if not user.is_authenticated or not user.is_active:
        return False
    if user.is_superuser:
        return True
    return user.groups.filter(name=OPERATOR_GROUP).exists()


def role_of(user):
    return "operator" if is_operator(user) else "viewer"


def set_role(user, role):
    group, _ = Group.objects.get_or_create(name=OPERATOR_GROUP)
    if role == "operator":
        user.groups.add(group)
    else:
        user.groups.remove(group)


def wants_json(request):
    return request.path.startswith(("/api/", "/v1/")) or "application/json" in request.headers.get("Accept", "")


def operator_required(view):
    """Refuse viewers with 403: a JSON error for the API, a page for the browser."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not is_operator(request.user):
            message = OPERATOR_ONLY
            if wants_json(request):
                return JsonResponse({"error": {"code": "forbidden", "message": message}}, status=403)
            return render(request, "403.html", {"message": message}, status=403)
        return view(request, *args, **kwargs)

    return wrapper


def context_processor(request):
    user = getattr(request, "user", None)
    return {"is_operator": bool(user and is_operator(user))}
