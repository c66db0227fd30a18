"""SGLang: `python -m sglang.launch_server`.

SGLang has no stand-alone server executable, so a runtime is a virtualenv or
the Python interpreter that has sglang installed. Log lines are the ones SGLang
prints on start-up ("Load weight begin", "Capture cuda graph begin", "The
server is fired up and ready to roll!").
"""

from __future__ import annotations

import re

from inference.engines.base import (
    PHASE_COMPILING,
    PHASE_LOADING,
    PHASE_READY,
    PHASE_STARTING,
    Engine,
    LaunchSpec,
    Runtime,
    VersionInfo,
    probe_torch,
    register,
    rule,
    run_probe,
    venv_bin,
)
from inference.engines.base import gettext_noop

MODULE = "sglang.launch_server"


@register
class SglangEngine(Engine):
    name = "sglang"
    label = "SGLang"
    health_path = "/health"
    metrics_path = "/metrics"  # needs --enable-metrics, which we always pass
    dtypes = ("auto", "half", "float16", "bfloat16", "float", "float32")
    kv_cache_dtypes = ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16")
    docker_command = ("python3", "-m", MODULE)

    owned_flags = frozenset({
        "--model-path", "--model", "--host", "--port", "--api-key", "--tp-size", "--tensor-parallel-size",
        "--tp", "--dtype", "--quantization", "--context-length", "--mem-fraction-static", "--kv-cache-dtype",
        "--attention-backend", "--disable-radix-cache", "--max-running-requests", "--speculative-algorithm",
        "--speculative-draft-model-path", "--speculative-num-draft-tokens", "--served-model-name",
        "--cpu-offload-gb", "--enable-metrics", "--trust-remote-code",
    })
    dangerous_flags = {
        "--config": "a config file could override any field of the form unchecked",
        "--enable-custom-logit-processor": "lets API callers send code to run in the server",
    }
    allowed_flags = frozenset({
        "--chunked-prefill-size", "--max-prefill-tokens", "--schedule-policy", "--schedule-conservativeness",
        "--cuda-graph-max-bs", "--disable-cuda-graph", "--enable-torch-compile", "--tokenizer-path",
        "--tokenizer-mode", "--revision", "--load-format", "--download-dir", "--random-seed",
        "--reasoning-parser", "--tool-call-parser", "--chat-template", "--log-level", "--log-requests",
        "--page-size", "--dp-size", "--ep-size", "--enable-dp-attention", "--speculative-num-steps",
        "--speculative-eagle-topk", "--sampling-backend", "--grammar-backend", "--stream-interval",
        "--watchdog-timeout", "--enable-mixed-chunk", "--disable-overlap-schedule",
    })

    metric_prefix = "sglang:"
    metric_names = {
        "prompt_tokens_total": (("sglang:prompt_tokens_total",), "sum"),
        "generation_tokens_total": (("sglang:generation_tokens_total",), "sum"),
        "cached_tokens_total": (("sglang:cached_tokens_total",), "sum"),
        "requests_running": (("sglang:num_running_reqs",), "sum"),
        "requests_waiting": (("sglang:num_queue_reqs",), "sum"),
        "kv_cache_usage": (("sglang:token_usage",), "max"),
        "prefix_cache_hit_rate_gauge": (("sglang:cache_hit_rate",), "max"),
        # SGLang calls a preemption a retraction.
        "preemptions_total": (("sglang:num_retracted_requests_total",), "sum"),
        "spec_acceptance_gauge": (("sglang:spec_accept_rate",), "max"),
        "spec_accept_length_gauge": (("sglang:spec_accept_length",), "max"),
        "generation_tokens_per_s_gauge": (("sglang:gen_throughput",), "sum"),
    }

    phase_rules = (
        (PHASE_READY, re.compile(r"The server is fired up and ready to roll")),
        (PHASE_COMPILING, re.compile(r"Capture cuda graph|KV Cache is allocated|Memory pool end|torch\.compile")),
        (PHASE_LOADING, re.compile(r"Load weight begin|Load weight end|Loading safetensors checkpoint shards")),
        (PHASE_STARTING, re.compile(r"server_args=|Init torch distributed begin")),
    )
    failure_rules = (
        rule("not_enough_memory", r"Not enough memory\. Please try to increase --mem-fraction-static",
             gettext_noop("The KV cache got no memory: raise GPU memory utilization (--mem-fraction-static), "
             "lower max model len, or use more GPUs."), fatal=True),
        rule("bf16_unsupported", r"Bfloat16 is only supported|bf16 is not supported",
             gettext_noop("This GPU has no bf16 (V100 is compute capability 7.0): set dtype to half."), fatal=True),
        rule("no_kernel_image", r"no kernel image is available for execution on the device",
             gettext_noop("This SGLang/torch build has no kernels for this GPU's architecture."), fatal=True),
        rule("cuda_oom", r"CUDA out of memory|torch\.OutOfMemoryError",
             gettext_noop("The GPU ran out of memory: lower GPU memory utilization, max model len or max running requests.")),
        rule("port_in_use", r"Address already in use",
             gettext_noop("The port is taken: leave the port empty so the panel picks a free one.")),
        rule("unknown_argument", r"unrecognized arguments|error: argument",
             gettext_noop("This SGLang version does not accept one of the flags: check the extra arguments."), fatal=True),
        rule("scheduler_failed", r"Scheduler hit an exception|Rank \d+ scheduler is dead",
             gettext_noop("The SGLang scheduler crashed; the lines above name the cause.")),
    )

    def program(self, runtime: Runtime) -> list[str]:
        python = venv_bin(runtime, "python") if runtime.kind == "venv" else runtime.path
        return [python, "-m", MODULE]

    def engine_args(self, spec: LaunchSpec, listen_host: str, port: int) -> list[str]:
        a = ["--model-path", spec.model, "--host", listen_host, "--port", str(port), "--enable-metrics"]
        if spec.served_model_name:
            a += ["--served-model-name", spec.served_model_name]
        if spec.tensor_parallel_size and spec.tensor_parallel_size > 1:
            a += ["--tp-size", str(spec.tensor_parallel_size)]
        if spec.dtype:
            a += ["--dtype", spec.dtype]
        if spec.quantization:
            a += ["--quantization", spec.quantization]
        if spec.max_model_len:
            a += ["--context-length", str(spec.max_model_len)]
        if spec.gpu_memory_utilization is not None:
            # SGLang's knob is the static share (weights + KV cache), close to vLLM's.
            a += ["--mem-fraction-static", f"{spec.gpu_memory_utilization:g}"]
        if spec.cpu_offload_gb:
            a += ["--cpu-offload-gb", f"{spec.cpu_offload_gb:g}"]
        if spec.kv_cache_dtype:
            a += ["--kv-cache-dtype", spec.kv_cache_dtype]
        if spec.attention_backend:
            a += ["--attention-backend", spec.attention_backend]
        if spec.enable_prefix_caching is False:
            a += ["--disable-radix-cache"]
        if spec.max_num_seqs:
            a += ["--max-running-requests", str(spec.max_num_seqs)]
        if spec.speculative_config:
            sc = spec.speculative_config
            a += ["--speculative-algorithm", str(sc["method"]).upper()]
            if sc.get("model"):
                a += ["--speculative-draft-model-path", str(sc["model"])]
            if sc.get("num_speculative_tokens"):
                a += ["--speculative-num-draft-tokens", str(sc["num_speculative_tokens"])]
        if spec.api_key:
            # SGLang reads the key only from argv; command_preview masks it.
            a += ["--api-key", spec.api_key]
        if spec.trust_remote_code:
            a += ["--trust-remote-code"]
        return a

    def check_spec(self, spec: LaunchSpec, runtime=None) -> dict[str, str]:
        p = super().check_spec(spec, runtime)
        if spec.swap_space_gb is not None:
            p["swap_space_gb"] = "SGLang has no swap space; use CPU offload instead"
        return p

    def detect_version(self, runtime: Runtime, timeout: float = 60.0) -> VersionInfo:
        if runtime.kind == "docker":
            return VersionInfo(detail="version of a Docker image is read from its tag; not probed", ok=False)
        python = self.program(runtime)[0]
        code, out = run_probe([python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"], timeout)
        if code != 0 or not out.strip():
            return VersionInfo(detail=out.strip()[-300:] or "sglang is not installed there", ok=False)
        cuda, archs, why = probe_torch(python, timeout)
        return VersionInfo(version=out.strip().splitlines()[-1], torch_cuda=cuda, cuda_archs=archs,
                           detail=why, ok=True)
