"""Goodput (requests per second that meet every SLO, as `vllm bench serve
--goodput` counts them): on synthetic records with a known answer, the SLO
text and its refusals, a plain run against the SSE stub, and an experiment
whose verdict gets a goodput row with intervals."""
import json

import pytest
from django.conf import settings
from django.test import Client

from inference.benchmarks import experiments, metrics, services, verdict
from inference.benchmarks.records import RequestRecord
from inference.models import BenchmarkRun, Deployment, Experiment
from tests.sse_stub import StubScript, running_stub


def _record(ttft, latency, tokens, success=True):
    return RequestRecord(index=0, success=success, ttft=ttft, latency=latency, output_tokens=tokens, prompt_tokens=4,
                         chunk_times=[ttft, latency], tokens_per_chunk=[1, tokens - 1])


def test_goodput_counts_the_requests_that_meet_every_slo_known_answer():
    records = [
        _record(0.100, 1.090, 100),  # TTFT 100 ms, TPOT 10 ms: meets both
        _record(0.300, 1.290, 100),  # TTFT 300 ms: misses the TTFT SLO
        _record(0.100, 3.070, 100),  # TPOT 30 ms: misses the TPOT SLO
        _record(0.150, 0.150, 1),  # one token: TPOT counts as 0, meets both
        _record(0.050, 0.500, 10, success=False),  # failed: never counts
    ]
    out = metrics.summarize(records, duration=2.0, goodput_slos={"ttft": 200, "tpot": 20})
    assert out["completed"] == 4 and out["request_throughput"] == 2.0
    assert out["request_goodput"] == pytest.approx(2 / 2.0)
    assert out["goodput_slos_ms"] == {"ttft": 200, "tpot": 20}
    # One SLO: only TTFT matters, so the slow decoder counts too.
    assert metrics.summarize(records, 2.0, {"ttft": 200})["request_goodput"] == pytest.approx(3 / 2.0)
    assert metrics.summarize(records, 2.0, {"e2el": 1200})["request_goodput"] == pytest.approx(2 / 2.0)
    assert metrics.summarize(records, 2.0)["request_goodput"] is None  # no SLO: not measured


@pytest.mark.parametrize("given,expected", [
    ("ttft:500 tpot:50", {"ttft": 500.0, "tpot": 50.0}),
    ("e2el:5000, TTFT:250.5", {"ttft": 250.5, "e2el": 5000.0}),
    ({"tpot": "20", "ttft": ""}, {"tpot": 20.0}),
    ("", {}),
    (None, {}),
])
def test_goodput_slos_read_vllm_text_or_an_object(given, expected):
    assert services.goodput_slos(given) == expected


@pytest.mark.parametrize("given,words", [
    ("ttft=500", "write NAME:MILLISECONDS"),
    ("latency:500", "use ttft, tpot or e2el"),
    ("tpot:0", "positive number of milliseconds"),
    ("tpot:fast", "positive number of milliseconds"),
    ({"ttft": True}, "positive number of milliseconds"),
    ("tpot:10 tpot:20", "given twice"),
    (["ttft", 5], "give text such as"),
])
def test_bad_goodput_slos_are_refused_with_what_to_write(given, words):
    with pytest.raises(services.BenchmarkInputError, match=words):
        services.goodput_slos(given)


def test_the_goodput_definition_in_words():
    assert verdict.goodput_definition({}) == ""
    assert verdict.goodput_definition({"tpot": 50.0, "ttft": 500.0}) == (
        "Goodput: the requests per second that met every SLO (time to first token ≤ 500 ms, "
        "time per output token ≤ 50 ms).")


def test_goodput_gets_a_verdict_with_intervals_on_synthetic_repetitions():
    rows = []
    for rep, (a, b) in enumerate([(2.0, 4.1), (2.1, 3.9), (1.9, 4.0)]):
        for config, value in ((0, a), (1, b)):
            rows.append({"configuration": config, "repetition": rep, "concurrency": 8, "prompt_tokens": None,
                         "metrics": {"request_goodput": value}, "run_id": None})
    result = verdict.analyse(rows, ["A", "B"])
    (row,) = result["points"][0]["metrics"]
    assert row["metric"] == "request_goodput" and row["better"] == "higher"
    assert [c["mean"] for c in row["configs"]] == [pytest.approx(2.0), pytest.approx(4.0)]
    assert row["ratios"][1]["ratio"] == pytest.approx(2.0)
    assert 1.0 < row["ratios"][1]["low"] < 2.0 < row["ratios"][1]["high"]
    assert row["verdicts"][1] == "better"
    assert row["sentences"][1].startswith("B's goodput is 2.00× higher than A's at concurrency 8 (95% CI")


# ---------------------------------------------------------------- against the SSE stub


def _deployment(name, stub, argv):
    return Deployment.objects.create(name=name, host=settings.HOST_NAME, engine_name="vllm", status="ready",
                                     phase="ready", port=stub.port, served_model_name="stub", argv=argv)


