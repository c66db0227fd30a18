"""The audit trail: every operator action is an AuditEntry row.

One mechanism, so that a new route cannot be forgotten: AuditMiddleware
(dashboard/middleware.py) records every state-changing request (POST, PUT,
PATCH, DELETE) a signed-in user makes to a page or an /api/ route, and the
sign-in signals below record sign-ins and failed sign-ins. Views call nothing.

ACTIONS names what each state-changing route does in the trail's words; a
route missing from it still records its URL name, and
tests/dashboard/test_audit.py fails until it is named here or listed in
NOT_ACTIONS (a preview or a dry run that changes nothing).

What is kept: who (user id and name as text, so deleting the account keeps its
trail), when, the client address (REMOTE_ADDR), the action, the object (the
URL's id, or a new object's id from the JSON answer or the redirect), the
status code and result (ok / refused / failed) with a refusal's error code.
Never the body: it may hold hub tokens or passwords.
"""
from __future__ import annotations

import csv
import datetime as dt
import json
import logging
import time
from typing import Iterator

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.db import transaction
from django.urls import Resolver404, resolve
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from dashboard import signin
from dashboard.models import AuditEntry

log = logging.getLogger(__name__)

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})

# View name (namespace:url_name) -> action. The part before the dot is the kind
# of object the action is on.
ACTIONS: dict[str, str] = {
    # accounts (pages)
    "logout": "account.sign_out",
    "password_change": "account.password_change",
    "set_language": "account.language",
    "user_create": "user.create",
    "user_role": "user.role_change",
    "user_reset_password": "user.password_reset",
    "user_end_sessions": "user.end_sessions",
    "user_active": "user.disable_or_enable",
    "user_delete": "user.delete",
    "hub_preference": "settings.hub",
    # API keys (pages)
    "gateway_key_create": "key.create",
    "gateway_key_revoke": "key.revoke",
    # batch jobs (pages, and the OpenAI Files/Batches API when called with a session)
    "batch_new": "batch.create",
    "batch_cancel": "batch.cancel",
    "batch_resume": "batch.resume",
    "gateway_files": "file.upload",
    "gateway_file": "file.delete",
    "gateway_batches": "batch.create",
    "gateway_batch_cancel": "batch.cancel",
    # deployments (pages)
    "deployment_stop": "deployment.stop",
    "deployment_restart": "deployment.restart",
    "deployment_relaunch_max_len": "deployment.relaunch_max_len",
    "preset_launch": "preset.launch",
    "profile_new": "profile.create",
    "profile_edit": "profile.edit",
    "profile_launch": "profile.launch",
    "runtime_create": "runtime.create",
    "runtime_detect": "runtime.detect",
    "runtime_install": "runtime.install",
    "runtime_uninstall": "runtime.uninstall",
    # alerts (pages)
    "alert_channel_new": "alert_channel.create",
    "alert_channel_edit": "alert_channel.edit",
    "alert_channel_test": "alert_channel.send_test",
    "alert_channel_delete": "alert_channel.delete",
    "alert_rule_new": "alert_rule.create",
    "alert_rule_edit": "alert_rule.edit",
    "alert_rule_delete": "alert_rule.delete",
    # benchmarks (pages)
    "benchmark_import": "benchmark.import",
    "experiments": "experiment.create",
    "experiment_preset": "experiment.create_preset",
    "experiment_cancel": "experiment.cancel",
    "experiment_resume": "experiment.resume",
    # /api/: jobs
    "api:api_worker_check": "job.worker_check",
    # /api/: models
    "api:api_models_start": "model.download",
    "api:api_model_import": "model.import",
    "api:api_model_delete": "model.delete",
    "api:api_model_delete_post": "model.delete",
    "api:api_model_cancel": "model.cancel",
    "api:api_model_resume": "model.resume",
    "api:api_model_reverify": "model.reverify",
    # /api/: deployments and runtimes
    "api:api_deployments_launch": "deployment.launch",
    "api:api_deployment_stop": "deployment.stop",
    "api:api_deployment_restart": "deployment.restart",
    "api:api_runtimes_register": "runtime.create",
    "api:api_runtime_install": "runtime.install",
    "api:api_runtime_uninstall": "runtime.uninstall",
    # /api/: benchmarks
    "api:api_benchmarks_start": "benchmark.start",
    "api:api_benchmark_import": "benchmark.import",
    "api:api_benchmark_cancel": "benchmark.cancel",
}

