"""What a Chinese-first user sees: the language from the browser, the switch kept
on the account across sessions, API messages in the caller's language with the
same codes, numbers and dates written the language's way."""
import datetime as dt
import json

import httpx
import pytest
from django.template import Context, Template
from django.test import Client
from django.utils import translation

from dashboard.models import Account

ZH = "zh-CN,zh;q=0.9,en;q=0.8"  # what a browser in mainland China sends


def test_the_sign_in_page_follows_accept_language(db):
    client = Client()
    zh = client.get("/login/", HTTP_ACCEPT_LANGUAGE=ZH).content.decode()
    assert '<html lang="zh-hans">' in zh
    assert "登录 Kiln" in zh and "Sign in to Kiln" not in zh
    assert 'src="/jsi18n/"' in zh  # the JS catalogue comes before the page's scripts
    en = Client().get("/login/", HTTP_ACCEPT_LANGUAGE="en-US,en;q=0.9").content.decode()
    assert "Sign in to Kiln" in en and '<html lang="en">' in en
    # Both pages offer the other language in the top bar.
    assert 'value="en"' in zh and 'value="zh-hans"' in en


def test_the_js_catalogue_carries_the_chinese_strings(db):
    cancelling = json.dumps("正在取消…")  # the catalogue is JSON inside the script: \\u escapes
    body = Client().get("/jsi18n/", HTTP_ACCEPT_LANGUAGE=ZH).content.decode("utf-8")
    assert cancelling in body and "django.pluralidx" in body
    assert cancelling not in Client().get("/jsi18n/", HTTP_ACCEPT_LANGUAGE="en").content.decode()


def test_the_switch_is_kept_on_the_account_and_follows_the_user(operator):
    first = Client()
    first.force_login(operator)
    answer = first.post("/language/", {"language": "zh-hans", "next": "/models/"}, HTTP_ACCEPT_LANGUAGE="en")
    assert answer.status_code == 302 and answer["Location"] == "/models/"
    assert answer.cookies["django_language"].value == "zh-hans"
    assert Account.objects.get(user=operator).language == "zh-hans"
    # Another browser, another session, an English browser: the account's choice wins.
    other = Client()
    other.force_login(operator)
    page = other.get("/models/", HTTP_ACCEPT_LANGUAGE="en-US,en").content.decode()
    assert "模型库" in page and "Download from a hub" not in page
    assert other.cookies["django_language"].value == "zh-hans"  # so the sign-in page stays Chinese too
    # Back to English, from either browser.
    other.post("/language/", {"language": "en", "next": "/"})
    assert Account.objects.get(user=operator).language == "en"
    assert "Download from a hub" in first.get("/models/", HTTP_ACCEPT_LANGUAGE=ZH).content.decode()


def test_an_unknown_language_changes_nothing_and_says_why(operator):
    client = Client()
    client.force_login(operator)
    answer = client.post("/language/", {"language": "xx", "next": "/models/"}, follow=True)
    assert answer.redirect_chain[-1][0] == "/models/"
    assert "Unknown language “xx”" in answer.content.decode()
    assert Account.objects.get(user=operator).language == ""


def test_a_foreign_next_address_is_not_followed(db):
    answer = Client().post("/language/", {"language": "zh-hans", "next": "https://evil.example/"})
    assert answer.status_code == 302 and answer["Location"] == "/"


def test_api_errors_keep_their_code_and_speak_the_callers_language(operator):
    en = Client().get("/api/models/", HTTP_ACCEPT_LANGUAGE="en").json()["error"]
    zh = Client().get("/api/models/", HTTP_ACCEPT_LANGUAGE=ZH).json()["error"]
    assert en["code"] == zh["code"] == "not_authenticated"
    assert en["message"].startswith("Sign in first") and zh["message"] == "请先登录：此接口需要 Kiln 会话。"
    client = Client()
    client.force_login(operator)
    gone = client.get("/api/nowhere", HTTP_ACCEPT_LANGUAGE=ZH)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    assert "处没有任何内容" in gone.json()["error"]["message"]


def test_model_choice_labels_and_form_errors_are_translated(db):
    from inference.models import Deployment

    with translation.override("zh-hans"):
        assert str(Deployment.Status.READY.label) == "就绪"
        from dashboard.forms import AccountCreateForm

        form = AccountCreateForm({"username": "bad name!", "role": "viewer"})
        assert not form.is_valid() and "只能使用字母" in form.errors["username"][0]
    with translation.override("en"):
        assert str(Deployment.Status.READY.label) == "Ready"


