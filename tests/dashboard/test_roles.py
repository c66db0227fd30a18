"""Roles, proven for every route.

Every URL pattern in Django's resolver (pages and the JSON API under /api/),
every /v1/ route of the gateway and every websocket path of dashboard.routing
is tried as anonymous, viewer and operator, with every method:

- anonymous is refused: 401 JSON under /api/ and /v1/, the login page for a
  page, a websocket closed with 4401;
- a viewer reads (GET answers 200) and every change is 403 with nothing
  written (every table is compared before and after each request);
- an operator reads and changes (a change is not refused: a 400 for an empty
  body is fine; never a 500);
- a method a route does not serve is 405 and writes nothing.

The routes come from the resolvers themselves: a route this file has no case
for fails the first test. A page's methods are listed in PAGES; an API
route's methods are read from the OpenAPI document. The counts (routes x
roles) are written to test-artifacts/role-matrix.txt and printed.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import httpx
import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.apps import apps
from django.conf import settings
from django.shortcuts import resolve_url
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from dashboard import services as accounts
from dashboard.api import api
from dashboard.models import Job
from dashboard.routing import CLOSE_NOT_FOUND, websocket_urlpatterns
from inference.deployments.presets import GEMMA_DEMO
from inference.gateway import keys
from inference.models import (Batch, BatchFile, BenchmarkRun, Deployment, EngineRuntime, Experiment, LaunchProfile,
                              ModelArtifact)
from monitoring.alerts.models import AlertChannel, AlertRule
from monitoring.consumers import CLOSE_NOT_AUTHENTICATED
from tests.helpers import REPO

# What a method on a route is: a read (anyone signed in), a change (operators),
# or a read that only operators may make (the audit trail).
READ, CHANGE, OPERATOR_READ = "read", "change", "operator read"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
ROLES = ("anonymous", "viewer", "operator")
ARTIFACTS = Path(REPO) / "test-artifacts"

# Pages: route -> the methods it serves, each a read or a change. Any other method is 405.
PAGES = {
    "": {"GET": READ},
    "users/": {"GET": READ},
    "users/new": {"POST": CHANGE},
    "users/<int:user_id>/role": {"POST": CHANGE},
    "users/<int:user_id>/reset-password": {"POST": CHANGE},
    "users/<int:user_id>/end-sessions": {"POST": CHANGE},
    "users/<int:user_id>/active": {"POST": CHANGE},
    "users/<int:user_id>/delete": {"POST": CHANGE},
    "settings/hub": {"POST": CHANGE},
    "audit/": {"GET": OPERATOR_READ},
    "audit.csv": {"GET": OPERATOR_READ},
    "deployments/plan": {"GET": READ},
    "models/": {"GET": READ},
    "models/<int:artifact_id>/": {"GET": READ},
    "deployments/": {"GET": READ},
    "deployments/<int:deployment_id>/": {"GET": READ},
    "deployments/<int:deployment_id>/stop": {"POST": CHANGE},
    "deployments/<int:deployment_id>/restart": {"POST": CHANGE},
    "deployments/<int:deployment_id>/relaunch-max-len": {"POST": CHANGE},
    "deployments/presets/<slug:slug>/launch": {"POST": CHANGE},
    "deployments/profiles/new": {"GET": READ, "POST": CHANGE},
    "deployments/profiles/<int:profile_id>/": {"GET": READ, "POST": CHANGE},
    "deployments/profiles/<int:profile_id>/launch": {"POST": CHANGE},
    "deployments/runtimes/": {"GET": READ},
    "deployments/runtimes/install": {"POST": CHANGE},
    "deployments/runtimes/<int:runtime_id>/uninstall": {"POST": CHANGE},
    "deployments/runtimes/new": {"POST": CHANGE},
    "deployments/runtimes/<int:runtime_id>/detect": {"POST": CHANGE},
    "benchmarks/": {"GET": READ},
    "benchmarks/compare": {"GET": READ},
    "benchmarks/import": {"POST": CHANGE},
    "benchmarks/<int:run_id>/": {"GET": READ},
    "benchmarks/experiments/": {"GET": READ, "POST": CHANGE},
    "benchmarks/experiments/preset": {"POST": CHANGE},
    "benchmarks/experiments/<int:experiment_id>/": {"GET": READ},
    "benchmarks/experiments/<int:experiment_id>/progress": {"GET": READ},
    "benchmarks/experiments/<int:experiment_id>/cancel": {"POST": CHANGE},
    "benchmarks/experiments/<int:experiment_id>/resume": {"POST": CHANGE},
    "benchmarks/experiments/<int:experiment_id>/report.html": {"GET": READ},
    "benchmarks/experiments/<int:experiment_id>/results.jsonl": {"GET": READ},
    "monitoring/": {"GET": READ},
    "monitoring/history": {"GET": READ},
    "monitoring/history.csv": {"GET": READ},
    "alerts/": {"GET": READ},
    "alerts/channels/new": {"GET": READ, "POST": CHANGE},
    "alerts/channels/<int:channel_id>/": {"GET": READ, "POST": CHANGE},
    "alerts/channels/<int:channel_id>/test": {"POST": CHANGE},
    "alerts/channels/<int:channel_id>/delete": {"POST": CHANGE},
    "alerts/rules/new": {"GET": READ, "POST": CHANGE},
    "alerts/rules/<int:rule_id>/": {"GET": READ, "POST": CHANGE},
    "alerts/rules/<int:rule_id>/delete": {"POST": CHANGE},
    "keys/": {"GET": READ},
    "keys/new": {"POST": CHANGE},
    "keys/<int:key_id>/revoke": {"POST": CHANGE},
    "playground/": {"GET": READ},
    "batches/": {"GET": READ},
    "batches/new": {"POST": CHANGE},
    "batches/<str:batch_id>/": {"GET": READ},
    "batches/<str:batch_id>/progress": {"GET": READ},
    "batches/<str:batch_id>/cancel": {"POST": CHANGE},
    "batches/<str:batch_id>/resume": {"POST": CHANGE},
    "batches/<str:batch_id>/download/<str:which>": {"GET": READ},
    # The API's own pages, beside its routes: the document, its docs page, its root (a 404 naming the docs).
    "api/": {"GET": READ},
    "api/openapi.json": {"GET": READ},
    "api/docs": {"GET": READ},
}
# Open to anyone, signed in or not: the health probe and the sign-in page.
# (Django's form views answer PUT as they answer POST.)
PUBLIC = {
    "healthz": {"GET": READ},
    "login/": {"GET": READ, "POST": READ, "PUT": READ},
    "jsi18n/": {"GET": READ},
    # The language switch: a signed-in user's choice is also kept on their account.
    "language/": {"POST": READ},
}
# The signed-in user's own account: a viewer, too, changes their password and signs out.
OWN_ACCOUNT = {
    "password/": {"GET": READ, "POST": READ, "PUT": READ},
    "logout/": {"POST": READ},
}
# JSON routes that compute an answer from their body and write nothing: reads, by POST.
READS_BY_POST = {"api/preflight", "api/launch-profiles/preview"}
# The gateway: chatting is reading (a viewer may chat in the Playground through the session);
# uploading, deleting and starting or cancelling batches are changes (a viewer's session is 403).
GATEWAY = {
    "v1/chat/completions": {"POST": READ},
    "v1/completions": {"POST": READ},
    "v1/embeddings": {"POST": READ},
    "v1/models": {"GET": READ},
    "v1/files": {"GET": READ, "POST": CHANGE},
    "v1/files/<str:file_id>": {"GET": READ, "DELETE": CHANGE},
    "v1/files/<str:file_id>/content": {"GET": READ},
    "v1/batches": {"GET": READ, "POST": CHANGE},
    "v1/batches/<str:batch_id>": {"GET": READ},
    "v1/batches/<str:batch_id>/cancel": {"POST": CHANGE},
}
WEBSOCKETS = {"ws/live/"}
# What a read answers when it is not 200: a preflight of an empty body names the missing fields.
READ_STATUS = {"api/preflight": 400}
# Signed in, every method here is a 404 (the API's root only points at its docs).
NOWHERE = {"api/"}
QUERY = {"benchmarks/compare": "?ids={run_id},{run_id2}", "api/benchmarks/compare": "?ids={run_id},{run_id2}"}
# Tables a request may write whoever sends it: the session store, and the audit
# trail (it records the refused attempt itself).
NOT_DATA = {"sessions.Session", "dashboard.AuditEntry"}

MATRIX: Counter = Counter()  # (area, role) -> checks that passed, for the summary


def url_routes(patterns=None, prefix=""):
    """The route of every URL pattern in Django's resolver, includes and the ninja API walked."""
    for p in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(p.pattern)
        if isinstance(p, URLResolver):
            yield from url_routes(p.url_patterns, route)
        elif isinstance(p, URLPattern):
            yield route


