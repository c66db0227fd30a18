"""Bad input to the model library's API is a 400 naming the field (a 404 for an id that is
just unknown), never a 500, and nothing is written or fetched."""
import json

import pytest
from django.test import Client

from dashboard.api import MAX_INT
from inference.models import ModelArtifact

TOO_BIG = MAX_INT + 1


@pytest.fixture
def api(operator, monkeypatch):
    """The operator's client; any call to a hub fails the test (a refusal must come first)."""
    from inference.library import services

    def no_hub(*args, **kwargs):
        raise AssertionError("a refused request reached a hub")

    monkeypatch.setattr(services, "hub_for", no_hub)
    c = Client()
    c.force_login(operator)
    return c


def post(client, url, body):
    """Post a JSON text as it is (so that Infinity and non-objects reach the server)."""
    return client.post(url, body if isinstance(body, str) else json.dumps(body), content_type="application/json")


def refused(response, field):
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid", error
    assert field in error["fields"] and field in error["message"], error


@pytest.mark.parametrize("url", ["/api/models/", "/api/models/preview"])
@pytest.mark.parametrize("body, field", [
    ({"repo_id": 5}, "repo_id"),
    ({"repo_id": ["org/model"]}, "repo_id"),
    ({"repo_id": "org/model\x00"}, "repo_id"),
    ('{"repo_id": Infinity}', "repo_id"),
    ({"repo_id": "org/" + "m" * 300}, "repo_id"),
    ({"repo_id": "org/model", "revision": 1}, "revision"),
    ({"repo_id": "org/model", "include": [5]}, "include"),
    ({"repo_id": "org/model", "exclude": {"*.bin": True}}, "exclude"),
    ({"repo_id": "org/model", "endpoint": "https://hf-mirror.com\x00"}, "endpoint"),
    ({"repo_id": "org/model", "token": 12345}, "token"),
    ({"repo_id": "org/model", "hub": True}, "hub"),
])
def test_a_download_or_preview_with_a_wrong_value_is_a_400_naming_the_field(api, url, body, field):
    refused(post(api, url, body), field)
    assert not ModelArtifact.objects.exists()


@pytest.mark.parametrize("body, field", [
    ({"path": ["/"]}, "path"),
    ({"path": {"folder": "/srv/models"}}, "path"),
    ({"path": 5}, "path"),
    ({"path": "/srv/models\x00/etc/passwd"}, "path"),
    ({"path": "/" + "a" * 1000}, "path"),
    ({"path": "/srv/models", "name": ["x"]}, "name"),
    ({"path": "/srv/models", "name": "x\x00"}, "name"),
])
def test_an_import_with_a_wrong_value_is_a_400_naming_the_field(api, body, field):
    refused(post(api, "/api/models/import", body), field)
    assert not ModelArtifact.objects.exists()


def test_a_body_that_is_not_a_json_object_is_a_400(api, db):
    for url in ("/api/models/", "/api/models/preview", "/api/models/import"):
        for body in ("[1]", '"org/model"', "null", "{nope", "7"):
            r = post(api, url, body)
            assert r.status_code == 400 and r.json()["error"]["code"] == "bad_json", (url, body, r.content)
    assert not ModelArtifact.objects.exists()


@pytest.mark.parametrize("method, suffix", [("get", ""), ("delete", ""), ("post", "/delete"), ("post", "/cancel"),
                                            ("post", "/resume"), ("post", "/reverify")])
def test_model_ids_beyond_the_database_are_a_400_and_unknown_ones_a_404(api, db, method, suffix):
    for bad in (TOO_BIG, 10**30, 0, "x"):
        refused(getattr(api, method)(f"/api/models/{bad}{suffix}"), "artifact_id")
    r = getattr(api, method)(f"/api/models/{MAX_INT}{suffix}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.content


def test_a_resume_token_of_the_wrong_type_is_a_400(api, db):
    artifact = ModelArtifact.objects.create(name="m", source="hf", repo_id="org/m", host="testhost",
                                            path="/nowhere", status="failed")
    refused(post(api, f"/api/models/{artifact.pk}/resume", {"token": ["hf_x"]}), "token")
    refused(post(api, f"/api/models/{artifact.pk}/resume", {"token": "hf_x\x00"}), "token")
    assert ModelArtifact.objects.get(pk=artifact.pk).status == "failed"
