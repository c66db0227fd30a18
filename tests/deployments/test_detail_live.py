"""The deployment page watched live fills in what the engine learns after the
page was rendered: the port (endpoint and both snippets) and the Started and
Ready times -- without a reload (the issue: the snippets kept PORT)."""
import pytest
from django.utils import timezone

from inference.deployments.selectors import SNIPPET_PLACEHOLDER
from inference.deployments.watch import message_for
from inference.models import Deployment
from tests.helpers import REPO, free_port

ARTIFACTS = REPO / "test-artifacts"


def sign_in(page, base, user):
    page.goto(base + "/login/")
    page.fill("input[name=username]", user.username)
    page.fill("input[name=password]", user.plain_password)
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")


@pytest.mark.browser
def test_a_starting_deployment_shows_its_port_and_ready_time_once_known(asgi_server, browser, operator):
    dep = Deployment.objects.create(name="gemma live", host="testhost", engine_name="llamacpp",
                                    status=Deployment.Status.STARTING, phase="starting",
                                    served_model_name="gemma-3-270m")
    page = browser.new_page()
    page.set_viewport_size({"width": 1400, "height": 900})
    sign_in(page, asgi_server, operator)
    page.goto(f"{asgi_server}/deployments/{dep.pk}/")
    assert "PORT" in page.inner_text("#snippet-curl") and "PORT" in page.inner_text("#snippet-python")
    assert page.inner_text("#ready-at") == "—"

    port = free_port()
    now = timezone.now().replace(microsecond=0)
    Deployment.objects.filter(pk=dep.pk).update(status=Deployment.Status.READY, phase="ready", port=port,
                                                 started=now, ready_at=now, pid=4242)
    page.wait_for_function("() => !document.getElementById('snippet-curl').textContent.includes('PORT')",
                           timeout=15000)
    endpoint = f"http://127.0.0.1:{port}/v1"
    assert f"{endpoint}/chat/completions" in page.inner_text("#snippet-curl")
    assert f"base_url='{endpoint}'" in page.inner_text("#snippet-python")
    assert page.inner_text("#endpoint") == endpoint
    assert page.inner_text("#ready-at") == now.strftime("%Y-%m-%d %H:%M:%S")
    assert page.inner_text("#started") == now.strftime("%Y-%m-%d %H:%M:%S")
    assert page.inner_text("#status-badge").strip().lower() == "ready"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "deployment-live-filled.png"), full_page=True)


@pytest.mark.django_db
def test_the_live_message_carries_the_ready_time_and_a_rendered_page_marks_its_placeholder():
    from inference.deployments.selectors import snippets

    dep = Deployment(pk=7, name="d", host="h", engine_name="llamacpp", status="ready", port=8123,
                     started=timezone.now(), ready_at=timezone.now())
    m = message_for(dep)
    assert m["ready_at"] == dep.ready_at.isoformat() and m["started"] == dep.started.isoformat()
    assert m["base_url"] == "http://127.0.0.1:8123"
    assert snippets(dep, True)["placeholder"] == ""
    dep.port = None
    assert snippets(dep, True)["placeholder"] == SNIPPET_PLACEHOLDER in snippets(dep, True)["curl"]
