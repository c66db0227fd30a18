"""The audit trail: one row per operator action, written by the middleware and the sign-in signals."""
import csv
import datetime as dt
import io
import json

import pytest
from django.conf import settings
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from dashboard import audit
from dashboard.models import AuditEntry
from inference.models import Deployment
from tests.deployments.helpers import make_deployment, make_profile
from tests.fakehub import FakeFile, FakeHub

SECRET = "hf_SECRET_token_never_stored"

# Plain views that take any method and answer with the page: a POST renders it
# again and changes nothing. A new view lands here only if that is true of it.
READ_ANY_METHOD = {"home", "users", "deployments", "deployment_detail", "models", "model_detail", "gateway_keys",
                   "playground", "api:openapi-json", "api:openapi-view", "api:api-root"}


def client_for(user, address="10.1.2.3"):
    c = Client(REMOTE_ADDR=address)
    c.force_login(user)
    AuditEntry.objects.filter(action=audit.SIGN_IN).delete()  # force_login's own sign-in row
    return c


def stored_text(entry):
    return json.dumps({f.name: str(getattr(entry, f.attname)) for f in AuditEntry._meta.fields})


# --------------------------------------------------------------------------- what is recorded


def test_a_download_start_is_one_row_and_its_token_is_never_stored(operator, settings, tmp_path):
    settings.MODELS_DIR = tmp_path
    c = client_for(operator)
    with FakeHub(token=SECRET) as hub:
        hub.add_repo("org/Tiny", {"config.json": FakeFile.of_bytes(b"{}")})
        response = c.post("/api/models/", {"hub": "hf", "repo_id": "org/Tiny", "endpoint": hub.url, "token": SECRET},
                          content_type="application/json")
    assert response.status_code == 202, response.content
    model_id = response.json()["model"]["id"]
    entry = AuditEntry.objects.get()
    assert (entry.user_id, entry.username, entry.address) == (operator.pk, "olga", "10.1.2.3")
    assert (entry.action, entry.object_type, entry.object_id) == ("model.download", "model", str(model_id))
    assert (entry.method, entry.path, entry.status_code, entry.result) == ("POST", "/api/models/", 202, "ok")
    assert entry.error_code == "" and SECRET not in stored_text(entry)
    assert timezone.now() - entry.created < dt.timedelta(minutes=1)


def test_a_viewers_refused_action_is_recorded_as_refused(viewer):
    c = client_for(viewer, "10.9.9.9")
    response = c.post("/api/models/", {"repo_id": "org/Tiny", "token": SECRET}, content_type="application/json")
    assert response.status_code == 403
    entry = AuditEntry.objects.get()
    assert (entry.username, entry.address, entry.action) == ("victor", "10.9.9.9", "model.download")
    assert (entry.status_code, entry.result, entry.error_code) == (403, "refused", "forbidden")
    assert SECRET not in stored_text(entry)


def test_behind_a_trusted_proxy_the_row_has_the_forwarded_address_as_the_throttle_sees_it(viewer, settings):
    settings.TRUSTED_PROXIES = ["10.9.9.9"]
    c = client_for(viewer, "10.9.9.9")
    c.post("/api/models/", {"repo_id": "org/Tiny"}, content_type="application/json",
           HTTP_X_FORWARDED_FOR="203.0.113.7, 10.9.9.9")
    assert AuditEntry.objects.get().address == "203.0.113.7"


def test_sign_in_and_failed_sign_in_are_recorded_without_the_password(operator):
    c = Client(REMOTE_ADDR="192.0.2.7")
    assert c.post("/login/", {"username": "olga", "password": "wrong-password-123"}).status_code == 200
    failed = AuditEntry.objects.get()
    assert (failed.action, failed.username, failed.user_id, failed.address) == (
        "account.sign_in_failed", "olga", None, "192.0.2.7")
    assert failed.result == "refused" and failed.error_code == "bad_credentials"
    assert "wrong-password-123" not in stored_text(failed)
    assert c.post("/login/", {"username": "olga", "password": operator.plain_password}).status_code == 302
    signed_in = AuditEntry.objects.exclude(pk=failed.pk).get()  # one row: the middleware leaves /login/ to the signal
    assert (signed_in.action, signed_in.user_id, signed_in.username, signed_in.address, signed_in.result) == (
        "account.sign_in", operator.pk, "olga", "192.0.2.7", "ok")
    assert operator.plain_password not in stored_text(signed_in)


def test_a_key_create_is_one_row(operator):
    c = client_for(operator)
    response = c.post("/keys/new", {"name": "ci", "rate_limit": "0"})
    assert response.status_code == 302
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.object_type, entry.result, entry.username) == ("key.create", "key", "ok", "olga")
    assert entry.path == "/keys/new" and entry.status_code == 302


