"""Benchmark runs end to end: the API queues a row, a real Celery worker runs
the scenario against a real llama-server (Gemma demo), the row records the
metrics, the snapshot and /metrics deltas; cancel, import, export, compare,
and the operator-only rules."""
import json

import pytest

from inference.benchmarks.services import BenchmarkInputError, benchmark_import
from inference.models import BenchmarkRun
from tests.helpers import wait_until

VLLM_KEYS = ["date", "backend", "model_id", "num_prompts", "request_rate", "burstiness", "max_concurrency",
             "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
             "request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms",
             "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
             "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms", "input_lens", "output_lens", "ttfts", "itls"]

VLLM_SAVED = {"date": "20260101-000000", "backend": "vllm", "model_id": "Qwen/Qwen3-8B", "num_prompts": 100,
              "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 16, "duration": 20.0,
              "completed": 100, "failed": 0, "total_input_tokens": 102400, "total_output_tokens": 12800,
              "request_throughput": 5.0, "request_goodput": None, "output_throughput": 640.0,
              "total_token_throughput": 5760.0, "mean_ttft_ms": 120.0, "median_ttft_ms": 110.0,
              "std_ttft_ms": 5.0, "p99_ttft_ms": 200.0, "mean_tpot_ms": 20.0, "median_tpot_ms": 20.0,
              "std_tpot_ms": 1.0, "p99_tpot_ms": 25.0, "mean_itl_ms": 20.0, "median_itl_ms": 19.0,
              "std_itl_ms": 2.0, "p99_itl_ms": 40.0, "mean_e2el_ms": 2660.0, "median_e2el_ms": 2600.0,
              "p99_e2el_ms": 3100.0, "ttfts": [0.1] * 100}


def _dist(mean, median=None, std=1.0, p99=None, total=None):
    d = {"mean": mean, "median": median if median is not None else mean, "std_dev": std,
         "percentiles": {"p50": median if median is not None else mean, "p90": mean * 1.2, "p95": mean * 1.3,
                         "p99": p99 if p99 is not None else mean * 1.5}}
    if total is not None:
        d["total_sum"] = total
    return {"successful": d}


GUIDELLM_REPORT = {
    "metadata": {"version": 2, "guidellm_version": "0.5.0"},
    "config": {"model": "Qwen/Qwen3-8B", "target": "http://localhost:8000"},
    "benchmarks": [{
        "type_": "generative_benchmark", "config": {"strategy": {"type_": "concurrent", "streams": streams}},
        "duration": 30.0,
        "metrics": {
            "request_totals": {"successful": 60, "errored": 0, "incomplete": 0, "total": 60},
            "requests_per_second": _dist(2.0 * streams), "output_tokens_per_second": _dist(100.0 * streams),
            "tokens_per_second": _dist(400.0 * streams), "prompt_token_count": _dist(500.0, total=30000),
            "output_token_count": _dist(200.0, total=12000),
            "time_to_first_token_ms": _dist(150.0 * streams), "time_per_output_token_ms": _dist(20.0),
            "inter_token_latency_ms": _dist(19.0), "request_latency": _dist(4.2),
        },
    } for streams in (1, 8)],
}


def login(client, user):
    assert client.post("/login/", {"username": user.username, "password": user.plain_password}).status_code == 302


def start(client, deployment, **body):
    body = {"deployment": deployment.pk, "scenario": "decode-single-stream", **body}
    return client.post("/api/benchmarks/", json.dumps(body), content_type="application/json")


def finished(run_id):
    run = BenchmarkRun.objects.get(pk=run_id)
    return run if run.is_finished else None


def wait_finished(run_id, timeout, tmp_path):
    """The finished row; on a timeout, the worker's log says why."""
    try:
        return wait_until(lambda: finished(run_id), timeout, "the worker to finish the run", interval=0.3)
    except AssertionError:
        log = tmp_path / "worker.log"
        run = BenchmarkRun.objects.get(pk=run_id)
        raise AssertionError(f"run #{run_id} still {run.status} {run.progress}; worker log:\n"
                             + (log.read_text()[-4000:] if log.exists() else "(none)")) from None