# State-changing routes that are not operator actions, and why: nothing is recorded.
NOT_ACTIONS: dict[str, str] = {
    "login": "recorded by the sign-in signals (sign-in and failed sign-in)",
    "api:api_model_preview": "a preview: lists what a download would fetch, changes nothing",
    "api:api_preflight": "a dry run of the launch checks, changes nothing",
    "api:api_profile_preview": "a preview of the engine command, changes nothing",
    "gateway_chat": "/v1/ gateway call: usage is recorded by the gateway",
    "gateway_completions": "/v1/ gateway call: usage is recorded by the gateway",
    "gateway_embeddings": "/v1/ gateway call: usage is recorded by the gateway",
    "gateway_models": "/v1/ gateway call: usage is recorded by the gateway",
    "gateway_file_content": "/v1/ read: a file's content",
    "gateway_batch": "/v1/ read: a batch object",
}

SIGN_IN = "account.sign_in"
SIGN_IN_FAILED = "account.sign_in_failed"

# Checked on write at most this often per process: old rows are deleted then.
PRUNE_EVERY_S = 3600
_last_prune = float("-inf")


# --------------------------------------------------------------------------- writing


def client_address(request) -> str | None:
    """Where the request came from, as the sign-in throttle sees it (signin.client_address:
    REMOTE_ADDR, or the forwarded address when a TRUSTED_PROXIES proxy sent it)."""
    return (signin.client_address(request) or None) if request is not None else None


def result_of(status_code: int) -> str:
    if status_code >= 500:
        return AuditEntry.Result.FAILED
    if status_code >= 400:
        return AuditEntry.Result.REFUSED
    return AuditEntry.Result.OK


def _json_answer(response) -> dict | None:
    if getattr(response, "streaming", False) or not response.get("Content-Type", "").startswith("application/json"):
        return None
    if len(response.content) > 256 * 1024:
        return None
    try:
        data = json.loads(response.content)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def error_code_of(response, answer: dict | None) -> str:
    """The refusal's code: the API's {"error": {"code"}}, else a name for the status."""
    if answer and isinstance(answer.get("error"), dict):
        return str(answer["error"].get("code", ""))[:60]
    if response.status_code == 403:
        return "forbidden"
    if response.status_code == 404:
        return "not_found"
    if response.status_code >= 400:
        return f"http_{response.status_code}"
    return ""


def _created_id(response, answer: dict | None) -> str:
    """A new object's id: {"id"} or {"<kind>": {"id"}} in the JSON answer, else the
    first id in the redirect's URL (/deployments/7/ -> 7)."""
    if answer:
        if "id" in answer and not isinstance(answer["id"], (dict, list)):
            return str(answer["id"])
        nested = [v for k, v in answer.items() if k != "error" and isinstance(v, dict) and "id" in v]
        if len(nested) == 1:
            return str(nested[0]["id"])
    location = response.get("Location") if 300 <= response.status_code < 400 else None
    if location and location.startswith("/"):
        try:
            kwargs = resolve(location.split("?", 1)[0]).kwargs
        except Resolver404:
            return ""
        for name, value in kwargs.items():
            if name.endswith("_id"):
                return str(value)
    return ""


def _object_id(kwargs: dict) -> str:
    for name, value in kwargs.items():
        if name.endswith("_id") or name in ("slug", "pk"):
            return str(value)[:100]
    return ""


def _page_refused(request) -> bool:
    """A page that answered a refusal as an error message and a redirect (a form error)."""
    storage = getattr(request, "_messages", None)
    queued = getattr(storage, "_queued_messages", None) or []
    return any(m.level >= messages.ERROR for m in queued)