def api_methods() -> dict[str, dict[str, str]]:
    """route -> {method: read or change} of every route in the API's OpenAPI document."""
    document = api.get_openapi_schema(path_prefix="/api/")
    routes = {}
    for path, operations in document["paths"].items():
        route = re.sub(r"\{(\w+)\}", r"<\1>", path.lstrip("/"))
        routes[route] = {m.upper(): READ if m == "get" or route in READS_BY_POST else CHANGE for m in operations}
    return routes


def cases() -> tuple[dict[str, dict[str, str]], list[str]]:
    """route -> methods for every route the resolver has (/v1/ aside), and the routes without a case."""
    resolved = list(dict.fromkeys(url_routes()))  # first: the URLconf mounts the API's routers
    from_document = api_methods()
    found, missing = {}, []
    for route in resolved:
        if route.startswith("v1/"):
            if route not in GATEWAY:
                missing.append(route)
            continue
        plain = re.sub(r"<(?:\w+:)?(\w+)>", r"<\1>", route)
        methods = PAGES.get(route) or PUBLIC.get(route) or OWN_ACCOUNT.get(route) or from_document.get(plain)
        if methods is None:
            missing.append(route)
        else:
            found[route] = methods
    return found, missing


def is_json_route(route):
    return route.startswith("api/") and route != "api/docs"


