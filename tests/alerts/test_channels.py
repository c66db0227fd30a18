"""Each channel against a loopback receiver: the platform's documented body and
signature, recomputed here independently, and the platform's error answers."""
import base64
import hashlib
import hmac
import time
import urllib.parse
from types import SimpleNamespace

import pytest
from django.db import connection
from django.utils import timezone

from monitoring.alerts import channels, delivery
from monitoring.alerts.models import AlertChannel, AlertDelivery, AlertEvent, Severity
from tests.alerts.receivers import Receiver, SmtpReceiver

pytestmark = pytest.mark.django_db


def event(**kw):
    fields = dict(kind="engine_crashed", key="deployment:7", severity=Severity.CRITICAL,
                  subject="Engine of “qwen” crashed", link="/deployments/7/", host="gpu1", deployment_id=7,
                  details={"reason": "exited", "hint": "see the log"}, occurred=timezone.now())
    fields.update(kw)
    return AlertEvent.objects.create(**fields)


def channel(kind, url="", secret="", **options):
    c = AlertChannel(name=f"{kind}-{time.monotonic_ns()}", kind=kind, options=options)
    c.url, c.secret = url, secret
    c.save()
    return c


def send(c, e=None):
    e = e or event()
    d = AlertDelivery.objects.create(event=e, channel=c)
    status = delivery.deliver(d.pk)
    d.refresh_from_db()
    return status, d


