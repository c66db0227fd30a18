"""The Content-Security-Policy in Chromium: every main page, the API docs (Swagger
UI) and the plotly charts work under it, and the browser reports no violation.

The panel is opened under a real-looking name (kiln.test, mapped to 127.0.0.1 in
Chromium) rather than 127.0.0.1: Swagger UI, for one, fetches a validator badge
from the internet for any host that is not localhost."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests.helpers import REPO, child_env, stop_group

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NAME = "kiln.test"

# Every violation the page sees, even one raised before our listeners could attach.
REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (e) => {
  console.error("CSP violation: " + e.violatedDirective + " blocked " + (e.blockedURI || "inline")
                + " at " + e.sourceFile + ":" + e.lineNumber);
});
"""


@pytest.fixture
def named_server(transactional_db, monkeypatch, request):
    """The real ASGI server (tests/conftest.py), answering to kiln.test too. It is
    asked for by name after ALLOWED_HOSTS is set, so the database it shares must be
    asked for here: a test wrapped in a transaction would keep it locked."""
    monkeypatch.setenv("ALLOWED_HOSTS", f"{NAME},127.0.0.1")
    url = request.getfixturevalue("asgi_server")
    return url.replace("127.0.0.1", NAME)


@pytest.fixture
def named_browser():
    """Debian's Chromium, resolving kiln.test to this machine."""
    from playwright.sync_api import sync_playwright

    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # the test's ORM calls beside Playwright's loop
    profile = tempfile.mkdtemp(prefix="kiln-chromium-")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  f"--host-resolver-rules=MAP {NAME} 127.0.0.1"])
        yield context
        context.close()
    shutil.rmtree(profile, ignore_errors=True)
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


@pytest.fixture
def fake_monitor(named_server, tmp_path):
    log = tmp_path / "monitor.log"
    process = subprocess.Popen(
        [sys.executable, "manage.py", "monitor", "--interval", "0.5"], cwd=REPO,
        env=child_env(KILN_NVML_LIB="tests.fakenvml:two_gpus"), stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    yield process
    stop_group(process)


VLLM_RESULT = {"date": "20260101-000000", "backend": "vllm", "model_id": "Qwen/Qwen3-8B", "num_prompts": 100,
               "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 16, "duration": 20.0,
               "completed": 100, "failed": 0, "total_input_tokens": 102400, "total_output_tokens": 12800,
               "request_throughput": 5.0, "request_goodput": None, "output_throughput": 640.0,
               "total_token_throughput": 5760.0, "mean_ttft_ms": 120.0, "median_ttft_ms": 110.0,
               "std_ttft_ms": 5.0, "p99_ttft_ms": 200.0, "mean_tpot_ms": 20.0, "median_tpot_ms": 20.0,
               "std_tpot_ms": 1.0, "p99_tpot_ms": 25.0, "mean_itl_ms": 20.0, "median_itl_ms": 19.0,
               "std_itl_ms": 2.0, "p99_itl_ms": 40.0}


@pytest.mark.browser
def test_pages_work_under_the_policy(named_server, fake_monitor, named_browser, operator):
    from inference.benchmarks.services import benchmark_import
    run = benchmark_import(data=json.dumps(VLLM_RESULT).encode(), file_name="qwen-c16.json", user=operator)
    page = named_browser.new_page()
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.add_init_script(REPORT_VIOLATIONS)
    complaints, errors = [], []

    def on_console(message):
        if "Content Security Policy" in message.text or "CSP violation" in message.text:
            complaints.append(f"{page.url}: {message.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda e: errors.append(f"{page.url}: {e}"))

    page.goto(f"{named_server}/login/")
    page.fill("input[name=username]", operator.username)
    page.fill("input[name=password]", operator.plain_password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{named_server}/")

    def visit(path):
        response = page.goto(f"{named_server}{path}")
        assert response.status == 200, path
        script_src = [d.strip() for d in response.headers["content-security-policy"].split(";") if "script-src" in d]
        assert script_src == ["script-src 'self'"], (path, script_src)

    for path in ("/", "/models/", "/deployments/", "/benchmarks/"):
        visit(path)
        # The live websocket (ws://kiln.test:<port>/ws/live/) connects under connect-src.
        page.wait_for_selector("#live-dot.on", state="attached", timeout=15000)

    visit(f"/benchmarks/{run.pk}/")
    page.locator("#chart-throughput .plot-container").wait_for(timeout=30000)
    page.locator("#chart-percentiles .plot-container").wait_for(timeout=30000)

    visit("/monitoring/")
    page.wait_for_selector(".gpu-card >> nth=1", timeout=30000)
    chart = "gpu-testhost-0-load"
    page.wait_for_function(f"() => (document.getElementById('{chart}').data || [{{x: []}}])[0].x.length >= 3",
                           timeout=20000)
    assert page.locator(f"#{chart} .main-svg").count() >= 1

    visit("/api/docs")
    page.wait_for_selector(".opblock", timeout=30000)  # Swagger UI drew the operations
    page.locator(".opblock-summary").first.click()
    page.wait_for_timeout(1000)  # time for anything late (a validator badge) to be tried and refused

    assert complaints == [], "\n".join(complaints)
    assert errors == [], "\n".join(errors)

    # The control: an inline script is refused, and the listeners above hear of it.
    page.evaluate("""() => document.body.appendChild(
        Object.assign(document.createElement("script"), {textContent: "window.inlineRan = true"}))""")
    page.wait_for_timeout(500)
    assert page.evaluate("() => window.inlineRan") is None
    assert any("script-src" in c for c in complaints), complaints
