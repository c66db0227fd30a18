"""Experiment pages on rows written as a finished experiment leaves them:
the verdict first, the tables, the exports (a self-contained HTML report,
vllm-bench JSON lines that Kiln's import reads back)."""
import json
import random
import re

import pytest
from django.conf import settings
from django.test import Client

from inference.benchmarks import services
from inference.models import BenchmarkRun, Deployment, EngineRuntime, Experiment, ExperimentStep, LaunchProfile


@pytest.fixture
def finished(db, operator):
    """A finished experiment: A at about 30 tok/s, B 2.7x faster, 3 repetitions at concurrency 1 and 4."""
    runtime = EngineRuntime.objects.create(host=settings.HOST_NAME, name="vllm", engine="vllm", kind="executable",
                                           path="/bin/false", version="0.26.0")
    profiles = [LaunchProfile.objects.create(name=n, host=settings.HOST_NAME, runtime=runtime, model_path="/m",
                                             gpus=[0]) for n in ("plain", "dflash")]
    experiment = Experiment.objects.create(
        name="DFlash2 on V100", host=settings.HOST_NAME, scenario="decode-single-stream", repetitions=3,
        configurations=[{"label": "A", "name": "plain", "profile": profiles[0].pk, "deployment": None},
                        {"label": "B", "name": "dflash", "profile": profiles[1].pk, "deployment": None}],
        concurrency_levels=[1, 4], status="succeeded", order="blocks", created_by=operator,
        progress={"done": 12, "total": 12, "percent": 100})
    rng = random.Random(1)
    index = 0
    for config, speed, argv in ((0, 30.0, ["vllm", "serve", "m"]),
                                (1, 81.0, ["vllm", "serve", "m", "--speculative-config", "{}"])):
        dep = Deployment.objects.create(name=profiles[config].name, host=settings.HOST_NAME, profile=profiles[config],
                                        status="stopped", argv=argv)
        for rep in range(3):
            for c in (1, 4):
                thr = rng.gauss(speed * c * 0.8, 1.0)
                result = [{"completed": 5, "failed": 0, "request_throughput": 1.0, "output_throughput": thr,
                           "median_decode_tokens_per_s_per_stream": rng.gauss(speed, 0.5),
                           "mean_ttft_ms": rng.gauss(100, 2), "mean_tpot_ms": 1000 / speed,
                           "mean_e2el_ms": 512000 / speed, "max_concurrency": c, "source": "kiln", "step": 0}]
                run = BenchmarkRun.objects.create(deployment=dep, scenario="decode-single-stream", status="succeeded",
                                                  result=result, snapshot={"argv": argv}, label=f"{config}-{rep}-{c}")
                ExperimentStep.objects.create(experiment=experiment, index=index, kind="measure",
                                              configuration=config, repetition=rep, concurrency=c,
                                              scenario="decode-single-stream", status="done", run=run, deployment=dep)
                index += 1
    return experiment


def test_the_detail_page_says_the_verdict_first(finished, viewer):
    client = Client()
    client.force_login(viewer)
    page = client.get(f"/benchmarks/experiments/{finished.pk}/").content.decode()
    verdict = page.index('id="verdict"')
    assert verdict < page.index('id="steps"') and verdict < page.index("exp-chart-0-throughput")
    text = re.sub(r"\s+", " ", page)
    assert re.search(r"B decodes 2\.\d\d× faster than A per stream at concurrency 1 \(95% CI 2\.\d\d–2\.\d\d×\)", text)
    assert "time to first token: no measurable difference between B and A" in text
    assert "--speculative-config" in text  # what differs between the configurations
    assert "Student" in text  # the method is stated
    assert 'href="/benchmarks/experiments/%d/report.html"' % finished.pk in page


def test_the_report_is_one_file_that_needs_no_network(finished, viewer):
    client = Client()
    client.force_login(viewer)
    response = client.get(f"/benchmarks/experiments/{finished.pk}/report.html")
    assert response.status_code == 200 and "attachment" in response["Content-Disposition"]
    html = response.content.decode()
    assert "B decodes 2." in html and "Plotly" in html and "KilnExperiment" in html
    # nothing fetched from anywhere: no src= or href= to another file or host
    assert not re.search(r'<(script|link|img)[^>]+(src|href)=', html)
    data = json.loads(re.search(r'<script type="application/json" id="experiment-data">(.*?)</script>', html).group(1))
    assert [p["concurrency"] for p in data["workloads"][0]["curves"]["series"][1]["points"]] == [1, 4]


