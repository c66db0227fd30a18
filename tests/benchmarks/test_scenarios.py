"""Scenario presets and synthetic prompts of a target token length."""

import random
import threading

import pytest

from inference.benchmarks.scenarios import (
    SCENARIOS,
    build_prompt,
    build_requests,
    get_scenario,
    run_scenario,
)
from tests.sse_stub import running_stub


def words(text: str) -> int:
    return len(text.split())


def test_the_five_presets_users_ask_for_exist():
    titles = {s.title for s in SCENARIOS.values()}
    assert titles == {"Decode, single stream", "Prefill, long prompt (TTFT)", "Concurrency sweep 1-32",
                      "Long context 8K", "Prefix cache"}
    assert get_scenario("concurrency-sweep").sweep == (1, 8, 16, 32)
    long = get_scenario("long-context-8k")
    assert long.prompt_tokens + long.output_tokens == 8192
    for s in SCENARIOS.values():
        assert s.to_dict()["name"] == s.name
    with pytest.raises(ValueError, match="decode-single-stream"):
        get_scenario("nope")


def test_build_prompt_hits_the_target_even_when_tokens_are_not_words():
    # A tokenizer where long words cost two tokens: the builder must correct.
    def count(text):
        return sum(2 if len(w) > 4 else 1 for w in text.split())

    for target in (1, 17, 600, 4096):
        text, measured = build_prompt(target, count, random.Random(target))
        assert measured == count(text)
        assert abs(measured - target) <= max(1, target // 100)


def test_prompts_are_unique_except_for_the_shared_prefix():
    measured, warmups = build_requests(get_scenario("prefix-cache"), words, seed=3)
    assert len(measured) == 24 and len(warmups) == 1
    prefix = measured[0].prompt.split()[:2048]
    assert all(r.prompt.split()[:2048] == prefix for r in measured + warmups)
    assert len({r.prompt for r in measured + warmups}) == 25
    assert measured[0].prompt_tokens == 2176
    plain, _ = build_requests(get_scenario("decode-single-stream"), words, seed=3)
    firsts = [" ".join(r.prompt.split()[:8]) for r in plain]
    assert len(set(firsts)) == len(firsts)
    assert all(abs(words(r.prompt) - 128) <= 1 for r in plain)


def test_sweep_prompts_scale_with_concurrency():
    sweep = get_scenario("concurrency-sweep")
    assert [len(build_requests(sweep, words, concurrency=c)[0]) for c in sweep.sweep] == [8, 32, 64, 128]


def test_run_scenario_end_to_end_against_the_stub():
    scenario = get_scenario("prefix-cache")
    updates = []
    with running_stub() as stub:
        run = run_scenario(scenario, stub.url, "stub", progress=updates.append, goodput_slos={"ttft": 1000})
    assert run.tokenizer_source == "vllm /tokenize"
    (step,) = run.steps
    assert step.metrics["completed"] == 24
    # Prompt tokens come from usage and agree with the server's own counter.
    assert step.metrics["prompt_tokens_source"] == "usage"
    assert step.metrics["total_input_tokens"] == step.server_metrics["prompt_tokens"]
    assert abs(step.metrics["total_input_tokens"] - 24 * 2176) <= 24
    assert step.metrics["request_goodput"] > 0
    assert step.server_metrics["generation_tokens"] == 24 * 128
    assert updates[-1].phase == "done"
    assert run.to_dict()["steps"][0]["metrics"]["completed"] == 24


def test_run_scenario_sweep_can_be_cancelled_between_steps():
    cancel = threading.Event()

    def progress(update):
        if update.step == 1 and update.phase == "measure":
            cancel.set()

    with running_stub() as stub:
        run = run_scenario(get_scenario("concurrency-sweep"), stub.url, "stub", progress=progress, cancel=cancel)
    assert run.cancelled
    assert len(run.steps) == 2 and not run.steps[0].cancelled
