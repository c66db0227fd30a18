"""Benchmark and preflight messages follow the caller's language (issue 17): the benchmarks
API's refusals keep their codes, the compare and run pages explain bad input, and
preflight's findings, the fit's advice and the CPU's name come from the catalogue.

As in test_api_messages.py, each message is compared with what the catalogue makes of its
msgid (English until the lead translates it), so the tests hold before and after that;
`test_the_benchmark_and_preflight_messages_are_extracted_for_translation` fails when one
stops going through gettext, and the "translated" tests below fail when code picks
messages out by their English words again.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import translation
from django.utils.html import escape

from inference.benchmarks import services as benchmark_services
from inference.benchmarks.records import BenchmarkError, LoadShape
from inference.benchmarks.scenarios import SCENARIOS
from inference.deployments import presets
from inference.models import BenchmarkRun, Deployment
from inference.preflight import fit, rules, shapes
from inference.preflight import services as preflight_services
from inference.preflight.rules import RuntimeInfo
from tests.helpers import FIXTURES, REPO
from tests.i18n.test_api_messages import ZH, not_extracted, post_json, said

UNKNOWN_SCENARIO = "Unknown benchmark scenario %(name)r; choose one of: %(names)s."
BETWEEN = "must be between %(low)s and %(high)s, not %(value)s"
NOT_READY = ("Deployment %(name)r is %(status)s; a benchmark needs a ready deployment. "
             "Launch it and wait for Ready.")
CHOOSE_FILE = "file: choose a result file to import."
FIELD_REQUIRED = "Field required"
EMPTY_FILE = "The file is empty: choose a vllm bench --save-result JSON or a guidellm report."
NOT_UTF8 = "%(file)s is not UTF-8 text: is it a result JSON?"
UNKNOWN_FORMAT = ("Not a known result format: expected a `vllm bench serve --save-result` file "
                  "(with 'completed' and 'request_throughput') or a guidellm report (with 'benchmarks').")
BAD_IDS = "ids: give run numbers separated by commas, e.g. ?ids=3,5."
BANDWIDTH_NAN = "bandwidth: %(value)r is not a number of GB/s."
LOAD_SHAPE = "Unknown load shape %(kind)r: use 'concurrency' or 'rate'."
TP_NEEDS_GPUS = "tensor parallel size %(tp)s needs %(tp)s GPUs; %(count)s chosen"
CHOOSE_GPUS = "choose as many GPUs as the tensor parallel size"
CPU_ONLY = "CPU only (this machine's RAM)"
CPU_NAME = "CPU (%(ram).0f GiB RAM)"
LETS = ("lets %(count)s request of that length run at once", "lets %(count)s requests of that length run at once")

ONECAT = RuntimeInfo(engine="vllm", version="0.10.2", name="1Cat-vLLM 0.10.2 sm70", cuda_version="12.6",
                     cuda_arch_list=["sm_70", "sm_75", "sm_80"])


def said_n(language, singular, plural, n, **params):
    with translation.override(language):
        text = translation.ngettext(singular, plural, n)
    return text % params


@pytest.fixture
def api(operator):
    client = Client()
    client.force_login(operator)
    return client


def status_label(language, status):
    with translation.override(language):
        return str(Deployment.Status(status).label).lower()


# ---------------------------------------------------------------- benchmarks


def test_a_benchmark_start_is_refused_in_the_callers_language_with_its_code(api):
    ready = Deployment.objects.create(name="ready-one", host="testhost", status="ready", port=9, engine_name="vllm")
    stopped = Deployment.objects.create(name="stopped-one", host="testhost", status="stopped", engine_name="vllm")
    for language, header in (("zh-hans", ZH), ("en", "en")):
        bad = post_json(api, "/api/benchmarks/", {"deployment": ready.pk, "scenario": "warp-speed"}, header)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid"
        assert bad.json()["error"]["message"] == said(language, UNKNOWN_SCENARIO, name="warp-speed",
                                                      names=", ".join(SCENARIOS))
        # the schema's own range check, worded at validation time
        few = post_json(api, "/api/benchmarks/", {"deployment": ready.pk, "num_prompts": 0}, header)
        assert few.status_code == 400 and few.json()["error"]["code"] == "invalid"
        assert few.json()["error"]["fields"]["num_prompts"] == said(language, BETWEEN, low=1, high=10000, value=0)
        down = post_json(api, "/api/benchmarks/", {"deployment": stopped.pk}, header)
        assert down.status_code == 409 and down.json()["error"]["code"] == "not_ready"
        assert down.json()["error"]["message"] == said(language, NOT_READY, name="stopped-one",
                                                       status=status_label(language, "stopped"))
    assert down.json()["error"]["message"] == ("Deployment 'stopped-one' is stopped; a benchmark needs a ready "
                                               "deployment. Launch it and wait for Ready.")
    assert not BenchmarkRun.objects.exists()


def test_import_refusals_follow_the_callers_language(api):
    for language, header in (("zh-hans", ZH), ("en", "en")):
        none = api.post("/api/benchmarks/import", {"label": "x"}, HTTP_ACCEPT_LANGUAGE=header)
        assert none.status_code == 400 and none.json()["error"]["code"] == "invalid"
        assert none.json()["error"]["message"] == said(language, CHOOSE_FILE)
        assert none.json()["error"]["fields"] == {"file": said(language, FIELD_REQUIRED)}
        for content, msgid, params in ((b"", EMPTY_FILE, {}), (b"\xff\xfe\x00", NOT_UTF8, {"file": "x.json"}),
                                       (b'{"hello": 1}', UNKNOWN_FORMAT, {})):
            answer = api.post("/api/benchmarks/import", {"file": SimpleUploadedFile("x.json", content)},
                              HTTP_ACCEPT_LANGUAGE=header)
            assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid", content
            assert answer.json()["error"]["message"] == said(language, msgid, **params), content
    assert not BenchmarkRun.objects.exists()


def test_the_compare_and_run_pages_explain_bad_input_in_the_readers_language(api):
    run = BenchmarkRun.objects.create(scenario="decode-single-stream", status="succeeded")
    for language, header in (("zh-hans", ZH), ("en", "en")):
        page = api.get("/benchmarks/compare?ids=3,x", HTTP_ACCEPT_LANGUAGE=header)
        assert page.status_code == 400
        assert escape(said(language, BAD_IDS)) in page.content.decode()
        detail = api.get(f"/benchmarks/{run.pk}/?bandwidth=lots", HTTP_ACCEPT_LANGUAGE=header)
        assert detail.status_code == 200
        assert escape(said(language, BANDWIDTH_NAN, value="lots")) in detail.content.decode()


def test_a_harness_error_keeps_its_msgid_and_is_recorded_translated(db, monkeypatch):
    """The harness is plain Python: it raises English with the msgid kept; the row gets the msgid
    through the panel's gettext (here one whose every message differs from the English)."""
    with pytest.raises(BenchmarkError) as caught:
        LoadShape("zigzag").validate()
    exc = caught.value
    assert str(exc) == "Unknown load shape 'zigzag': use 'concurrency' or 'rate'."
    assert exc.translated(translation.gettext) == said("en", LOAD_SHAPE, kind="zigzag")
    monkeypatch.setattr(benchmark_services, "_", lambda message: f"«{message}»")
    run = BenchmarkRun.objects.create(scenario="decode-single-stream", status="running")
    benchmark_services._record(run, SCENARIOS["decode-single-stream"], {"error": exc}, False, {})
    run.refresh_from_db()
    assert run.status == "failed" and run.error == "«Unknown load shape 'zigzag': use 'concurrency' or 'rate'.»"


