"""Benchmark scenario presets and synthetic prompts of a given token length.

A scenario is data: what load to apply and what prompts to send. The five
presets mirror what users test by hand; the UI may override any field with
`dataclasses.replace(SCENARIOS["decode-single-stream"], num_prompts=20)`.

Prompts are built from plain English words and measured with a token counter
(the deployment's own /tokenize through server.ServerTokenizer, or any
`count(text) -> int`), then trimmed or grown until they hit the target length.
Every prompt starts with its own random words so an engine's prefix cache
cannot serve one prompt from another, except in the shared-prefix scenario
where that is the point.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
import threading
from dataclasses import dataclass

from inference.benchmarks.harness import (
    DEFAULT_CLIENT,
    BenchmarkConfig,
    LoadShape,
    ProgressUpdate,
    RequestSpec,
    RunResult,
    run_benchmark,
    run_sweep,
)
from inference.benchmarks.records import gettext_noop
from inference.benchmarks.server import ServerTokenizer

CountTokens = Callable[[str], int]


@dataclass(frozen=True)
class Scenario:
    name: str  # slug, stored on the BenchmarkRun row
    title: str  # English msgid (marked below): the panel translates it where it shows it
    description: str  # the same
    load: LoadShape
    prompt_tokens: int
    output_tokens: int
    num_prompts: int  # measured requests (per sweep step: see prompts_for)
    num_warmups: int
    sweep: tuple[int, ...] = ()  # concurrency levels; empty = one run
    shared_prefix_tokens: int = 0  # > 0: every prompt starts with the same prefix
    prompts_per_concurrency: int = 0  # sweep: measured prompts = max(num_prompts, this x level)

    def prompts_for(self, concurrency: int | None) -> int:
        if self.prompts_per_concurrency and concurrency:
            return max(self.num_prompts, self.prompts_per_concurrency * concurrency)
        return self.num_prompts

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["load"]["request_rate"] = str(self.load.request_rate)
        data["sweep"] = list(self.sweep)
        return data


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="decode-single-stream",
            title=gettext_noop("Decode, single stream"),
            description=gettext_noop("One request at a time, short prompt, long answer: the tokens/s one user sees. "
                                     "Compare with the roofline (memory bandwidth / weight bytes)."),
            load=LoadShape("concurrency", 1),
            prompt_tokens=128, output_tokens=512, num_prompts=5, num_warmups=1,
        ),
        Scenario(
            name="prefill-long-prompt",
            title=gettext_noop("Prefill, long prompt (TTFT)"),
            description=gettext_noop("One request at a time with a 4K-token prompt and a short answer: "
                                     "time to first token is prompt processing speed."),
            load=LoadShape("concurrency", 1),
            prompt_tokens=4096, output_tokens=16, num_prompts=5, num_warmups=1,
        ),
        Scenario(
            name="concurrency-sweep",
            title=gettext_noop("Concurrency sweep 1-32"),
            description=gettext_noop("Fixed concurrency 1, 8, 16 and 32: how throughput grows and latency "
                                     "degrades as users are added."),
            load=LoadShape("concurrency", 1),
            prompt_tokens=512, output_tokens=256, num_prompts=8, num_warmups=2,
            sweep=(1, 8, 16, 32), prompts_per_concurrency=4,
        ),
        Scenario(
            name="long-context-8k",
            title=gettext_noop("Long context 8K"),
            description=gettext_noop("8K tokens in total (7936 prompt + 256 answer) at concurrency 2: "
                                     "KV-cache pressure and long-sequence attention speed."),
            load=LoadShape("concurrency", 2),
            prompt_tokens=7936, output_tokens=256, num_prompts=6, num_warmups=1,
        ),
        Scenario(
            name="prefix-cache",
            title=gettext_noop("Prefix cache"),
            description=gettext_noop("Every prompt shares a 2048-token prefix (a system prompt or document) "
                                     "plus a short unique question: TTFT with prefix caching, and the server's "
                                     "cache hit rate from /metrics."),
            load=LoadShape("concurrency", 4),
            prompt_tokens=2176, output_tokens=128, num_prompts=24, num_warmups=1,
            shared_prefix_tokens=2048,
        ),
    )
}


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        # The same msgid as services.scenario_with_overrides' refusal, which the panel shows translated.
        raise ValueError(gettext_noop("Unknown benchmark scenario %(name)r; choose one of: %(names)s.")
                         % {"name": name, "names": ", ".join(SCENARIOS)}) from None


# Common, short English words: they tokenize to about one token each in every
# tokenizer we meet, which makes lengths converge in one or two corrections.
_WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one "
    "had by word but not what all were we when your can said there use an each which she do how their "
    "if will up other about out many then them these so some her would make like him into time has look "
    "two more write go see number no way could people my than first water been call who oil its now "
    "find long down day did get come made may part over new sound take only little work know place year "
    "live me back give most very after thing our just name good sentence man think say great where help "
    "through much before line right too mean old any same tell boy follow came want show also around form "
    "three small set put end does another well large must big even such because turn here why ask went "
    "men read need land different home us move try kind hand picture again change off play spell air away "
    "animal house point page letter mother answer found study still learn should world high every near add "
    "food between own below country plant last school father keep tree never start city earth eye light"
).split()


def _words(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(_WORDS) for _ in range(n)]


def build_prompt(target_tokens: int, count_tokens: CountTokens, rng: random.Random,
                 prefix: str = "", max_rounds: int = 6) -> tuple[str, int]:
    """Text of about `target_tokens` tokens (counted with `count_tokens`),
    starting with `prefix`. Returns (text, measured tokens)."""
    if target_tokens < 1:
        raise ValueError(gettext_noop("A prompt needs at least 1 token."))
    head = [prefix] if prefix else []
    body: list[str] = []
    guess = max(1, target_tokens - (count_tokens(prefix) if prefix else 0))
    body = _words(rng, guess)
    measured = count_tokens(" ".join(head + body))
    for _ in range(max_rounds):
        if measured == target_tokens:
            break
        missing = target_tokens - measured
        if missing > 0:
            body += _words(rng, max(1, missing))
        else:
            # Words run about a token each; drop one word per surplus token.
            drop = min(len(body) - 1, max(1, -missing))
            if drop <= 0:
                break
            body = body[:-drop]
        measured = count_tokens(" ".join(head + body))
    return " ".join(head + body), measured


def build_requests(scenario: Scenario, count_tokens: CountTokens, *, concurrency: int | None = None,
                   seed: int = 0) -> tuple[list[RequestSpec], list[RequestSpec]]:
    """(measured, warm-up) requests for a scenario (sweep: for one level).

    Lengths are calibrated once on the first prompt and reused: tokenizing
    every 8K prompt would cost more than the benchmark. The true per-request
    prompt length comes back from the server's `usage`.
    """
    rng = random.Random(seed)
    n = scenario.prompts_for(concurrency if concurrency is not None else scenario.load.concurrency)
    prefix = ""
    if scenario.shared_prefix_tokens:
        prefix, _ = build_prompt(scenario.shared_prefix_tokens, count_tokens, random.Random(seed + 1))
    first, measured = build_prompt(scenario.prompt_tokens, count_tokens, rng, prefix)
    words_after_prefix = len(first.split()) - len(prefix.split())

    def make(i: int) -> RequestSpec:
        if i == 0:
            return RequestSpec(first, scenario.output_tokens, measured)
        # Same word count as the calibrated prompt, different words: unique
        # from the first word on (or right after the shared prefix).
        body = " ".join(_words(rng, words_after_prefix))
        text = f"{prefix} {body}" if prefix else body
        return RequestSpec(text, scenario.output_tokens, None)

    requests = [make(i) for i in range(n)]
    warmups = [make(n + i) for i in range(scenario.num_warmups)]
    # A warm-up also primes a shared prefix, as a real system prompt would be.
    return requests, warmups


@dataclass
class ScenarioRun:
    """A scenario's outcome: one RunResult per step (one step unless a sweep)."""

    scenario: Scenario
    steps: list[RunResult]
    tokenizer_source: str

    @property
    def cancelled(self) -> bool:
        return any(step.cancelled for step in self.steps)

    def to_dict(self, detailed: bool = False) -> dict:
        return {
            "scenario": self.scenario.to_dict(),
            "tokenizer_source": self.tokenizer_source,
            "cancelled": self.cancelled,
            "steps": [step.to_dict(detailed) for step in self.steps],
        }


