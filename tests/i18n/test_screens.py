"""The main pages in Chinese in Chromium, at desktop (1400 px) and phone (420 px)
width: every page answers in Chinese, the top bar with its language switch fits the
phone's width, and full-page screenshots go to test-artifacts/i18n/ for a person
to look at (long Chinese labels, truncation)."""
from pathlib import Path

import pytest

from tests.helpers import REPO

PAGES = {  # path -> a Chinese word the page shows
    "/": "总览",
    "/models/": "模型库",
    "/deployments/": "推理引擎运行时",
    "/monitoring/": "监控",
    "/monitoring/history": "监控历史",
    "/benchmarks/": "基准测试",
    "/deployments/plan": "预检",
    "/audit/": "审计日志",
    "/keys/": "创建密钥",
    "/playground/": "对话测试",
    "/users/": "添加用户",
}
SHOTS = Path(REPO) / "test-artifacts" / "i18n"


@pytest.mark.browser
def test_main_pages_in_chinese_at_desktop_and_phone_width(asgi_server, browser, operator):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page()
    page.set_extra_http_headers({"Accept-Language": "zh-CN,zh;q=0.9"})
    page.goto(f"{asgi_server}/login/")
    page.fill("input[name=username]", operator.username)
    page.fill("input[name=password]", operator.plain_password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{asgi_server}/")
    problems = []
    for width in (1400, 420):
        page.set_viewport_size({"width": width, "height": 900})
        for path, word in PAGES.items():
            page.goto(f"{asgi_server}{path}")
            page.wait_for_load_state("networkidle")
            text = page.inner_text("body")
            if word not in text:
                problems.append(f"{path} at {width} px does not show {word!r}")
            header_width = page.evaluate("document.querySelector('header.topbar').scrollWidth")
            if header_width > width:
                problems.append(f"{path} at {width} px: the top bar is {header_width} px wide")
            name = path.strip("/").replace("/", "-") or "home"
            page.screenshot(path=str(SHOTS / f"zh-{name}-{width}.png"), full_page=True)
    assert not problems, "\n".join(problems)
