"""Every route of /api/ fuzzed from its OpenAPI document, as a signed-in operator.

Schemathesis reads the OpenAPI document (the one /api/openapi.json serves to a
signed-in user) and sends each operation valid and invalid input -- wrong types,
missing fields, numbers past 64 bits, NUL bytes, odd strings in paths and
queries -- through the real WSGI stack (middleware, session cookie, CSRF token).
Every answer must be no 5xx, a status code and content type the document lists,
and a body that fits the document's schema for that status.

Nothing fuzzed may reach the network or start work: hubs are answered "not
reachable" (as a hub behind a firewall would), and jobs are queued to nowhere
(`dashboard.jobs.send`), so a download, an import, a launch, a benchmark or a
runtime check is written as a row and left there. No operation is excluded;
what those rows would do when run is tested by each area's own tests.

The run is bounded (a fixed number of examples per operation, derandomized) so
that it takes about a minute on a slow machine and fails the same way every time.
"""
from __future__ import annotations

import json
import secrets

import hypothesis
import pytest
import schemathesis
from django.conf import settings
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import Client
from hypothesis import HealthCheck
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                               status_code_conformance)

from dashboard.wsgi import application

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = 15  # per operation, per generation mode; the coverage phase adds its boundary cases


@pytest.fixture
def rows(operator, tmp_path):
    """One row of each kind with id 1 (the smallest id the document allows, which the fuzzer
    always tries), so that fuzzed ids also reach routes past their 404."""
    from dashboard.models import Job
    from inference.models import BenchmarkRun, Deployment, EngineRuntime, LaunchProfile, ModelArtifact

    log = tmp_path / "engine.log"
    log.write_text("".join(f"line {i}\n" for i in range(20)))
    runtime = EngineRuntime.objects.create(pk=1, host=settings.HOST_NAME, name="llama", engine="llamacpp",
                                           kind="executable", path=str(tmp_path / "llama-server"))
    profile = LaunchProfile.objects.create(pk=1, name="demo", host=settings.HOST_NAME, runtime=runtime,
                                           model_path=str(tmp_path / "m.gguf"), served_model_name="demo")
    deployment = Deployment.objects.create(pk=1, name="demo", host=settings.HOST_NAME, profile=profile,
                                           engine_name="llamacpp", status="ready", port=1, log_path=str(log),
                                           served_model_name="demo")
    ModelArtifact.objects.create(pk=1, name="demo", source="local", host=settings.HOST_NAME, path=str(tmp_path),
                                 folder=str(tmp_path), status="ready", job="import")
    step = {"output_throughput": 12.5, "median_ttft_ms": 40.0, "median_tpot_ms": 8.0, "max_concurrency": 1,
            "completed": 8, "failed": 0}
    BenchmarkRun.objects.create(pk=1, deployment=deployment, scenario="decode", label="seeded", status="succeeded",
                                result=[step], model_name="demo", engine="llamacpp")
    Job.objects.create(pk=1, kind="worker-check", status="succeeded", created_by=operator)
    # An explicit id does not move PostgreSQL's sequence (SQLite takes the highest id + 1): without
    # this the first row a fuzzed call creates would be given id 1 again, an IntegrityError.
    from django.core.management.color import no_style
    from django.db import connection

    with connection.cursor() as cursor:
        for sql in connection.ops.sequence_reset_sql(
                no_style(), [EngineRuntime, LaunchProfile, Deployment, ModelArtifact, BenchmarkRun, Job]):
            cursor.execute(sql)


@pytest.fixture
def signed_in(operator, rows, redis_clean, monkeypatch):
    """The operator's session cookie and CSRF token; hubs unreachable, jobs queued to nowhere."""
    from dashboard import jobs
    from dashboard.celery import app as celery_app
    from inference.library.hubs import huggingface, modelscope
    from inference.library.hubs.base import HubError

    def unreachable(client, url, *, hub, **kwargs):
        raise HubError(f"The hub at {url} is not reachable from this test.", hub=hub, code="Unavailable")

    for module in (huggingface, modelscope):
        monkeypatch.setattr(module, "get_with_retries", unreachable)
    monkeypatch.setattr(jobs, "send", lambda task, row_id, **kwargs: True)
    monkeypatch.setattr(celery_app.control, "ping", lambda timeout=1.0: [])

    # The WSGI app runs in this thread, on the test's database transaction: like Django's
    # test client, keep a finished request from closing that connection.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        client = Client()
        client.force_login(operator)
        token = secrets.token_hex(16)  # 32 characters: a CSRF secret Django accepts as cookie and header alike
        yield {"cookies": {"sessionid": client.cookies["sessionid"].value, "csrftoken": token},
               "headers": {"X-CSRFToken": token}}
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def openapi_document() -> dict:
    """The document /api/openapi.json serves (built here, at collection, so that each
    operation is a test of its own; the first test checks it is the one served)."""
    from django.urls import get_resolver

    from dashboard.api import api

    get_resolver().url_patterns  # noqa: B018 -- loading the URLconf adds every area's router to the API
    return json.loads(json.dumps(api.get_openapi_schema(path_prefix="/api/")))


schema = schemathesis.openapi.from_dict(openapi_document())


def test_the_fuzzed_document_is_the_one_served(signed_in):
    client = Client()
    client.cookies.load(signed_in["cookies"])
    response = client.get("/api/openapi.json")
    assert response.status_code == 200, response.content
    assert response.json() == schema.raw_schema


@schema.parametrize()
@hypothesis.settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                     suppress_health_check=list(HealthCheck))
def test_no_input_gets_a_server_error_or_an_answer_outside_the_document(case, signed_in):
    case.call_and_validate(checks=CHECKS, app=application, **signed_in)
