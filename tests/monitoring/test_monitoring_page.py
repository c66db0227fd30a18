"""The monitoring pages in Chromium: the real web server, the real `monitor`
command on a fake NVML with two GPUs (an H200 and a V100 with unsupported
fields and a link trained at x8), live charts growing in place."""
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, child_env, stop_group

ARTIFACTS = REPO / "test-artifacts"


def sign_in(page, base, user):
    page.goto(f"{base}/login/")
    page.fill("input[name=username]", user.username)
    page.fill("input[name=password]", user.plain_password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")


@pytest.fixture
def fake_monitor(asgi_server, tmp_path):
    log = tmp_path / "monitor.log"
    process = subprocess.Popen(
        [sys.executable, "manage.py", "monitor", "--interval", "0.5"], cwd=REPO,
        env=child_env(KILN_NVML_LIB="tests.fakenvml:two_gpus"), stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    yield process, log
    stop_group(process)


def points(page, chart_id):
    return page.evaluate(f"() => (document.getElementById('{chart_id}').data || [{{x: []}}])[0].x.length")


@pytest.mark.browser
def test_two_gpu_cards_with_growing_charts(asgi_server, fake_monitor, browser, viewer):
    process, log = fake_monitor
    page = browser.new_page()
    page.set_viewport_size({"width": 1400, "height": 1300})
    sign_in(page, asgi_server, viewer)
    page.goto(f"{asgi_server}/monitoring/")
    page.wait_for_selector(".gpu-card >> nth=1", timeout=30000)
    assert process.poll() is None, Path(log).read_text()
    cards = page.locator(".gpu-card")
    assert cards.count() == 2
    assert "NVIDIA H200" in cards.nth(0).inner_text()
    v100 = cards.nth(1)
    assert "Tesla V100-PCIE-32GB" in v100.inner_text()
    # Unsupported on this card: shown as n/a, nothing crashed.
    assert v100.locator("dd[data-field='Fan']").inner_text() == "n/a"
    assert "n/a" in v100.locator("dd[data-field='Remapped rows']").inner_text()
    assert "PCIe downgraded: Gen3 x8 of Gen3 x16" in v100.locator(".badges").inner_text()
    assert "healthy" in cards.nth(0).locator(".badges").inner_text()

    chart = "gpu-testhost-1-load"
    first = points(page, chart)
    page.wait_for_function(f"() => document.getElementById('{chart}').data[0].x.length >= {first + 3}",
                           timeout=15000)
    assert points(page, "gpu-testhost-0-power") >= first + 3
    # Extended in place: still one plot per chart div, not redrawn ones stacked up.
    assert page.locator(f"#{chart} .plot-container").count() == 1
    assert not page.locator("#no-gpu").is_visible()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "monitoring.png"), full_page=True)

    # History: the monitor has written some rows by now (flush every 5 s).
    page.wait_for_timeout(5500)
    page.goto(f"{asgi_server}/monitoring/history?range=15m")
    page.wait_for_selector(".history-chart .main-svg", timeout=15000)
    assert page.locator(".history-chart").count() == 2
    page.screenshot(path=str(ARTIFACTS / "monitoring-history.png"), full_page=True)


@pytest.mark.browser
def test_no_gpu_state_names_the_reason(asgi_server, browser, viewer, tmp_path):
    log = tmp_path / "monitor.log"
    process = subprocess.Popen(
        [sys.executable, "manage.py", "monitor", "--interval", "0.5"], cwd=REPO,
        env=child_env(KILN_NVML_LIB="tests.fakenvml:no_driver"), stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        page = browser.new_page()
        page.set_viewport_size({"width": 1400, "height": 900})
        sign_in(page, asgi_server, viewer)
        page.goto(f"{asgi_server}/monitoring/")
        page.wait_for_selector("#no-gpu:not([hidden])", timeout=30000)
        assert "No NVIDIA GPU/driver found" in page.locator("#no-gpu").inner_text()
        page.wait_for_function("() => document.getElementById('monitor-line').textContent.includes('sample')",
                               timeout=15000)
        assert "kernel driver is not loaded" in page.locator("#no-gpu-reason").inner_text()
        assert page.locator(".gpu-card").count() == 0
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "monitoring-no-gpu.png"), full_page=True)
    finally:
        stop_group(process)