def test_a_plain_run_measures_goodput_with_the_slos_it_was_given(operator, django_capture_on_commit_callbacks):
    client = Client()
    client.force_login(operator)
    # The first chunk (the role-only one, which TTFT counts) waits 0.5 s: no request can meet a 250 ms
    # TTFT SLO, every one meets a 60 s E2E SLO.
    with running_stub(StubScript(role_delay=0.5)) as stub:
        dep = _deployment("slow start", stub, ["vllm", "serve", "m"])
        body = {"deployment": dep.pk, "scenario": "decode-single-stream", "num_prompts": 2, "num_warmups": 0,
                "prompt_tokens": 8, "output_tokens": 4}
        refused = client.post("/api/benchmarks/", json.dumps({**body, "goodput": "ttft:250 p99:3"}),
                              content_type="application/json")
        assert refused.status_code == 400 and "use ttft, tpot or e2el" in refused.json()["error"]["message"]
        assert BenchmarkRun.objects.count() == 0
        runs = []
        for goodput in ("ttft:250", {"e2el": 60000}):
            with django_capture_on_commit_callbacks(execute=False):
                response = client.post("/api/benchmarks/", json.dumps({**body, "goodput": goodput}),
                                       content_type="application/json")
            assert response.status_code == 202, response.content
            run = BenchmarkRun.objects.get(pk=response.json()["run"]["id"])
            services.benchmark_execute(run.pk, worker="here")  # the task's work, in this process
            run.refresh_from_db()
            assert run.status == "succeeded", run.error
            runs.append(run)
    missed, met = runs
    assert missed.config["goodput_slos"] == {"ttft": 250.0}
    assert missed.result[0]["goodput_slos_ms"] == {"ttft": 250.0}
    assert missed.result[0]["request_goodput"] == 0.0 and missed.result[0]["completed"] == 2
    assert met.result[0]["request_goodput"] == pytest.approx(met.result[0]["request_throughput"])
    page = client.get(f"/benchmarks/{missed.pk}/").content.decode()
    assert "time to first token ≤ 250 ms" in page
    # Runs with other goodput SLOs measured different things: the compare page says so.
    compared = client.get(f"/benchmarks/compare?ids={missed.pk},{met.pk}").content.decode()
    assert 'data-field="goodput"' in compared and "e2el:60000" in compared


def test_an_experiment_verdict_has_a_goodput_row_with_intervals(operator, transactional_db, monkeypatch):
    """Two stub servers, B decoding about 4x faster than A; the per-stream SLO (1 tok/s) gives the goodput
    definition TPOT <= 1000 ms, which every request meets, so each run's goodput is its request throughput.
    Committed rows (transactional_db): the runner's heartbeat thread has a connection of its own."""
    queued = []
    monkeypatch.setattr(experiments.jobs, "enqueue", lambda task, *args, **kw: queued.append(args))  # no broker here
    with running_stub(StubScript(token_delay=0.02)) as slow, running_stub(StubScript(token_delay=0.005)) as fast:
        # The two differ in one setting and in the address each listens on.
        a = _deployment("A", slow, ["vllm", "serve", "m", "--host", "127.0.0.1", "--port", str(slow.port),
                                    "--max-num-seqs", "8", "--api-key", "***"])
        b = _deployment("B", fast, ["vllm", "serve", "m", "--host", "0.0.0.0", "--port", str(fast.port),
                                    "--max-num-seqs", "16"])
        experiment = experiments.experiment_create(
            configurations=[{"deployment": a.pk}, {"deployment": b.pk}], scenario="decode-single-stream",
            repetitions=3, slo_decode_tok_s=1, user=operator,
            overrides={"num_prompts": 3, "num_warmups": 0, "prompt_tokens": 8, "output_tokens": 8})
        assert experiment.workload["goodput_slos"] == {"tpot": 1000.0} and queued == [(experiment.pk,)]
        experiments.experiment_execute(experiment.pk, worker="here")  # the task's work, in this process
    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.SUCCEEDED, (experiment.error, list(
        experiment.steps.values_list("status", "note")))
    runs = BenchmarkRun.objects.filter(experiment_steps__experiment=experiment)
    assert runs.count() == 6 and all(r.config["goodput_slos"] == {"tpot": 1000.0} for r in runs)

    result = experiments.analysis(experiment)
    rows = {r["metric"]: r for r in result["workloads"][0]["points"][0]["metrics"]}
    goodput = rows["request_goodput"]
    for ci in goodput["configs"]:
        assert ci["n"] == 3 and ci["low"] is not None and ci["low"] <= ci["mean"] <= ci["high"]
    ratio = goodput["ratios"][1]
    assert ratio["low"] is not None and ratio["low"] <= ratio["ratio"] <= ratio["high"]
    assert ratio["ratio"] > 1.5  # B answers each request about 4x sooner, one at a time
    assert goodput["sentences"][1]
    # Every request met the SLO: goodput is each run's request throughput, so the statistics agree.
    measured = experiments.measurements(experiment)
    assert all(m["metrics"]["request_goodput"] == pytest.approx(m["metrics"]["request_throughput"]) for m in measured)
    assert [c["mean"] for c in goodput["configs"]] == [
        pytest.approx(sum(m["metrics"]["request_throughput"] for m in measured if m["configuration"] == i) / 3)
        for i in (0, 1)]
    # Only the setting that differs is listed; the port, the host and the key are not configuration.
    assert [d["flag"] for d in result["differences"]] == ["--max-num-seqs"]

    client = Client()
    client.force_login(operator)
    page = client.get(f"/benchmarks/experiments/{experiment.pk}/").content.decode()
    assert 'data-metric="request_goodput"' in page and "goodput (req/s within SLO)" in page
    assert "Goodput: the requests per second that met every SLO (time per output token ≤ 1000 ms)." in page
    assert "--max-num-seqs" in page and "--port" not in page
