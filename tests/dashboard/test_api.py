"""The JSON API as a whole: every /api/ URL is a route of the one ninja API and
is in its OpenAPI document; the document and its docs page need a session;
bad input is a 400 naming the field (404 for a valid id that does not exist),
and nothing is written."""
import json
import re

import pytest
from django.contrib.staticfiles import finders
from django.urls import URLPattern, URLResolver, get_resolver

from dashboard.api import MAX_INT
from dashboard.models import Job
from inference.models import BenchmarkRun, Deployment

TOO_BIG = MAX_INT + 1
# The API's own pages, not routes: its root (a 404 naming the docs) and the document and docs.
NOT_ROUTES = {"api-root", "openapi-json", "openapi-view"}


def login(client, user):
    assert client.post("/login/", {"username": user.username, "password": user.plain_password}).status_code == 302


def api_patterns(patterns=None, prefix="", namespace=None):
    """(route, namespace, url name) of every URL pattern under /api/, from Django's resolver."""
    for p in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(p.pattern)
        if isinstance(p, URLResolver):
            if route.startswith("api/") or "api/".startswith(route) or not route:
                yield from api_patterns(p.url_patterns, route, p.namespace or namespace)
        elif isinstance(p, URLPattern) and route.startswith("api/"):
            yield route, namespace, p.name


def test_every_api_url_is_a_ninja_route_listed_in_the_document(client, viewer):
    login(client, viewer)
    document = client.get("/api/openapi.json")
    assert document.status_code == 200
    paths = document.json()["paths"]
    found = list(api_patterns())
    routes = [(route, name) for route, namespace, name in found if name not in NOT_ROUTES]
    assert len(routes) > 20
    for route, namespace, name in found:
        assert namespace == "api", f"/{route} ({name}) is a plain Django view: declare it on dashboard.api.api"
    for route, name in routes:
        openapi_path = "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)
        assert openapi_path in paths, f"{openapi_path} ({name}) is not in the OpenAPI document"
    # Every route says what it answers, refusals included.
    for path, operations in paths.items():
        for method, operation in operations.items():
            assert operation["responses"], f"{method.upper()} {path} declares no response"


def test_the_document_and_its_page_need_a_session(client, db):
    document = client.get("/api/openapi.json")
    assert document.status_code == 401 and document.json()["error"]["code"] == "not_authenticated"
    page = client.get("/api/docs")
    assert page.status_code == 302 and page.url == "/login/?next=/api/docs"


def test_the_docs_page_works_offline(client, viewer):
    login(client, viewer)
    page = client.get("/api/docs")
    assert page.status_code == 200
    html = page.content.decode()
    assert "/static/ninja/swagger-ui-bundle.js" in html and "/static/ninja/swagger-ui.css" in html
    assert "https://" not in html and "http://" not in html  # no CDN: the panels often have no internet
    assert finders.find("ninja/swagger-ui-bundle.js") and finders.find("ninja/swagger-ui-init.js")
    assert "/api/openapi.json" in html


@pytest.fixture
def ready(db):
    return Deployment.objects.create(name="d", host="testhost", status="ready", port=9, engine_name="vllm")


def refused(response, field, status=400):
    """The response is the API's refusal naming `field`."""
    assert response.status_code == status, (field, response.status_code, response.content)
    error = response.json()["error"]
    assert field in error.get("fields", {}), (field, error)
    assert error["message"].startswith(f"{field}:") or f"; {field}:" in error["message"], error
    return error


def post(client, url, body):
    return client.post(url, body if isinstance(body, str) else json.dumps(body), content_type="application/json")


