"""vLLM's own start-up lines about memory, as real logs print them, and estimate vs actual."""
import json

from inference.preflight import fit
from inference.preflight.fit import GPU, GiB, LaunchSettings
from inference.preflight.capacity import compare_with_estimate, parse_vllm_capacity
from tests.helpers import FIXTURES

# A V1 start (vLLM late 2025), lines as printed by an EngineCore process
# (the loading line is from a real log; the KV lines follow kv_cache_utils' merged format).
V1_LOG = """\
(EngineCore_DP0 pid=497) INFO 10-03 07:29:01 [default_loader.py:268] Loading weights took 2.39 seconds
(EngineCore_DP0 pid=497) INFO 10-03 07:29:02 [gpu_model_runner.py:2392] Model loading took 27.5185 GiB and 305.873276 seconds
(EngineCore_DP0 pid=497) INFO 10-03 07:29:06 [backends.py:539] Using cache directory: /root/.cache/vllm/torch_compile_cache/db0c3ad157/rank_0_0/backbone for vLLM's torch.compile
(EngineCore_DP0 pid=497) INFO 10-03 07:29:20 [gpu_worker.py:298] Available KV cache memory: 8.11 GiB
(EngineCore_DP0 pid=497) INFO 10-03 07:29:20 [kv_cache_utils.py:1087] GPU KV cache size: 34,952 tokens, Maximum concurrency for 8,192 tokens per request: 4.27x
(APIServer pid=1) INFO 10-03 07:29:41 [launcher.py:44] Application startup complete.
"""

# Early V1 (vllm-project/vllm PR #12569): blocks instead of tokens, "GB" weights line.
EARLY_V1_LOG = """\
INFO 01-30 03:18:12 gpu_model_runner.py:848] Loading model weights took 67.7229 GB
INFO 01-30 03:19:13 monitor.py:31] torch.compile takes 54.73 s in total
INFO 01-30 03:19:14 kv_cache_utils.py:395] # GPU blocks: 1381
INFO 01-30 03:19:14 kv_cache_utils.py:398] Maximum concurrency for 2048 tokens per request: 10.79x
"""

# Separate lines (vllm-project/vllm issue #21348, Qwen3-235B-A22B-FP8 on 4xH100) and the newest
# "GiB memory and" wording with a CUDA graph estimate (vllm-project/vllm PR #39559).
SPLIT_LOG = """\
(EngineCore pid=1623438) INFO 04-13 22:09:30 [gpu_model_runner.py:4104] Model loading took 5.12 GiB memory and 12.512337 seconds
(EngineCore pid=1623438) INFO 04-13 22:09:36 [gpu_model_runner.py:5993] Estimated CUDA graph memory: 0.73 GiB total
Available KV cache memory: 8.11 GiB
GPU KV cache size: 178,880 tokens
"""

# Tensor parallel: each rank reports its own loading; V0 worker summary line (PR #14447).
TP_V0_LOG = """\
(VllmWorkerProcess pid=521) INFO 04-12 08:21:19 [worker.py:267] model weights take 21.21GiB; non_torch_memory takes 0.20GiB; PyTorch activation peak memory takes 0.37GiB; the rest of the memory reserved for KV Cache is 1.57GiB.
(VllmWorkerProcess pid=507) INFO 04-12 08:21:19 [worker.py:267] model weights take 21.25GiB; non_torch_memory takes 0.20GiB; PyTorch activation peak memory takes 0.37GiB; the rest of the memory reserved for KV Cache is 1.53GiB.
"""


def test_v1_log():
    got = parse_vllm_capacity(V1_LOG)
    assert got == {"model_loading_gib": 27.5185, "available_kv_cache_gib": 8.11, "kv_cache_tokens": 34952,
                   "max_model_len": 8192, "max_concurrency": 4.27, "started": True}


def test_early_v1_log_turns_blocks_into_tokens():
    got = parse_vllm_capacity(EARLY_V1_LOG.splitlines())
    assert got["model_loading_gib"] == 67.7229
    assert got["gpu_blocks"] == 1381 and got["kv_cache_tokens"] == 1381 * 16
    assert (got["max_model_len"], got["max_concurrency"]) == (2048, 10.79)
    assert "started" not in got


def test_split_lines_and_newest_wording():
    got = parse_vllm_capacity(SPLIT_LOG)
    assert got["model_loading_gib"] == 5.12 and got["cuda_graph_gib"] == 0.73
    assert got["available_kv_cache_gib"] == 8.11 and got["kv_cache_tokens"] == 178880


def test_tensor_parallel_ranks_keep_the_limiting_rank():
    got = parse_vllm_capacity(TP_V0_LOG)
    assert got["model_loading_gib"] == 21.25
    assert got["available_kv_cache_gib"] == 1.53


def test_unrelated_or_broken_lines_are_ignored():
    assert parse_vllm_capacity(["", "garbage", None, "Available KV cache memory: lots"]) == {}


def test_estimate_vs_actual_rows():
    cfg = json.loads((FIXTURES / "llama3_8b_config.json").read_text())
    report = fit.fit_from_config(cfg, [GPU("A100", 80 * GiB, "8.0")], LaunchSettings(max_model_len=8192))
    actual = {"model_loading_gib": 14.99, "available_kv_cache_gib": 54.2, "kv_cache_tokens": 443_904,
              "max_concurrency": 54.19}
    rows = {r["what"]: r for r in compare_with_estimate(report, actual)}
    weights = rows["weights per GPU"]
    assert weights["estimate"] == round(16060522496 / GiB, 2) == 14.96
    assert weights["actual"] == 14.99 and abs(weights["ratio"] - 1.002) < 0.001
    assert rows["KV cache tokens"]["estimate"] == report.kv_cache_tokens
    # the dict form (as stored on a deployment) gives the same rows
    assert compare_with_estimate(report.as_dict(), actual) == list(rows.values())
    missing = compare_with_estimate(report, {})
    assert all(r["actual"] is None and r["ratio"] is None for r in missing)