def test_generic_webhook_is_signed_over_timestamp_and_raw_body(receiver):
    secret = "whsec-0123456789abcdef"
    c = channel("webhook", receiver.url + "/hook", secret)
    status, d = send(c)
    got = receiver.get()
    assert status == "sent" and d.response_code == 200 and d.attempts == 1
    ts = got.headers["x-kiln-timestamp"]
    assert abs(int(ts) - time.time()) < 30
    expected = "sha256=" + hmac.new(secret.encode(), f"{ts}.".encode() + got.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(got.headers["x-kiln-signature"], expected)
    body = got.json()
    assert body["kind"] == "engine_crashed" and body["severity"] == "critical" and body["resolved"] is False
    assert body["link"] == "/deployments/7/" and body["details"]["reason"] == "exited"
    # A different body does not match the signature.
    assert hmac.new(secret.encode(), f"{ts}.".encode() + got.body + b" ", hashlib.sha256).hexdigest() \
        not in got.headers["x-kiln-signature"]


def test_slack_incoming_webhook_gets_text_and_blocks(receiver):
    receiver.answer = (200, b"ok")
    status, _ = send(channel("slack", receiver.url + "/services/T000/B000/XXXX"))
    body = receiver.get().json()
    assert status == "sent"
    assert "Engine crashed" in body["text"] and "qwen" in body["text"]
    assert body["blocks"][0]["type"] == "section" and body["blocks"][0]["text"]["type"] == "mrkdwn"


def test_slack_refusal_is_a_failure_with_the_reason(receiver):
    receiver.answer = (403, b"invalid_token")
    _, d = send(channel("slack", receiver.url + "/x"))
    assert d.status == "pending" and d.response_code == 403 and "invalid_token" in d.error
    assert d.next_attempt_at is not None  # retried later with backoff


def test_feishu_sign_is_hmac_of_empty_message_keyed_by_timestamp_and_secret(receiver):
    receiver.answer = (200, b'{"code":0,"msg":"success","data":{}}')
    secret = "feishu-signing-secret"
    status, _ = send(channel("feishu", receiver.url + "/open-apis/bot/v2/hook/abc", secret))
    body = receiver.get().json()
    assert status == "sent"
    assert body["msg_type"] == "text" and "Engine crashed" in body["content"]["text"]
    ts = body["timestamp"]
    assert isinstance(ts, str) and abs(int(ts) - time.time()) < 30
    key = f"{ts}\n{secret}".encode()
    assert body["sign"] == base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def test_feishu_error_code_in_a_200_answer_is_a_failure(receiver):
    receiver.answer = (200, b'{"code":19021,"msg":"sign match fail or timestamp is not within one hour"}')
    _, d = send(channel("feishu", receiver.url + "/hook", "s"))
    assert d.status == "pending" and d.response_code == 200 and "19021" in d.error


def test_dingtalk_sign_goes_in_the_query_and_body_is_markdown(receiver):
    secret = "SEC0123456789abcdef"
    status, _ = send(channel("dingtalk", receiver.url + "/robot/send?access_token=tok", secret))
    got = receiver.get()
    assert status == "sent"
    assert got.query["access_token"] == ["tok"]
    ts = got.query["timestamp"][0]
    assert len(ts) == 13 and abs(int(ts) / 1000 - time.time()) < 30  # milliseconds
    mac = hmac.new(secret.encode(), f"{ts}\n{secret}".encode(), hashlib.sha256).digest()
    signature = base64.b64encode(mac).decode()
    assert got.query["sign"][0] == signature  # parse_qs undid the one URL encoding
    # On the wire it is percent-encoded once, whatever characters this signature has.
    assert raw_param(got, "sign") == urllib.parse.quote(signature, safe="")
    body = got.json()
    assert body["msgtype"] == "markdown" and "Engine crashed" in body["markdown"]["title"]
    assert "[Open in Kiln](/deployments/7/)" in body["markdown"]["text"]


def raw_param(got, name):
    """A query parameter's value as sent, not decoded (parse_qs would turn a raw '+' into a space)."""
    values = [p.split("=", 1)[1] for p in got.raw_query.split("&") if p.startswith(name + "=")]
    assert len(values) == 1, got.raw_query
    return values[0]


def test_dingtalk_sign_with_plus_slash_and_equals_is_percent_encoded_in_the_raw_query(receiver, monkeypatch):
    """A fixed timestamp whose signature has '+', '/' and '=': DingTalk reads the query
    decoded, so each must arrive as %2B, %2F and %3D (a raw '+' would read as a space)."""
    secret, ts = "SEC0123456789abcdef", "1767225600000"
    monkeypatch.setattr(channels, "time", SimpleNamespace(time=lambda: int(ts) / 1000))
    signature = base64.b64encode(hmac.new(secret.encode(), f"{ts}\n{secret}".encode(), hashlib.sha256).digest()
                                 ).decode()
    assert "+" in signature and "/" in signature and signature.endswith("=")  # what this test is about
    status, _ = send(channel("dingtalk", receiver.url + "/robot/send?access_token=tok", secret))
    got = receiver.get()
    assert status == "sent"
    assert raw_param(got, "timestamp") == ts and raw_param(got, "access_token") == "tok"
    sign = raw_param(got, "sign")
    assert sign == signature.replace("+", "%2B").replace("/", "%2F").replace("=", "%3D")
    assert not set("+/=") & set(sign)
    assert urllib.parse.unquote(sign) == signature


def test_dingtalk_errcode_is_a_failure(receiver):
    receiver.answer = (200, b'{"errcode":310000,"errmsg":"sign not match"}')
    _, d = send(channel("dingtalk", receiver.url + "/robot/send?access_token=t", "SECx"))
    assert d.status == "pending" and "310000" in d.error


def test_wecom_markdown_and_errcode(receiver):
    status, _ = send(channel("wecom", receiver.url + "/cgi-bin/webhook/send?key=abc"))
    got = receiver.get()
    assert status == "sent" and got.query["key"] == ["abc"]
    body = got.json()
    assert body["msgtype"] == "markdown" and "Engine crashed" in body["markdown"]["content"]
    receiver.answer = (200, b'{"errcode":93000,"errmsg":"invalid webhook url"}')
    _, d = send(channel("wecom", receiver.url + "/cgi-bin/webhook/send?key=bad"))
    assert d.status == "pending" and "93000" in d.error


def test_wecom_cuts_markdown_to_its_4096_byte_limit(receiver):
    send(channel("wecom", receiver.url + "/k"), event(details={"log": "é" * 5000}))
    assert len(receiver.get().json()["markdown"]["content"].encode()) <= 4096


def test_a_receiver_that_is_down_is_retried_with_backoff_then_failed():
    c = channel("webhook", "http://127.0.0.1:9/nothing-listens", "s")
    d = AlertDelivery.objects.create(event=event(), channel=c)
    delays = []
    for attempt in range(1, delivery.MAX_ATTEMPTS + 1):
        AlertDelivery.objects.filter(pk=d.pk).update(next_attempt_at=None)  # due now
        status = delivery.deliver(d.pk)
        d.refresh_from_db()
        assert d.attempts == attempt and d.error and len(d.attempt_log) == attempt
        if attempt < delivery.MAX_ATTEMPTS:
            assert status == "pending"
            delays.append((d.next_attempt_at - timezone.now()).total_seconds())
    assert status == "failed" and d.status == "failed"
    assert [a["ok"] for a in d.attempt_log] == [False] * delivery.MAX_ATTEMPTS
    assert all(a["code"] is None and a["error"] for a in d.attempt_log)  # nothing listens: no answer code
    assert delays == pytest.approx([5, 10, 20, 40, 80], abs=1.5)  # doubling backoff


def test_a_delivery_whose_attempts_are_used_up_fails_instead_of_retrying(receiver):
    """A worker that died mid-send each time leaves the row 'sending' with its attempts counted."""
    d = AlertDelivery.objects.create(event=event(), channel=channel("webhook", receiver.url, "s"),
                                     status="sending", attempts=delivery.MAX_ATTEMPTS,
                                     claimed_at=timezone.now() - timezone.timedelta(hours=1))
    assert delivery.deliver(d.pk) is None
    d.refresh_from_db()
    assert d.status == "failed" and d.attempts == delivery.MAX_ATTEMPTS
    assert receiver.received.empty()
    assert d.pk not in delivery.due_ids(grace_s=0)


def test_an_attempt_whose_sender_died_is_in_the_log_as_lost(receiver):
    """A claim counts the attempt before sending; a worker killed mid-send records nothing. The
    next attempt's log says so, so the log and the attempt count agree."""
    first = {"at": timezone.now().isoformat(), "ok": False, "code": 502, "error": "bad gateway", "ms": 12}
    d = AlertDelivery.objects.create(event=event(), channel=channel("webhook", receiver.url, "s"),
                                     status="sending", attempts=2, attempt_log=[first],
                                     claimed_at=timezone.now() - timezone.timedelta(seconds=delivery.STALE_CLAIM_S + 5))
    assert delivery.deliver(d.pk) == "sent"
    d.refresh_from_db()
    assert d.attempts == 3 and len(d.attempt_log) == 3
    assert d.attempt_log[0] == first
    assert d.attempt_log[1]["lost"] is True and d.attempt_log[1]["code"] is None
    assert d.attempt_log[2]["code"] == 200 and d.attempt_log[2]["ok"] is True


def test_a_row_from_before_the_attempt_log_gets_no_made_up_lost_attempts(receiver):
    """Attempts made before the attempt_log column existed were not lost, only never logged."""
    d = AlertDelivery.objects.create(event=event(), channel=channel("webhook", receiver.url, "s"),
                                     status="pending", attempts=3, attempt_log=[])
    assert delivery.deliver(d.pk) == "sent"
    d.refresh_from_db()
    assert d.attempts == 4 and len(d.attempt_log) == 1
    assert d.attempt_log[0]["code"] == 200 and "lost" not in d.attempt_log[0]


def test_a_claim_taken_over_during_a_slow_send_keeps_the_other_senders_record(receiver, monkeypatch):
    """A send slower than STALE_CLAIM_S: another sender reclaims the row and records its attempt;
    the first one's late answer must not overwrite that (nor queue a retry of a row now not its own)."""
    d = AlertDelivery.objects.create(event=event(), channel=channel("webhook", receiver.url, "s"))
    theirs = {"at": timezone.now().isoformat(), "ok": True, "code": 200, "error": "", "ms": 5}
    taken_over = []

    def slow_send(c, message):
        # The first claim looks stale now; the other sender claims the row and is still sending.
        AlertDelivery.objects.filter(pk=d.pk).update(
            claimed_at=timezone.now() - timezone.timedelta(seconds=delivery.STALE_CLAIM_S + 1))
        taken_over.append(real_claim(d.pk))
        AlertDelivery.objects.filter(pk=d.pk).update(attempt_log=[theirs])
        return channels.Outcome(False, 504, "timed out after 70 s")

    real_claim = delivery.claim
    queued = []
    monkeypatch.setattr(channels, "send", slow_send)
    monkeypatch.setattr(delivery, "queue", lambda ids, countdown=None: queued.append(ids))
    assert delivery.deliver(d.pk) is None
    d.refresh_from_db()
    assert taken_over[0] is not None and d.claimed_at == taken_over[0]
    assert d.status == "sending" and d.attempts == 2 and d.attempt_log == [theirs]
    assert d.response_code is None and d.error == "" and queued == []


def test_the_attempt_log_keeps_each_error_short():
    c = channel("webhook", "http://127.0.0.1:9/x", "s")
    d = AlertDelivery.objects.create(event=event(), channel=c)
    long_error = channels.Outcome(False, 502, "x" * 5000)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(channels, "send", lambda channel, message: long_error)
        mp.setattr(delivery, "queue", lambda ids, countdown=None: None)
        delivery.deliver(d.pk)
    d.refresh_from_db()
    assert len(d.attempt_log[0]["error"]) == delivery.ATTEMPT_ERROR_CHARS and len(d.error) == 2000


def test_an_email_title_with_line_breaks_is_sent_on_one_subject_line(tmp_path):
    smtp = SmtpReceiver(tmp_path, implicit_tls=False).start()
    try:
        c = channel("email", host="127.0.0.1", port=smtp.port, security="starttls", sender="kiln@example.test",
                    recipients=["ops@example.test"], ca_file=str(smtp.cert), verify=True)
        status, d = send(c, event(subject="crashed\r\nBcc: victim@example.test"))
        assert status == "sent", d.error
        envelope = smtp.messages.get(timeout=10)
        assert envelope.rcpt_tos == ["ops@example.test"]
        headers = envelope.content.decode().replace("\r\n", "\n").split("\n\n")[0]
        assert "Subject: [CRITICAL] Engine crashed: crashed Bcc: victim@example.test" in headers
        assert "\nBcc:" not in headers
    finally:
        smtp.stop()


def test_a_claimed_delivery_is_not_sent_twice(receiver):
    d = AlertDelivery.objects.create(event=event(), channel=channel("webhook", receiver.url, "s"))
    assert delivery.claim(d.pk)
    assert delivery.deliver(d.pk) is None  # someone else has it
    assert receiver.received.empty()


@pytest.mark.parametrize("implicit_tls", [False, True], ids=["starttls", "implicit-tls"])
def test_email_over_smtp_with_tls_and_login(tmp_path, implicit_tls):
    smtp = SmtpReceiver(tmp_path, implicit_tls=implicit_tls).start()
    try:
        c = channel("email", secret="s3cret-pass", host="127.0.0.1", port=smtp.port,
                    security="tls" if implicit_tls else "starttls", username="kiln", sender="kiln@example.test",
                    recipients=["ops@example.test", "oncall@example.test"], verify=True, ca_file=str(smtp.cert))
        status, d = send(c)
        assert status == "sent", d.error
        envelope = smtp.messages.get(timeout=10)
        assert envelope.rcpt_tos == ["ops@example.test", "oncall@example.test"]
        text = envelope.content.decode()
        assert "Subject: [CRITICAL] Engine crashed" in text and "/deployments/7/" in text
        assert smtp.logins == [("kiln", True)]
        # Without the CA, the self-signed certificate is refused (verification is on)...
        c.options = {**c.options, "ca_file": ""}
        c.save()
        _, d = send(c)
        assert d.status == "pending" and "CERTIFICATE_VERIFY_FAILED" in d.error
        # ...and a wrong password is an SMTP 535.
        c.options = {**c.options, "verify": False}
        c.secret = "wrong"
        c.save()
        _, d = send(c)
        assert d.status == "pending" and d.response_code == 535
    finally:
        smtp.stop()


def test_secrets_are_not_stored_in_plain_text():
    c = channel("dingtalk", "https://oapi.dingtalk.com/robot/send?access_token=TOKEN-abcdef123456",
                "SEC-signing-secret-9876")
    with connection.cursor() as cursor:
        cursor.execute("SELECT url_encrypted, secret_encrypted, options FROM monitoring_alertchannel WHERE id = %s",
                       [c.pk])
        row = " ".join(str(v) for v in cursor.fetchone())
    assert "TOKEN-abcdef123456" not in row and "SEC-signing-secret" not in row and "fernet:" in row
    again = AlertChannel.objects.get(pk=c.pk)
    assert again.url.endswith("TOKEN-abcdef123456") and again.secret == "SEC-signing-secret-9876"
    assert again.secret_shown == "•••• 9876" and "TOKEN" not in again.url_shown


def test_message_link_is_absolute_with_a_public_url(monkeypatch):
    monkeypatch.setenv("KILN_PUBLIC_URL", "https://kiln.example.test/")
    assert channels.message_for(event()).link == "https://kiln.example.test/deployments/7/"