@pytest.fixture
def rows(db, tmp_path, operator, viewer):
    """One row of each kind a path names, so that every route resolves to something."""
    target, _ = accounts.account_create(username="tina", role="viewer")
    folder = tmp_path / "model"
    folder.mkdir()
    artifact = ModelArtifact.objects.create(name="m", source="local", host=settings.HOST_NAME, path=str(folder),
                                            folder=str(folder), status="ready")
    runtime = EngineRuntime.objects.create(name="rt", host=settings.HOST_NAME, engine="llamacpp", kind="executable",
                                           path="/nonexistent/llama-server")
    profile = LaunchProfile.objects.create(name="p", host=settings.HOST_NAME, runtime=runtime, model=artifact,
                                           model_path=str(folder))
    deployment = Deployment.objects.create(name="d", host=settings.HOST_NAME, status="ready", port=9,
                                           engine_name="llamacpp", profile=profile, model=artifact,
                                           served_model_name="m")
    result = [{"completed": 1, "request_throughput": 1.0, "output_throughput": 10.0, "step": 0, "source": "kiln"}]
    run = BenchmarkRun.objects.create(scenario="decode-single-stream", status="succeeded", deployment=deployment,
                                      result=result)
    run2 = BenchmarkRun.objects.create(scenario="decode-single-stream", status="succeeded", deployment=deployment,
                                       result=result)
    experiment = Experiment.objects.create(name="e", host=settings.HOST_NAME, scenario="decode-single-stream",
                                           status="succeeded",
                                           configurations=[{"label": "A", "name": "d", "deployment": deployment.pk}])
    key, _ = keys.key_create(user=operator, name="ops")
    job = Job.objects.create(kind="worker-check", created_by=operator)
    channel = AlertChannel(name="ops", kind="webhook")
    channel.url = "http://127.0.0.1:9/nothing-listens"  # a test send is refused at once
    channel.save()
    rule = AlertRule.objects.create(name="all")
    rule.channels.set([channel])
    batch_input = tmp_path / "batch.jsonl"
    batch_input.write_bytes(b'{"custom_id": "a", "url": "/v1/chat/completions", "body": {"messages": []}}\n')
    batch_file = BatchFile.objects.create(filename="batch.jsonl", path=str(batch_input), bytes=76, lines=1)
    # The viewer's own batch: its files are the owner's and operators' to download (tests/batches covers others).
    batch = Batch.objects.create(endpoint="/v1/chat/completions", input_file=batch_file, host=settings.HOST_NAME,
                                 status="completed", total=1, user=viewer)
    return {"batch_id": batch.pk, "which": "input",
            "channel_id": channel.pk, "rule_id": rule.pk, "user_id": target.pk, "artifact_id": artifact.pk, "runtime_id": runtime.pk, "profile_id": profile.pk,
            "deployment_id": deployment.pk, "experiment_id": experiment.pk, "run_id": run.pk, "run_id2": run2.pk, "key_id": key.pk, "job_id": job.pk,
            "slug": GEMMA_DEMO.slug}