# ---------------------------------------------------------------- real engine, real worker


def test_a_run_from_the_api_records_metrics_snapshot_and_server_deltas(client, operator, celery_worker,
                                                                       demo_deployment, tmp_path):
    login(client, operator)
    response = start(client, demo_deployment, num_prompts=3, num_warmups=1, prompt_tokens=32, output_tokens=16,
                     label="gemma decode")
    assert response.status_code == 202, response.content
    run_id = response.json()["run"]["id"]
    assert response.json()["run"]["status"] == "queued"

    run = wait_finished(run_id, 240, tmp_path)
    assert run.status == "succeeded", run.error
    assert run.worker == "test@testhost"
    (step,) = run.result
    # Three measured requests of 16 tokens each; the warm-up is not counted.
    assert (step["completed"], step["failed"], step["total_output_tokens"]) == (3, 0, 48)
    assert step["max_concurrency"] == 1 and step["num_warmups"] == 1
    assert step["median_decode_tokens_per_s_per_stream"] > 5
    assert step["mean_ttft_ms"] > 0 and len(step["ttfts"]) == 3 and step["input_lens"][0] > 30
    # The snapshot says exactly what was measured.
    snap = run.snapshot
    assert snap["engine"]["name"] == "llamacpp" and snap["engine"]["version"]
    assert snap["argv"] == demo_deployment.argv and "--metrics" in snap["argv"]
    assert snap["profile"]["max_num_seqs"] == 4 and snap["profile"]["preset"] == "gemma3-270m-demo-cpu"
    assert list(snap["model"]["sha256"].values()) == [demo_deployment.model.recorded_hashes[
        "gemma-3-270m-q4_k_m.gguf"]]
    assert snap["gpu"]["name"] == "CPU" and run.gpu_name == "CPU"
    # Server-side counters moved by exactly what the harness measured (warm-up excluded).
    assert snap["server_metrics"]["generation_tokens"] == 48
    # llama.cpp counts only prompt tokens it processed: the demo's transcript
    # template opens every prompt with the same words, which come from its
    # prompt cache after the first request, so the server's count is lower.
    assert 0 < snap["server_metrics"]["prompt_tokens"] <= step["total_input_tokens"]
    assert run.progress["percent"] == 100.0 and run.started <= run.finished

    api = client.get(f"/api/benchmarks/{run_id}").json()["run"]
    assert api["status"] == "succeeded" and api["headline"]["completed"] == 3

    export = client.get(f"/api/benchmarks/{run_id}/export")
    assert export.status_code == 200 and "attachment" in export["Content-Disposition"]
    data = json.loads(export.content)
    for key in VLLM_KEYS:
        assert key in data, key
    assert data["completed"] == 3 and data["kiln"]["argv"] == snap["argv"]
    assert "generated_texts" not in data

    page = client.get(f"/benchmarks/{run_id}/").content.decode()
    assert "gemma decode" in page and "Succeeded" in page and "median_decode_tokens_per_s_per_stream" in page


def test_cancel_mid_run_keeps_what_finished(client, operator, celery_worker, demo_deployment, tmp_path):
    login(client, operator)
    run_id = start(client, demo_deployment, num_prompts=40, num_warmups=0, prompt_tokens=32,
                   output_tokens=48).json()["run"]["id"]

    def some_done():
        run = BenchmarkRun.objects.get(pk=run_id)
        return run.status == "running" and (run.progress.get("completed") or 0) >= 1

    wait_until(some_done, 120, "the first requests to finish", interval=0.3)
    response = client.post(f"/api/benchmarks/{run_id}/cancel")
    assert response.status_code == 202
    run = wait_finished(run_id, 60, tmp_path)
    assert run.status == "cancelled", run.error
    (step,) = run.result
    assert 1 <= step["completed"] < 40 and step["cancelled"] is True
    # A finished run cannot be cancelled again.
    again = client.post(f"/api/benchmarks/{run_id}/cancel")
    assert again.status_code == 409 and "already cancelled" in again.json()["error"]["message"]


