"""End to end with everything real: the API (or the browser) -> a Celery worker
on the host queue -> llama-server with the Gemma demo -> the monitor process
marks it ready -> a chat completion through the OpenAI endpoint -> stop ->
no process left."""
import json
from pathlib import Path

import psutil
import pytest
from django.conf import settings
from django.test import Client

from inference.deployments import services as svc
from inference.models import Deployment, ModelArtifact
from inference.deployments.presets import GEMMA_DEMO
from inference.deployments.supervisor import group_members, port_is_free
from tests.helpers import REPO, demo_model_path, needs_llama, wait_until

pytestmark = [needs_llama, pytest.mark.engine, pytest.mark.postgres, pytest.mark.timeout(400)]
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture
def demo_model(transactional_db):
    """The demo GGUF as the model library registers it (a ready ModelArtifact)."""
    path = demo_model_path()
    return ModelArtifact.objects.create(name="Gemma 3 270M (demo)", source="local", repo_id=GEMMA_DEMO.model.repo_id,
                                        host=settings.HOST_NAME, path=path, format="gguf", status="ready")


def engine_processes(dep):
    """Every process of the engine's group still alive (zombies excluded)."""
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and psutil.os.getpgid(p.info["pid"]) == dep.pgid:
                out.append(p.info["pid"])
        except (ProcessLookupError, psutil.Error):
            pass
    return out


def test_launch_the_gemma_demo_through_the_api_chat_with_it_and_stop_it(
        celery_worker, monitor_process, demo_model, operator):
    svc.ensure_demo_runtime()
    client = Client()
    client.force_login(operator)
    r = client.post("/api/deployments/", json.dumps({"preset": GEMMA_DEMO.slug}), content_type="application/json")
    assert r.status_code == 202, r.content
    dep_id = r.json()["deployment"]["id"]

    def status():
        return client.get(f"/api/deployments/{dep_id}").json()["deployment"]

    d = wait_until(lambda: (lambda d: d if d["status"] in ("ready", "failed") else None)(status()), 180,
                   "deployment ready", interval=0.5)
    assert d["status"] == "ready", (d["failure"], d["hint"], d["log_tail"])
    phases = [p["phase"] for p in d["phases"]]
    assert phases[:2] == ["queued", "starting"] and "loading_weights" in phases and phases[-1] == "ready"
    assert d["command"].startswith("CUDA_VISIBLE_DEVICES='' ") and "--alias gemma-3-270m" in d["command"]
    assert d["base_url"] == f"http://127.0.0.1:{d['port']}"

    from openai import OpenAI

    ai = OpenAI(base_url=d["openai_base_url"], api_key="none", timeout=120)
    reply = ai.chat.completions.create(model="gemma-3-270m", max_tokens=8,
                                       messages=[{"role": "user", "content": "Say hi"}])
    assert reply.choices[0].message.content is not None and reply.usage.completion_tokens >= 1

    dep = Deployment.objects.get(pk=dep_id)
    assert engine_processes(dep)  # llama-cpp-server and its llama-server child
    assert Path(dep.log_path).read_text().count("--- kiln: starting") == 1, Path(dep.log_path).read_text()[:3000]
    r = client.post(f"/api/deployments/{dep_id}/stop")
    assert r.status_code == 202 and r.json()["deployment"]["status"] == "stopping"
    wait_until(lambda: status()["status"] == "stopped", 60, "deployment stopped", interval=0.25)
    assert engine_processes(dep) == [] and group_members(dep.pgid, dep.start_time) == []
    assert port_is_free("127.0.0.1", dep.port)
    assert [p["phase"] for p in status()["phases"]][-2:] == ["stopping", "stopped"]


@pytest.mark.browser
def test_launch_the_gemma_preset_from_the_page_watch_it_get_ready_live_and_stop_it(
        asgi_server, celery_worker, monitor_process, demo_model, operator, browser):
    svc.ensure_demo_runtime()
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page()
    # What the live websocket brings: log lines of this deployment must arrive
    # there (not only in the page's first render, which a fast engine may beat).
    frames = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(payload)))
    page.goto(f"{asgi_server}/login/")
    page.fill("input[name=username]", operator.username)
    page.fill("input[name=password]", operator.plain_password)
    page.click("button[type=submit]")
    page.goto(f"{asgi_server}/deployments/")
    page.wait_for_selector("#live-dot.on", timeout=15000)
    page.click(f'[data-preset="{GEMMA_DEMO.slug}"] button')
    page.wait_for_url("**/deployments/*/", timeout=15000)
    page.wait_for_selector("#live-dot.on", timeout=15000)
    dep_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    badge = page.locator("#status-badge")
    page.wait_for_function("() => document.getElementById('status-badge').textContent.trim() === 'Ready'", timeout=180000)
    assert "green" in badge.get_attribute("class")
    page.wait_for_timeout(500)
    log_text = page.locator("#log").inner_text()
    live = [json.loads(f) for f in frames if isinstance(f, str) and '"deployment"' in f]
    live_lines = [line for m in live if m.get("id") == dep_id for line in m.get("lines", [])]
    assert live_lines, "no log line reached the page over the websocket"
    assert all(line in log_text for line in live_lines[-5:])  # the tail shows what arrived live
    assert "model loaded" in log_text
    assert log_text.count("--- kiln: starting") == 1  # live lines the page already showed are not repeated
    assert "ready" in page.locator("#timeline").inner_text()
    assert "curl" in page.locator("#snippet-curl").inner_text()
    page.screenshot(path=str(ARTIFACTS / "deployment-detail-ready.png"), full_page=True)

    page.goto(f"{asgi_server}/deployments/")
    row_badge = page.locator(f'#deployments tr[data-id="{dep_id}"] [data-role=status]')
    assert row_badge.inner_text() == "Ready"
    page.screenshot(path=str(ARTIFACTS / "deployments-list.png"), full_page=True)

    page.goto(f"{asgi_server}/deployments/{dep_id}/")
    page.once("dialog", lambda dialog: dialog.accept())  # Stop asks first
    page.click("#stop-button")
    page.wait_for_function("() => document.getElementById('status-badge').textContent.trim() === 'Stopped'", timeout=60000)
    # The page reloads itself once stopped, to offer "Launch again" instead of Stop.
    page.wait_for_selector("#restart-button", timeout=15000)
    page.screenshot(path=str(ARTIFACTS / "deployment-detail-stopped.png"), full_page=True)
    dep = Deployment.objects.get(pk=dep_id)
    assert dep.status == "stopped" and engine_processes(dep) == []
    page.goto(f"{asgi_server}/deployments/profiles/new")
    page.fill("input[name=extra_args]", "--threads 2 && reboot")
    page.wait_for_function("() => document.querySelector('[data-errors=extra_args]').textContent.includes('shell')",
                           timeout=10000)
    page.screenshot(path=str(ARTIFACTS / "profile-form.png"), full_page=True)
