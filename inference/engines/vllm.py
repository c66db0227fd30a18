"""vLLM: `vllm serve` with its OpenAI-compatible server.

Flags used here are checked in tests against the flag list of a real release
(tests/fixtures/vllm_flags.txt, read from vLLM 0.34.0's source).
V100 users usually run an older sm70-capable build or the 1Cat-vLLM fork; the
flags we emit are ones those builds share (older ones also know --swap-space).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

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


@register
class VllmEngine(Engine):
    name = "vllm"
    label = "vLLM"
    health_path = "/health"  # 200 when serving, 503 once the engine core died
    metrics_path = "/metrics"
    api_key_env = "VLLM_API_KEY"
    dtypes = ("auto", "half", "float16", "bfloat16", "float", "float32")
    kv_cache_dtypes = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")

    owned_flags = frozenset({
        "--model", "--host", "--port", "--api-key", "--tensor-parallel-size", "-tp", "--dtype",
        "--quantization", "-q", "--max-model-len", "--gpu-memory-utilization", "--swap-space",
        "--cpu-offload-gb", "--kv-cache-dtype", "--attention-backend", "--enable-prefix-caching",
        "--no-enable-prefix-caching", "--max-num-seqs", "--speculative-config", "-sc",
        "--spec-method", "--spec-model", "--spec-tokens", "--served-model-name",
        "--trust-remote-code", "--no-trust-remote-code", "--uds",
    })
    dangerous_flags = {
        "--config": "a config file could override any field of the form unchecked",
        "--allowed-local-media-path": "lets API callers read files on the host",
        "--middleware": "imports arbitrary Python code into the server",
        "--worker-cls": "imports arbitrary Python code",
        "--worker-extension-cls": "imports arbitrary Python code",
        "--scheduler-cls": "imports arbitrary Python code",
        "--logits-processors": "imports arbitrary Python code",
        "--tool-parser-plugin": "loads arbitrary Python code from a file",
        "--io-processor-plugin": "loads arbitrary Python code",
        "--tool-server": "the demo tool server runs model-written code",
        "--hf-token": "the token would be visible in the process list; set HF_TOKEN in the env vars instead",
        "--headless": "the panel needs the HTTP server to supervise the engine",
        "--grpc": "the panel needs the HTTP server to supervise the engine",
    }
    # Tuning flags a user may add by hand. Each exists in vLLM 0.34.0 (tested).
    allowed_flags = frozenset({
        "--enforce-eager", "--no-enforce-eager", "--max-num-batched-tokens", "--block-size", "--seed",
        "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--tokenizer", "--tokenizer-mode",
        "--revision", "--tokenizer-revision", "--load-format", "--download-dir", "--disable-log-stats",
        "--enable-log-requests", "--no-enable-log-requests", "--compilation-config", "-cc",
        "--cudagraph-capture-sizes", "--max-cudagraph-capture-size", "--pipeline-parallel-size", "-pp",
        "--data-parallel-size", "-dp", "--enable-expert-parallel", "--reasoning-parser",
        "--tool-call-parser", "--enable-auto-tool-choice", "--chat-template", "--generation-config",
        "--override-generation-config", "--hf-overrides", "--limit-mm-per-prompt",
        "--mm-processor-cache-gb", "--disable-custom-all-reduce", "--distributed-executor-backend",
        "--kv-offloading-size", "--kv-offloading-backend", "--long-prefill-token-threshold",
        "--async-scheduling", "--no-async-scheduling",
        "--max-logprobs", "--uvicorn-log-level", "--disable-uvicorn-access-log",
        "--disable-access-log-for-endpoints", "--enable-prompt-tokens-details",
        "--enable-force-include-usage", "--default-chat-template-kwargs", "--prefix-caching-hash-algo",
        "--num-gpu-blocks-override", "--kv-cache-memory-bytes", "--enable-lora", "--lora-modules",
        "--max-loras", "--max-lora-rank", "--disable-sliding-window", "--disable-cascade-attn",
        "--structured-outputs-config", "--skip-tokenizer-init", "--mamba-cache-dtype",
        "--max-parallel-loading-workers", "--response-role", "--max-log-len", "--disable-fastapi-docs",
        "--enable-sleep-mode", "--optimization-level", "--performance-mode",
    })

    phase_rules = (
        (PHASE_READY, re.compile(r"Application startup complete")),
        (PHASE_COMPILING, re.compile(r"torch\.compile took|Compiling a graph|Dynamo bytecode transform|"
                                     r"Capturing CUDA graph|Graph capturing finished|Available KV cache memory|"
                                     r"KV cache size: [\d,]+ tokens|Maximum concurrency for|init engine \(profile")),
        (PHASE_LOADING, re.compile(r"Starting to load model|Loading model from scratch|"
                                   r"Loading safetensors checkpoint shards|Loading weights took|Model loading took")),
        (PHASE_STARTING, re.compile(r"vLLM API server version|non-default args|Initializing a V1 LLM engine")),
    )
    failure_rules = (
        rule("bf16_unsupported", r"Bfloat16 is only supported on GPUs with compute capability of at least 8\.0",
             "This GPU has no bf16 (V100 is compute capability 7.0): set dtype to half.", fatal=True),
        rule("no_kv_cache_memory", r"No available memory for the cache blocks",
             "Nothing is left for the KV cache after the weights: raise GPU memory utilization, "
             "use more GPUs (tensor parallel) or a smaller / more quantized model.", fatal=True),
        rule("max_model_len_too_long", r"the estimated maximum model length is (\d+)",
             "The KV cache can't hold the max model length: lower max model len to the estimate in "
             "this line, or raise GPU memory utilization.", fatal=True),
        rule("gpu_memory_taken", r"less than desired GPU memory utilization|not enough GPU memory",
             "Not enough free GPU memory: another process holds the GPU, or GPU memory utilization is "
             "set too high. Check the GPU's processes or lower the utilization."),
        rule("no_kernel_image", r"no kernel image is available for execution on the device",
             "This vLLM/torch build has no kernels for this GPU's architecture (stock wheels dropped "
             "sm70/V100): use a build compiled for it, e.g. an older vLLM or 1Cat-vLLM on V100.", fatal=True),
        rule("cuda_oom", r"CUDA out of memory|torch\.OutOfMemoryError",
             "The GPU ran out of memory: lower max model len / max num seqs or GPU memory utilization, "
             "or add GPUs."),
        rule("unknown_argument", r"unrecognized arguments|error: argument",
             "This vLLM version does not accept one of the flags: check the extra arguments against "
             "`vllm serve --help` of the installed version.", fatal=True),
        rule("port_in_use", r"Address already in use|error while attempting to bind on address",
             "The port is taken: leave the port empty so the panel picks a free one."),
        rule("engine_core_failed", r"Engine core initialization failed",
             "The engine failed while starting; the lines above this one name the cause."),
    )

    def program(self, runtime: Runtime) -> list[str]:
        if runtime.kind == "venv":
            return [venv_bin(runtime, "vllm"), "serve"]
        return [runtime.path, "serve"]

    def engine_args(self, spec: LaunchSpec, listen_host: str, port: int) -> list[str]:
        a = ["--model", spec.model, "--host", listen_host, "--port", str(port)]
        if spec.served_model_name:
            a += ["--served-model-name", spec.served_model_name]
        if spec.tensor_parallel_size and spec.tensor_parallel_size > 1:
            a += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
        if spec.dtype:
            a += ["--dtype", spec.dtype]
        if spec.quantization:
            a += ["--quantization", spec.quantization]
        if spec.max_model_len:
            a += ["--max-model-len", str(spec.max_model_len)]
        if spec.gpu_memory_utilization is not None:
            a += ["--gpu-memory-utilization", f"{spec.gpu_memory_utilization:g}"]
        if spec.swap_space_gb is not None:
            a += ["--swap-space", f"{spec.swap_space_gb:g}"]
        if spec.cpu_offload_gb:
            a += ["--cpu-offload-gb", f"{spec.cpu_offload_gb:g}"]
        if spec.kv_cache_dtype:
            a += ["--kv-cache-dtype", spec.kv_cache_dtype]
        if spec.attention_backend:
            a += ["--attention-backend", spec.attention_backend]
        if spec.enable_prefix_caching is True:
            a += ["--enable-prefix-caching"]
        elif spec.enable_prefix_caching is False:
            a += ["--no-enable-prefix-caching"]
        if spec.max_num_seqs:
            a += ["--max-num-seqs", str(spec.max_num_seqs)]
        if spec.speculative_config:
            # One argv element: JSON needs no quoting when no shell is involved.
            a += ["--speculative-config", json.dumps(spec.speculative_config, separators=(", ", ": "))]
        if spec.trust_remote_code:
            a += ["--trust-remote-code"]
        return a

    def detect_version(self, runtime: Runtime, timeout: float = 60.0) -> VersionInfo:
        if runtime.kind == "docker":
            return VersionInfo(detail="version of a Docker image is read from its tag; not probed", ok=False)
        python = None
        if runtime.kind == "venv":
            python = venv_bin(runtime, "python")
        else:
            # An executable installed by pip starts with "#!/path/to/python".
            python = _shebang_python(runtime.path)
        if python:
            # Reading the package metadata is instant; `vllm --version`
            # imports torch and takes many seconds.
            code, out = run_probe([python, "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
                                  timeout)
        else:
            code, out = run_probe([runtime.path, "--version"], timeout)
        version = _last_version(out) if code == 0 else ""
        if not version:
            return VersionInfo(detail=out.strip()[-300:] or "no version printed", ok=False)
        cuda, archs, why = probe_torch(python, timeout) if python else ("", (), "no Python interpreter found")
        return VersionInfo(version=version, torch_cuda=cuda, cuda_archs=archs, detail=why, ok=True)


def _shebang_python(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            first = f.readline(300).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if first.startswith("#!") and "python" in first:
        interp = first[2:].strip().split()[0]
        return interp if Path(interp).exists() else None
    return None


def _last_version(out: str) -> str:
    found = re.findall(r"\b(\d+\.\d+(?:\.\d+)?(?:[.+\-][0-9A-Za-z.+\-]*)?)\b", out or "")
    return found[-1] if found else ""