def test_a_run_against_a_deployment_that_is_not_ready_is_refused(client, operator, demo_deployment):
    demo_deployment.status = "stopped"
    demo_deployment.save()
    login(client, operator)
    response = start(client, demo_deployment)
    assert response.status_code == 409
    assert "needs a ready deployment" in response.json()["error"]["message"]
    assert not BenchmarkRun.objects.exists()


# ---------------------------------------------------------------- no engine needed


def test_bad_start_input_says_what_to_fix(client, operator, db):
    from inference.models import Deployment

    dep = Deployment.objects.create(name="d", host="testhost", status="ready", port=9, engine_name="vllm")
    login(client, operator)
    bad = start(client, dep, scenario="warp-speed").json()["error"]["message"]
    assert "Unknown benchmark scenario 'warp-speed'" in bad and "decode-single-stream" in bad
    assert "num_prompts: must be between 1 and 10000" in start(client, dep, num_prompts=0).json()["error"]["message"]
    assert "sweep:" in start(client, dep, scenario="concurrency-sweep", sweep="1,x").json()["error"]["message"]
    no_dep = client.post("/api/benchmarks/", json.dumps({"scenario": "prefix-cache"}), content_type="application/json")
    assert no_dep.json()["error"]["message"].startswith("deployment:")
    assert client.post("/api/benchmarks/", "{", content_type="application/json").status_code == 400


def test_queued_run_is_cancelled_at_once(client, operator, db):
    run = BenchmarkRun.objects.create(scenario="decode-single-stream")
    login(client, operator)
    assert client.post(f"/api/benchmarks/{run.pk}/cancel").json()["run"]["status"] == "cancelled"
    from inference.benchmarks.services import benchmark_execute

    benchmark_execute(run.pk, "w")  # a late worker finds it cancelled and leaves it alone
    run.refresh_from_db()
    assert run.status == "cancelled" and not run.worker


def test_import_vllm_save_result_and_guidellm_report(client, operator, db):
    login(client, operator)
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = SimpleUploadedFile("qwen-c16.json", json.dumps(VLLM_SAVED).encode(), "application/json")
    response = client.post("/api/benchmarks/import", {"file": upload})
    assert response.status_code == 201, response.content
    run = BenchmarkRun.objects.get(pk=response.json()["run"]["id"])
    assert (run.source, run.status, run.label, run.model_name) == ("vllm-bench", "succeeded", "qwen-c16",
                                                                   "Qwen/Qwen3-8B")
    assert run.result[0]["output_throughput"] == 640.0 and "ttfts" not in run.result[0]

    upload = SimpleUploadedFile("guidellm.json", json.dumps(GUIDELLM_REPORT).encode(), "application/json")
    response = client.post("/benchmarks/import", {"file": upload, "label": "guidellm sweep"})
    assert response.status_code == 302
    g = BenchmarkRun.objects.get(label="guidellm sweep")
    assert g.source == "guidellm" and len(g.result) == 2
    assert [s["max_concurrency"] for s in g.result] == [1, 8]
    assert g.result[1]["output_throughput"] == 800.0 and g.result[0]["mean_e2el_ms"] == pytest.approx(4200.0)

    # The history filters by model; the detail page renders an imported run.
    listed = client.get("/api/benchmarks/?model=Qwen/Qwen3-8B").json()["runs"]
    assert {r["id"] for r in listed} == {run.pk, g.pk}
    assert client.get("/api/benchmarks/?model=nope").json()["runs"] == []
    assert "guidellm sweep" in client.get(f"/benchmarks/{g.pk}/").content.decode()


