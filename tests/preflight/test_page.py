"""/deployments/plan in a real browser: the live preflight panel answers as the form changes."""
import pytest

from inference.deployments import presets
from inference.models import EngineRuntime
from tests.helpers import REPO


@pytest.mark.browser
def test_plan_nvfp4_on_one_v100_stock_vllm_errors_then_1cat_clears_them_live(asgi_server, browser, operator):
    EngineRuntime.objects.create(name="vLLM 0.33.0 (PyPI)", host="gpu1", engine="vllm", kind="venv",
                                 version="0.33.0", torch_cuda="12.8",
                                 cuda_archs=["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"])
    onecat = EngineRuntime.objects.create(name="1Cat-vLLM 0.10.2 sm70", host="gpu1", engine="vllm", kind="venv",
                                          version="0.10.2", torch_cuda="12.6", cuda_archs=["sm_70", "sm_75", "sm_80"])
    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    page = browser.new_page()
    page.set_viewport_size({"width": 1400, "height": 1100})
    page.goto(asgi_server + "/login/")
    page.fill("input[name=username]", operator.username)
    page.fill("input[name=password]", operator.plain_password)
    page.click("button[type=submit]")
    page.wait_for_url(asgi_server + "/")

    page.goto(asgi_server + "/deployments/plan")
    assert page.inner_text("h1") == "Plan a launch"
    page.select_option("#id_preset", presets.QWEN_NVFP4.slug)
    page.select_option("#id_target", label="1× V100 32GB (sm70)")
    page.select_option("#id_runtime", label="vLLM 0.33.0 (PyPI) · vLLM 0.33.0 on gpu1")
    # the preset filled in its launch values
    assert page.input_value("#id_dtype") == "half"
    assert page.input_value("#id_max_model_len") == "32768"

    panel = page.locator("#preflight-panel")
    error = panel.locator('li.error[data-code="no-sm70-kernels"]')
    error.wait_for(timeout=15000)
    assert "Fix: this vLLM build has no sm_70 kernels: register an sm70 build such as 1Cat-vLLM" in error.inner_text()
    nvfp4 = panel.locator('li.error[data-code="nvfp4-needs-sm75"]')
    assert "ModelOpt NVFP4 needs compute capability 7.5" in nvfp4.inner_text()
    assert "error" in panel.locator('[data-pf="state"]').inner_text()
    assert panel.locator('[data-pf="override-box"]').count() == 0     # nothing is launched from this page
    # the memory bar: weights / KV cache / overhead / free for the one V100, with GiB labels
    bar = panel.locator('.pf-gpu[data-gpu="Tesla V100-SXM2-32GB"] .pf-bar')
    for seg in ("weights", "kv", "overhead", "free"):
        assert bar.locator(f'[data-seg="{seg}"]').count() == 1, seg
    assert "GiB" in bar.locator('[data-seg="weights"]').get_attribute("title")
    widths = [bar.locator(f'[data-seg="{s}"]').bounding_box()["width"] for s in ("weights", "kv", "overhead", "free")]
    assert all(w > 3 for w in widths) and widths[0] > widths[1]       # 18 GiB of weights > 9 GiB of cache
    # the cache holds fewer than the 8 planned requests of 32,768 tokens; the page says how many and
    # suggests exactly that --max-num-seqs (3 with vLLM's hybrid paging: 784-token blocks)
    held = panel.locator('[data-answer="max_concurrency"]').inner_text().split()[-2]
    assert held.isdigit() and 1 <= int(held) < 8
    assert "tokens" in panel.locator('[data-answer="max_context"]').inner_text()
    assert f"--max-num-seqs {held}" in panel.locator('[data-pf="suggestions"]').inner_text()
    page.screenshot(path=str(artifacts / "plan-stock-vllm-errors.png"), full_page=True)

    # switch to the sm70 build: the errors go away without a reload
    page.select_option("#id_runtime", str(onecat.pk))
    page.wait_for_function("() => document.querySelectorAll('#preflight-panel li.error').length === 0", timeout=15000)
    assert panel.locator('li.warning[data-code="nvfp4-emulated-on-sm70"]').count() == 1
    assert "1 warning" in panel.locator('[data-pf="state"]').inner_text()
    assert "1Cat-vLLM 0.10.2 sm70" in panel.locator('[data-pf="where"]').inner_text()

    # a bad value is named, and fixing it brings the answers back
    page.fill("#id_gpu_memory_utilization", "1.7")
    panel.locator('[data-pf="problems"] [data-field="gpu_memory_utilization"]').wait_for(timeout=15000)
    page.fill("#id_gpu_memory_utilization", "0.95")
    page.wait_for_function("() => document.querySelector('#preflight-panel [data-pf=problems]').children.length === 0",
                           timeout=15000)
    # CPU only: the bar is the machine's RAM
    page.select_option("#id_preset", presets.GEMMA_DEMO.slug)
    page.select_option("#id_runtime", "")
    page.select_option("#id_target", "cpu")
    panel.locator(".pf-gpu-name strong:has-text('RAM')").wait_for(timeout=15000)
    assert page.input_value("#id_engine") == "llamacpp"
    page.wait_for_function("() => document.querySelector('#preflight-panel [data-pf=where]').textContent.includes('llamacpp')",
                           timeout=15000)
    assert "for 4 × 4,096 tokens" in panel.locator('[data-answer="kv_tokens"]').inner_text()
    page.screenshot(path=str(artifacts / "plan-cpu-gemma.png"), full_page=True)
    page.select_option("#id_preset", presets.QWEN_NVFP4.slug)
    page.select_option("#id_target", "v100-32gb-x1")
    page.select_option("#id_runtime", str(onecat.pk))
    panel.locator('li.warning[data-code="nvfp4-emulated-on-sm70"]').wait_for(timeout=15000)
    page.screenshot(path=str(artifacts / "plan-1cat-ok.png"), full_page=True)
    page.close()


@pytest.mark.browser
def test_plan_opens_without_errors_and_a_preset_sets_the_hardware_it_names(asgi_server, browser, operator):
    """The issue: the page opened on three red errors, and the 2× V100 preset left the hardware at 1× V100."""
    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    page = browser.new_page()
    page.set_viewport_size({"width": 1400, "height": 1100})
    page.goto(asgi_server + "/login/")
    page.fill("input[name=username]", operator.username)
    page.fill("input[name=password]", operator.plain_password)
    page.click("button[type=submit]")
    page.wait_for_url(asgi_server + "/")
    page.goto(asgi_server + "/deployments/plan")
    panel = page.locator("#preflight-panel")
    panel.locator('[data-answer="max_concurrency"]').wait_for(timeout=30000)
    page.wait_for_function("() => document.querySelector('#preflight-panel [data-pf=state]').textContent.trim() !== ''",
                           timeout=15000)
    assert panel.locator("li.error").count() == 0, panel.inner_text()
    assert page.input_value("#id_target") == "v100-32gb-x1" and page.is_checked("#id_sm70_build")
    page.screenshot(path=str(artifacts / "plan-first-open.png"), full_page=True)

    page.select_option("#id_preset", presets.QWEN_AWQ_TP2.slug)
    assert page.input_value("#id_target") == "v100-32gb-x2"
    assert page.input_value("#id_tensor_parallel_size") == "2"
    page.wait_for_function("() => document.querySelectorAll('#preflight-panel .pf-gpu').length === 2", timeout=15000)
    assert panel.locator("li.error").count() == 0, panel.inner_text()
    page.select_option("#id_preset", presets.GEMMA_DEMO.slug)
    assert page.input_value("#id_target") == "cpu" and not page.is_checked("#id_sm70_build")
    page.close()