def _write(**fields) -> AuditEntry | None:
    """Insert one row; a failure is logged, never raised (recording must not break the action)."""
    global _last_prune
    try:
        with transaction.atomic():
            entry = AuditEntry.objects.create(created=timezone.now(), **fields)
    except Exception:  # noqa: BLE001 -- any database trouble: the action itself went through
        log.exception("audit: could not record %s by %s", fields.get("action"), fields.get("username"))
        return None
    now = time.monotonic()
    if now - _last_prune >= PRUNE_EVERY_S:
        _last_prune = now
        try:
            prune()
        except Exception:  # noqa: BLE001
            log.exception("audit: could not delete entries past AUDIT_RETENTION_DAYS")
    return entry


def ninja_operations(view) -> list | None:
    """The django-ninja operations behind a URL pattern's view (None for a plain Django view).

    Ninja serves every method of one path through one URL pattern named after its
    first route; each operation keeps its own url_name, which is the name used here."""
    for cell in getattr(view, "__closure__", None) or ():
        operations = getattr(cell.cell_contents, "operations", None)
        if isinstance(operations, list):
            return operations
    return None


def view_name_of(match, method: str) -> str:
    """"namespace:url_name" of what answered: for an API path, the operation of this method."""
    for op in ninja_operations(match.func) or ():
        if method in op.methods and getattr(op, "url_name", None):
            return ":".join(n for n in (match.namespace, op.url_name) if n)
    return match.view_name


def record_request(request, response, *, user_id, username) -> AuditEntry | None:
    """The row for one state-changing request, or None when it is not an operator action."""
    try:
        match = getattr(request, "resolver_match", None)
        if match is None or request.path.startswith("/v1/"):
            return None
        view_name = view_name_of(match, request.method)
        if view_name in NOT_ACTIONS:
            return None
        action = ACTIONS.get(view_name, view_name or request.path)[:80]
        answer = _json_answer(response)
        result = result_of(response.status_code)
        error_code = error_code_of(response, answer)
        if result == AuditEntry.Result.OK and _page_refused(request):
            result, error_code = AuditEntry.Result.REFUSED, "invalid"
        object_id = _object_id(match.kwargs)
        if not object_id and result == AuditEntry.Result.OK:
            object_id = _created_id(response, answer)[:100]
        object_type = action.split(".", 1)[0] if view_name in ACTIONS else ""
        fields = dict(user_id=user_id, username=username[:150], address=client_address(request),
                      action=action, method=request.method[:10], path=request.path[:500],
                      object_type=object_type[:40], object_id=object_id, status_code=response.status_code,
                      result=result, error_code=error_code)
    except Exception:  # noqa: BLE001
        log.exception("audit: could not describe %s %s", request.method, request.path)
        return None
    return _write(**fields)


def _signed_in(sender, request, user, **kwargs):
    _write(user_id=user.pk, username=user.get_username(), address=client_address(request), action=SIGN_IN,
           method=getattr(request, "method", "") or "", path=getattr(request, "path", "")[:500],
           status_code=None, result=AuditEntry.Result.OK)


def _sign_in_failed(sender, credentials, request=None, **kwargs):
    # Django has already replaced the password in `credentials` with stars; only the name is kept.
    tried = str(credentials.get("username", "") or "")[:150]
    # People type passwords into the name box: keep the name only when it is an account's.
    if not get_user_model().objects.filter(username__iexact=tried.strip()).exists():
        tried = "(unknown)"
    _write(user_id=None, username=tried, address=client_address(request), action=SIGN_IN_FAILED,
           method=getattr(request, "method", "") or "", path=(getattr(request, "path", "") or "")[:500],
           object_type="user", object_id=tried[:100], status_code=None, result=AuditEntry.Result.REFUSED,
           error_code="bad_credentials")


def connect_signals():
    """Called from DashboardConfig.ready(): sign-ins are recorded whichever view signs in."""
    user_logged_in.connect(_signed_in, dispatch_uid="kiln_audit_sign_in")
    user_login_failed.connect(_sign_in_failed, dispatch_uid="kiln_audit_sign_in_failed")