def url_for(route, rows):
    def fill(match):
        name = match.group(1)
        assert name in rows, f"/{route}: no row fills <{name}>; create one in the `rows` fixture"
        return str(rows[name])

    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", fill, route) + QUERY.get(route, "").format(**rows)


def snapshot():
    """Every row of every table (the session store aside)."""
    return {m._meta.label: list(m.objects.order_by("pk").values()) for m in apps.get_models()
            if m._meta.label not in NOT_DATA}


def written(before, after):
    """The tables whose rows differ, with their counts before and after."""
    return {label: f"{len(before[label])} -> {len(after[label])} rows" for label in before
            if before[label] != after[label]}


def send(client, route, method, url):
    body, kind = ("{}", "application/json") if is_json_route(route) else ("", "application/x-www-form-urlencoded")
    accept = "application/json" if is_json_route(route) else "text/html"
    return client.generic(method, url, body if method != "GET" else "", content_type=kind, HTTP_ACCEPT=accept)


def signed_in(user):
    client = Client(raise_request_exception=False)
    if user is not None:
        client.force_login(user)
    return client


def verdict(route, method, role, kind, response):
    """None if `role` got the right answer for `method` on `route` (kind: read, change or None: not served)."""
    status = response.status_code
    if status >= 500:
        return f"{status} (a server error)"
    public, own = route in PUBLIC, route in OWN_ACCOUNT
    if role == "anonymous" and not public:
        if is_json_route(route):
            if status == 401 and response.json()["error"]["code"] == "not_authenticated":
                return None
            if kind is None and status == 405:
                return None
            return f"{status}, not the API's 401"
        if status == 302 and response.url.startswith(resolve_url(settings.LOGIN_URL) + "?next="):
            return None
        return f"{status}, not a redirect to the login page"
    if route in NOWHERE:
        return None if status == 404 else f"{status}, not 404"
    if kind is None and public and status == 302 and "?next=" not in response.get("Location", ""):
        return None  # the sign-in page sends a signed-in user home, whatever the method
    if kind is None:
        return None if status == 405 else f"{status} for a method the route does not serve, not 405"
    if public or own:  # a form (200, its errors shown) or where it sends you next
        return None if status in (200, 302) and "?next=" not in response.get("Location", "") \
            else f"{status} on the sign-in or own-account page"
    if kind == READ or (kind == OPERATOR_READ and role == "operator"):
        expected = READ_STATUS.get(route, 200)
        return None if status == expected else f"{status}, not {expected}"
    if role == "viewer":
        if status != 403:
            return f"{status}, not 403"
        if is_json_route(route) and response.json()["error"]["code"] != "forbidden":
            return f"403 without the API's error shape: {response.content[:200]!r}"
        return None
    return f"{status}: the operator was refused" if status in (401, 403) else None


