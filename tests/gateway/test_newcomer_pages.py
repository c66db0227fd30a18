"""What a new user missed on the gateway pages (issue 17): a Copy button for a new key,
the per-key usage chart in time order, and Stop in the Playground while an answer streams."""
import datetime as dt

import pytest
from django.utils import timezone

from inference.gateway import keys
from inference.models import UsageRecord
from tests.gateway.test_gateway import deployment
from tests.gateway.test_pages import sign_in
from tests.sse_stub import StubScript, running_stub

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


def test_a_new_key_has_a_copy_button_and_the_usage_chart_runs_in_time_order(asgi_server, browser, operator):
    early, _ = keys.key_create(user=operator, name="early")
    late, _ = keys.key_create(user=operator, name="late")
    now = timezone.now().replace(second=0, microsecond=0)
    # "late" (first trace by name) has only the later minutes; "early" the earlier ones.
    for key, minutes in ((late, (1, 3)), (early, (10, 8, 2))):
        for m in minutes:
            UsageRecord.objects.create(minute=now - dt.timedelta(minutes=m), key=key, user=operator, requests=1,
                                       prompt_tokens=1000, completion_tokens=330)
    browser.grant_permissions(["clipboard-read", "clipboard-write"])
    page = browser.new_page()
    sign_in(page, asgi_server, operator)
    page.goto(asgi_server + "/keys/")
    page.fill("input[name=name]", "notebook")
    page.click("text=Create key")
    secret = page.inner_text("#new-key-secret")
    page.click("#copy-new-key")
    page.wait_for_function("() => document.getElementById('copy-new-key').textContent !== 'Copy'", timeout=5000)
    assert page.evaluate("navigator.clipboard.readText()") == secret
    page.wait_for_selector("#chart-keys .main-svg")
    ticks = page.evaluate("document.getElementById('chart-keys')._fullLayout.xaxis._categories")
    assert len(ticks) == 5 and ticks == sorted(ticks), ticks


def test_stop_ends_a_streaming_answer_and_keeps_what_arrived(asgi_server, browser, viewer):
    with running_stub(StubScript(tokens=400, token_delay=0.05)) as stub:
        deployment("slow", stub.port, model="stub-model")
        page = browser.new_page()
        sign_in(page, asgi_server, viewer)
        page.goto(asgi_server + "/playground/")
        assert page.is_hidden("#pg-stop")
        page.fill("#pg-max-tokens", "400")
        page.fill("#pg-input", "talk for a while")
        page.click("#pg-send")
        page.wait_for_function("() => document.querySelector('.msg.assistant .text')?.textContent.length > 10",
                               timeout=30000)
        assert page.is_visible("#pg-stop") and page.is_hidden("#pg-send")
        page.click("#pg-stop")
        stats = page.wait_for_selector(".msg.assistant .stats", timeout=10000).inner_text()
        assert "stopped" in stats and "error" not in stats
        words = len(page.inner_text(".msg.assistant .text").split())
        assert 0 < words < 400
        assert page.is_visible("#pg-send") and page.is_hidden("#pg-stop")
