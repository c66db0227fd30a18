"""API and form refusals that used to be English-only (issue 17 review): their codes stay,
their messages come from the catalogue of the caller's language.

Until the lead translates the new msgids, zh-Hans falls back to the English text; the
tests compare with what the zh-Hans catalogue says for each msgid, so they hold before
and after the translation, and `test_the_new_messages_are_extracted_for_translation`
fails when a message stops going through gettext.
"""
import json
import shutil
import subprocess
from pathlib import Path

import httpx
import polib
import pytest
from django.test import Client
from django.utils import translation

from tests.helpers import REPO

ZH = "zh-CN,zh;q=0.9,en;q=0.8"

GIVE_PROFILE = 'Give {"profile": <id>} or {"preset": "<slug>"}.'
GIVE_FIELDS = "Give %(fields)s."
REQUIRED = "required"
NO_RUNTIME = "No runtime #%(id)s."
GIVE_EXPECTED = "give %(expected)s"
GPU_INDEXES = 'GPU indexes as a list such as [0, 1] or text such as "0,1"'
KEY_NAME = "Give the key a name, e.g. the tool or person that will use it."
BAD_LIMIT = "limit must be a whole number from 1 to 10000."
NOT_MULTIPART = ("Upload the file as multipart/form-data with the fields 'file' and 'purpose' "
                 "(the openai client's files.create does).")
NO_BATCH = "No batch with id %(id)r."


def said(language, msgid, **params):
    """What the catalogue of `language` makes of `msgid` (with its placeholders filled)."""
    with translation.override(language):
        text = translation.gettext(msgid)
    return text % params if params else text


@pytest.fixture
def api(operator):
    client = Client()
    client.force_login(operator)
    return client


def post_json(client, url, body, language):
    return client.post(url, json.dumps(body), content_type="application/json", HTTP_ACCEPT_LANGUAGE=language)


def test_a_launch_without_profile_or_preset_is_refused_in_the_callers_language(api):
    for language, header in (("zh-hans", ZH), ("en", "en")):
        answer = post_json(api, "/api/deployments/", {}, header)
        assert answer.status_code == 400, answer.content
        error = answer.json()["error"]
        assert error["code"] == "missing"
        assert error["message"] == said(language, GIVE_PROFILE)
    assert error["message"] == GIVE_PROFILE  # the English one, word for word


def test_runtime_refusals_name_the_missing_fields_and_the_unknown_id_in_the_callers_language(api):
    answer = post_json(api, "/api/runtimes/", {}, ZH)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "missing"
    assert error["message"] == said("zh-hans", GIVE_FIELDS, fields="name, engine, kind")
    assert error["fields"] == {k: said("zh-hans", REQUIRED) for k in ("name", "engine", "kind")}
    gone = api.get("/api/runtimes/987654", HTTP_ACCEPT_LANGUAGE=ZH)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    assert gone.json()["error"]["message"] == said("zh-hans", NO_RUNTIME, id=987654)
    assert api.get("/api/runtimes/987654", HTTP_ACCEPT_LANGUAGE="en").json()["error"]["message"] == "No runtime #987654."


def test_a_form_value_of_the_wrong_shape_is_explained_in_the_callers_language(api):
    """The expected shape is a lazy translation, the sentence around it a request-time one."""
    for language, header in (("zh-hans", ZH), ("en", "en")):
        answer = post_json(api, "/api/launch-profiles/preview", {"gpus": {"first": 0}}, header)
        assert answer.status_code == 400, answer.content
        error = answer.json()["error"]
        assert error["code"] == "invalid"
        assert error["fields"]["gpus"] == said(language, GIVE_EXPECTED, expected=said(language, GPU_INDEXES))
    assert error["fields"]["gpus"] == "give " + GPU_INDEXES


def test_the_keys_page_says_why_a_key_was_not_made_in_the_readers_language(api):
    page = api.post("/keys/new", {"name": "  ", "rate_limit": "5"}, HTTP_ACCEPT_LANGUAGE=ZH, follow=True)
    assert page.status_code == 200
    assert said("zh-hans", KEY_NAME) in page.content.decode()