def test_the_harness_modules_still_import_and_explain_without_django():
    """bench/*.py and the harness as a script run without Django's settings: the messages there are
    only marked, and no module imports django.utils.translation on the way."""
    code = ("import sys\n"
            "from inference.benchmarks import clients, harness, records, scenarios, stream\n"
            "assert 'django.utils.translation' not in sys.modules, 'Django translation imported'\n"
            "print(scenarios.SCENARIOS['prefix-cache'].title)\n"
            "try:\n    records.LoadShape('zigzag').validate()\n"
            "except records.BenchmarkError as exc:\n    print(exc)\n"
            "try:\n    scenarios.get_scenario('warp-speed')\n"
            "except ValueError as exc:\n    print(exc)\n")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "Prefix cache", "Unknown load shape 'zigzag': use 'concurrency' or 'rate'.",
        "Unknown benchmark scenario 'warp-speed'; choose one of: " + ", ".join(SCENARIOS) + "."]


# ---------------------------------------------------------------- preflight


def test_a_preflight_finding_and_the_cpu_target_follow_the_callers_language(viewer):
    client = Client()
    client.force_login(viewer)
    plan = {"preset": presets.QWEN_AWQ_TP2.slug, "target": "v100-32gb-x1", "engine": "vllm",
            "sm70_build": True, "dtype": "half", "tensor_parallel_size": 2}
    for language, header in (("zh-hans", ZH), ("en", "en")):
        body = post_json(client, "/api/preflight", plan, header).json()
        f = next(f for f in body["findings"] if f["code"] == "fit-input")
        assert (f["level"], f["message"], f["fix"]) == ("error", said(language, TP_NEEDS_GPUS, tp=2, count=1),
                                                       said(language, CHOOSE_GPUS))
        cpu = post_json(client, "/api/preflight", {**plan, "target": "cpu", "engine": "llamacpp",
                                                   "preset": presets.GEMMA_DEMO.slug, "tensor_parallel_size": 1},
                        header).json()
        assert cpu["where"] == said(language, CPU_ONLY)
        assert cpu["gpus"][0]["name"] == said(language, CPU_NAME, ram=preflight_services.host_ram_bytes() / fit.GiB)
    assert f["message"] == "tensor parallel size 2 needs 2 GPUs; 1 chosen"