def check_http(role, user, rows, routes, only=None):
    """Every method on every route as `role`; returns the failures."""
    failures = []
    for route, methods in routes.items():
        url = url_for(route, rows)
        for method in METHODS:
            kind = methods.get(method)
            if only is not None and kind not in only:
                continue
            client = signed_in(user)
            before = snapshot()
            response = send(client, route, method, url)
            after = snapshot()
            problem = verdict(route, method, role, kind, response)
            changed = written(before, after)
            if changed and (role != "operator" or kind != CHANGE):
                problem = (problem + "; " if problem else "") + f"wrote {changed}"
            if problem:
                failures.append(f"{role} {method} {url}: {problem}")
            else:
                MATRIX[("http", role)] += 1
    return failures


def test_every_route_has_a_case():
    routes, missing = cases()
    assert not missing, (
        f"routes without a role case: {missing}. Add a page to PAGES (its methods: read or change), a /v1/ "
        f"route to GATEWAY; an API route is taken from the OpenAPI document, so it must be declared on "
        f"dashboard.api.api.")
    listed = set(PAGES) | set(PUBLIC) | set(OWN_ACCOUNT)
    assert listed <= set(routes), f"cases for routes that no longer exist: {listed - set(routes)}"
    assert {str(p.pattern) for p in websocket_urlpatterns} == WEBSOCKETS, "a websocket path without a case"
    assert len(routes) > 60
    MATRIX[("routes", "http")] = len(routes)


def test_anonymous_is_refused_everywhere_but_sign_in_and_health(rows):
    routes, _ = cases()
    failures = check_http("anonymous", None, rows, routes)
    assert not failures, "\n".join(failures)


def test_a_viewer_reads_and_every_change_is_403_with_nothing_written(rows, viewer):
    routes, _ = cases()
    failures = check_http("viewer", viewer, rows, routes)
    assert not failures, "\n".join(failures)


def test_an_operator_reads_and_changes(rows, operator):
    routes, _ = cases()
    # Reads first: the changes stop, delete and revoke the rows the reads look at.
    failures = check_http("operator", operator, rows, routes, only={READ, OPERATOR_READ, None})
    failures += check_http("operator", operator, rows, routes, only={CHANGE})
    assert not failures, "\n".join(failures)


def test_keys_page_shows_a_viewer_no_key_buttons(rows, viewer, operator, client):
    from inference.models import ApiKey

    keys.key_create(user=viewer, name="made before")  # e.g. while the viewer was an operator
    client.force_login(viewer)
    page = client.get("/keys/").content.decode()
    assert "made before" in page and "Create key" not in page and "/revoke" not in page
    assert "Operators create and revoke API keys" in page
    assert client.post("/keys/new", {"name": "mine"}).status_code == 403
    assert not ApiKey.objects.filter(name="mine").exists()
    client.force_login(operator)
    page = client.get("/keys/").content.decode()
    assert "Create key" in page and "/revoke" in page


# ------------------------------------------------------------------ /v1/


def gateway_routes():
    routes = [r for r in dict.fromkeys(url_routes()) if r.startswith("v1/")]
    assert set(routes) == set(GATEWAY), f"/v1/ routes without a case: {set(routes) - set(GATEWAY)}"
    return routes


def session_headers(user):
    """A session cookie and a CSRF token (cookie and header), as the Playground sends them."""
    client = Client()
    client.force_login(user)
    token = "k" * 32
    return {"Cookie": f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}; "
                      f"{settings.CSRF_COOKIE_NAME}={token}", "X-CSRFToken": token}