def test_batches_and_files_refusals_follow_accept_language_on_the_gateway(asgi_server, operator):
    from inference.gateway import keys

    _key, secret = keys.key_create(user=operator, name="i18n")
    for language, header in (("zh-hans", ZH), ("en", "en")):
        headers = {"Authorization": f"Bearer {secret}", "Accept-Language": header}
        limit = httpx.get(f"{asgi_server}/v1/batches?limit=0", headers=headers, timeout=10)
        assert limit.status_code == 400 and limit.json()["error"]["code"] == "invalid_request"
        assert limit.json()["error"]["param"] == "limit"
        assert limit.json()["error"]["message"] == said(language, BAD_LIMIT)
        upload = httpx.post(f"{asgi_server}/v1/files", json={"purpose": "batch"}, headers=headers, timeout=10)
        assert upload.status_code == 400 and upload.json()["error"]["message"] == said(language, NOT_MULTIPART)
        gone = httpx.get(f"{asgi_server}/v1/batches/batch_nope", headers=headers, timeout=10)
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "batch_not_found"
        assert gone.json()["error"]["message"] == said(language, NO_BATCH, id="batch_nope")
    assert gone.json()["error"]["message"] == "No batch with id 'batch_nope'."


# The sources the review's messages moved into gettext, and those messages (each exactly
# as the catalogue will hold it).
SOURCES = {
    "inference/deployments/api.py": [
        GIVE_PROFILE, GIVE_FIELDS, REQUIRED, 'Give {"build": "<catalog key>"} (GET /api/engine-catalog lists them).',
        "port %(port)s is free now; the launch picks again if it is taken by then", "the port is picked at launch"],
    "inference/deployments/selectors.py": ["No deployment #%(id)s.", NO_RUNTIME, "No launch profile #%(id)s."],
    "inference/deployments/schemas.py": [GIVE_EXPECTED, GPU_INDEXES, 'true, false, "on", "off" or ""'],
    "inference/gateway/keys.py": [KEY_NAME, "The key's name is longer than %(max)s characters; shorten it.",
                                  "The rate limit is requests per minute: 0 (unlimited) or more."],
    "inference/gateway/selectors.py": ["playground (%(user)s)", "deleted user", "%(model)s (deployment deleted)"],
    "inference/gateway/errors.py": ["The request body is larger than %(limit)s bytes (DATA_UPLOAD_MAX_MEMORY_SIZE); "
                                    "send a shorter prompt or raise that setting."],
    "inference/gateway/proxy.py": ["The request body is not valid JSON.", "'stream' must be true or false.",
                                   "'%(name)s' must be a whole number of tokens (0 to %(max)s) or null."],
    "inference/batches/v1.py": [BAD_LIMIT, NOT_MULTIPART, NO_BATCH, "No file with id %(id)r.",
                                "%(path)s takes %(first)s or %(second)s.", "'%(name)s' is required (a string)."],
    "inference/library/selectors.py": ["No model #%(id)s."],
    "inference/library/hubs/base.py": ["%(repo)r is not a model id. Paste it as owner/name, for example Qwen/Qwen3-8B."],
    "monitoring/views.py": ["kind=%(kind)r is not known: use kind=gpu or kind=engine."],
    "monitoring/alerts/checks.py": ["Only %(free).1f GiB free in the %(name)s folder on %(host)s (%(path)s)"],
    "dashboard/services.py": ["Redis at %(url)s is not reachable (%(error)s). Start Redis, or unset REDIS_URL to use "
                              "the embedded one."],
}
# The keywords `manage.py translations update` (Django's makemessages) gives xgettext for Python.
KEYWORDS = ["gettext_noop", "gettext_lazy", "ngettext:1,2", "ngettext_lazy:1,2", "pgettext:1c,2",
            "npgettext:1c,2,3", "pgettext_lazy:1c,2", "npgettext_lazy:1c,2,3"]


def not_extracted(sources: dict) -> dict:
    """path -> the wanted msgids xgettext does not find in that file (as makemessages would run it)."""
    assert shutil.which("xgettext"), "GNU gettext is needed to extract messages (apt-get install gettext)"
    assert all((Path(REPO) / path).exists() for path in sources)
    out = subprocess.run(["xgettext", "--language=Python", "--from-code=UTF-8", "--output=-",
                          *(f"--keyword={k}" for k in KEYWORDS), *sources],
                         cwd=REPO, capture_output=True, text=True, check=True, timeout=60).stdout
    extracted = {e.msgid for e in polib.pofile(out)}
    missing = {path: [m for m in wanted if m not in extracted] for path, wanted in sources.items()}
    return {path: msgs for path, msgs in missing.items() if msgs}


def test_the_new_messages_are_extracted_for_translation():
    missing = not_extracted(SOURCES)
    assert not missing, f"not marked for translation (wrap them in gettext):\n{missing}"
