"""An address with a NUL character (%00 in the path or a query parameter) is a 400 naming
where it is, on every page, the API and /v1/, before a view or the session reads the
database with it: PostgreSQL refuses NUL in text even in a lookup (a 500 there), SQLite
takes it. A session cookie with a NUL is no session (the caller is signed out)."""
import httpx
import pytest
from django.test import Client

from inference.gateway import keys
from inference.models import Batch, BatchFile

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("address, where", [
    ("/batches/batch_%00/", "The address"),
    ("/benchmarks/?model=%00", "The query parameter model"),
    ("/batches/?q=a%00b", "The query parameter q"),
    ("/monitoring/history?x%00=1", "The query parameter x%00"),
    ("/users/?page=%00", "The query parameter page"),
])
def test_a_page_with_nul_in_its_address_is_a_400_page_naming_where(operator_page_client, address, where):
    answer = operator_page_client.get(address)
    assert answer.status_code == 400, answer.content[:300]
    text = answer.content.decode()
    assert where in text and "must not contain a NUL character (%00)" in text
    assert answer["Content-Type"].startswith("text/html")


def test_the_api_and_v1_answer_in_their_own_error_shapes(operator_page_client, redis_clean):
    answer = operator_page_client.get("/api/benchmarks/?model=%00")  # the API's own check, naming the field
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid" and "model" in answer.json()["error"]["fields"]
    for address in ("/v1/files?after=%00", "/v1/batches?after=x%00", "/v1/files/file-%00", "/v1/batches/b%00"):
        answer = operator_page_client.get(address)
        assert answer.status_code == 400, (address, answer.content)
        assert answer.json()["error"]["type"] == "invalid_request_error", address
        assert "NUL character (%00)" in answer.json()["error"]["message"], address


def test_an_address_without_nul_is_served_as_before(operator_page_client):
    assert operator_page_client.get("/batches/?q=100%25").status_code == 200
    assert operator_page_client.get("/benchmarks/?model=a%2500").status_code == 200  # "%00" as text, no NUL


def test_a_session_cookie_with_nul_is_no_session(transactional_db):
    c = Client(raise_request_exception=False)
    c.cookies["sessionid"] = "abcdefgh\x00ijklmnop"  # sent as "abcdefgh\000ijklmnop", read back with the NUL
    answer = c.get("/models/")
    assert answer.status_code == 302 and answer["Location"].startswith("/login/")


def test_the_gateway_door_of_the_real_server_refuses_nul_too(asgi_server, operator):
    """Under uvicorn /v1/ skips the page middleware (inference/gateway/asgi.py): checked there."""
    _, secret = keys.key_create(user=operator, name="nul", rate_limit=0)
    bearer = {"Authorization": f"Bearer {secret}"}
    for method, address in (("GET", "/v1/files?purpose=batch%00"), ("GET", "/v1/files/file-%00/content"),
                            ("POST", "/v1/batches/batch_%00/cancel"), ("GET", "/v1/batches?after=%00")):
        answer = httpx.request(method, asgi_server + address, headers=bearer, timeout=10)
        assert answer.status_code == 400, (address, answer.text)
        assert answer.json()["error"]["code"] == "invalid_request", address
        assert "NUL character (%00)" in answer.json()["error"]["message"], address
    answer = httpx.get(asgi_server + "/v1/files?purpose=batch", headers=bearer, timeout=10)
    assert answer.status_code == 200 and answer.json()["data"] == []
    page = httpx.get(asgi_server + "/batches/b%00/", timeout=10)
    assert page.status_code == 400 and "The address must not contain a NUL character" in page.text
    assert not Batch.objects.exists() and not BatchFile.objects.exists()
