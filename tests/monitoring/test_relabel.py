"""Live messages in the reader's language: the monitor and the workers publish English
labels (they handle no request); the websocket consumer rewrites them per tab."""
import pytest
from django.utils import translation
from django.utils.translation import gettext

from inference.deployments import phases
from monitoring.relabel import reader_language, relabel


def deployment_message(**fields):
    return {"type": "deployment", "id": 1, "status": "ready", "status_label": "Ready", "phase": "loading_weights",
            "phases": [{"phase": "queued", "at": 1.0}, {"phase": "loading_weights", "at": 2.0}],
            "hint": "", **fields}


def test_a_deployment_message_reads_in_chinese_for_a_chinese_tab():
    out = relabel(deployment_message(), "zh-hans")
    assert out["status_label"] == "就绪"
    with translation.override("zh-hans"):
        assert out["phase_label"] == gettext("loading weights")
        assert [p["label"] for p in out["phases"]] == [gettext("queued"), gettext("loading weights")]
    assert [p["phase"] for p in out["phases"]] == ["queued", "loading_weights"]  # codes kept for the page's classes


def test_an_english_tab_gets_labels_not_phase_codes():
    out = relabel(deployment_message(), "en")
    assert out["status_label"] == "Ready" and out["phase_label"] == "loading weights"
    assert out["phases"][1]["label"] == "loading weights"


def test_an_engine_hint_is_translated_and_other_messages_pass_untouched():
    from inference.engines.llamacpp import LlamaCppEngine
    from inference.models import EngineRuntime

    oom = next(r.hint for r in LlamaCppEngine.failure_rules if r.code == "out_of_memory")
    out = relabel(deployment_message(status="failed", status_label="Failed", hint=oom), "zh-hans")
    assert "内存不足" in out["hint"] and out["status_label"] != "Failed"
    assert relabel(deployment_message(hint=oom), "en")["hint"] == oom
    raw = {"type": "gpu-sample", "status_label": "whatever"}
    assert relabel(raw, "zh-hans") is raw
    runtime = relabel({"type": "runtime", "id": 3, "install_status": "installing", "status_label": "Installing"},
                      "zh-hans")
    with translation.override("zh-hans"):
        assert runtime["status_label"] == str(EngineRuntime.InstallStatus.INSTALLING.label) != "Installing"


class FakeAccount:
    def __init__(self, language):
        self.language = language


class FakeUser:
    is_authenticated = True

    def __init__(self, language=""):
        self.account = FakeAccount(language)


@pytest.mark.parametrize("user_language, cookie, accept, expected", [
    ("zh-hans", "en", "en-US", "zh-hans"),  # the account's switch wins
    ("", "zh-hans", "en-US", "zh-hans"),    # then the language cookie
    ("", "", "zh-CN,zh;q=0.9,en;q=0.8", "zh-hans"),  # then the browser
    ("", "", "fr-FR,fr;q=0.9", "en"),        # nothing Kiln speaks: the default
    ("", "", "", "en"),
])
def test_a_tabs_language_is_chosen_as_a_pages_is(user_language, cookie, accept, expected, settings):
    cookies = {settings.LANGUAGE_COOKIE_NAME: cookie} if cookie else {}
    headers = [(b"accept-language", accept.encode())] if accept else []
    assert reader_language(FakeUser(user_language), cookies, headers) == expected


def test_every_phase_the_code_writes_has_a_label():
    import re
    from pathlib import Path

    from tests.helpers import REPO

    written = set()
    for path in (Path(REPO) / "inference").rglob("*.py"):
        written |= set(re.findall(r'record_phase\([^,]+, "([a-z_ ]+)"', path.read_text()))
    assert written and written <= set(phases.LABELS), written - set(phases.LABELS)