def test_results_export_is_vllm_bench_json_lines_that_import_back(finished, viewer, operator):
    client = Client()
    client.force_login(viewer)
    response = client.get(f"/benchmarks/experiments/{finished.pk}/results.jsonl")
    lines = [json.loads(line) for line in response.content.decode().splitlines()]
    assert len(lines) == 12
    assert all(line["kiln"]["experiment"] == finished.pk for line in lines)
    assert {line["kiln"]["configuration"] for line in lines} == {"A", "B"}
    run = services.benchmark_import(data=response.content, file_name="exp.jsonl", user=operator)
    assert len(run.result) == 12 and run.status == "succeeded"


def test_a_viewer_cannot_start_or_cancel(finished, viewer):
    client = Client()
    client.force_login(viewer)
    assert client.post("/benchmarks/experiments/", {"config_a": "p1"}).status_code == 403
    assert client.post(f"/benchmarks/experiments/{finished.pk}/cancel").status_code == 403


def test_the_form_refuses_bad_input_with_the_reason(finished, operator):
    client = Client()
    client.force_login(operator)
    response = client.post("/benchmarks/experiments/", {
        "config_a": f"p{finished.configurations[0]['profile']}", "config_b": f"p{finished.configurations[1]['profile']}",
        "scenario": "decode-single-stream", "repetitions": 3, "order": "interleaved"})
    assert response.status_code == 400
    assert "GPUs overlap" in response.content.decode()
    response = client.post("/benchmarks/experiments/", {
        "config_a": f"p{finished.configurations[0]['profile']}", "config_b": f"p{finished.configurations[1]['profile']}",
        "scenario": "decode-single-stream", "repetitions": 3, "goodput": "ttft=800"})
    assert response.status_code == 400 and "write NAME:MILLISECONDS" in response.content.decode()
    response = client.post("/benchmarks/experiments/", {
        "config_a": f"p{finished.configurations[0]['profile']}", "config_b": f"p{finished.configurations[1]['profile']}",
        "scenario": "decode-single-stream", "repetitions": 2, "concurrency_levels": "1,2", "goodput": "ttft:800"})
    assert response.status_code == 302
    experiment = Experiment.objects.exclude(pk=finished.pk).get()
    assert experiment.order == "alternating" and experiment.steps.filter(kind="measure").count() == 8
    assert experiment.workload["goodput_slos"] == {"ttft": 800.0}
    page = client.get("/benchmarks/experiments/").content.decode()
    assert f"/benchmarks/experiments/{experiment.pk}/" in page


def _login(page, server, user):
    page.goto(f"{server}/login/")
    page.fill("input[name=username]", user.username)
    page.fill("input[name=password]", user.plain_password)
    page.click("button[type=submit]")


@pytest.mark.browser
def test_the_experiment_pages_in_the_browser_draw_curves_and_fit_a_phone(asgi_server, finished, operator, browser):
    from tests.helpers import REPO

    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    _login(page, asgi_server, operator)
    run_ids = list(finished.steps.values_list("run_id", flat=True))
    for width in (1400, 420):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{asgi_server}/benchmarks/experiments/{finished.pk}/")
        page.locator("#exp-chart-0-throughput .plot-container").wait_for(timeout=30000)
        page.locator("#exp-chart-0-pareto .plot-container").wait_for(timeout=30000)
        assert "B decodes 2." in page.inner_text("#verdict")
        # ticks only at the measured levels
        ticks = page.locator("#exp-chart-0-throughput .xtick text").all_text_contents()
        assert ticks == ["1", "4"], ticks
        page.screenshot(path=str(artifacts / f"experiment-detail-{width}.png"), full_page=True)
        page.goto(f"{asgi_server}/benchmarks/experiments/")
        page.screenshot(path=str(artifacts / f"experiments-{width}.png"), full_page=True)
        page.goto(f"{asgi_server}/benchmarks/compare?ids={run_ids[0]},{run_ids[2]},{run_ids[4]},"
                  f"{run_ids[6]},{run_ids[8]},{run_ids[10]}")
        page.locator("#chart-throughput .plot-container").wait_for(timeout=30000)
        page.screenshot(path=str(artifacts / f"benchmarks-compare-{width}.png"), full_page=True)
    # The exported report, opened with every request refused: the charts still draw.
    client = Client()
    client.force_login(operator)
    html = client.get(f"/benchmarks/experiments/{finished.pk}/report.html").content.decode()
    offline = browser.new_page()
    requests = []
    offline.route("**/*", lambda route: (requests.append(route.request.url), route.abort()))
    offline.on("pageerror", lambda exc: errors.append(str(exc)))
    offline.set_viewport_size({"width": 1400, "height": 900})
    offline.set_content(html)
    offline.locator("#exp-chart-0-decode .plot-container").wait_for(timeout=30000)
    offline.screenshot(path=str(artifacts / "experiment-report-1400.png"), full_page=True)
    assert not requests, requests
    assert not errors, errors
