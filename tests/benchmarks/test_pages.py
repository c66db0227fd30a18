"""The Benchmarks pages in Chromium: start a "decode, single stream" run on the
demo deployment, watch its progress, open two runs side by side.

Screenshots land in test-artifacts/ (git ignores it)."""

import pytest

from inference.models import BenchmarkRun
from tests.helpers import REPO, wait_until

ARTIFACTS = REPO / "test-artifacts"


def shot(page, name):
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def start_from_form(page, label, **overrides):
    page.select_option("select[name=scenario]", "decode-single-stream")
    page.fill("#new-run-form input[name=label]", label)
    page.evaluate("document.querySelector('#new-run-form details').open = true")
    for name, value in overrides.items():
        page.fill(f"#new-run-form input[name={name}]", str(value))
    page.click("#start-run")


@pytest.mark.browser
def test_start_watch_and_compare_runs_in_the_browser(asgi_server, celery_worker, demo_deployment, browser, operator):
    page = browser.new_page()
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(asgi_server + "/login/")
    page.fill("input[name=username]", operator.username)
    page.fill("input[name=password]", operator.plain_password)
    page.click("button[type=submit]")
    page.goto(asgi_server + "/benchmarks/")
    assert "Prefill, long prompt (TTFT)" in page.inner_text("select[name=scenario]")

    start_from_form(page, "browser run A", num_prompts=6, num_warmups=0, prompt_tokens=32, output_tokens=32)
    row = page.locator("#runs tbody tr").first
    row.locator(".progress").wait_for(timeout=20000)
    # Live progress: the worker's updates reach the row while it runs.
    page.wait_for_function(
        "() => /measure [1-9]\\/6/.test(document.querySelector('#runs tbody tr .progress-text')?.textContent || '')",
        timeout=180000)
    shot(page, "benchmarks-running.png")
    page.wait_for_function(
        "() => document.querySelector('#runs tbody tr .badge')?.textContent.trim() === 'Succeeded'", timeout=240000)
    run_a = BenchmarkRun.objects.get(label="browser run A")
    assert run_a.status == "succeeded" and run_a.result[0]["completed"] == 6

    page.goto(asgi_server + "/benchmarks/")
    start_from_form(page, "browser run B", num_prompts=4, num_warmups=0, prompt_tokens=32, output_tokens=32,
                    concurrency=2)
    wait_until(lambda: BenchmarkRun.objects.filter(label="browser run B", status="succeeded").exists()
               or BenchmarkRun.objects.filter(label="browser run B", status="failed").exists(), 240, "run B")
    run_b = BenchmarkRun.objects.get(label="browser run B")
    assert run_b.status == "succeeded", run_b.error
    page.reload()
    page.wait_for_function(
        "() => [...document.querySelectorAll('#runs tbody .badge')].every((b) => b.textContent.trim() === 'Succeeded')",
        timeout=30000)
    shot(page, "benchmarks-history.png")

    page.check(f"input.pick[value='{run_a.pk}']")
    page.check(f"input.pick[value='{run_b.pk}']")
    page.click("#compare-selected")
    page.wait_for_url("**/benchmarks/compare?ids=*")
    page.locator("#chart-throughput .plot-container").wait_for(timeout=30000)
    table = page.inner_text("#compare-table")
    assert "output_throughput" in table and "×" in table
    # Run B used concurrency 2: the arg diff is empty (same engine), the table shows the load difference.
    assert "The same command line" in page.inner_text("body")
    # CPU host: no bandwidth in the GPU table until the user gives one.
    assert "no memory bandwidth known for CPU" in page.inner_text("#roofline-notes")
    page.fill("input[name=bandwidth]", "20")
    page.click("form.filters button[type=submit]")
    page.locator("#chart-roofline .plot-container").wait_for(timeout=30000)
    assert "GB/s" in page.inner_text("#roofline-notes")
    shot(page, "benchmarks-compare.png")

    page.goto(f"{asgi_server}/benchmarks/{run_a.pk}/")
    page.locator("#chart-percentiles .plot-container").wait_for(timeout=30000)
    assert "llamacpp" in page.inner_text("body") and "CPU" in page.inner_text("body")
    assert page.locator("#export").get_attribute("href") == f"/api/benchmarks/{run_a.pk}/export"
    shot(page, "benchmarks-detail.png")
