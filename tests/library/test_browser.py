"""The Models page in Chromium: a download started from the browser shows a moving
progress bar, turns Ready live over the websocket, and is still listed after a reload."""
import os

import pytest

from inference.models import ModelArtifact
from tests.helpers import REPO
from tests.library.helpers import MiB

ARTIFACTS = REPO / "test-artifacts"


def sign_in(page, base, user):
    page.goto(base + "/login/")
    page.fill("input[name=username]", user.username)
    page.fill("input[name=password]", user.plain_password)
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")


@pytest.mark.browser
def test_download_from_the_browser_with_live_progress(browser, asgi_server, worker, operator, hub, models_dir):
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page()
    sign_in(page, asgi_server, operator)
    page.goto(asgi_server + "/models/")
    page.wait_for_selector("#live-dot.on")

    # A listing error is a clear message under the form.
    page.fill("#add-form input[name=repo_id]", "org/Nope")
    page.click("text=Endpoint and token")
    page.fill("#add-form input[name=endpoint]", hub.url)
    page.click("#preview-button")
    page.wait_for_selector("#add-error:not([hidden])")
    assert "Model org/Nope was not found" in page.inner_text("#add-error")

    page.fill("#add-form input[name=repo_id]", "org/Big")
    page.fill("#add-form input[name=include]", "big.gguf")
    page.click("#preview-button")
    page.wait_for_selector("#preview:not([hidden])")
    summary = page.inner_text("#preview-summary")
    assert "1 file, 64.0 MiB" in summary and "fits" in summary
    assert page.inner_text("#preview-files") .count("big.gguf") == 1
    page.screenshot(path=str(ARTIFACTS / "models-preview.png"), full_page=True)

    hub.throttle_bps = 12 * MiB  # about five seconds: long enough to watch the bar
    page.click("#confirm-download")
    row = page.wait_for_selector("#models tbody tr")
    pk = int(row.get_attribute("data-id"))
    widths = set()
    for _ in range(200):
        width = page.eval_on_selector(f"#model-{pk} .bar > span", "e => parseFloat(e.style.width)")
        widths.add(width)
        if 0 < width < 100 and len([w for w in widths if 0 < w < 100]) >= 2:
            break
        page.wait_for_timeout(50)
    moving = sorted(w for w in widths if 0 < w < 100)
    assert len(moving) >= 2, f"the progress bar did not move: {sorted(widths)}"
    assert "MiB/s" in page.inner_text(f"#model-{pk}")
    page.screenshot(path=str(ARTIFACTS / "models-downloading.png"), full_page=True)

    page.wait_for_selector(f"#model-{pk} .badge:text('Ready')", timeout=60_000)
    assert ModelArtifact.objects.get(pk=pk).status == "ready"
    page.screenshot(path=str(ARTIFACTS / "models-ready.png"), full_page=True)

    page.reload()
    page.wait_for_selector(f"#model-{pk} .badge:text('Ready')")
    assert "org/Big" in page.inner_text("#models")

    page.click(f"#model-{pk} a")
    page.wait_for_selector("#files")
    assert "big.gguf" in page.inner_text("#files")
    assert ModelArtifact.objects.get(pk=pk).recorded_hashes["big.gguf"] in page.inner_text("#files")
    page.screenshot(path=str(ARTIFACTS / "model-detail.png"), full_page=True)
    page.click("button[data-action=reverify]")
    page.wait_for_selector("#verify-result:text('All 1 files match')", timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "model-detail-verified.png"), full_page=True)
    assert os.path.isfile(ModelArtifact.objects.get(pk=pk).path)