def test_the_gateway_refuses_anonymous_and_serves_viewer_and_operator(asgi_server, viewer, operator):
    """Through the real ASGI app (/v1/ has its own handler, and keys their own fast path)."""
    _, secret = keys.key_create(user=operator, name="ops", rate_limit=0)
    callers = [("anonymous", {}), ("viewer", session_headers(viewer)), ("operator", session_headers(operator)),
               ("operator", {"Authorization": f"Bearer {secret}"})]
    failures = []
    for route in gateway_routes():
        for role, headers in callers:
            for method in METHODS:
                kind = GATEWAY[route].get(method)
                before = snapshot()
                r = httpx.request(method, f"{asgi_server}/{route}", headers=headers,
                                  content=b"{}" if method != "GET" else None, timeout=30)
                after = snapshot()
                if r.status_code >= 500:
                    problem = f"{r.status_code} (a server error)"
                elif role == "anonymous":
                    problem = None if r.status_code == 401 or (kind is None and r.status_code == 405) \
                        else f"{r.status_code}, not 401"
                elif kind is None:
                    problem = None if r.status_code == 405 else f"{r.status_code}, not 405"
                elif kind == CHANGE and role == "viewer":
                    problem = None if r.status_code == 403 and r.json()["error"]["code"] == "forbidden" \
                        else f"{r.status_code}, not 403 forbidden"
                else:  # a read or an operator's change: an empty body is a 400, never a refusal
                    problem = f"{r.status_code}: refused" if r.status_code in (401, 403) else None
                if r.headers.get("content-type", "").startswith("application/json") is False:
                    problem = problem or f"not JSON: {r.headers.get('content-type')}"
                if written(before, after):
                    problem = (problem or "") + f" wrote {written(before, after)}"
                if problem:
                    failures.append(f"{role} {method} /{route}: {problem}")
                else:
                    MATRIX[("gateway", role)] += 1
    assert not failures, "\n".join(failures)
    MATRIX[("routes", "gateway")] = len(GATEWAY)


# ------------------------------------------------------------------ websockets

ORIGIN = (b"origin", b"http://localhost")


def ws_connect(path, user=None, send=None, cookie=None):
    """(accepted, close code) of a websocket to `path` through the real ASGI app."""
    from dashboard.asgi import application

    headers = [ORIGIN, (b"host", b"localhost")]
    if user is not None or cookie is not None:
        headers.append((b"cookie", cookie or session_headers(user)["Cookie"].encode()))

    async def attempt():
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, code = await communicator.connect(timeout=10)
        if connected and send is not None:
            await communicator.send_to(text_data=send)
            assert await communicator.receive_nothing(timeout=0.5)
        await communicator.disconnect()
        return connected, code

    return async_to_sync(attempt)()


def test_websockets_refuse_anonymous_and_serve_viewer_and_operator(transactional_db, redis_clean, viewer, operator):
    for pattern in websocket_urlpatterns:
        path = "/" + str(pattern.pattern)
        assert ws_connect(path) == (False, CLOSE_NOT_AUTHENTICATED), path
        MATRIX[("websocket", "anonymous")] += 1
        cookie = session_headers(viewer)["Cookie"].encode()
        before = snapshot()
        assert ws_connect(path, send=json.dumps({"type": "stop", "deployment": 1}), cookie=cookie)[0], path
        assert written(before, snapshot()) == {}, "a viewer's websocket message wrote rows"
        MATRIX[("websocket", "viewer")] += 1
        assert ws_connect(path, operator)[0], path
        MATRIX[("websocket", "operator")] += 1
    MATRIX[("routes", "websocket")] = len(websocket_urlpatterns)


def test_a_websocket_to_an_unrouted_path_is_closed_not_a_server_error(asgi_server, viewer, tmp_path):
    """Closed at the handshake with 4404, signed in or not, and nothing in the server's log."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    for user in (None, viewer):
        assert ws_connect("/ws/nowhere/", user) == (False, CLOSE_NOT_FOUND)
        assert ws_connect("/", user) == (False, CLOSE_NOT_FOUND)
    ws_url = asgi_server.replace("http://", "ws://")
    for path in ("/ws/nowhere/", "/nothing", "/ws/live/extra"):
        with pytest.raises(InvalidStatus) as refused:
            connect(ws_url + path, origin=asgi_server, open_timeout=10)
        assert refused.value.response.status_code == 403  # a handshake closed before it was accepted
    log = (tmp_path / "web.log").read_text()
    assert "Traceback" not in log and "Exception" not in log and "No route found" not in log, log


def test_zz_role_matrix_counts():
    """Last in the file: the matrix of the checks above, for the closing note."""
    lines = ["Role matrix (checks that passed; one check = one route x method x role)", ""]
    for area in ("http", "gateway", "websocket"):
        routes = MATRIX.get(("routes", area), 0)
        counts = " ".join(f"{role}={MATRIX.get((area, role), 0)}" for role in ROLES)
        lines.append(f"{area:10} routes={routes:3} {counts}")
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "role-matrix.txt").write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))
