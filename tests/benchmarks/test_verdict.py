"""The experiment's verdict on synthetic measurements with known answers."""
import random

from inference.benchmarks import verdict


def _measure(config, rep, concurrency, **metrics):
    return {"configuration": config, "repetition": rep, "concurrency": concurrency, "prompt_tokens": None,
            "metrics": metrics, "run_id": config * 100 + rep}


def _experiment(seed=5, reps=4):
    """B decodes 2.7x faster than A at concurrency 1; TTFT is the same."""
    rng = random.Random(seed)
    rows = []
    for rep in range(reps):
        rows.append(_measure(0, rep, 1, median_decode_tokens_per_s_per_stream=rng.gauss(30, 0.6),
                             mean_ttft_ms=rng.gauss(100, 3), output_throughput=rng.gauss(30, 0.6)))
        rows.append(_measure(1, rep, 1, median_decode_tokens_per_s_per_stream=rng.gauss(81, 1.5),
                             mean_ttft_ms=rng.gauss(100, 3), output_throughput=rng.gauss(81, 1.5)))
    return rows


def _row(result, metric):
    return next(r for r in result["points"][0]["metrics"] if r["metric"] == metric)


def test_faster_decode_is_said_in_words_with_its_interval():
    result = verdict.analyse(_experiment(), ["A", "B"])
    decode = _row(result, "median_decode_tokens_per_s_per_stream")
    assert decode["verdicts"] == ["baseline", "better"]
    ratio = decode["ratios"][1]
    assert ratio["low"] < 2.7 < ratio["high"] and ratio["high"] - ratio["low"] < 0.3
    assert decode["sentences"][1].startswith("B decodes 2.")
    assert "× faster than A per stream at concurrency 1 (95% CI" in decode["sentences"][1]
    ttft = _row(result, "mean_ttft_ms")
    assert ttft["verdicts"][1] == "same"
    assert "no measurable difference" in ttft["sentences"][1]
    assert result["repetitions"] == [4, 4]
    assert len(result["headline"]) == 3


def test_lower_latency_reads_as_shorter_and_worse_as_longer():
    rows = [_measure(0, r, 4, mean_e2el_ms=v) for r, v in enumerate([400, 410, 395])]
    rows += [_measure(1, r, 4, mean_e2el_ms=v) for r, v in enumerate([200, 205, 198])]
    row = _row(verdict.analyse(rows, ["A", "B"]), "mean_e2el_ms")
    assert row["verdicts"][1] == "better"
    assert "B's end-to-end latency is 2.0" in row["sentences"][1] and "shorter" in row["sentences"][1]
    row = _row(verdict.analyse(rows, ["A", "B"], baseline=1), "mean_e2el_ms")
    assert row["verdicts"][0] == "worse" and "longer" in row["sentences"][0]


def test_single_runs_get_no_verdict():
    rows = [_measure(0, 0, 1, output_throughput=10.0), _measure(1, 0, 1, output_throughput=30.0)]
    row = _row(verdict.analyse(rows, ["A", "B"]), "output_throughput")
    assert row["verdicts"][1] == "unknown"
    assert "repeat the runs" in row["sentences"][1]
    assert "faster" not in row["sentences"][1] and "higher" not in row["sentences"][1]


def test_curves_mark_saturation_and_the_slo_limit():
    rows = []
    # throughput grows to concurrency 16, then flat; per-stream decode falls as users are added
    for c, thr, dec in [(1, 30, 30), (2, 58, 29), (4, 110, 27), (8, 200, 25), (16, 320, 20), (32, 330, 10),
                        (64, 335, 5)]:
        for rep in range(2):
            rows.append(_measure(0, rep, c, output_throughput=thr + rep, median_decode_tokens_per_s_per_stream=dec,
                                 mean_e2el_ms=1000 * c / thr))
    out = verdict.curves(rows, ["A"], slo_decode_tok_s=20)
    series = out["series"][0]
    assert series["saturation_concurrency"] == 16
    assert series["slo_concurrency"] == 16
    assert [p["concurrency"] for p in series["points"]] == [1, 2, 4, 8, 16, 32, 64]
    front = series["pareto"]
    assert front and all(a["throughput"] < b["throughput"] for a, b in zip(front, front[1:]))
    assert verdict.saturation_point([(1, 10, None), (2, 20, None)]) is None  # still growing
