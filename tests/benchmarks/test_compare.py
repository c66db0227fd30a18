"""Export as vLLM JSON, import vLLM and guidellm results, compare, roofline."""

import json

import pytest

from inference.benchmarks.compare import (
    ResultFormatError,
    compare,
    diff_launch_args,
    load_results,
    roofline_decode_tokens_per_s,
    vllm_result_json,
)
from inference.benchmarks.harness import BenchmarkConfig, LoadShape, RequestSpec, run_benchmark
from tests.sse_stub import running_stub

VLLM_KEYS = ["date", "backend", "model_id", "num_prompts", "request_rate", "burstiness", "max_concurrency",
             "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
             "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
             "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms",
             "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms"]


@pytest.fixture(scope="module")
def run():
    with running_stub() as stub:
        cfg = BenchmarkConfig(stub.url, "stub", load=LoadShape("concurrency", 2))
        return run_benchmark(cfg, [RequestSpec("a b c", 8) for _ in range(4)])


def test_export_uses_vllm_field_names_and_round_trips(run, tmp_path):
    data = vllm_result_json(run, label="kiln", detailed=True)
    for key in VLLM_KEYS:
        assert key in data, key
    assert data["completed"] == 4 and data["max_concurrency"] == 2 and data["request_rate"] == "inf"
    assert data["output_lens"] == [8, 8, 8, 8] and len(data["itls"]) == 4
    path = tmp_path / "kiln.json"
    path.write_text(json.dumps(data))
    (back,) = load_results(path)
    assert "itls" not in back  # per-request lists stay out of comparisons
    assert back["mean_ttft_ms"] == data["mean_ttft_ms"]


def test_imports_a_vllm_save_result_file(tmp_path):
    saved = {"date": "20260101-000000", "backend": "vllm", "model_id": "Qwen/Qwen3-8B", "num_prompts": 100,
             "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 16, "duration": 20.0,
             "completed": 100, "failed": 0, "total_input_tokens": 102400, "total_output_tokens": 12800,
             "request_throughput": 5.0, "request_goodput": None, "output_throughput": 640.0,
             "total_token_throughput": 5760.0, "mean_ttft_ms": 120.0, "median_ttft_ms": 110.0,
             "std_ttft_ms": 5.0, "p99_ttft_ms": 200.0, "mean_tpot_ms": 20.0, "median_tpot_ms": 20.0,
             "std_tpot_ms": 1.0, "p99_tpot_ms": 25.0, "mean_itl_ms": 20.0, "median_itl_ms": 19.0,
             "std_itl_ms": 2.0, "p99_itl_ms": 40.0, "ttfts": [0.1] * 100}
    lines = tmp_path / "append.jsonl"
    lines.write_text(json.dumps(saved) + "\n" + json.dumps({**saved, "max_concurrency": 32}) + "\n")
    results = load_results(lines)
    assert [r["max_concurrency"] for r in results] == [16, 32]
    assert results[0]["source"] == "vllm" and "ttfts" not in results[0]


def _dist(mean, median=None, std=0.0, p99=None, total=None):
    median = mean if median is None else median
    pct = {"p001": mean, "p01": mean, "p05": mean, "p10": mean, "p25": mean, "p50": median, "p75": mean,
           "p90": mean, "p95": mean, "p99": p99 if p99 is not None else mean, "p999": mean}
    d = {"mean": mean, "median": median, "mode": mean, "variance": std * std, "std_dev": std, "min": mean,
         "max": mean, "count": 10, "total_sum": total if total is not None else mean * 10, "percentiles": pct}
    return {"successful": d, "errored": d, "incomplete": d, "total": d}