def prune(now: dt.datetime | None = None) -> int:
    """Delete entries older than AUDIT_RETENTION_DAYS; returns how many."""
    cutoff = (now or timezone.now()) - dt.timedelta(days=settings.AUDIT_RETENTION_DAYS)
    deleted, _ = AuditEntry.objects.filter(created__lt=cutoff).delete()
    return deleted


# --------------------------------------------------------------------------- reading


class AuditFilterForm(forms.Form):
    """The page's and the CSV's filters (query string); bad values are form errors, not 500s."""

    user = forms.CharField(label=_("User"), required=False, max_length=150)
    action = forms.CharField(label=_("Action"), required=False, max_length=80)
    result = forms.ChoiceField(label=_("Result"), required=False,
                               choices=[("", _("any"))] + list(AuditEntry.Result.choices))
    since = forms.DateField(label=_("From"), required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(label=_("To"), required=False, widget=forms.DateInput(attrs={"type": "date"}))
    object = forms.CharField(label=_("Object"), required=False, max_length=150,
                             help_text=_('"deployment", "deployment 3" or "3"'))

    def clean(self):
        cleaned = super().clean()
        for name in ("user", "action", "object"):
            if "\x00" in (cleaned.get(name) or ""):
                self.add_error(name, _("must not contain a NUL character"))
        since, until = cleaned.get("since"), cleaned.get("until")
        for name, day in (("since", since), ("until", until)):
            if day and not dt.date(1970, 1, 1) <= day <= dt.date(9000, 12, 31):
                self.add_error(name, _("give a date between 1970 and 9000"))
                cleaned[name] = None
        since, until = cleaned.get("since"), cleaned.get("until")
        if since and until and since > until:
            self.add_error("until", _("must not be before From"))
        return cleaned


def action_choices() -> list[str]:
    """Every action the table knows plus those already in the trail (unmapped URL names included)."""
    known = set(ACTIONS.values()) | {SIGN_IN, SIGN_IN_FAILED}
    known |= set(AuditEntry.objects.values_list("action", flat=True).distinct())
    return sorted(known)


def _day_start(day: dt.date) -> dt.datetime:
    return timezone.make_aware(dt.datetime.combine(day, dt.time.min))


def entries(filters: dict | None = None):
    """The trail, newest first, narrowed by AuditFilterForm's cleaned data."""
    rows = AuditEntry.objects.all()
    f = filters or {}
    if f.get("user"):
        rows = rows.filter(username__iexact=f["user"].strip())
    if f.get("action"):
        rows = rows.filter(action=f["action"].strip())
    if f.get("result"):
        rows = rows.filter(result=f["result"])
    if f.get("since"):
        rows = rows.filter(created__gte=_day_start(f["since"]))
    if f.get("until"):
        rows = rows.filter(created__lt=_day_start(f["until"] + dt.timedelta(days=1)))
    target = (f.get("object") or "").replace("#", " ").replace(":", " ").split()
    if len(target) == 1:
        word = target[0]
        rows = rows.filter(object_id=word) if word.isdigit() else rows.filter(object_type=word)
    elif len(target) >= 2:
        rows = rows.filter(object_type=target[0], object_id=" ".join(target[1:]))
    return rows


CSV_HEADER = ["time", "user_id", "username", "address", "action", "object_type", "object_id", "method", "path",
              "status_code", "result", "error_code"]


class _Echo:
    def write(self, value):
        return value


def _csv_cell(value):
    """A cell a spreadsheet will not run as a formula (a username may start with "=")."""
    text = "" if value is None else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def csv_lines(rows) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_HEADER)
    for e in rows.iterator(chunk_size=1000):
        yield writer.writerow([e.created.isoformat(), e.user_id, _csv_cell(e.username), e.address,
                               _csv_cell(e.action), _csv_cell(e.object_type), _csv_cell(e.object_id), e.method,
                               _csv_cell(e.path), e.status_code, e.result, _csv_cell(e.error_code)])
