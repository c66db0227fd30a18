import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inference.benchmarks.server import metrics_delta
from inference.engines.metrics import MetricsParseError, detect_engine, parse_prometheus_text, sum_by_name
from monitoring.enginemetrics import SCHEMA_FIELDS, EngineMetricsReader, RateTracker

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name):
    return (FIXTURES / name).read_text()


def bump(text, name, by):
    """The same page a moment later: one unlabelled-or-labelled sample grown by `by`."""
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, value = line.rsplit(" ", 1)
            line = f"{head} {float(value) + by}"
        out.append(line)
    return "\n".join(out) + "\n"


def test_parser_agrees_with_prometheus_client_on_every_fixture():
    for name in ["vllm_v1.txt", "vllm_v0.txt", "sglang.txt", "llamacpp.txt"]:
        text = fixture(name)
        ours = parse_prometheus_text(text)
        theirs = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                # prometheus_client renames a counter that lacks "_total" (llama.cpp's
                # n_tokens_max) to a name the page does not have; ours keeps the page's.
                sample_name = s.name if s.name in ours else s.name.removesuffix("_total")
                theirs.setdefault(sample_name, []).append((dict(s.labels), s.value))
        assert ours == theirs, name


def test_parser_handles_escapes_timestamps_and_special_values():
    text = ('# HELP x y\n'
            'a{path="C:\\\\dir",msg="say \\"hi\\"",b="}{,"} 1.5 1712345678000\n'
            'b NaN\nc +Inf\nd{} -3e2\n')
    parsed = parse_prometheus_text(text)
    assert parsed["a"] == [({"path": "C:\\dir", "msg": 'say "hi"', "b": "}{,"}, 1.5)]
    assert parsed["c"][0][1] == float("inf") and parsed["d"] == [({}, -300.0)]


def test_parser_names_the_bad_line():
    with pytest.raises(MetricsParseError, match="line 2 has a value that is not a number"):
        parse_prometheus_text("ok 1\nbad{a=\"1\"} one\n")
    with pytest.raises(MetricsParseError, match="line 1 has malformed labels"):
        parse_prometheus_text('x{a=1} 2\n')


def test_engine_detected_from_names():
    assert detect_engine(parse_prometheus_text(fixture("vllm_v1.txt"))) == "vllm"
    assert detect_engine(parse_prometheus_text(fixture("vllm_v0.txt"))) == "vllm"
    assert detect_engine(parse_prometheus_text(fixture("sglang.txt"))) == "sglang"
    assert detect_engine(parse_prometheus_text(fixture("llamacpp.txt"))) == "llamacpp"
    assert detect_engine({"process_cpu_seconds_total": []}) is None


def test_vllm_v1_two_scrapes_give_rates_and_interval_ratios():
    text = fixture("vllm_v1.txt")
    reader = EngineMetricsReader()
    first = reader.read(text, now=100.0)
    assert first["engine"] == "vllm"
    assert first["prompt_tokens_per_s"] is None and first["generation_tokens_per_s"] is None
    assert first["requests_running"] == 12 and first["requests_waiting"] == 3
    assert first["kv_cache_usage"] == pytest.approx(0.4375)
    assert first["prefix_cache_hit_rate"] == pytest.approx(0.25)  # lifetime 600k / 2.4M
    assert first["spec_decode_acceptance_rate"] == pytest.approx(0.4)
    assert first["spec_decode_mean_accept_length"] == pytest.approx(7.0)
    assert first["preemptions_total"] == 7

    later = text
    later = bump(later, "vllm:prompt_tokens_total", 4000)
    later = bump(later, "vllm:generation_tokens_total", 1000)
    later = bump(later, "vllm:prefix_cache_queries_total", 4000)
    later = bump(later, "vllm:prefix_cache_hits_total", 3000)
    later = bump(later, "vllm:spec_decode_num_draft_tokens_total", 1500)
    later = bump(later, "vllm:spec_decode_num_accepted_tokens_total", 1200)
    later = bump(later, "vllm:spec_decode_num_drafts_total", 100)
    later = bump(later, "vllm:num_preemptions_total", 2)
    second = reader.read(later, now=102.0)
    assert second["prompt_tokens_per_s"] == pytest.approx(2000)
    assert second["generation_tokens_per_s"] == pytest.approx(500)
    assert second["prefix_cache_hit_rate"] == pytest.approx(0.75)  # this interval, not lifetime
    assert second["spec_decode_acceptance_rate"] == pytest.approx(0.8)
    assert second["spec_decode_mean_accept_length"] == pytest.approx(13.0)
    assert second["preemptions_per_s"] == pytest.approx(1.0) and second["preemptions_total"] == 9
    assert set(second) == set(SCHEMA_FIELDS)
    json.dumps(second)