def test_imports_a_guidellm_report():
    report = {
        "metadata": {"version": 2, "guidellm_version": "0.5.0"},
        "config": {"model": "Qwen/Qwen3-8B", "target": "http://localhost:8000"},
        "benchmarks": [{
            "type_": "generative_benchmark",
            "config": {"strategy": {"type_": "concurrent", "streams": 8}},
            "scheduler_metrics": {"measure_start_time": 100.0, "measure_end_time": 130.0},
            "duration": 30.0,
            "metrics": {
                "request_totals": {"successful": 60, "errored": 2, "incomplete": 1, "total": 63},
                "requests_per_second": _dist(2.0),
                "output_tokens_per_second": _dist(400.0),
                "tokens_per_second": _dist(1400.0),
                "prompt_token_count": _dist(500.0, total=30000),
                "output_token_count": _dist(200.0, total=12000),
                "time_to_first_token_ms": _dist(150.0, median=140.0, std=10.0, p99=300.0),
                "time_to_first_output_token_ms": _dist(151.0),
                "time_per_output_token_ms": _dist(20.0),
                "inter_token_latency_ms": _dist(19.0),
                "request_latency": _dist(4.2),
                "output_tokens_per_iteration": _dist(1.0),
            },
        }],
    }
    (r,) = load_results(json.dumps(report))
    assert r["source"] == "guidellm" and r["model_id"] == "Qwen/Qwen3-8B"
    assert (r["completed"], r["failed"], r["max_concurrency"], r["duration"]) == (60, 3, 8, 30.0)
    assert (r["mean_ttft_ms"], r["median_ttft_ms"], r["std_ttft_ms"], r["p99_ttft_ms"]) == (150.0, 140.0, 10.0, 300.0)
    assert r["mean_e2el_ms"] == pytest.approx(4200.0)  # guidellm keeps latency in seconds
    assert (r["total_input_tokens"], r["total_output_tokens"], r["output_throughput"]) == (30000, 12000, 400.0)


def test_unknown_files_get_a_clear_error(tmp_path):
    with pytest.raises(ResultFormatError, match="guidellm report"):
        load_results({"hello": 1})
    with pytest.raises(ResultFormatError, match="No result file"):
        load_results(tmp_path / "missing.json")


def test_compare_gives_ratios_to_the_baseline_and_the_differing_flags(run):
    a = vllm_result_json(run, label="before")
    b = {**a, "label": "after", "output_throughput": a["output_throughput"] * 2, "mean_ttft_ms": 0.0}
    table = compare([a, b], launch_argvs=[
        ["vllm", "serve", "m", "--max-num-seqs", "64", "--enforce-eager"],
        ["vllm", "serve", "m", "--max-num-seqs=128", "--gpu-memory-utilization", "0.9"],
    ])
    assert table["columns"] == ["before", "after"]
    rows = {row["metric"]: row for row in table["rows"]}
    assert rows["output_throughput"]["ratios"] == [1.0, 2.0] and rows["output_throughput"]["better"] == "higher"
    assert rows["mean_ttft_ms"]["ratios"][1] == 0.0 and rows["mean_ttft_ms"]["better"] == "lower"
    assert table["launch_args"] == {"--enforce-eager": [True, None], "--gpu-memory-utilization": [None, "0.9"],
                                    "--max-num-seqs": ["64", "128"]}
    with pytest.raises(ValueError, match="at least two"):
        compare([a])


def test_diff_launch_args_sees_a_changed_model_and_negative_numbers():
    diff = diff_launch_args([["llama-server", "-m", "a.gguf", "--temp", "-1"],
                             ["llama-server", "-m", "b.gguf", "--temp", "-1"]])
    assert diff == {"-m": ["a.gguf", "b.gguf"]}


def test_roofline_bound_is_bandwidth_over_weight_bytes():
    # A 27B model at ~4.5 bits on a V100 (900 GB/s): about 58 tokens/s at best.
    bound = roofline_decode_tokens_per_s(900, 27.8e9 * 4.5 / 8)
    assert bound == pytest.approx(57.55, rel=1e-3)
    with pytest.raises(ValueError, match="positive"):
        roofline_decode_tokens_per_s(0, 1)