def test_bad_benchmark_starts_are_400_naming_the_field(client, operator, ready):
    login(client, operator)
    url = "/api/benchmarks/"
    dep = ready.pk
    cases = [
        ({}, "deployment"),                                             # missing
        ({"scenario": "decode-single-stream"}, "deployment"),
        ({"deployment": "three"}, "deployment"),                        # wrong types
        ({"deployment": [dep]}, "deployment"),
        ({"deployment": dep, "num_prompts": "many"}, "num_prompts"),
        ({"deployment": dep, "num_prompts": 2.5}, "num_prompts"),
        ({"deployment": dep, "num_prompts": True}, "num_prompts"),
        ({"deployment": dep, "label": 5}, "label"),
        ({"deployment": dep, "scenario": {"name": "x"}}, "scenario"),
        ({"deployment": dep, "sweep": {"levels": 1}}, "sweep"),
        ({"deployment": dep, "sweep": [1, True]}, "sweep"),
        ({"deployment": dep, "label": "a\x00b"}, "label"),              # NUL
        ({"deployment": dep, "scenario": "decode\x00"}, "scenario"),
        ({"deployment": TOO_BIG}, "deployment"),                        # too large for the database
        ({"deployment": 0}, "deployment"),
        ({"deployment": dep, "num_prompts": 0}, "num_prompts"),          # out of range
        ({"deployment": dep, "concurrency": 5000}, "concurrency"),
        ({"deployment": dep, "prompt_tokens": TOO_BIG}, "prompt_tokens"),
        ({"deployment": dep, "sweep": "0,2"}, "sweep"),
        ({"deployment": dep, "sweep": "1,x"}, "sweep"),
    ]
    for body, field in cases:
        refused(post(client, url, body), field)
    for text, field in (('{"deployment": Infinity}', "deployment"), ('{"deployment": 1e400}', "deployment"),
                        (f'{{"deployment": {dep}, "num_prompts": 1e400}}', "num_prompts"),
                        (f'{{"deployment": {dep}, "output_tokens": NaN}}', "output_tokens")):
        refused(post(client, url, text), field)
    assert "must be between 1 and 10000, not 0" in post(client, url, {"deployment": dep, "num_prompts": 0}) \
        .json()["error"]["message"]
    assert "between 1 and 4096" in post(client, url, {"deployment": dep, "sweep": [0]}).json()["error"]["message"]
    for text in ("[1, 2]", "5", '"deployment"', "null", "{", "", "\x00"):  # not a JSON object
        response = post(client, url, text)
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid", text
    # A form post is read too; its empty fields mean "the preset's value".
    form = client.post(url, {"deployment": "x", "num_prompts": ""})
    refused(form, "deployment")
    # A valid id that names nothing is a 404.
    missing = post(client, url, {"deployment": MAX_INT, "scenario": "decode-single-stream"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert not BenchmarkRun.objects.exists()


def test_bad_ids_in_paths_and_queries_are_400_unknown_ones_404(client, operator, db):
    run = BenchmarkRun.objects.create(scenario="decode-single-stream", status="succeeded")
    login(client, operator)
    for url in (f"/api/benchmarks/{TOO_BIG}", f"/api/benchmarks/{TOO_BIG}/export", "/api/benchmarks/0",
                "/api/benchmarks/x1/export", f"/api/jobs/{TOO_BIG}", "/api/jobs/-1"):
        refused(client.get(url), "job_id" if "/jobs/" in url else "run_id")
    refused(client.post(f"/api/benchmarks/{TOO_BIG}/cancel"), "run_id")
    for url in (f"/api/benchmarks/{MAX_INT}", f"/api/benchmarks/{MAX_INT}/export", f"/api/jobs/{MAX_INT}"):
        response = client.get(url)
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found", url
    assert client.post(f"/api/benchmarks/{MAX_INT}/cancel").status_code == 404
    for query, field in ((f"ids={run.pk},x", "ids.1"), (f"ids={run.pk},{TOO_BIG}", "ids.1"),
                         (f"ids={run.pk},{run.pk}&baseline=first", "baseline"),
                         (f"ids={run.pk},{run.pk}&bandwidth=inf", "bandwidth"),
                         (f"ids={run.pk},{run.pk}&bandwidth=1e400", "bandwidth"),
                         (f"ids={run.pk},{run.pk}&bandwidth=-5", "bandwidth")):
        refused(client.get(f"/api/benchmarks/compare?{query}"), field)
    missing = client.get(f"/api/benchmarks/compare?ids={run.pk},{MAX_INT}")
    assert missing.status_code == 404, missing.content
    assert f"No benchmark run #{MAX_INT}" in missing.json()["error"]["message"]
    refused(client.get("/api/benchmarks/?model=a%00b"), "model")
    refused(client.get("/api/status?workers=maybe"), "workers")
    assert BenchmarkRun.objects.get(pk=run.pk).status == "succeeded" and not Job.objects.exists()


def test_bad_imports_are_400_and_write_nothing(client, operator, db):
    from django.core.files.uploadedfile import SimpleUploadedFile

    login(client, operator)
    saved = json.dumps({"completed": 1, "request_throughput": 1.0, "model_id": "m"})
    refused(client.post("/api/benchmarks/import?name=a%00b", saved, content_type="application/json"), "name")
    upload = SimpleUploadedFile("r.json", saved.encode())
    refused(client.post("/api/benchmarks/import", {"file": upload, "label": "x\x00"}), "label")
    no_file = client.post("/api/benchmarks/import", {"label": "x"})
    assert no_file.status_code == 400 and "file" in no_file.json()["error"]["fields"]
    assert not BenchmarkRun.objects.exists()


def test_a_result_larger_than_a_request_body_imports_as_an_upload(client, operator, settings):
    """Files stream; only a raw body has to fit in DATA_UPLOAD_MAX_MEMORY_SIZE (then a 400 that says so)."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    login(client, operator)
    saved = json.dumps({"completed": 1, "request_throughput": 1.0, "model_id": "m", "ttfts": [0.125] * 2000})
    assert len(saved) > 4096
    response = client.post("/api/benchmarks/import", {"file": SimpleUploadedFile("big.json", saved.encode())})
    assert response.status_code == 201, response.content
    as_body = client.post("/api/benchmarks/import?name=big.json", saved, content_type="application/json")
    assert as_body.status_code == 400 and as_body.json()["error"]["code"] == "too_large"
    assert BenchmarkRun.objects.count() == 1


def test_a_method_a_route_does_not_take_is_a_json_405_naming_the_allowed_ones(client, operator):
    login(client, operator)
    for method, path in (("put", "/api/models/"), ("delete", "/api/status"), ("get", "/api/models/import")):
        response = getattr(client, method)(path)
        assert response.status_code == 405, path
        error = response.json()["error"]
        assert error["code"] == "method_not_allowed"
        assert method.upper() in error["message"] and response["Allow"] in error["message"]


def test_a_body_too_large_for_memory_is_a_json_413(client, operator, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    login(client, operator)
    response = client.post("/api/models/", json.dumps({"repo_id": "x" * 2000}), content_type="application/json")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "too_large"


def test_a_change_without_the_csrf_token_is_a_json_403_that_says_so(operator):
    from django.test import Client

    c = Client(enforce_csrf_checks=True)
    c.force_login(operator)
    response = c.post("/api/models/import", json.dumps({"path": "/x"}), content_type="application/json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "csrf_failed"


def test_the_preflight_override_takes_json_true_only(client, operator, db):
    login(client, operator)
    for value in ("on", "true", 1, "yes"):
        response = client.post("/api/deployments/", json.dumps({"preset": "gemma3-270m-demo-cpu", "override": value}),
                               content_type="application/json")
        assert response.status_code == 400, value
        assert "override" in response.json()["error"]["fields"]
    assert not Deployment.objects.exists()
