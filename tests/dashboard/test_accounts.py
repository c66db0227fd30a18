import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from dashboard.models import Job
from dashboard.roles import is_operator


def login(client, user):
    return client.post("/login/", {"username": user.username, "password": user.plain_password})


def test_every_page_needs_a_signed_in_user(client, db):
    for path in ["/", "/models/", "/deployments/", "/monitoring/", "/benchmarks/", "/users/"]:
        response = client.get(path)
        assert response.status_code == 302, path
        assert response.url.startswith("/login/?next=")


def test_api_answers_401_json_to_anonymous_callers(client, db):
    response = client.get("/api/status")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
    assert client.post("/api/jobs/worker-check").status_code == 401


def test_healthz_is_open(client, db):
    assert client.get("/healthz").json() == {"ok": True}


def test_wrong_password_gets_a_clear_message(client, operator):
    response = client.post("/login/", {"username": operator.username, "password": "not-the-password"})
    assert response.status_code == 200
    assert "did not match" in response.content.decode()
    assert client.get("/").status_code == 302


def test_operator_signs_in_and_sees_the_overview(client, operator):
    response = login(client, operator)
    assert response.status_code == 302 and response.url == "/"
    page = client.get("/").content.decode()
    for section in ["Models", "Deployments", "Monitoring", "Benchmarks"]:
        assert section in page
    assert "Run a worker check" in page


def test_viewer_sees_pages_but_gets_403_on_operator_actions(client, viewer):
    login(client, viewer)
    page = client.get("/").content.decode()
    assert "Run a worker check" not in page
    response = client.post("/api/jobs/worker-check")
    assert response.status_code == 403
    assert "operator role" in response.json()["error"]["message"]
    response = client.post("/users/new", {"username": "mallory", "role": "operator"})
    assert response.status_code == 403
    assert "operator role" in response.content.decode()
    assert not get_user_model().objects.filter(username="mallory").exists()
    assert Job.objects.count() == 0


def test_operator_creates_a_viewer_with_a_one_time_password(client, operator):
    login(client, operator)
    response = client.post("/users/new", {"username": "vera", "role": "viewer"})
    assert response.status_code == 200
    password = response.context["password"]
    vera = get_user_model().objects.get(username="vera")
    assert not is_operator(vera)
    assert vera.check_password(password)

    # Vera must choose her own password before she can do anything else.
    other = client.__class__()
    other.post("/login/", {"username": "vera", "password": password})
    response = other.get("/")
    assert response.status_code == 302 and response.url == "/password/"
    assert other.get("/api/status").status_code == 403
    other.post("/password/", {"old_password": password, "new_password1": "kiln-vera-2026", "new_password2": "kiln-vera-2026"})
    assert other.get("/").status_code == 200


def test_duplicate_username_is_refused_with_the_reason(client, operator):
    login(client, operator)
    response = client.post("/users/new", {"username": "OLGA", "role": "viewer"})
    assert response.status_code == 400
    assert "already exists" in response.content.decode()


def test_operator_cannot_demote_themself(client, operator):
    login(client, operator)
    response = client.post(f"/users/{operator.pk}/role", {"role": "viewer"}, follow=True)
    assert "cannot take the operator role from yourself" in response.content.decode()
    assert is_operator(operator)


def test_createoperator_prints_a_one_time_password(db, capsys):
    call_command("createoperator", "root2")
    out = capsys.readouterr().out
    password = out.split("one-time password ")[1].split()[0]
    user = get_user_model().objects.get(username="root2")
    assert user.check_password(password) and is_operator(user)
    assert user.account.must_change_password


def test_createoperator_refuses_an_existing_name_without_reset(operator):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="already exists"):
        call_command("createoperator", operator.username)


def test_unknown_page_is_a_plain_404(client, operator):
    login(client, operator)
    response = client.get("/no/such/page")
    assert response.status_code == 404
    assert "Nothing lives at /no/such/page" in response.content.decode()
