"""What a user sees of a GPU host that stopped reporting, in English and in Chinese: the
Monitoring page says the host is offline, the Deployments list and the deployment's page
show its running deployment as Unreachable (amber), never Failed, with why. Full-page
screenshots at 1400 and 420 px go to test-artifacts/ (the multi-host test in
test_multihost.py shows the same state reached by cutting a real link)."""
import time

import pytest
import redis as redis_lib
from django.conf import settings

from inference.models import Deployment
from monitoring.liveness import KNOWN_HOSTS_KEY
from tests.helpers import REPO

ARTIFACTS = REPO / "test-artifacts"
pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

WORDS = {
    "en": {"unreachable": "Unreachable", "offline": "gpu-b is offline", "detail": "has stopped reporting",
           "ready": "Ready"},
    "zh-hans": {"unreachable": "无法连接", "offline": "gpu-b 已离线", "detail": "已停止上报", "ready": "就绪"},
}


def sign_in(page, base, user):
    page.goto(base + "/login/")
    page.fill("input[name=username]", user.username)
    page.fill("input[name=password]", user.plain_password)
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_a_host_that_stopped_reporting_is_offline_and_its_deployment_unreachable_not_failed(
        asgi_server, browser, viewer, language):
    on_b = Deployment.objects.create(name="qwen-on-b", host="gpu-b", status="ready", phase="ready",
                                     engine_name="llamacpp", bind_host="10.213.2.2", port=8123,
                                     served_model_name="qwen")
    here = Deployment.objects.create(name="gemma-here", host=settings.HOST_NAME, status="ready", phase="ready",
                                     engine_name="llamacpp", port=8124, served_model_name="gemma")
    # gpu-b's monitor was seen 40 s ago and its heartbeat key has expired: the state a cut link leaves.
    redis_lib.Redis.from_url(settings.REDIS_URL).hset(KNOWN_HOSTS_KEY, "gpu-b", time.time() - 40)
    words = WORDS[language]
    browser.add_cookies([{"name": settings.LANGUAGE_COOKIE_NAME, "value": language, "url": asgi_server}])
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(page, asgi_server, viewer)
    tag = "zh" if language == "zh-hans" else "en"
    for width in (1400, 420):
        page.set_viewport_size({"width": width, "height": 900})

        page.goto(asgi_server + "/monitoring/")
        assert words["offline"] in page.inner_text(f"[data-offline-host='gpu-b']")
        page.screenshot(path=str(ARTIFACTS / f"host-offline-monitoring-{tag}-{width}.png"), full_page=True)

        page.goto(asgi_server + "/deployments/")
        row_b = page.locator(f"tr[data-id='{on_b.pk}'] [data-role=status]")
        assert row_b.inner_text() == words["unreachable"]
        assert "amber" in row_b.get_attribute("class")
        # The host that reports is not touched by its neighbour's outage.
        assert page.locator(f"tr[data-id='{here.pk}'] [data-role=status]").inner_text() == words["ready"]
        page.screenshot(path=str(ARTIFACTS / f"host-offline-deployments-{tag}-{width}.png"), full_page=True)

        page.goto(asgi_server + f"/deployments/{on_b.pk}/")
        assert page.inner_text("#status-badge") == words["unreachable"]
        assert page.locator("#host-offline").is_visible()
        assert words["detail"] in page.inner_text("#host-offline")
        page.screenshot(path=str(ARTIFACTS / f"host-offline-detail-{tag}-{width}.png"), full_page=True)
    assert not errors, errors
    on_b.refresh_from_db()
    assert on_b.status == "ready"  # shown unreachable, never written as failed
