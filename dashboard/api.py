"""The two things every JSON endpoint needs: its error shape and its body."""
import json

from django.http import JsonResponse


def json_error(code, message, status=400, **extra):
    """{"error": {"code", "message", ...}}: the one error shape of Kiln's API."""
    return JsonResponse({"error": {"code": code, "message": message, **extra}}, status=status)


def json_body(request):
    """The request's JSON object (or its form fields as a dict); None when the JSON is broken."""
    if request.content_type == "application/json":
        try:
            data = json.loads(request.body or b"{}")
        except ValueError:
            return None
        return data if isinstance(data, dict) else None
    return request.POST.dict()