def test_a_deployment_stop_is_one_row_on_that_deployment(operator):
    dep = make_deployment(make_profile(host=settings.HOST_NAME, runtime_path="/opt/llama/llama-server"))
    Deployment.objects.filter(pk=dep.pk).update(status=Deployment.Status.READY)
    c = client_for(operator)
    response = c.post(f"/api/deployments/{dep.pk}/stop")
    assert response.status_code == 202, response.content
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.object_type, entry.object_id, entry.result) == (
        "deployment.stop", "deployment", str(dep.pk), "ok")
    # Stopping a stopped one is refused, recorded with the API's code, on the same object.
    Deployment.objects.filter(pk=dep.pk).update(status=Deployment.Status.STOPPED)
    assert c.post(f"/api/deployments/{dep.pk}/stop").status_code == 409
    refused = AuditEntry.objects.exclude(pk=entry.pk).get()
    assert (refused.action, refused.object_id, refused.result, refused.error_code) == (
        "deployment.stop", str(dep.pk), "refused", "not_running")


def test_reads_and_previews_are_not_recorded(operator):
    c = client_for(operator)
    for url in ("/", "/api/models/", "/deployments/", "/users/", "/audit/", "/audit.csv"):
        assert c.get(url).status_code == 200, url
    c.post("/api/preflight", {}, content_type="application/json")
    assert not AuditEntry.objects.exists()


def test_a_failure_to_record_never_breaks_the_action(operator, monkeypatch, caplog):
    c = client_for(operator)

    def broken(**fields):
        raise RuntimeError("database gone")

    monkeypatch.setattr(AuditEntry.objects, "create", broken)
    response = c.post("/keys/new", {"name": "still-made", "rate_limit": "0"})
    assert response.status_code == 302
    assert "audit: could not record key.create" in caplog.text


# --------------------------------------------------------------------------- the page and the CSV


@pytest.fixture
def trail(operator, viewer):
    now = timezone.now()
    rows = [
        dict(username="olga", user_id=operator.pk, action="deployment.stop", object_type="deployment",
             object_id="3", result="ok", status_code=202, created=now),
        dict(username="olga", user_id=operator.pk, action="model.delete", object_type="model", object_id="9",
             result="failed", status_code=500, created=now - dt.timedelta(days=3)),
        dict(username="victor", user_id=viewer.pk, action="model.download", object_type="model",
             result="refused", status_code=403, error_code="forbidden", created=now - dt.timedelta(days=10)),
        dict(username="=cmd|evil", action="account.sign_in_failed", result="refused", created=now),
    ]
    return [AuditEntry.objects.create(address="10.0.0.1", **row) for row in rows]


