"""Error pages that say what happened in plain words (JSON for the API)."""
from django.http import JsonResponse
from django.shortcuts import render
from django.utils.translation import gettext as _

from dashboard.roles import wants_json


def _error(request, status, code, message):
    if wants_json(request):
        return JsonResponse({"error": {"code": code, "message": message}}, status=status)
    return render(request, "error.html", {"status": status, "message": message}, status=status)


def bad_address(request, message):
    return _error(request, 400, "invalid", message)


def forbidden(request, exception=None):
    return _error(request, 403, "forbidden", _("You may not do that here."))


def not_found(request, exception=None):
    return _error(request, 404, "not_found", _("Nothing lives at %(path)s.") % {"path": request.path})


def server_error(request):
    return _error(request, 500, "server_error", _("Kiln hit an internal error; the details are in the web process’s log."))
