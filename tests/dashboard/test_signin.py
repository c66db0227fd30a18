"""Sign-in: the throttle of failed sign-ins, password rules, idle expiry, ending sessions."""
import datetime
import re

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.test import Client, RequestFactory
from django.utils import timezone

from dashboard import signin
from tests.helpers import free_port, wait_until


def sign_in(client, username, password, address="127.0.0.1"):
    return client.post("/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def signed_in(client):
    return client.get("/").status_code == 200


@pytest.fixture
def throttle(redis_clean, settings):
    """A clean Redis for the counts; small limits so that a test needs few slow password checks."""
    settings.LOGIN_FAILURES_PER_ACCOUNT = 5
    settings.LOGIN_FAILURES_PER_ADDRESS = 20
    settings.LOGIN_COOLOFF_S = 300
    yield settings
    # Other tests sign in from 127.0.0.1 too: leave no count behind.
    signin._redis().flushall()


def retry_after(response):
    return int(re.search(r"Try again in (\d+) s", response.content.decode()).group(1))


def test_five_failures_throttle_the_account_with_the_seconds_to_wait(client, operator, throttle):
    for _ in range(4):
        response = sign_in(client, operator.username, "not-the-password")
        assert response.status_code == 200
        assert "did not match" in response.content.decode()
    response = sign_in(client, operator.username, "still-not-it")
    assert response.status_code == 429
    assert "Too many failed sign-ins for this account" in response.content.decode()
    from dashboard.models import AuditEntry

    rows = AuditEntry.objects.count()
    for _ in range(5):  # refused without a password check: no new rows, however many
        assert sign_in(client, operator.username, "flood").status_code == 429
    assert AuditEntry.objects.count() == rows
    assert 295 <= retry_after(response) <= 300
    assert response["Retry-After"] == str(retry_after(response))

    # The right password is refused as well while the account cools off ...
    response = sign_in(client, operator.username, operator.plain_password)
    assert response.status_code == 429 and "Try again in" in response.content.decode()
    assert not signed_in(client)
    # ... whatever the case of the name ...
    response = sign_in(Client(), operator.username.upper(), operator.plain_password)
    assert response.status_code == 429
    # ... but only from the address that failed: nobody elsewhere can lock the owner out.
    elsewhere = Client()
    response = sign_in(elsewhere, operator.username, operator.plain_password, address="10.9.9.9")
    assert response.status_code == 302 and signed_in(elsewhere)


def test_after_the_cool_off_the_owner_signs_in(client, operator, throttle):
    throttle.LOGIN_COOLOFF_S = 2
    for _ in range(5):
        sign_in(client, operator.username, "not-the-password")
    response = sign_in(client, operator.username, operator.plain_password)
    assert response.status_code == 429
    assert 1 <= retry_after(response) <= 2
    # Attempts refused during the cool-off do not extend it.
    wait_until(lambda: sign_in(client, operator.username, operator.plain_password).status_code == 302, 5,
               "the account was still throttled after its cool-off")
    assert signed_in(client)


def test_a_success_clears_the_account_count(client, operator, throttle):
    for _ in range(4):
        sign_in(client, operator.username, "not-the-password")
    assert sign_in(client, operator.username, operator.plain_password).status_code == 302
    client.post("/logout/")
    assert sign_in(client, operator.username, "not-the-password").status_code == 200


def test_one_address_trying_many_names_is_throttled(client, operator, throttle):
    throttle.LOGIN_FAILURES_PER_ADDRESS = 4
    for name in ["alice", "bob", "carol"]:
        assert sign_in(client, name, "guess-guess", address="10.0.0.7").status_code == 200
    response = sign_in(client, "dave", "guess-guess", address="10.0.0.7")
    assert response.status_code == 429
    assert "Too many failed sign-ins from your address" in response.content.decode()
    # Even the right password of an account never tried, from that address ...
    assert sign_in(client, operator.username, operator.plain_password, address="10.0.0.7").status_code == 429
    # ... while the same account signs in from elsewhere.
    other = Client()
    assert sign_in(other, operator.username, operator.plain_password, address="10.0.0.8").status_code == 302
    assert signed_in(other)


def test_the_count_is_shared_by_every_web_worker(client, operator, throttle, asgi_server):
    """Failures counted by this process throttle the same account on a separate uvicorn process."""
    for _ in range(5):
        sign_in(client, operator.username, "not-the-password")
    with httpx.Client(base_url=asgi_server) as browser:
        browser.get("/login/")
        response = browser.post("/login/", data={"username": operator.username, "password": operator.plain_password,
                                                 "csrfmiddlewaretoken": browser.cookies["csrftoken"]})
        assert response.status_code == 429
        assert "Try again in" in response.text
        assert 0 < int(response.headers["Retry-After"]) <= 300


def test_sign_in_goes_on_when_redis_is_down(client, operator, monkeypatch):
    import redis

    monkeypatch.setattr(signin, "_redis", lambda: redis.Redis(port=free_port(), socket_connect_timeout=1))
    assert sign_in(client, operator.username, "not-the-password").status_code == 200
    assert sign_in(client, operator.username, operator.plain_password).status_code == 302


def test_client_address_is_remote_addr_unless_the_proxy_is_trusted(settings):
    request = RequestFactory().get("/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="6.6.6.6, 192.0.2.4")
    settings.TRUSTED_PROXIES = []
    assert signin.client_address(request) == "10.0.0.1"
    settings.TRUSTED_PROXIES = ["10.0.0.1"]
    assert signin.client_address(request) == "192.0.2.4"  # the hop the proxy saw, not what the client claims


# Password rules


def test_password_like_the_username_or_all_digits_is_refused(client, viewer):
    sign_in(client, viewer.username, viewer.plain_password)
    page = client.get("/password/").content.decode()
    assert "entirely numeric" in page and "similar to your other personal information" in page

    for new, reason in [("victor2026", "too similar to the username"), ("4815162342", "entirely numeric")]:
        response = client.post("/password/", {"old_password": viewer.plain_password,
                                              "new_password1": new, "new_password2": new})
        assert response.status_code == 200
        assert reason in response.content.decode()
        viewer.refresh_from_db()
        assert viewer.check_password(viewer.plain_password)


def test_the_one_time_password_step_shows_the_rules_messages(client, operator):
    sign_in(client, operator.username, operator.plain_password)
    one_time = client.post("/users/new", {"username": "victoria", "role": "viewer"}).context["password"]
    newcomer = Client()
    sign_in(newcomer, "victoria", one_time)
    assert newcomer.get("/").url == "/password/"
    response = newcomer.post("/password/", {"old_password": one_time,
                                            "new_password1": "victoria99", "new_password2": "victoria99"})
    assert "too similar to the username" in response.content.decode()
    assert newcomer.get("/").url == "/password/"


# Idle expiry


def session_row(client):
    return Session.objects.get(session_key=client.session.session_key)


def test_a_session_ends_after_the_idle_timeout_and_activity_extends_it(client, operator, settings):
    sign_in(client, operator.username, operator.plain_password)
    age = settings.SESSION_COOKIE_AGE
    assert settings.SESSION_SAVE_EVERY_REQUEST and age == settings.SESSION_IDLE_TIMEOUT
    written = session_row(client).expire_date

    # A request within a minute of the last write leaves the row alone (the cost of idle expiry).
    assert signed_in(client)
    assert session_row(client).expire_date == written

    # Last written two minutes ago: a request moves the expiry to a full timeout from now.
    Session.objects.filter(pk=client.session.session_key).update(
        expire_date=timezone.now() + datetime.timedelta(seconds=age - 120))
    assert signed_in(client)
    left = (session_row(client).expire_date - timezone.now()).total_seconds()
    assert age - 5 < left <= age

    # Idle past the timeout: the next request goes to the sign-in page.
    Session.objects.filter(pk=client.session.session_key).update(
        expire_date=timezone.now() - datetime.timedelta(seconds=1))
    response = client.get("/")
    assert response.status_code == 302 and response.url.startswith("/login/")


# Ending sessions


def test_operator_ends_a_users_sessions(client, operator, viewer):
    laptop, phone = Client(), Client()
    sign_in(laptop, viewer.username, viewer.plain_password)
    sign_in(phone, viewer.username, viewer.plain_password)
    sign_in(client, operator.username, operator.plain_password)

    page = client.get("/users/").content.decode()
    assert "2 sessions" in page and f"/users/{viewer.pk}/end-sessions" in page
    assert client.get(f"/users/{viewer.pk}/end-sessions").status_code == 405  # nothing is ended on a GET
    assert signed_in(laptop) and signed_in(phone)

    response = client.post(f"/users/{viewer.pk}/end-sessions", follow=True)
    assert "Ended 2 sessions of victor." in response.content.decode()
    for browser in (laptop, phone):
        response = browser.get("/")
        assert response.status_code == 302 and response.url.startswith("/login/")
    assert signed_in(client)


def test_an_operator_ending_their_own_sessions_keeps_this_one(client, operator):
    elsewhere = Client()
    sign_in(elsewhere, operator.username, operator.plain_password)
    sign_in(client, operator.username, operator.plain_password)
    response = client.post(f"/users/{operator.pk}/end-sessions", follow=True)
    assert "Ended 1 session of olga." in response.content.decode()
    assert signed_in(client) and not signed_in(elsewhere)


def test_a_viewer_cannot_end_sessions(client, operator, viewer):
    sign_in(client, viewer.username, viewer.plain_password)
    other = Client()
    sign_in(other, operator.username, operator.plain_password)
    assert "end-sessions" not in client.get("/users/").content.decode()
    response = client.post(f"/users/{operator.pk}/end-sessions")
    assert response.status_code == 403 and "operator role" in response.content.decode()
    assert signed_in(other)


def test_resetting_a_password_ends_that_users_sessions(client, operator, viewer):
    away = Client()
    sign_in(away, viewer.username, viewer.plain_password)
    sign_in(client, operator.username, operator.plain_password)
    client.post(f"/users/{viewer.pk}/reset-password")
    assert not signed_in(away)
    assert get_user_model().objects.get(pk=viewer.pk).account.must_change_password
    assert not [s for s in Session.objects.all() if s.get_decoded().get("_auth_user_id") == str(viewer.pk)]


def test_a_disabled_user_is_signed_out_cannot_sign_in_and_their_keys_stop_until_enabled(
        transactional_db, client, operator, viewer, redis_clean):
    # transactional: the gateway's async views read the key on another thread's connection
    from inference.gateway import keys

    key, secret = keys.key_create(user=viewer, name="script")
    laptop = Client()
    sign_in(laptop, viewer.username, viewer.plain_password)
    sign_in(client, operator.username, operator.plain_password)

    assert Client().get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 200  # cached now
    response = client.post(f"/users/{viewer.pk}/active", follow=True)
    assert "victor is disabled and signed out." in response.content.decode() and "disabled" in response.content.decode()
    viewer.refresh_from_db()
    assert viewer.is_active is False
    assert laptop.get("/").status_code == 302  # signed out
    again = Client()
    sign_in(again, viewer.username, viewer.plain_password)
    assert not signed_in(again)
    refused = Client().get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert refused.status_code == 401

    assert "cannot disable your own account" in client.post(f"/users/{operator.pk}/active", follow=True).content.decode()
    operator.refresh_from_db()
    assert operator.is_active

    client.post(f"/users/{viewer.pk}/active", {"active": "on"})
    viewer.refresh_from_db()
    assert viewer.is_active is True
    assert Client().get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 200


def test_a_viewer_cannot_disable_anyone(client, operator, viewer):
    sign_in(client, viewer.username, viewer.plain_password)
    assert client.post(f"/users/{operator.pk}/active").status_code == 403
    operator.refresh_from_db()
    assert operator.is_active