def test_the_page_filters_by_user_action_result_date_and_object(operator, trail):
    c = client_for(operator)
    page = c.get("/audit/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "deployment.stop" in html and "model.delete" in html and "deployment #3" in html

    def shown(**query):
        response = c.get("/audit/", query)
        assert response.status_code == 200
        return {e.action for e in response.context["page"]}

    assert shown(user="victor") == {"model.download"}
    assert shown(action="model.delete") == {"model.delete"}
    assert shown(result="refused") == {"model.download", "account.sign_in_failed"}
    today = timezone.localdate()
    assert shown(since=str(today - dt.timedelta(days=5))) == {"deployment.stop", "account.sign_in_failed",
                                                               "model.delete"}
    assert shown(until=str(today - dt.timedelta(days=5))) == {"model.download"}
    assert shown(object="deployment 3") == {"deployment.stop"}
    assert shown(object="model") == {"model.delete", "model.download"}
    assert shown(object="9") == {"model.delete"}
    bad = c.get("/audit/", {"since": "yesterday", "result": "maybe"})
    assert bad.status_code == 400 and b"since" in bad.content


def test_the_page_is_paginated(operator):
    c = client_for(operator)
    AuditEntry.objects.bulk_create([AuditEntry(created=timezone.now(), action="model.delete", result="ok")
                                    for _ in range(120)])
    first = c.get("/audit/", {"action": "model.delete"})
    assert len(first.context["page"]) == 50 and "page=2" in first.content.decode()
    last = c.get("/audit/", {"action": "model.delete", "page": 99})
    assert last.status_code == 200 and len(last.context["page"]) == 20


def test_the_csv_has_the_same_filters_and_no_formulas(operator, trail):
    c = client_for(operator)
    response = c.get("/audit.csv", {"result": "refused"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert {r["action"] for r in rows} == {"model.download", "account.sign_in_failed"}
    assert {r["username"] for r in rows} == {"victor", "'=cmd|evil"}
    refused = next(r for r in rows if r["action"] == "model.download")
    assert refused["error_code"] == "forbidden" and refused["status_code"] == "403" and refused["address"] == "10.0.0.1"
    bad = c.get("/audit.csv", {"until": "not-a-date"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid"


def test_viewers_may_not_read_the_trail(viewer, trail):
    c = client_for(viewer)
    assert c.get("/audit/").status_code == 403
    assert c.get("/audit.csv").status_code == 403
    assert b'href="/audit/"' not in c.get("/").content


def test_operators_find_it_in_the_top_bar(operator):
    assert b'href="/audit/"' in client_for(operator).get("/").content


def test_retention_deletes_entries_older_than_the_setting(db, settings, monkeypatch):
    settings.AUDIT_RETENTION_DAYS = 30
    now = timezone.now()
    old = AuditEntry.objects.create(created=now - dt.timedelta(days=31), action="model.delete", result="ok")
    kept = AuditEntry.objects.create(created=now - dt.timedelta(days=29), action="model.delete", result="ok")
    assert audit.prune() == 1
    assert list(AuditEntry.objects.values_list("pk", flat=True)) == [kept.pk]
    # A write prunes too, at most once an hour.
    old = AuditEntry.objects.create(created=now - dt.timedelta(days=40), action="model.delete", result="ok")
    monkeypatch.setattr(audit, "_last_prune", float("-inf"))
    audit._write(action="model.delete", result="ok")
    assert not AuditEntry.objects.filter(pk=old.pk).exists()
    again = AuditEntry.objects.create(created=now - dt.timedelta(days=40), action="model.delete", result="ok")
    audit._write(action="model.delete", result="ok")
    assert AuditEntry.objects.filter(pk=again.pk).exists()


# --------------------------------------------------------------------------- every route is named


def every_route(patterns=None, prefix="", namespace=None):
    """(route, view name, methods or None for any) of every URL pattern from Django's resolver;
    an API path once per django-ninja operation (each has its own name)."""
    for p in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(p, URLResolver):
            inner = ":".join(n for n in (namespace, p.namespace) if n) or None
            yield from every_route(p.url_patterns, prefix + str(p.pattern), inner)
        elif isinstance(p, URLPattern):
            route = prefix + str(p.pattern)
            operations = audit.ninja_operations(p.callback)
            if operations is None:
                yield route, ":".join(n for n in (namespace, p.name) if n), methods_of(p.callback)
            for op in operations or ():
                yield route, ":".join(n for n in (namespace, op.url_name or p.name) if n), set(op.methods)


def methods_of(view):
    """The HTTP methods a plain Django view answers, or None when it takes any."""
    view_class = getattr(view, "view_class", None)
    if view_class is not None:
        return {m.upper() for m in view_class.http_method_names if hasattr(view_class, m)}
    while view is not None:  # require_GET / require_POST / require_http_methods
        code = getattr(view, "__code__", None)
        if code is not None and "request_method_list" in code.co_freevars:
            return set(view.__closure__[code.co_freevars.index("request_method_list")].cell_contents)
        view = getattr(view, "__wrapped__", None)
    return None


def test_every_state_changing_route_is_named_in_the_action_table(db):
    routes = list(every_route())
    assert len(routes) > 40
    unnamed = []
    changing = 0
    for route, name, methods in routes:
        if methods is None:
            if name in READ_ANY_METHOD:
                continue
        elif not methods & audit.STATE_CHANGING:
            continue
        changing += 1
        if name not in audit.ACTIONS and name not in audit.NOT_ACTIONS:
            unnamed.append(f"/{route} ({name}, {sorted(methods or ['any'])})")
    assert not unnamed, ("name these routes in dashboard.audit.ACTIONS (or NOT_ACTIONS if they change "
                         "nothing):\n" + "\n".join(unnamed))
    assert changing > 30
    known = {name for _, name, _ in routes}
    stale = (set(audit.ACTIONS) | set(audit.NOT_ACTIONS)) - known
    assert not stale, f"the action table names routes that no longer exist: {sorted(stale)}"


def test_an_unnamed_route_still_records_its_url_name(operator, monkeypatch):
    monkeypatch.delitem(audit.ACTIONS, "gateway_key_create")
    client_for(operator).post("/keys/new", {"name": "x", "rate_limit": "0"})
    entry = AuditEntry.objects.get()
    assert entry.action == "gateway_key_create" and entry.object_type == ""


def test_a_name_that_is_no_account_is_not_kept(db):
    # People type their password into the name box: such a "name" must not sit in the trail.
    Client(REMOTE_ADDR="192.0.2.8").post("/login/", {"username": "hunter2-my-password", "password": "x"})
    entry = AuditEntry.objects.get()
    assert entry.username == "(unknown)" and "hunter2" not in stored_text(entry)


def test_dates_out_of_range_are_a_form_error_not_a_crash(operator):
    c = client_for(operator)
    for query in ({"until": "9999-12-31"}, {"since": "0001-01-01"}):
        for path in ("/audit/", "/audit.csv"):
            response = c.get(path, query)
            assert response.status_code in (200, 400), (path, query)
            assert response.status_code == 400 or b"between 1970 and 9000" in response.content