def test_vllm_v0_old_names():
    reader = EngineMetricsReader()
    snap = reader.read(fixture("vllm_v0.txt"), now=0.0)
    assert snap["engine"] == "vllm"
    assert snap["kv_cache_usage"] == pytest.approx(0.9731)  # gpu_cache_usage_perc
    # no rate yet from counters: the engine's own averages stand in
    assert snap["prompt_tokens_per_s"] == pytest.approx(1520.4)
    assert snap["generation_tokens_per_s"] == pytest.approx(412.7)
    assert snap["spec_decode_acceptance_rate"] == pytest.approx(0.62)
    assert snap["requests_running"] == 5 and snap["requests_waiting"] == 9 and snap["preemptions_total"] == 31
    assert snap["prefix_cache_hit_rate"] is None
    later = bump(fixture("vllm_v0.txt"), "vllm:generation_tokens_total", 300)
    assert reader.read(later, now=3.0)["generation_tokens_per_s"] == pytest.approx(100)


def test_vllm_data_parallel_engines_add_up():
    text = "".join(
        f'vllm:num_requests_running{{engine="{e}",model_name="m"}} {r}\n'
        f'vllm:kv_cache_usage_perc{{engine="{e}",model_name="m"}} {kv}\n'
        f'vllm:generation_tokens_total{{engine="{e}",model_name="m"}} {g}\n'
        for e, r, kv, g in [(0, 4, 0.2, 1000), (1, 6, 0.9, 3000)])
    snap = EngineMetricsReader().read(text, now=0)
    assert snap["requests_running"] == 10
    assert snap["kv_cache_usage"] == pytest.approx(0.9)
    assert snap["generation_tokens_total"] == 4000


def test_sglang_names():
    reader = EngineMetricsReader()
    first = reader.read(fixture("sglang.txt"), now=0.0)
    assert first["engine"] == "sglang"
    assert first["requests_running"] == 24 and first["requests_waiting"] == 6
    assert first["kv_cache_usage"] == pytest.approx(0.58)
    assert first["prefix_cache_hit_rate"] == pytest.approx(0.31)
    assert first["spec_decode_acceptance_rate"] == pytest.approx(0.48)
    assert first["spec_decode_mean_accept_length"] == pytest.approx(3.4)
    assert first["generation_tokens_per_s"] == pytest.approx(1432.5)  # gen_throughput gauge until 2nd scrape
    assert first["preemptions_total"] == 4
    later = bump(bump(fixture("sglang.txt"), "sglang:prompt_tokens_total", 9000), "sglang:generation_tokens_total", 600)
    second = reader.read(later, now=0.5)
    assert second["prompt_tokens_per_s"] == pytest.approx(18000)
    assert second["generation_tokens_per_s"] == pytest.approx(1200)


def test_llamacpp_real_capture():
    text = fixture("llamacpp.txt")
    reader = EngineMetricsReader()
    first = reader.read(text, now=0.0)
    assert first["engine"] == "llamacpp"
    assert first["problem"] is None
    samples = parse_prometheus_text(text)
    assert first["prompt_tokens_total"] == int(samples["llamacpp:prompt_tokens_total"][0][1]) > 0
    assert first["generation_tokens_total"] == int(samples["llamacpp:tokens_predicted_total"][0][1]) > 0
    assert first["requests_running"] == int(samples["llamacpp:requests_processing"][0][1])
    assert first["requests_waiting"] == int(samples["llamacpp:requests_deferred"][0][1])
    assert first["requests_running"] == 1  # captured mid-request
    # 26 of 36 + 26 prompt tokens came from the prompt cache (prompt_tokens_total excludes them).
    assert first["prefix_cache_hit_rate"] == pytest.approx(26 / 62)
    later = bump(bump(text, "llamacpp:tokens_predicted_total", 118), "llamacpp:prompt_tokens_total", 40)
    second = reader.read(later, now=2.0)
    assert second["generation_tokens_per_s"] == pytest.approx(59)
    assert second["prompt_tokens_per_s"] == pytest.approx(20)