def test_import_of_something_else_is_refused_with_a_reason(client, operator, db):
    from django.core.files.uploadedfile import SimpleUploadedFile

    login(client, operator)
    for content, expected in ((b"", "empty"), (b"\xff\xfe\x00", "not UTF-8"), (b"{nope", "not JSON"),
                              (b'{"hello": 1}', "Not a known result format")):
        upload = SimpleUploadedFile("x.json", content)
        response = client.post("/api/benchmarks/import", {"file": upload})
        assert response.status_code == 400 and expected in response.json()["error"]["message"], content
    assert not BenchmarkRun.objects.exists()


def test_an_exported_run_imports_back_with_its_snapshot(client, operator, db):
    run = BenchmarkRun.objects.create(
        scenario="decode-single-stream", status="succeeded", engine="vllm", gpu_name="Tesla V100-SXM2-32GB",
        result=[{**{k: v for k, v in VLLM_SAVED.items() if k != "ttfts"}, "source": "kiln", "step": 0}],
        snapshot={"argv": ["vllm", "serve", "m", "--max-num-seqs", "8"], "engine": {"name": "vllm"},
                  "gpu": {"name": "Tesla V100-SXM2-32GB"}, "model": {"name": "m", "sha256": {"a": "b"}}})
    login(client, operator)
    exported = client.get(f"/api/benchmarks/{run.pk}/export").content
    response = client.post("/api/benchmarks/import?name=back.json", exported, content_type="application/json")
    assert response.status_code == 201, response.content
    back = BenchmarkRun.objects.get(pk=response.json()["run"]["id"])
    assert back.snapshot["argv"] == run.snapshot["argv"] and back.engine == "vllm"
    assert back.gpu_name == "Tesla V100-SXM2-32GB" and back.result[0]["completed"] == 100


def _kiln_run(label, argv, throughput, ttft, decode, gpu="Tesla V100-SXM2-32GB"):
    step = {**{k: v for k, v in VLLM_SAVED.items() if k != "ttfts"}, "source": "kiln", "step": 0,
            "label": label, "max_concurrency": 1, "output_throughput": throughput, "median_ttft_ms": ttft,
            "mean_ttft_ms": ttft, "median_decode_tokens_per_s_per_stream": decode}
    return BenchmarkRun.objects.create(
        label=label, scenario="decode-single-stream", status="succeeded", engine="vllm", gpu_name=gpu,
        model_name="m", result=[step],
        snapshot={"argv": argv, "model": {"name": "m", "weight_bytes": 15 * 10**9},
                  "gpu": {"name": gpu, "bandwidth_gbps": 900.0}})