def test_numbers_sizes_and_dates_are_written_the_languages_way():
    template = Template('{% load kiln_format %}{{ size|binarysize }}|{{ n|grouped }}|{{ x|floatformat:"1g" }}|'
                        '{{ when|date:"DATETIME_FORMAT" }}|{{ when|date:"SHORT_DATETIME_FORMAT" }}')
    values = Context({"size": 12.5 * 1024**3, "n": 1234567, "x": 920192.25, "when": dt.datetime(2026, 12, 3, 10, 5)})
    with translation.override("zh-hans"):
        assert template.render(values) == "12.5 GiB|1,234,567|920,192.3|2026年12月3日 10:05|2026-12-03 10:05"
    with translation.override("en"):
        assert template.render(values) == "12.5 GiB|1,234,567|920,192.3|3 Dec 2026, 10:05|2026-12-03 10:05"


def test_the_gateway_answers_in_the_callers_language(asgi_server):
    """/v1/ runs outside Django's middleware (its own ASGI doors): the language still follows Accept-Language."""
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
    zh = httpx.post(f"{asgi_server}/v1/chat/completions", json=body, headers={"Accept-Language": ZH}, timeout=10)
    en = httpx.post(f"{asgi_server}/v1/chat/completions", json=body, headers={"Accept-Language": "en"}, timeout=10)
    assert zh.status_code == en.status_code == 401
    assert zh.json()["error"]["code"] == en.json()["error"]["code"] == "missing_api_key"
    assert "缺少 API 密钥" in zh.json()["error"]["message"] and en.json()["error"]["message"].startswith("No API key")
    keyed = httpx.post(f"{asgi_server}/v1/chat/completions", json=body, timeout=10,
                       headers={"Accept-Language": ZH, "Authorization": "Bearer kiln-nosuchkey"})
    assert keyed.status_code == 401 and keyed.json()["error"]["code"] == "invalid_api_key"
    assert "API 密钥错误或已被吊销" in keyed.json()["error"]["message"]


@pytest.mark.browser
def test_a_chinese_browser_gets_chinese_script_text(asgi_server, browser):
    """The page's scripts translate through the catalogue /jsi18n/ loads before them."""
    page = browser.new_page()
    page.set_extra_http_headers({"Accept-Language": ZH})
    page.goto(f"{asgi_server}/login/")
    assert page.evaluate("gettext('Cancelling…')") == "正在取消…"
    assert page.evaluate("interpolate(ngettext('%(count)s error', '%(count)s errors', 3), {count: 3}, true)") == "3 个错误"
    assert page.inner_text("h1") == "登录 Kiln"
    page.click("button[name=language][value=en]")
    page.wait_for_selector("text=Sign in to Kiln")
    assert page.evaluate("gettext('Cancelling…')") == "Cancelling…"


def test_an_engines_failure_hint_is_shown_in_the_readers_language(operator, tmp_path):
    """The worker stores the engine's hint in English; the page and the API show it translated."""
    from inference.engines.llamacpp import LlamaCppEngine
    from inference.models import Deployment
    from tests.deployments.helpers import make_deployment, make_profile

    hint = next(r.hint for r in LlamaCppEngine.failure_rules if r.code == "out_of_memory")
    dep = make_deployment(make_profile(host="testhost", runtime_path=str(tmp_path / "llama-server")))
    Deployment.objects.filter(pk=dep.pk).update(status=Deployment.Status.FAILED, failure="out_of_memory", hint=hint)
    client = Client()
    client.force_login(operator)
    page = client.get(f"/deployments/{dep.pk}/", HTTP_ACCEPT_LANGUAGE=ZH).content.decode()
    assert "内存不足" in page and hint not in page
    api = client.get(f"/api/deployments/{dep.pk}", HTTP_ACCEPT_LANGUAGE=ZH).json()
    assert "内存不足" in api["deployment"]["hint"]
    assert client.get(f"/api/deployments/{dep.pk}", HTTP_ACCEPT_LANGUAGE="en").json()["deployment"]["hint"] == hint


def test_a_language_picked_on_the_sign_in_page_is_kept_on_the_account(operator):
    client = Client()
    client.post("/language/", {"language": "zh-hans", "next": "/login/"})
    assert Account.objects.get(user=operator).language == ""
    assert client.post("/login/", {"username": operator.username, "password": operator.plain_password}).status_code == 302
    assert Account.objects.get(user=operator).language == "zh-hans"
    fresh = Client()
    fresh.force_login(operator)
    assert "模型库" in fresh.get("/models/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