@pytest.mark.parametrize("name", ["vllm_v1.txt", "vllm_v0.txt", "sglang.txt", "llamacpp.txt"])
def test_monitor_and_benchmark_harness_read_the_same_numbers(name):
    """One parser, one table of names: from the same two scrapes the monitor's
    totals and rates and the harness's server_metrics agree."""
    text = fixture(name)
    engine = detect_engine(parse_prometheus_text(text))
    later = text
    for metric in ("prompt_tokens_total", "generation_tokens_total", "tokens_predicted_total",
                   "num_preemptions_total", "num_retracted_requests_total", "prefix_cache_queries_total",
                   "prefix_cache_hits_total", "gpu_prefix_cache_queries_total", "gpu_prefix_cache_hits_total"):
        later = bump(later, f"{engine}:{metric}", 300 if "hits" in metric else 400)
    reader = EngineMetricsReader()
    first = reader.read(text, now=10.0)
    second = reader.read(later, now=11.0)  # one second later: rates equal deltas
    before, after = sum_by_name(parse_prometheus_text(text)), sum_by_name(parse_prometheus_text(later))
    lifetime = metrics_delta({}, before)
    run = metrics_delta(before, after)

    assert lifetime["prompt_tokens"] == first["prompt_tokens_total"] > 0
    assert lifetime["generation_tokens"] == first["generation_tokens_total"] > 0
    assert run["prompt_tokens"] == second["prompt_tokens_per_s"] == 400
    assert run["generation_tokens"] == second["generation_tokens_per_s"] == 400
    if engine == "llamacpp":  # llama-server publishes no preemption counter
        assert "preemptions" not in run and first["preemptions_total"] is None
    else:
        assert lifetime["preemptions"] == first["preemptions_total"] > 0
        assert run["preemptions"] == second["preemptions_per_s"] == 400
    if name == "vllm_v1.txt":  # the one fixture with prefix-cache counters
        assert lifetime["prefix_cache_hit_rate"] == pytest.approx(first["prefix_cache_hit_rate"]) == 0.25
        assert run["prefix_cache_hit_rate"] == pytest.approx(second["prefix_cache_hit_rate"]) == 0.75
    else:
        assert lifetime["prefix_cache_hit_rate"] is None and run["prefix_cache_hit_rate"] is None


def test_counter_reset_after_engine_restart_is_not_a_negative_rate():
    reader = EngineMetricsReader()
    reader.read('vllm:generation_tokens_total{engine="0"} 50000\n', now=0.0)
    snap = reader.read('vllm:generation_tokens_total{engine="0"} 300\n', now=2.0)
    assert snap["generation_tokens_per_s"] == pytest.approx(150)  # 300 new tokens since the restart
    assert reader.tracker.resets == 1


def test_rate_tracker_ignores_a_clock_that_did_not_move():
    tracker = RateTracker()
    assert tracker.update({"a": 1.0}, 5.0) is None
    assert tracker.update({"a": 2.0}, 5.0) is None
    assert tracker.update({"a": 3.0}, 6.0).rate("a") == pytest.approx(2.0)


def test_page_without_engine_metrics_explains_itself():
    snap = EngineMetricsReader().read("process_cpu_seconds_total 3.2\n", now=0)
    assert snap["engine"] is None and "--metrics" in snap["problem"]
    assert snap["generation_tokens_per_s"] is None


def test_garbled_page_is_a_problem_not_a_crash():
    snap = EngineMetricsReader(engine="vllm").read("vllm:num_requests_running{engine=\"0\" 3\n", now=0)
    assert snap["engine"] == "vllm" and "malformed labels" in snap["problem"]


def test_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="Unknown engine 'tgi'"):
        EngineMetricsReader(engine="tgi")


def test_llamacpp_rate_is_averaged_over_a_window_not_0_then_4x():
    """llama-server adds a request's tokens when it ends: one 240-token request ending every
    4 s is 60 tok/s, but scrape-to-scrape rates read 0, 0, 0, 240 (the issue's jumping chart)."""
    text = fixture("llamacpp.txt")
    reader = EngineMetricsReader()
    rates = []
    for t in range(0, 91):
        page = bump(text, "llamacpp:tokens_predicted_total", 240 * (t // 4))
        snap = reader.read(page, now=1000.0 + t)
        rates.append(snap["generation_tokens_per_s"])
        assert snap["rate_window_s"] == 30
    steady = rates[35:]
    assert max(steady) - min(steady) <= 240 / 30 + 1e-9, steady  # at most one request's step over the window
    assert sum(steady) / len(steady) == pytest.approx(60, rel=0.05)
    # two scrapes (other engines) would have given 0 and 240
    two = RateTracker()
    assert two.update({"g": 0.0}, 0.0) is None
    assert two.update({"g": 0.0}, 1.0).rate("g") == 0 and two.update({"g": 240.0}, 2.0).rate("g") == 240


def test_a_windowed_rate_starts_again_after_an_engine_restart():
    tracker = RateTracker(window_s=30)
    for t in range(0, 40):
        tracker.update({"g": 10.0 * t}, float(t))
    after = tracker.update({"g": 5.0}, 40.0)  # restarted: counted again from 0
    assert after.rate("g") == pytest.approx(5.0) and tracker.resets == 1
    assert tracker.update({"g": 15.0}, 41.0).rate("g") == pytest.approx(10.0)  # from the restart at t=40