def test_compare_two_runs_ratios_argument_diff_and_roofline(client, viewer, db):
    base = _kiln_run("seqs 8", ["vllm", "serve", "m", "--max-num-seqs", "8", "--enforce-eager"], 400.0, 100.0, 50.0)
    other = _kiln_run("seqs 16", ["vllm", "serve", "m", "--max-num-seqs", "16"], 600.0, 150.0, 45.0)
    login(client, viewer)  # reading and comparing needs no operator role
    data = client.get(f"/api/benchmarks/compare?ids={base.pk},{other.pk}").json()
    rows = {r["metric"]: r for r in data["table"]["rows"]}
    assert rows["output_throughput"]["ratios"] == [1.0, 1.5]
    # One run each: the ratio, but never "better", "worse" or "same" (no interval to tell it from noise).
    assert rows["output_throughput"]["verdicts"] == ["baseline", "unknown"]
    assert rows["median_ttft_ms"]["ratios"] == [1.0, 1.5] and rows["median_ttft_ms"]["verdicts"][1] == "unknown"
    assert data["table"]["launch_args"] == {"--enforce-eager": [True, None], "--max-num-seqs": ["8", "16"]}
    # Roofline: 900 GB/s / 15 GB = 60 tok/s at batch 1.
    assert [r["limit"] for r in data["rooflines"]] == [pytest.approx(60.0)] * 2
    assert data["rooflines"][0]["efficiency"] == pytest.approx(50 / 60)
    # Baseline switch.
    flipped = client.get(f"/api/benchmarks/compare?ids={base.pk},{other.pk}&baseline={other.pk}").json()
    assert {r["metric"]: r for r in flipped["table"]["rows"]}["output_throughput"]["ratios"][0] == pytest.approx(2 / 3)

    page = client.get(f"/benchmarks/compare?ids={base.pk},{other.pk}").content.decode()
    assert "--max-num-seqs" in page and "chart-roofline" in page
    # The ratio is shown in the colour of "no interval", not of a verdict the single runs cannot give.
    assert '<span class="unknown">×1.50</span>' in page
    text = " ".join(page.split())
    assert "output throughput: #" in text and "= 1.50× from single runs at concurrency 1; repeat the runs" in text
    assert text.index('id="verdict"') < text.index('id="differences"') < text.index('id="compare-table"')
    detail = client.get(f"/benchmarks/{base.pk}/").content.decode()
    assert "Batch-1 decode 50.0 tok/s of a 60.0 tok/s limit" in detail
    assert "of a 120.0 tok/s limit" in client.get(f"/benchmarks/{base.pk}/?bandwidth=1800").content.decode()
    assert client.get(f"/benchmarks/compare?ids={base.pk}").status_code == 400
    too_big = client.get(f"/benchmarks/compare?ids=99999999999999999999,{base.pk}")  # beyond 64 bits
    assert too_big.status_code == 400 and b"whole numbers from 1" in too_big.content
    assert "No benchmark run #999" in client.get(f"/api/benchmarks/compare?ids={base.pk},999").json()["error"]["message"]


def test_gpu_names_map_to_bandwidth():
    from inference.benchmarks.services import gpu_bandwidth_gbps

    assert gpu_bandwidth_gbps("Tesla V100-SXM2-32GB") == 900.0
    assert gpu_bandwidth_gbps("Tesla V100S-PCIE-32GB") == 1134.0
    assert gpu_bandwidth_gbps("NVIDIA H100 80GB HBM3") == 3350.0
    assert gpu_bandwidth_gbps("NVIDIA A100-SXM4-80GB") == 2039.0
    assert gpu_bandwidth_gbps("NVIDIA L40S") == 864.0
    assert gpu_bandwidth_gbps("NVIDIA H200") == 4800.0
    assert gpu_bandwidth_gbps("CPU") is None and gpu_bandwidth_gbps("Some Card") is None


def test_viewer_gets_403_on_start_cancel_and_import(client, viewer, db):
    from inference.models import Deployment

    dep = Deployment.objects.create(name="d", host="testhost", status="ready", port=9)
    run = BenchmarkRun.objects.create(scenario="decode-single-stream")
    login(client, viewer)
    assert start(client, dep).status_code == 403
    assert client.post(f"/api/benchmarks/{run.pk}/cancel").status_code == 403
    assert client.post("/api/benchmarks/import", json.dumps(VLLM_SAVED), content_type="application/json").status_code == 403
    assert client.post("/benchmarks/import").status_code == 403
    assert BenchmarkRun.objects.get(pk=run.pk).status == "queued" and BenchmarkRun.objects.count() == 1
    page = client.get("/benchmarks/").content.decode()
    assert "New run" not in page and "Import results" not in page
    assert client.get("/api/benchmarks/").status_code == 200


