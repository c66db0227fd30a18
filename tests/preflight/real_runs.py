"""Real vLLM starts kept as fixtures (tests/fixtures/vllm_gpu/<run>/), and Kiln's estimate for the same launch.

Each run folder holds what tools/vllm-gpu/probe.py brought back from a lent H200: vllm.log (the real
start-up log), probe.json (the command line, nvidia-smi before/after), gpu.csv (nvidia-smi's and torch's
totals) and config.json (the model shape it started with --load-format dummy).

vLLM's figures are read from the log by Kiln's own parsers (inference/preflight/capacity.py); the
launch settings from the command line probe.json recorded; the GPU as Kiln's monitor sees it
(nvidia-smi's total). Nothing here repeats an expected number.
"""
from __future__ import annotations

import csv
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from inference.preflight import fit
from inference.preflight.capacity import parse_actual_usage, parse_vllm_capacity
from inference.preflight.fit import GPU, GiB, LaunchSettings, MiB

ROOT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "vllm_gpu"
VLLM_DEFAULT_UTILIZATION = 0.92      # vLLM 0.26's --gpu-memory-utilization when not given


def run_names() -> list[str]:
    return sorted(p.parent.name for p in ROOT.glob("*/probe.json"))


def _flags(argv: list[str]) -> dict:
    """`vllm serve MODEL --flag value ...` -> {flag: value or True}."""
    out, i = {}, 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a[2:].split("=", 1)
                out[k] = v
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[a[2:]] = argv[i + 1]
                i += 1
            else:
                out[a[2:]] = True
        i += 1
    return out


def nvidia_smi_total_bytes(folder: Path) -> int:
    """memory.total [MiB] of the GPU, as nvidia-smi (and NVML, Kiln's monitor) reports it."""
    rows = list(csv.reader((folder / "gpu.csv").read_text().splitlines()))
    header = [h.strip() for h in rows[0]]
    return int(rows[1][header.index("memory.total [MiB]")].split()[0]) * MiB


@dataclass
class RealRun:
    name: str
    config: dict
    flags: dict
    gpu: GPU
    settings: LaunchSettings
    actual: dict                  # vLLM's own figures, parsed from vllm.log
    log: str

    def estimate(self) -> fit.FitReport:
        return fit.fit_from_config(self.config, [self.gpu], self.settings)


def load(name: str) -> RealRun:
    folder = ROOT / name
    probe = json.loads((folder / "probe.json").read_text())
    cmd = probe["cmd"] if isinstance(probe["cmd"], list) else shlex.split(probe["cmd"])
    flags = _flags(cmd[cmd.index("serve") + 2:])
    log = (folder / "vllm.log").read_text()
    actual = parse_vllm_capacity(log)
    actual.update(parse_actual_usage(log))
    limits = json.loads(flags["limit-mm-per-prompt"]) if "limit-mm-per-prompt" in flags else None
    settings = LaunchSettings(
        engine="vllm",
        kv_cache_dtype=flags.get("kv-cache-dtype", "auto"),
        gpu_memory_utilization=float(flags.get("gpu-memory-utilization", VLLM_DEFAULT_UTILIZATION)),
        max_model_len=int(flags["max-model-len"]),
        max_num_batched_tokens=int(flags["max-num-batched-tokens"]) if "max-num-batched-tokens" in flags else None,
        engine_max_num_seqs=int(flags["max-num-seqs"]) if "max-num-seqs" in flags else None,
        enforce_eager=bool(flags.get("enforce-eager")),
        enable_prefix_caching=True if flags.get("enable-prefix-caching") else None,
        language_model_only=bool(flags.get("language-model-only"))
        or (limits is not None and not any(limits.values())),
    )
    gpu = GPU("NVIDIA H200", nvidia_smi_total_bytes(folder), "9.0")
    return RealRun(name, json.loads((folder / "config.json").read_text()), flags, gpu, settings, actual, log)


def rows(run: RealRun) -> list[tuple[str, float, float, float]]:
    """(what, Kiln's estimate, vLLM's figure, allowed relative error) for one run."""
    r = run.estimate()
    g = r.gpus[0]
    a = run.actual
    actual_overhead = a["peak_activation_gib"] + a["non_torch_gib"] + a["cudagraph_gib"]
    est_overhead = (g.activation_bytes + g.non_torch_bytes + g.cudagraph_bytes) / GiB
    return [
        ("weights GiB", g.weights_bytes / GiB, a["model_loading_gib"], 0.03),
        ("KV cache GiB", g.kv_cache_bytes / GiB, a["available_kv_cache_gib"], 0.03),
        ("KV cache tokens", r.kv_cache_tokens, a["kv_cache_tokens"], 0.03),
        (f"max concurrency @ {a['max_model_len']:,}", r.concurrency_ratio, a["max_concurrency"], 0.03),
        ("activation+overhead GiB", est_overhead, actual_overhead, 0.30),
    ]
