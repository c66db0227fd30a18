"""The alerts pages as a user meets them: operators add channels and rules and send a test; viewers read."""
import pytest
from django.db import connection
from django.test import Client

from monitoring.alerts.models import AlertChannel, AlertDelivery, AlertRule

pytestmark = pytest.mark.django_db


@pytest.fixture
def ops(operator):
    c = Client()
    c.force_login(operator)
    return c


@pytest.fixture
def view(viewer):
    c = Client()
    c.force_login(viewer)
    return c


def add_channel(client, receiver, **extra):
    data = {"name": "ops-feishu", "kind": "feishu", "enabled": "on", "url": receiver.url + "/open-apis/bot/v2/hook/T0K3N",
            "secret": "feishu-secret-abcd", "security": "starttls", "verify": "on"}
    data.update(extra)
    return client.post("/alerts/channels/new", data)


def test_operator_adds_a_channel_and_the_secret_is_never_shown_back(ops, receiver):
    response = add_channel(ops, receiver)
    assert response.status_code == 302
    channel = AlertChannel.objects.get(name="ops-feishu")
    page = ops.get(f"/alerts/channels/{channel.pk}/").content.decode()
    assert "T0K3N" not in page and "feishu-secret" not in page
    assert "•••• abcd" in page  # set, last 4 characters
    listing = ops.get("/alerts/").content.decode()
    assert "T0K3N" not in listing and "ops-feishu" in listing
    # Saving with blank secret fields keeps the stored ones.
    ops.post(f"/alerts/channels/{channel.pk}/", {"name": "ops-feishu", "kind": "feishu", "enabled": "on",
                                                 "url": "", "secret": "", "security": "starttls"})
    channel.refresh_from_db()
    assert channel.url.endswith("T0K3N") and channel.secret == "feishu-secret-abcd"
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM monitoring_alertchannel")
        assert "T0K3N" not in repr(cursor.fetchall())


def test_send_a_test_reaches_the_receiver_and_is_in_the_history(ops, receiver):
    receiver.answer = (200, b'{"code":0,"msg":"success"}')
    add_channel(ops, receiver)
    channel = AlertChannel.objects.get()
    response = ops.post(f"/alerts/channels/{channel.pk}/test", follow=True)
    got = receiver.get()
    assert "Test message from Kiln" in got.json()["content"]["text"]
    assert "Test message sent" in response.content.decode()
    d = AlertDelivery.objects.get()
    assert d.is_test and d.status == "sent" and d.response_code == 200 and d.attempts == 1
    page = ops.get("/alerts/").content.decode()
    assert f'id="delivery-{d.pk}"' in page and "Sent" in page


def test_a_failing_test_says_why(ops, receiver):
    receiver.answer = (200, b'{"code":19021,"msg":"sign match fail"}')
    add_channel(ops, receiver)
    channel = AlertChannel.objects.get()
    page = ops.post(f"/alerts/channels/{channel.pk}/test", follow=True).content.decode()
    assert "failed" in page and "19021" in page
    assert AlertDelivery.objects.get().status == "failed"  # a test is not retried


def test_bad_input_is_named(ops):
    response = ops.post("/alerts/channels/new", {"name": "x", "kind": "dingtalk", "url": "oapi.dingtalk.com/robot"})
    assert response.status_code == 400 and "https://" in response.content.decode()
    response = ops.post("/alerts/channels/new", {"name": "m", "kind": "email", "recipients": "not-an-address"})
    body = response.content.decode()
    assert response.status_code == 400 and "SMTP server" in body and "not-an-address" in body
    response = ops.post("/alerts/rules/new", {"name": "r", "min_severity": "20", "cooldown_s": "99999999",
                                               "quiet_start": "22:00"})
    body = response.content.decode()
    assert response.status_code == 400 and "a week" in body and "both ends" in body
    assert not AlertChannel.objects.exists() and not AlertRule.objects.exists()


def test_operator_adds_a_rule(ops, receiver):
    add_channel(ops, receiver)
    channel = AlertChannel.objects.get()
    response = ops.post("/alerts/rules/new", {"name": "gpu faults", "enabled": "on", "kinds": ["gpu_xid", "gpu_ecc"],
                                              "min_severity": "20", "channels": [channel.pk], "host": "gpu1",
                                              "cooldown_s": "300", "send_resolved": "on",
                                              "quiet_start": "23:00", "quiet_end": "07:00"})
    assert response.status_code == 302
    rule = AlertRule.objects.get()
    assert rule.kinds == ["gpu_xid", "gpu_ecc"] and list(rule.channels.all()) == [channel] and rule.host == "gpu1"
    assert "gpu faults" in ops.get("/alerts/").content.decode()


def test_viewer_reads_but_cannot_change(view, receiver):
    channel = AlertChannel(name="c", kind="webhook")
    channel.url = receiver.url
    channel.save()
    page = view.get("/alerts/").content.decode()
    assert "Send a test" not in page and "Add a channel" not in page
    form = view.get(f"/alerts/channels/{channel.pk}/").content.decode()
    assert "disabled" in form and ">Save<" not in form
    assert view.post(f"/alerts/channels/{channel.pk}/test").status_code == 403
    assert view.post("/alerts/channels/new", {"name": "x", "kind": "wecom", "url": "https://x"}).status_code == 403
    assert receiver.received.empty() and AlertChannel.objects.count() == 1


def test_a_webhook_address_the_sender_cannot_parse_is_a_form_error(ops):
    for url in ("https://hooks.example:abc/T0K3N", "https://hooks.example:99999/T0K3N"):
        response = ops.post("/alerts/channels/new", {"name": "w", "kind": "webhook", "url": url})
        assert response.status_code == 400 and "port number" in response.content.decode(), url
    assert not AlertChannel.objects.exists()


def test_send_a_test_with_an_error_the_sender_does_not_expect_is_a_failure_not_a_500(ops, monkeypatch):
    from monitoring.alerts import channels

    def broken(channel, message):
        raise RuntimeError(f"could not reach {channel.url}")  # a message quoting the token URL

    monkeypatch.setitem(channels.SENDERS, "webhook", broken)
    channel = AlertChannel(name="w", kind="webhook")
    channel.url = "https://hooks.example/T0K3N"
    channel.save()
    response = ops.post(f"/alerts/channels/{channel.pk}/test", follow=True)
    assert response.status_code == 200 and "failed" in response.content.decode()
    d = AlertDelivery.objects.get()
    assert d.status == "failed" and d.error == "RuntimeError" and "T0K3N" not in d.error

