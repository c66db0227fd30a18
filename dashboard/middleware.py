from urllib.parse import parse_qsl

from django.conf import settings
from django.contrib.auth.middleware import LoginRequiredMiddleware as DjangoLoginRequired
from django.http import JsonResponse
from django.utils import translation
from django.utils.translation import gettext as _

from dashboard import audit
from dashboard.roles import wants_json


class LoginRequiredMiddleware(DjangoLoginRequired):
    """Every page and API endpoint needs a signed-in user (views opt out with
    @login_not_required). API clients get a JSON 401 instead of a redirect."""

    def handle_no_permission(self, request, view_func):
        if wants_json(request):
            return JsonResponse(
                {"error": {"code": "not_authenticated", "message": _("Sign in first: this endpoint needs a Kiln session.")}},
                status=401,
            )
        return super().handle_no_permission(request, view_func)


class UserLanguageMiddleware:
    """A signed-in user's saved language (Account.language) wins over the cookie
    and Accept-Language that LocaleMiddleware read, so the choice follows them to
    any browser. The cookie is set to it too, so the sign-in page after signing
    out stays in their language. API and /v1/ calls with a key have no user: they
    keep LocaleMiddleware's answer from Accept-Language."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        language = user_language(getattr(request, "user", None))
        if language:
            translation.activate(language)
            request.LANGUAGE_CODE = language
        response = self.get_response(request)
        if language and request.COOKIES.get(settings.LANGUAGE_COOKIE_NAME) != language:
            set_language_cookie(response, language)
        return response


def user_language(user):
    """The language a signed-in user chose, or "" (follow the browser)."""
    if user is None or not user.is_authenticated:
        return ""
    account = getattr(user, "account", None) if hasattr(user, "account") else None
    return getattr(account, "language", "") or ""


def keep_language_chosen_before_sign_in(sender, request, user, **kwargs):
    """A language picked on the sign-in page (the cookie) becomes the account's
    when the account has none yet: the choice then follows the user everywhere."""
    language = request.COOKIES.get(settings.LANGUAGE_COOKIE_NAME, "") if request is not None else ""
    if language in dict(settings.LANGUAGES) and not user_language(user):
        from dashboard.services import account_set_language

        account_set_language(user=user, language=language)


def set_language_cookie(response, language):
    response.set_cookie(
        settings.LANGUAGE_COOKIE_NAME,
        language,
        max_age=settings.LANGUAGE_COOKIE_AGE,
        path=settings.LANGUAGE_COOKIE_PATH,
        domain=settings.LANGUAGE_COOKIE_DOMAIN,
        secure=settings.LANGUAGE_COOKIE_SECURE,
        httponly=settings.LANGUAGE_COOKIE_HTTPONLY,
        samesite=settings.LANGUAGE_COOKIE_SAMESITE,
    )


class OneTimePasswordMiddleware:
    """A user holding a one-time password changes it before doing anything else."""

    ALLOWED_URL_NAMES = {"password_change", "logout", "healthz"}

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_view(self, request, view_func, view_args, view_kwargs):
        user = request.user
        if not user.is_authenticated or request.resolver_match.url_name in self.ALLOWED_URL_NAMES:
            return None
        account = getattr(user, "account", None) if hasattr(user, "account") else None
        if account is None or not account.must_change_password:
            return None
        if wants_json(request):
            return JsonResponse(
                {"error": {"code": "password_change_required", "message": _("Change your one-time password in the browser first.")}},
                status=403,
            )
        from django.shortcuts import redirect

        return redirect("password_change")


class JsonMethodNotAllowedMiddleware:
    """A 405 from a JSON route answers in the API's error shape: django-ninja
    (and Django's require_http_methods) say it in plain text."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if response.status_code != 405 or not wants_json(request):
            return response
        if response.get("Content-Type", "").startswith("application/json"):
            return response
        allowed = response.get("Allow", "")
        answer = JsonResponse({"error": {"code": "method_not_allowed",
                                         "message": _("%(method)s is not allowed here; use %(allowed)s.") % {
                                             "method": request.method, "allowed": allowed}}},
                              status=405)
        answer["Allow"] = allowed
        return answer


class AuditMiddleware:
    """Every state-changing request by a signed-in user is one AuditEntry row
    (dashboard/audit.py says what is kept). Reads are not recorded; a failure to
    record is logged, never raised. Placed after AuthenticationMiddleware so it
    sees the user, and around the sign-in, one-time-password and message
    middleware so their refusals are recorded too."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method not in audit.STATE_CHANGING:
            return self.get_response(request)
        # Who asked, read before the view runs: signing out changes request.user.
        user = getattr(request, "user", None)
        signed_in = bool(user is not None and user.is_authenticated)
        user_id, username = (user.pk, user.get_username()) if signed_in else (None, "")
        response = self.get_response(request)
        if signed_in:
            audit.record_request(request, response, user_id=user_id, username=username)
        return response


def nul_in_address(path: str, query_string: str) -> str | None:
    """The message refusing an address with a NUL character (%00) in its path or in a query
    parameter, or None. PostgreSQL refuses NUL in text, in a lookup as in a row: an id or a
    filter with one would fail there with a 500 (SQLite takes it and finds nothing), and no
    page or API call of Kiln means one."""
    if "\x00" in path:
        return _("The address must not contain a NUL character (%(nul)s); remove it.") % {"nul": "%00"}
    if "%00" not in query_string and "\x00" not in query_string:
        return None
    for name, value in parse_qsl(query_string, keep_blank_values=True):
        if "\x00" in name or "\x00" in value:
            return _("The query parameter %(name)s must not contain a NUL character (%(nul)s); remove it.") % {
                "name": name.replace("\x00", "%00"), "nul": "%00"}
    return None


class NulCharacterMiddleware:
    """400 for an address with a NUL character, before any view or the session reads the
    database (see nul_in_address). The gateway's /v1/ door checks the same in
    inference/gateway/asgi.py; here /v1/ answers in the gateway's error shape too (Django's
    test client and runserver serve /v1/ through this stack). /api/ is left to its own
    checks: its Text type refuses NUL naming the field, its ids are integers."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith("/api/"):
            return self.get_response(request)
        message = nul_in_address(request.path, request.META.get("QUERY_STRING", ""))
        if message is None:
            return self.get_response(request)
        if request.path.startswith("/v1/"):
            from inference.gateway.errors import bad_request

            return bad_request(message)
        from dashboard.errors import bad_address

        return bad_address(request, message)
