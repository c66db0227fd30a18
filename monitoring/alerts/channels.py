"""How each platform wants a message, signed the way its documentation says.

Every sender takes a channel and a ``Message`` and returns an ``Outcome``
(ok, HTTP status, error). Platforms that answer HTTP 200 with an error code
in the JSON body (Feishu ``code``/``StatusCode``, DingTalk and WeCom
``errcode``) are read: a non-zero code is a failure.

Signatures:
- generic webhook: headers ``X-Kiln-Timestamp: <unix seconds>`` and
  ``X-Kiln-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>.<raw body>")>``
  (receivers recompute it over the raw body and refuse old timestamps).
- Feishu/Lark custom bot: ``timestamp`` (seconds, as a string) and
  ``sign = base64(HMAC-SHA256(key="<timestamp>\\n<secret>", message=b""))`` in the body.
- DingTalk custom robot: ``&timestamp=<ms>&sign=<urlencoded base64(HMAC-SHA256(key=secret,
  message="<timestamp>\\n<secret>"))>`` added to the URL.
- Slack and WeCom: the URL is the secret; no signature.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import os
import smtplib
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

import certifi
import httpx
from django.conf import settings
from django.utils.translation import gettext as _

from monitoring.alerts.crypto import SecretUnreadable

TIMEOUT_S = 10.0
# WeCom refuses markdown content over 4096 bytes; DingTalk and Feishu allow more,
# but nobody reads an alert that long: cut the details at this many characters.
MAX_DETAIL_CHARS = 1500


@dataclass
class Message:
    title: str  # "[CRITICAL] Engine crashed: qwen on gpu1"
    text: str  # details, plain text lines
    link: str  # absolute when KILN_PUBLIC_URL is set
    severity: str
    kind: str
    resolved: bool
    payload: dict  # the generic webhook's JSON body


@dataclass
class Outcome:
    ok: bool
    status: int | None = None
    error: str = ""


def public_url(link: str) -> str:
    base = getattr(settings, "KILN_PUBLIC_URL", "") or os.environ.get("KILN_PUBLIC_URL", "")
    if link and base and link.startswith("/"):
        return base.rstrip("/") + link
    return link


def message_for(event, *, test: bool = False) -> Message:
    from monitoring.alerts.events import KINDS
    from monitoring.alerts.models import Severity

    severity = Severity(event.severity).name.lower()
    label = str(KINDS[event.kind].label)
    state = _("RESOLVED") if event.resolved else severity.upper()
    title = f"[{state}] {label}: {event.subject}" if event.subject != label else f"[{state}] {label}"
    lines = []
    if event.host:
        lines.append(_("Host: %(host)s") % {"host": event.host})
    for name, value in (event.details or {}).items():
        if value not in (None, "", [], {}):
            lines.append(f"{name}: {value}")
    text = "\n".join(lines)[:MAX_DETAIL_CHARS]
    link = public_url(event.link)
    payload = {
        "event_id": event.pk, "kind": event.kind, "kind_label": label, "severity": severity,
        "resolved": event.resolved, "subject": event.subject, "title": title, "link": link,
        "host": event.host or None, "deployment_id": event.deployment_id, "details": event.details or {},
        "occurred": event.occurred.isoformat() if event.occurred else None, "test": test,
    }
    return Message(title=title, text=text, link=link, severity=severity, kind=event.kind,
                   resolved=event.resolved, payload=payload)


# ----------------------------------------------------------------------- signing


def webhook_signature(secret: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret.encode("utf-8"), timestamp.encode("ascii") + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def feishu_sign(secret: str, timestamp: str) -> str:
    key = f"{timestamp}\n{secret}".encode("utf-8")
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode("ascii")


def dingtalk_sign(secret: str, timestamp_ms: str) -> str:
    """The base64 signature before URL encoding (the URL builder encodes it once)."""
    mac = hmac.new(secret.encode("utf-8"), f"{timestamp_ms}\n{secret}".encode("utf-8"), hashlib.sha256)
    return base64.b64encode(mac.digest()).decode("ascii")


def _markdown(message: Message) -> str:
    parts = [f"**{message.title}**"]
    if message.text:
        parts.append(message.text.replace("\n", "\n\n"))
    if message.link:
        parts.append(f"[{_('Open in Kiln')}]({message.link})")
    return "\n\n".join(parts)


def _plain(message: Message) -> str:
    return "\n".join(p for p in (message.title, message.text, message.link) if p)


# ----------------------------------------------------------------------- senders


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # Built once: loading the CA bundle costs ~15 ms of CPU (150 ms on a busy 2-core host),
    # which a new httpx client per message would pay every time.
    return ssl.create_default_context(cafile=certifi.where())


def _post(url: str, *, body: bytes, headers: dict | None = None) -> httpx.Response:
    with httpx.Client(timeout=TIMEOUT_S, follow_redirects=False, verify=_tls_context()) as client:
        return client.post(url, content=body, headers={"Content-Type": "application/json; charset=utf-8",
                                                        "User-Agent": "Kiln-Alerts/1", **(headers or {})})


def _json_code(response: httpx.Response, *names) -> tuple[int | None, str]:
    try:
        data = response.json()
    except ValueError:
        return None, ""
    if not isinstance(data, dict):
        return None, ""
    for name in names:
        if name in data:
            try:
                code = int(data[name])
            except (TypeError, ValueError):
                return -1, str(data)[:300]
            text = data.get("msg") or data.get("errmsg") or data.get("StatusMessage") or ""
            return code, str(text)
    return None, ""


def _http_outcome(response: httpx.Response, *code_fields) -> Outcome:
    if not 200 <= response.status_code < 300:
        return Outcome(False, response.status_code, _("HTTP %(code)s: %(body)s") % {
            "code": response.status_code, "body": response.text[:300]})
    if code_fields:
        code, text = _json_code(response, *code_fields)
        if code is None:
            return Outcome(False, response.status_code,
                           _("the answer has no %(fields)s field: %(body)s") % {
                               "fields": "/".join(code_fields), "body": response.text[:300]})
        if code != 0:
            return Outcome(False, response.status_code, _("the platform refused it: code %(code)s %(text)s") % {
                "code": code, "text": text})
    return Outcome(True, response.status_code)


def send_webhook(channel, message: Message) -> Outcome:
    body = json.dumps(message.payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    timestamp = str(int(time.time()))
    headers = {"X-Kiln-Timestamp": timestamp, "X-Kiln-Event": message.kind}
    secret = channel.secret
    if secret:
        headers["X-Kiln-Signature"] = webhook_signature(secret, timestamp, body)
    return _http_outcome(_post(channel.url, body=body, headers=headers))


def send_slack(channel, message: Message) -> Outcome:
    text = f"*{message.title}*" + (f"\n{message.text}" if message.text else "")
    if message.link:
        text += f"\n<{message.link}|{_('Open in Kiln')}>"
    payload = {"text": text, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text[:2900]}}]}
    response = _post(channel.url, body=json.dumps(payload, ensure_ascii=False).encode("utf-8"))
    # Slack answers 200 "ok", or 4xx with a reason ("invalid_token", "no_text").
    return _http_outcome(response)


def send_feishu(channel, message: Message) -> Outcome:
    payload: dict = {"msg_type": "text", "content": {"text": _plain(message)}}
    secret = channel.secret
    if secret:
        timestamp = str(int(time.time()))
        payload = {"timestamp": timestamp, "sign": feishu_sign(secret, timestamp), **payload}
    response = _post(channel.url, body=json.dumps(payload, ensure_ascii=False).encode("utf-8"))
    # Feishu answers {"code":0,"msg":"success"} (older bots {"StatusCode":0,...}).
    return _http_outcome(response, "code", "StatusCode")


def send_dingtalk(channel, message: Message) -> Outcome:
    url = channel.url
    secret = channel.secret
    if secret:
        timestamp = str(int(time.time() * 1000))
        sign = urllib.parse.quote_plus(dingtalk_sign(secret, timestamp))
        url += ("&" if "?" in url else "?") + f"timestamp={timestamp}&sign={sign}"
    payload = {"msgtype": "markdown", "markdown": {"title": message.title[:100], "text": _markdown(message)}}
    response = _post(url, body=json.dumps(payload, ensure_ascii=False).encode("utf-8"))
    return _http_outcome(response, "errcode")


def send_wecom(channel, message: Message) -> Outcome:
    content = _markdown(message)
    while len(content.encode("utf-8")) > 4096:  # WeCom's documented limit for markdown
        content = content[:-100]
    payload = {"msgtype": "markdown", "markdown": {"content": content}}
    response = _post(channel.url, body=json.dumps(payload, ensure_ascii=False).encode("utf-8"))
    return _http_outcome(response, "errcode")


def send_email(channel, message: Message) -> Outcome:
    o = channel.options or {}
    recipients = [r.strip() for r in o.get("recipients", []) if r.strip()]
    security = o.get("security", "starttls")
    try:
        # Built inside the try: a bad header value or CA file is this delivery's failure, not a crash.
        mail = EmailMessage()
        # A line break in a header is refused by the email package (and would be header injection).
        mail["Subject"] = " ".join(message.title.splitlines()).replace("\r", " ").replace("\n", " ")[:200]
        mail["From"] = o.get("sender") or o.get("username") or "kiln@localhost"
        mail["To"] = ", ".join(recipients)
        mail["Date"] = formatdate(localtime=True)
        mail["Message-ID"] = make_msgid(domain="kiln")
        mail.set_content(_plain(message))
        context = ssl.create_default_context(cafile=o.get("ca_file") or None)
        if not o.get("verify", True):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        host, port = o.get("host", ""), int(o.get("port") or (465 if security == "tls" else 587))
        if security == "tls":
            smtp = smtplib.SMTP_SSL(host, port, timeout=TIMEOUT_S, context=context)
        else:
            smtp = smtplib.SMTP(host, port, timeout=TIMEOUT_S)
        with smtp:
            if security == "starttls":
                smtp.starttls(context=context)
            if o.get("username"):
                smtp.login(o["username"], channel.secret)
            refused = smtp.send_message(mail, to_addrs=recipients)
    except smtplib.SMTPResponseException as exc:
        return Outcome(False, exc.smtp_code, f"SMTP {exc.smtp_code}: {exc.smtp_error!r}"[:500])
    except smtplib.SMTPRecipientsRefused as exc:
        return Outcome(False, None, _("every recipient was refused: %(r)s") % {"r": exc.recipients})
    except (smtplib.SMTPException, OSError, ssl.SSLError) as exc:
        return Outcome(False, None, f"{type(exc).__name__}: {exc}"[:500])
    if refused:
        return Outcome(False, 250, _("refused recipients: %(r)s") % {"r": ", ".join(refused)})
    return Outcome(True, 250)


SENDERS = {
    "webhook": send_webhook,
    "slack": send_slack,
    "feishu": send_feishu,
    "dingtalk": send_dingtalk,
    "wecom": send_wecom,
    "email": send_email,
}


REDACTED = "••••"


def _secrets_of(channel) -> list[str]:
    """What must never appear in an error text: the URL (its path and query carry the bot's
    token: Slack and Feishu in the path, DingTalk and WeCom in the query), each query value,
    and the signing secret or SMTP password."""
    found = []
    for attr in ("url", "secret"):
        try:
            value = getattr(channel, attr) or ""
        except SecretUnreadable:
            continue
        if not value:
            continue
        found.append(value)
        if attr == "url":
            parts = urllib.parse.urlsplit(value)
            tail = parts.path + ("?" + parts.query if parts.query else "")
            found += [tail, parts.path, parts.query]
            found += [v for _name, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)]
            for v in list(found):
                found += [urllib.parse.quote(v, safe="/"), urllib.parse.unquote(v)]
    # Longest first, so the whole URL goes before its parts; very short bits (a "/x" path) are no secret.
    return sorted({f for f in found if len(f) >= 6}, key=len, reverse=True)


def redact(text: str, channel) -> str:
    """``text`` with the channel's URL, token and secret replaced by ••••."""
    if not text:
        return text
    for secret in _secrets_of(channel):
        text = text.replace(secret, REDACTED)
    return text


def send(channel, message: Message) -> Outcome:
    """Send through the channel's sender; the error text never carries its URL or secret."""
    outcome = _send(channel, message)
    if outcome.error:
        outcome.error = redact(outcome.error, channel)
    return outcome


def _send(channel, message: Message) -> Outcome:
    try:
        return SENDERS[channel.kind](channel, message)
    except httpx.TimeoutException as exc:
        return Outcome(False, None, _("no answer within %(s)s s (%(e)s)") % {"s": TIMEOUT_S, "e": type(exc).__name__})
    except httpx.HTTPError as exc:
        return Outcome(False, None, f"{type(exc).__name__}: {exc}"[:500])
    except SecretUnreadable as exc:
        return Outcome(False, None, _("the channel's secret cannot be read: %(e)s") % {"e": exc})
    except Exception as exc:  # noqa: BLE001 - any other sender error is this delivery's failure, never a 500
        # Only the type: the message may quote the webhook URL, which holds the platform's token.
        return Outcome(False, None, type(exc).__name__)
