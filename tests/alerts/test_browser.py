"""The alerts pages in Chromium: an operator adds a Feishu channel (the form shows
the URL for chat channels and the SMTP fields for email), sends a test that a
loopback receiver gets, and sees it in the history; screenshots at 1400 and 420 px."""
import pytest

from monitoring.alerts.models import AlertDelivery, AlertRule, Severity
from monitoring.alerts.events import raise_event
from tests.helpers import REPO

ARTIFACTS = REPO / "test-artifacts"
pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


def sign_in(page, base, user):
    page.goto(base + "/login/")
    page.fill("input[name=username]", user.username)
    page.fill("input[name=password]", user.plain_password)
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")


def test_operator_adds_a_channel_and_sends_a_test(asgi_server, browser, operator, receiver):
    ARTIFACTS.mkdir(exist_ok=True)
    receiver.answer = (200, b'{"code":0,"msg":"success"}')
    page = browser.new_page()
    page.set_viewport_size({"width": 1400, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    sign_in(page, asgi_server, operator)
    page.click("nav >> text=Alerts")
    page.wait_for_url(asgi_server + "/alerts/")
    page.click("text=Add a channel")
    page.select_option("#id_kind", "email")
    assert page.is_visible("#id_smtp_host") and not page.is_visible("#id_url")
    page.select_option("#id_kind", "feishu")
    assert page.is_visible("#id_url") and not page.is_visible("#id_smtp_host")
    page.fill("#id_name", "team-feishu")
    page.fill("#id_url", receiver.url + "/open-apis/bot/v2/hook/SECRET-TOKEN-1234")
    page.fill("#id_secret", "feishu-sign-secret")
    page.screenshot(path=str(ARTIFACTS / "alerts_channel_form_1400.png"), full_page=True)
    page.click("button.primary")
    page.wait_for_url(asgi_server + "/alerts/")
    assert "SECRET-TOKEN" not in page.content()
    page.click("text=Send a test")
    page.wait_for_selector(".flash")
    assert "Test message sent" in page.inner_text(".flash")
    got = receiver.get()
    assert got.json()["msg_type"] == "text" and got.json()["sign"]

    rule = AlertRule.objects.create(name="GPU and engines", min_severity=Severity.WARNING, cooldown_s=600)
    rule.channels.set(AlertDelivery.objects.values_list("channel", flat=True))
    raise_event("gpu_xid", subject="GPU 1 on gpu1: Xid 79: GPU has fallen off the bus", host="gpu1",
                link="/monitoring/", details={"uuid": "GPU-v100-1"})
    raise_event("engine_crashed", subject="Engine of “qwen” crashed", host="gpu1", deployment=3,
                link="/deployments/3/")
    page.goto(asgi_server + "/alerts/")
    assert page.is_visible("#history") and page.is_visible("#open-incidents")
    page.screenshot(path=str(ARTIFACTS / "alerts_1400.png"), full_page=True)
    page.set_viewport_size({"width": 420, "height": 900})
    page.screenshot(path=str(ARTIFACTS / "alerts_420.png"), full_page=True)
    page.goto(asgi_server + f"/alerts/rules/{rule.pk}/")
    page.screenshot(path=str(ARTIFACTS / "alerts_rule_form_420.png"), full_page=True)
    page.set_viewport_size({"width": 1400, "height": 900})
    page.screenshot(path=str(ARTIFACTS / "alerts_rule_form_1400.png"), full_page=True)
    assert errors == []