def run_scenario(scenario: Scenario, base_url: str, model: str, *, engine: str | None = None,
                 endpoint: str = "chat", client: str = DEFAULT_CLIENT,
                 goodput_slos: dict[str, float] | None = None, extra_body: dict | None = None,
                 api_key: str | None = None, seed: int = 0,
                 progress: Callable[[ProgressUpdate], None] | None = None,
                 cancel: threading.Event | None = None) -> ScenarioRun:
    """Build the scenario's prompts with the engine's tokenizer and run it (blocking).

    `engine` ("vllm", "llamacpp", "sglang" or None to probe) picks the
    /tokenize request shape.
    """
    config = BenchmarkConfig(
        base_url=base_url, model=model, endpoint=endpoint, load=scenario.load, client=client,
        goodput_slos=dict(goodput_slos or {}), extra_body=dict(extra_body or {}), api_key=api_key,
    )
    config.validate()
    with ServerTokenizer(base_url, model, engine, api_key=api_key) as tokenizer:
        def make(level: int | None):
            return build_requests(scenario, tokenizer.count, concurrency=level, seed=seed)

        if scenario.sweep:
            steps = run_sweep(config, scenario.sweep, make, progress, cancel)
        else:
            measured, warmups = make(None)
            steps = [run_benchmark(config, measured, warmups, progress, cancel)]
        return ScenarioRun(scenario, steps, tokenizer.source or "none")
