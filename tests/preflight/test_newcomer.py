"""Preflight answers a new user hit wrongly (issue 17): a safetensors folder on llama.cpp,
GPUs chosen on a host without any, advice for weights larger than the card, and a CPU
target spoken of as GPUs."""
import json
import time

import pytest
import redis as redis_lib
from django.conf import settings

from dashboard.services import MONITOR_HEARTBEAT_KEY
from inference.deployments import presets
from inference.models import ModelArtifact
from inference.preflight.services import planning_target, preflight_for
from tests.preflight.test_services import LLAMACPP_CPU, ONECAT, check_preset, codes


@pytest.mark.django_db
def test_a_safetensors_folder_on_llamacpp_is_an_error_naming_gguf(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1024, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000, "intermediate_size": 2048,
        "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 64)
    model = ModelArtifact.objects.create(name="qwen", source="local", host=settings.HOST_NAME, path=str(tmp_path),
                                         folder=str(tmp_path), status="ready", format="safetensors")
    result = preflight_for(profile_values={}, model=model, runtime=LLAMACPP_CPU, gpus=planning_target("cpu").gpus())
    finding = next(f for f in result["findings"] if f["code"] == "llamacpp-needs-gguf")
    assert finding["level"] == "error" and "GGUF" in finding["fix"] and result["has_errors"]
    # the GGUF demo on llama.cpp is fine
    demo = check_preset(presets.GEMMA_DEMO, planning_target("cpu"), LLAMACPP_CPU)
    assert "llamacpp-needs-gguf" not in codes(demo)


@pytest.mark.django_db
def test_gpus_chosen_on_a_host_whose_monitor_sees_none_is_an_error(redis_clean):
    client = redis_lib.Redis.from_url(redis_clean)
    beat = {"type": "heartbeat", "host": settings.HOST_NAME, "time": time.time(),
            "nvml": {"ok": False, "message": "NVML Shared Library Not Found", "gpu_count": 0}}
    client.set(MONITOR_HEARTBEAT_KEY.format(host=settings.HOST_NAME), json.dumps(beat), ex=30)
    meta = presets.GEMMA_DEMO
    result = check_preset(meta, planning_target("cpu"), LLAMACPP_CPU)  # CPU: fine
    assert not result["has_errors"]
    from inference.preflight.services import gpus_for_host, preset_model
    gpus = gpus_for_host(settings.HOST_NAME, [0, 1])
    result = preflight_for(profile_values={**meta.spec_values, "gpus": [0, 1]}, runtime=LLAMACPP_CPU, gpus=gpus,
                           model_meta_override=preset_model(meta.slug)["meta"])
    finding = next(f for f in result["findings"] if f["code"] == "host-has-no-gpu")
    assert finding["level"] == "error" and "0,1" in finding["message"] and "empty" in finding["fix"]
    # Without a heartbeat (the monitor not running) it stays the warning it was.
    client.delete(MONITOR_HEARTBEAT_KEY.format(host=settings.HOST_NAME))
    result = preflight_for(profile_values={**meta.spec_values, "gpus": [0, 1]}, runtime=LLAMACPP_CPU, gpus=gpus,
                           model_meta_override=preset_model(meta.slug)["meta"])
    assert "no-gpu-facts" in codes(result, "warning") and "host-has-no-gpu" not in codes(result)


@pytest.mark.django_db
def test_weights_larger_than_the_card_get_advice_about_the_weights_not_batched_tokens():
    result = check_preset(presets.QWEN_AWQ_TP2, planning_target("v100-16gb-x1"), ONECAT, tensor_parallel_size=1)
    error = next(f for f in result["findings"] if f["code"] == "does-not-fit")
    assert "weights alone" in error["message"] and "Tesla V100-PCIE-16GB" in error["message"]
    advice = result["fit"]["suggestions"]
    assert advice[0].startswith("--tensor-parallel-size 2") and error["fix"] == advice[0]
    assert not any(s.startswith(("--max-num-batched-tokens", "--enforce-eager", "--gpu-memory-utilization"))
                   for s in advice), advice
    assert any("smaller quantization" in s for s in advice)


@pytest.mark.django_db
def test_a_cpu_target_is_spoken_of_as_ram_not_gpus():
    result = check_preset(presets.QWEN_NVFP4, planning_target("cpu"), ONECAT, max_model_len=262144, max_num_seqs=4)
    assert result["cpu_only"] and result["has_errors"]
    text = json.dumps(result)
    assert "per GPU" not in text and "these GPUs" not in text and "1 requests" not in text
    assert not any(s.startswith(("--gpu-memory-utilization", "--enforce-eager")) for s in result["fit"]["suggestions"])