def test_the_fits_advice_keeps_its_flag_and_words_the_reason_in_the_active_language(db):
    pm = preflight_services.preset_model(presets.QWEN_NVFP4.slug)
    for language in ("zh-hans", "en"):
        with translation.override(language):
            result = preflight_services.preflight_for(
                profile_values=presets.QWEN_NVFP4.spec_values, runtime=ONECAT,   # 8 requests of 32768 tokens
                gpus=preflight_services.planning_target("v100-32gb-x1").gpus(),
                model_meta_override=pm["meta"], weight_bytes=pm["weight_bytes"])
        ctx = result["fit"]["max_context_at_concurrency"]
        assert f"--max-model-len {ctx} ({said_n(language, *LETS, 8, count=8)})" in result["fit"]["suggestions"]
    assert f"--max-model-len {ctx} (lets 8 requests of that length run at once)" in result["fit"]["suggestions"]


@pytest.fixture
def translated(monkeypatch):
    """A language whose every preflight message differs from the English (placeholders kept), as
    zh-Hans will once the lead has translated them: what the services and rules pick out of the
    fit's report must be told apart without its English words."""
    def gettext(message):
        return f"«{message}»"

    def ngettext(singular, plural, n):
        return f"«{singular if n == 1 else plural}»"

    for module in (fit, shapes, preflight_services):
        monkeypatch.setattr(module, "_", gettext)
    for module in (fit, preflight_services):
        monkeypatch.setattr(module, "ngettext", ngettext)
    monkeypatch.setattr(rules, "gettext", gettext)


def check_preset(preset, target, runtime, **overrides):
    pm = preflight_services.preset_model(preset.slug)
    return preflight_services.preflight_for(
        profile_values={**preset.spec_values, **overrides}, runtime=runtime,
        gpus=preflight_services.planning_target(target).gpus(), model_meta_override=pm["meta"],
        weight_bytes=pm["weight_bytes"])


def test_a_context_above_the_models_maximum_is_told_apart_in_a_translation(translated, db):
    cfg = json.loads((FIXTURES / "llama3_8b_config.json").read_text())     # max_position_embeddings 8192
    stock = RuntimeInfo(engine="vllm", version="0.33.0", name="vLLM 0.33.0", cuda_version="12.8",
                        cuda_arch_list=["sm_80", "sm_90"])
    result = preflight_services.preflight_for(
        profile_values={"engine": "vllm", "dtype": "half", "max_model_len": 16384}, runtime=stock,
        gpus=preflight_services.planning_target("a100-80gb-x1").gpus(), model_meta_override=cfg)
    # the rule says it; the fit's own line (in the translation) is dropped, and so is its memory advice
    assert [f["code"] for f in result["findings"]] == ["max-model-len-above-model"]
    assert result["fit"]["suggestions"] == ["--max-model-len 8192 («the model's maximum»)"]


