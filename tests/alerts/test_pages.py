"""The alerts pages as a user meets them: operators add channels and rules and send a test; viewers read."""
import re
from unittest import mock

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from monitoring.alerts import delivery
from monitoring.alerts.events import raise_event
from monitoring.alerts.models import AlertChannel, AlertDelivery, AlertEvent, AlertRule, Severity

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



def attempts_shown(page, delivery_pk):
    """The codes and texts of the attempts row under one delivery of the history."""
    row = re.search(rf'<tr class="attempts-row" id="delivery-{delivery_pk}-attempts">(.*?)</details>', page, re.S)
    assert row, f"no attempts row for delivery {delivery_pk}"
    return row.group(1), re.findall(r'<tr class="attempt" data-code="(\d*)" data-ok="(true|false)">', row.group(1))


def test_every_attempt_is_recorded_and_shown_under_its_delivery(view, receiver):
    """A receiver that fails twice (500) then answers 200: three attempts, each with its time, code, error."""
    answers = iter([(500, b"upstream broke"), (500, b"still broken"), (200, b"ok")])
    receiver.answer = lambda got: next(answers)
    channel = AlertChannel(name="hook", kind="webhook")
    channel.url = receiver.url + "/hook"
    channel.save()
    AlertRule.objects.create(name="all").channels.set([channel])
    with mock.patch("monitoring.alerts.delivery.queue"):  # no Redis: the test makes each attempt itself
        event = raise_event("engine_crashed", subject="qwen crashed", host="gpu1", deployment=3)
        d = AlertDelivery.objects.get(event=event)
        for expected in ("pending", "pending", "sent"):
            AlertDelivery.objects.filter(pk=d.pk).update(next_attempt_at=None)  # due now, not in 5 s
            assert delivery.deliver(d.pk) == expected
    d.refresh_from_db()
    assert d.attempts == 3 and d.status == "sent" and d.response_code == 200
    log = d.attempt_log
    assert [a["code"] for a in log] == [500, 500, 200] and [a["ok"] for a in log] == [False, False, True]
    assert "HTTP 500: upstream broke" in log[0]["error"] and "still broken" in log[1]["error"] and log[2]["error"] == ""
    times = [parse_datetime(a["at"]) for a in log]
    assert times == sorted(times) and all(isinstance(a["ms"], int) and a["ms"] >= 0 for a in log)

    page = view.get("/alerts/").content.decode()
    row, shown = attempts_shown(page, d.pk)
    assert shown == [("500", "false"), ("500", "false"), ("200", "true")]
    assert "3 attempts recorded" in row and "upstream broke" in row and "still broken" in row
    assert timezone.localtime(times[0]).strftime("%Y-%m-%d %H:%M:%S") in row


def test_an_attempts_error_never_carries_the_token_url(view, receiver):
    """A platform whose error page quotes the request (path and query hold the bot's token)."""
    receiver.answer = lambda got: (404, f"no bot at {receiver.url}{got.path}?key={got.query['key'][0]}".encode())
    channel = AlertChannel(name="wecom", kind="wecom")
    channel.url = receiver.url + "/cgi-bin/webhook/send?key=TOKEN-9f8e7d6c5b4a"
    channel.save()
    event = AlertEvent.objects.create(kind="engine_crashed", key="deployment:1", severity=Severity.CRITICAL,
                                      subject="x", occurred=timezone.now())
    d = AlertDelivery.objects.create(event=event, channel=channel)
    with mock.patch("monitoring.alerts.delivery.queue"):
        assert delivery.deliver(d.pk) == "pending"
    d.refresh_from_db()
    assert d.attempt_log[0]["code"] == 404 and "TOKEN-9f8e7d6c5b4a" not in repr(d.attempt_log)
    assert "TOKEN-9f8e7d6c5b4a" not in d.error and "no bot at ••••" in d.error
    row, shown = attempts_shown(view.get("/alerts/").content.decode(), d.pk)
    assert shown == [("404", "false")] and "no bot at" in row
    assert "TOKEN-9f8e7d6c5b4a" not in view.get("/alerts/").content.decode()
