"""The playground and API keys pages in Chromium, against the real llama-server."""


import httpx
import pytest

from inference.models import ApiKey, UsageRecord
from tests.gateway.test_gateway import DEMO, deployment, start_llama
from tests.helpers import REPO, needs_llama, wait_until

ARTIFACTS = REPO / "test-artifacts"
pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


def sign_in(page, base, user):
    page.goto(base + "/login/")
    page.fill("input[name=username]", user.username)
    page.fill("input[name=password]", user.plain_password)
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")


@needs_llama
@pytest.mark.engine
def test_playground_streams_an_answer_and_shows_ttft_and_tokens_per_second(tmp_path, asgi_server, browser, viewer):
    from inference.deployments import supervisor

    llama = start_llama(tmp_path / "llama.log")
    try:
        deployment("gemma demo", llama.port, handle=llama.handle)
        page = browser.new_page()
        sign_in(page, asgi_server, viewer)
        page.click("nav.sections >> text=Playground")
        page.wait_for_url(asgi_server + "/playground/")
        assert DEMO in page.inner_text("#pg-model")
        page.fill("#pg-system", "You are a friendly potter. Answer briefly.")
        page.fill("#pg-temperature", "0.2")
        page.fill("#pg-max-tokens", "40")
        page.fill("#pg-input", "What is a kiln?")
        page.click("#pg-send")
        # Text appears while the answer streams, before the stats line.
        page.wait_for_function("() => document.querySelector('.msg.assistant .text')?.textContent.length > 0",
                               timeout=60000)
        stats = page.wait_for_selector(".msg.assistant .stats", timeout=120000).inner_text()
        assert "TTFT" in stats and "tok/s" in stats and "40 tokens" in stats, stats
        assert "error" not in stats
        answer = page.inner_text(".msg.assistant .text")
        assert answer.strip()
        page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=True)
        # A follow-up carries the history; both answers have their own figures.
        page.fill("#pg-input", "And how hot does it get?")
        page.click("#pg-send")
        wait_until(lambda: len(page.query_selector_all(".msg.assistant .stats")) == 2, 120, "second answer")
        def both():
            rows = list(UsageRecord.objects.filter(user=viewer, key=None))
            return sum(r.requests for r in rows) == 2 and rows
        rows = wait_until(both, 10, "both answers counted against the viewer")
        assert sum(r.completion_tokens for r in rows) > 0
    finally:
        supervisor.stop(llama.handle, grace_s=5)


def test_keys_page_creates_a_key_shown_once_that_works_and_revokes_it(asgi_server, browser, viewer, operator):
    from tests.sse_stub import running_stub

    with running_stub() as stub:
        deployment("stub", stub.port, model="stub-model")
        page = browser.new_page()
        sign_in(page, asgi_server, operator)  # creating and revoking keys is an operator's action
        page.click("text=API keys")
        page.wait_for_url(asgi_server + "/keys/")
        page.fill("input[name=name]", "my notebook")
        page.fill("input[name=rate_limit]", "30")
        page.check("input[name=allowed_models][value=stub-model]")
        page.click("text=Create key")
        secret = page.inner_text("#new-key-secret")
        assert secret.startswith("kiln-") and len(secret) > 40
        row = ApiKey.objects.get(user=operator)
        assert row.allowed_models == ["stub-model"] and row.rate_limit == 30 and secret not in row.hashed_key
        assert row.prefix in page.inner_text("#keys-table")

        for _ in range(3):
            r = httpx.post(asgi_server + "/v1/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                           json={"model": "stub-model", "messages": [{"role": "user", "content": "a b"}],
                                 "max_tokens": 5})
            assert r.status_code == 200
        wait_until(lambda: UsageRecord.objects.filter(key=row).exists(), 10, "usage written")
        page.reload()
        assert page.query_selector("#new-key-secret") is None  # shown once
        usage = page.inner_text("#usage-keys")
        assert "my notebook" in usage and "\t3\t0\t6\t15" in usage
        assert "stub #" in page.inner_text("#usage-deployments")
        page.wait_for_selector("#chart-keys .main-svg")
        page.screenshot(path=str(ARTIFACTS / "keys.png"), full_page=True)

        page.on("dialog", lambda d: d.accept())
        page.click("#keys-table >> text=Revoke")
        page.wait_for_selector("text=revoked")
        r = httpx.post(asgi_server + "/v1/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                       json={"model": "stub-model", "messages": [{"role": "user", "content": "a b"}]})
        assert r.status_code == 401

    # A viewer sees only their own keys, no buttons, and cannot revoke a key (403); the operator sees everyone's.
    from inference.gateway import keys

    other, _ = keys.key_create(user=operator, name="ops")
    browser.clear_cookies()
    sign_in(page, asgi_server, viewer)
    page.goto(asgi_server + "/keys/")
    table = page.query_selector("#keys-table")  # the viewer has no keys: "No keys yet."
    assert (table is None or "ops" not in table.inner_text()) and page.query_selector("text=Create key") is None
    token = [c["value"] for c in browser.cookies() if c["name"] == "csrftoken"][0]
    refused = page.request.post(f"{asgi_server}/keys/{other.pk}/revoke", headers={"X-CSRFToken": token})
    assert refused.status == 403 and ApiKey.objects.get(pk=other.pk).revoked is None