def test_weights_larger_than_the_card_and_a_cpu_target_are_told_apart_in_a_translation(translated, db):
    result = check_preset(presets.QWEN_AWQ_TP2, "v100-16gb-x1", ONECAT, tensor_parallel_size=1)
    errors = [f["message"] for f in result["findings"] if f["code"] == "does-not-fit"]
    assert errors and errors[0].startswith("«the weights alone (") and "Tesla V100-PCIE-16GB" in errors[0]
    assert not any("leave no room for the KV cache" in e for e in errors)      # replaced by the line above
    advice = result["fit"]["suggestions"]
    assert "--tensor-parallel-size 2 over 2 such GPUs" in advice[0]       # one msgid, flag and all
    assert not any(s.startswith(("--max-num-batched-tokens", "--enforce-eager", "--gpu-memory-utilization"))
                   for s in advice), advice

    cpu = check_preset(presets.QWEN_NVFP4, "cpu", ONECAT, max_model_len=262144, max_num_seqs=4)
    assert cpu["cpu_only"] and cpu["has_errors"]
    text = json.dumps(cpu, ensure_ascii=False)
    assert "per GPU" not in text and "these GPUs" not in text
    assert not any(s.startswith(("--gpu-memory-utilization", "--enforce-eager", "--max-num-batched-tokens",
                                 "--kv-cache-dtype fp8")) for s in cpu["fit"]["suggestions"])

    short = check_preset(presets.QWEN_AWQ_TP2, "v100-32gb-x1", ONECAT)
    f = next(f for f in short["findings"] if f["code"] == "fit-input")
    assert f["fix"] == "«choose as many GPUs as the tensor parallel size»"


# ---------------------------------------------------------------- extraction

# The sources whose messages moved into gettext (or gettext_noop where plain Python runs them),
# and some of those messages, each exactly as the catalogue will hold it.
SOURCES = {
    "inference/benchmarks/api.py": [CHOOSE_FILE, FIELD_REQUIRED, "too large for a request body",
                                    "file: the file name must not contain a NUL character (\\x00)."],
    "inference/benchmarks/views.py": [BAD_IDS, "ids: run numbers are whole numbers from 1, e.g. ?ids=3,5.",
                                      BANDWIDTH_NAN],
    "inference/benchmarks/services.py": [UNKNOWN_SCENARIO, NOT_READY, EMPTY_FILE, NOT_UTF8,
                                         "%(key)s: must be between %(low)s and %(high)s, not %(value)s.",
                                         "Every request failed: %(error)s", "no request finished",
                                         "no memory bandwidth known for %(gpu)s; enter one to draw the line"],
    "inference/benchmarks/schemas.py": [BETWEEN, "give concurrency levels as whole numbers, e.g. 1,2,4",
                                        "every concurrency level must be between %(low)s and %(high)s"],
    "inference/benchmarks/compare.py": [UNKNOWN_FORMAT, "No result file at %(path)s."],
    "inference/benchmarks/records.py": [LOAD_SHAPE, "A fixed-concurrency load needs concurrency >= 1."],
    "inference/benchmarks/harness.py": ["No requests to send: give at least one prompt."],
    "inference/benchmarks/stream.py": ["The stream ended before [DONE] or a finish_reason: the connection was cut."],
    "inference/benchmarks/scenarios.py": [UNKNOWN_SCENARIO, "Decode, single stream", "Prefix cache",
                                          "A prompt needs at least 1 token."],
    "inference/preflight/fit.py": ["halves the KV cache per token", "largest context one request can have",
                                   "the cache holds %(count)s request of %(tokens)s tokens, not %(seqs)s",
                                   "max_model_len %(tokens)s is above the model's maximum %(max)s",
                                   "weights (%(weights).1f GiB) and overhead (%(overhead).1f GiB) leave no room "
                                   "for the KV cache"],
    "inference/preflight/shapes.py": ["GGUF metadata has no general.architecture: is this a GGUF model file?"],
    "inference/preflight/services.py": [TP_NEEDS_GPUS, CHOOSE_GPUS, CPU_ONLY, CPU_NAME, LETS[0],
                                        "the model's maximum",
                                        "No model metadata: the memory fit cannot be estimated."],
    "inference/preflight/capacity.py": ["weights per GPU", "compute and output buffers", "tokens"],
}


def test_the_benchmark_and_preflight_messages_are_extracted_for_translation():
    missing = not_extracted(SOURCES)
    assert not missing, f"not marked for translation (wrap them in gettext):\n{missing}"
