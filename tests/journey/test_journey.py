"""A new user's first visit, in a real browser against everything real: sign in with the
one-time password, choose a password, start the demo from the Overview, chat with it in
the Playground and get a sensible answer, run a small benchmark, open the compare page,
switch language. Full-page screenshots of each page at 1400 px and 420 px wide go to
test-artifacts/journey/."""

import json
import os
import shlex
import subprocess

import pytest

from inference.models import BenchmarkRun, Deployment
from tests.helpers import REPO, needs_llama, wait_until

pytestmark = [needs_llama, pytest.mark.engine, pytest.mark.browser, pytest.mark.timeout(900)]
SHOTS = REPO / "test-artifacts" / "journey"
NEW_PASSWORD = "glaze-and-fire-2026"
# Template tokens, or a turn label: the answer ran on into a turn the base demo model invented.
TURN_JUNK = ("<|im_", "<start_of_turn>", "<end_of_turn>", "User:", "Assistant:")


def shoot(page, name, lang):
    """The page at 1400 px and at 420 px (a phone); at 420 px nothing may stick out sideways."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    for width in (1400, 420):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(300)
        page.screenshot(path=str(SHOTS / f"{lang}-{name}-{width}.png"), full_page=True)
        if width == 420:
            overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 2, f"{name} at 420 px is {overflow} px wider than the screen"
    page.set_viewport_size({"width": 1400, "height": 900})


def test_first_visit_from_sign_in_to_a_benchmark_in_both_languages(
        asgi_server, celery_worker, monitor_process, browser, db):
    from dashboard import services

    user, one_time = services.account_create(username="mei", role="operator")
    page = browser.new_page()
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(asgi_server + "/login/")
    shoot(page, "sign-in", "en")
    page.fill("input[name=username]", "mei")
    page.fill("input[name=password]", one_time)
    page.click("button[type=submit]")
    page.wait_for_url("**/password/**")
    page.fill("input[name=old_password]", one_time)
    page.fill("input[name=new_password1]", NEW_PASSWORD)
    page.fill("input[name=new_password2]", NEW_PASSWORD)
    page.click("button[type=submit]")
    page.goto(asgi_server + "/")
    assert page.is_visible("#next-step") and page.is_visible("a[href='/deployments/plan']")
    shoot(page, "overview-first", "en")
    if page.is_visible("#hub-choice"):
        page.click("#hub-choice button[value=modelscope]")
    # The menu folds on a phone and opens with its button.
    page.set_viewport_size({"width": 420, "height": 900})
    assert page.is_hidden("#nav-sections a[href='/playground/']")
    page.click("#nav-toggle")
    assert page.is_visible("#nav-sections a[href='/playground/']")
    page.set_viewport_size({"width": 1400, "height": 900})

    page.click("#start-demo")
    page.wait_for_url("**/deployments/*/")
    dep = Deployment.objects.latest("pk")
    page.wait_for_function("() => document.getElementById('status-badge').dataset.status === 'ready' "
                           "|| document.getElementById('status-badge').textContent.trim().toLowerCase() === 'ready'",
                           timeout=240000)
    page.wait_for_function("() => !document.getElementById('snippet-curl').textContent.includes('PORT')",
                           timeout=30000)
    assert page.inner_text("#ready-at") != "—"
    shoot(page, "deployment-ready", "en")

    page.goto(asgi_server + "/playground/")
    page.fill("#pg-temperature", "0")
    page.fill("#pg-max-tokens", "60")
    page.fill("#pg-input", "What is the capital of France?")
    page.click("#pg-send")
    stats = page.wait_for_selector(".msg.assistant .stats", timeout=180000).inner_text()
    answer = page.inner_text(".msg.assistant .text")
    assert "error" not in stats and "Paris" in answer, (answer, stats)
    # No template tokens, and no "User:" turn the base model went on to invent: the answer
    # ended after its own turn (the demo preset's stop, added by the gateway), not at max tokens.
    assert not any(junk in answer for junk in TURN_JUNK), answer
    assert page.get_attribute(".msg.assistant", "data-finish-reason") == "stop", (answer, stats)
    shoot(page, "playground", "en")

    # The deployment page's curl snippet, pasted into a terminal, answers and stops too.
    page.goto(f"{asgi_server}/deployments/{dep.pk}/")
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    out = subprocess.run(shlex.split(page.inner_text("#snippet-curl")), capture_output=True, text=True,
                         timeout=120, check=True, env=env)
    choice = json.loads(out.stdout)["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"].strip(), choice
    assert not any(junk in choice["message"]["content"] for junk in TURN_JUNK), choice

    page.goto(asgi_server + "/benchmarks/")
    page.select_option("select[name=deployment]", str(dep.pk))
    page.click("#new-run-form summary")
    page.fill("input[name=num_prompts]", "2")
    page.fill("input[name=num_warmups]", "0")
    page.fill("input[name=output_tokens]", "16")
    page.fill("input[name=concurrency]", "1")
    page.click("#start-run")
    run = wait_until(lambda: BenchmarkRun.objects.filter(deployment=dep, status__in=("succeeded", "failed")).first(),
                     300, "the benchmark run")
    assert run.status == "succeeded", run.error if hasattr(run, "error") else run
    page.goto(asgi_server + "/benchmarks/")
    shoot(page, "benchmarks", "en")
    page.goto(f"{asgi_server}/benchmarks/compare?ids={run.pk}")
    shoot(page, "compare", "en")

    for path, name in (("/", "overview"), ("/deployments/", "deployments"), ("/deployments/plan", "plan"),
                       ("/models/", "models"), ("/monitoring/", "monitoring"), ("/keys/", "keys"),
                       ("/users/", "users")):
        page.goto(asgi_server + path)
        shoot(page, name, "en")

    # Switch language: the same pages in Simplified Chinese.
    page.goto(asgi_server + "/")
    page.click("form.language-switch button[value=zh-hans]")
    page.wait_for_function("() => document.documentElement.lang.toLowerCase().startsWith('zh')", timeout=10000)
    for path, name in (("/", "overview"), (f"/deployments/{dep.pk}/", "deployment"), ("/playground/", "playground"),
                       ("/benchmarks/", "benchmarks"), (f"/benchmarks/compare?ids={run.pk}", "compare"),
                       ("/deployments/plan", "plan")):
        page.goto(asgi_server + path)
        shoot(page, name, "zh-hans")
    page.goto(asgi_server + "/playground/")
    page.fill("#pg-temperature", "0")
    page.fill("#pg-input", "What is the capital of France?")
    page.click("#pg-send")
    page.wait_for_selector(".msg.assistant .stats", timeout=180000)
    answer = page.inner_text(".msg.assistant .text")
    assert "Paris" in answer and not any(junk in answer for junk in TURN_JUNK), answer
    assert page.get_attribute(".msg.assistant", "data-finish-reason") == "stop", answer

    page.goto(f"{asgi_server}/deployments/{dep.pk}/")
    page.on("dialog", lambda d: d.accept())
    page.click("#stop-button")
    wait_until(lambda: Deployment.objects.get(pk=dep.pk).status == "stopped", 60, "the demo stopped")