def test_compare_pools_repeated_runs_into_a_verdict_with_intervals(client, viewer, db):
    """Three runs of each command line: pooled as repetitions, so the page can say "faster" with a CI."""
    a_argv, b_argv = ["vllm", "serve", "m"], ["vllm", "serve", "m", "--speculative-config", "{}"]
    runs = [_kiln_run(f"A{i}", a_argv, 30.0 + i, 100.0 + i, 30.0 + i) for i in range(3)]
    runs += [_kiln_run(f"B{i}", b_argv, 81.0 + i, 101.0 - i, 81.0 + i) for i in range(3)]
    login(client, viewer)
    page = client.get("/benchmarks/compare?ids=" + ",".join(str(r.pk) for r in runs)).content.decode()
    text = " ".join(page.split())
    a_label = ", ".join(f"#{r.pk}" for r in runs[:3])
    b_label = ", ".join(f"#{r.pk}" for r in runs[3:])
    assert f"{b_label} decodes 2.6" in text and f"faster than {a_label} per stream" in text and "95% CI" in text
    assert "no measurable difference" in text  # TTFT: 100-102 vs 99-101 ms
    assert "--speculative-config" in text


def test_runs_that_differ_only_in_port_host_and_key_are_one_configuration(client, viewer, db):
    """The panel picks a free port per launch: the same profile launched three times on other ports
    is three repetitions of one configuration, not three configurations."""
    def argv(port, host, extra=()):
        port_args = [f"--port={port}"] if port % 2 else ["--port", str(port)]  # both spellings
        return ["vllm", "serve", "m", "--host", host, *port_args, "--api-key", "***", *extra]

    a = [_kiln_run(f"A{i}", argv(8000 + i, "127.0.0.1"), 30.0 + i, 100.0 + i, 30.0 + i) for i in range(3)]
    b = [_kiln_run(f"B{i}", argv(8100 + i, "0.0.0.0", ["--speculative-config", "{}"]), 81.0 + i, 100.0, 81.0 + i)
         for i in range(3)]
    login(client, viewer)
    ids = ",".join(str(r.pk) for r in a + b)
    data = client.get(f"/api/benchmarks/compare?ids={ids}").json()
    assert data["table"]["launch_args"] == {"--speculative-config": [None] * 3 + ["{}"] * 3}
    page = " ".join(client.get(f"/benchmarks/compare?ids={ids}").content.decode().split())
    assert ", ".join(f"#{r.pk}" for r in b) + " decodes 2.6" in page  # pooled: three runs each, with a CI
    assert "--port" not in page and "--host" not in page and "--api-key" not in page
    # Differing only in the port: pooled into one configuration, and no launch argument listed.
    same = client.get(f"/api/benchmarks/compare?ids={a[0].pk},{a[1].pk}").json()
    assert same["table"]["launch_args"] == {}
    from inference.benchmarks.services import pooled_verdict

    pooled = pooled_verdict([a[0], a[1]])
    assert pooled["pooled"] and pooled["labels"] == [f"#{a[0].pk}, #{a[1].pk}"] and pooled["repetitions"] == [2]


def test_compare_names_workload_differences_not_only_the_command_line(client, viewer, db):
    argv = ["vllm", "serve", "m"]
    base = _kiln_run("c1", argv, 30.0, 100.0, 30.0)
    other = _kiln_run("c4", argv, 90.0, 300.0, 25.0, gpu="NVIDIA H100 80GB HBM3")
    other.result = [{**other.result[0], "max_concurrency": 4}]
    other.save()
    login(client, viewer)
    page = client.get(f"/benchmarks/compare?ids={base.pk},{other.pk}").content.decode()
    assert 'data-field="concurrency"' in page and 'data-field="gpu"' in page
    assert "Same workload" not in page


def test_an_import_without_measured_data_is_refused(operator, db):
    empty = json.dumps({"completed": 0, "request_throughput": 0.0, "output_throughput": 0.0, "failed": 5}).encode()
    with pytest.raises(BenchmarkInputError, match="no measured data"):
        benchmark_import(data=empty, file_name="empty.json", user=operator)
    assert BenchmarkRun.objects.count() == 0
