"""vLLM: `vllm serve` with its OpenAI-compatible server.

Flags used here are checked in tests against the flag list of a real release
(tests/fixtures/vllm_flags.txt, read from vLLM 0.34.0's source).
V100 users usually run an older sm70-capable build or the 1Cat-vLLM fork; the
flags we emit are ones those builds share (older ones also know --swap-space).
"""

from __future__ import annotations

import json
import re

from inference.engines.base import (
    PHASE_COMPILING,
    PHASE_LOADING,
    PHASE_READY,
    PHASE_STARTING,
    Engine,
    LaunchSpec,
    LogEvent,
    Runtime,
    VersionInfo,
    probe_torch,
    register,
    rule,
    run_probe,
    shebang_python,
    venv_bin,
)
from inference.engines.base import gettext_noop

# Start-up lines that state memory figures, each figure's wordings newest first.
# inference/preflight/capacity.py reads the figures; the phase rules below see
# the same lines as progress. As printed (numbers carry thousands separators):
#     Model loading took 15.06 GiB memory and 8.123456 seconds        (2025-26, gpu_model_runner)
#     Model loading took 27.5185 GiB and 305.873276 seconds           (V1, late 2025)
#     Loading model weights took 67.7229 GB                           (early V1 / V0)
#     Available KV cache memory: 8.11 GiB
#     GPU KV cache size: 178,880 tokens
#     GPU KV cache size: 34,952 tokens, Maximum concurrency for 8,192 tokens per request: 4.27x
#     Maximum concurrency for 2048 tokens per request: 10.79x
#     # GPU blocks: 1381                                              (tokens = blocks x block size)
#     Estimated CUDA graph memory: 0.73 GiB total
#     ... the rest of the memory reserved for KV Cache is 1.57GiB.    (V0 worker summary)
# With tensor parallel every rank prints its own loading and KV cache memory line.
MODEL_LOADING = "Model loading took"
KV_CACHE_MEMORY = "Available KV cache memory"
KV_CACHE_SIZE = "KV cache size"  # "GPU KV cache size" (the CPU build: "CPU KV cache size")
MAX_CONCURRENCY = "Maximum concurrency for"
READY_LINE = "Application startup complete"

_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"
CAPACITY_LINES: tuple[tuple[str, re.Pattern], ...] = (
    ("model_loading_gib", re.compile(MODEL_LOADING + " " + _NUM + r" ?GiB")),
    ("model_loading_gib", re.compile(r"Loading model weights took " + _NUM + r" ?GB")),
    ("model_loading_gib", re.compile(r"model weights take " + _NUM + r" ?GiB")),
    ("available_kv_cache_gib", re.compile(KV_CACHE_MEMORY + ": " + _NUM + r" ?GiB")),
    ("available_kv_cache_gib", re.compile(r"memory reserved for KV Cache is " + _NUM + r" ?GiB")),
    ("kv_cache_tokens", re.compile("(?:GPU|CPU) " + KV_CACHE_SIZE + ": " + _NUM + r" tokens")),
    ("gpu_blocks", re.compile(r"# (?:GPU|cuda|CUDA) blocks: " + _NUM)),
    ("cuda_graph_gib", re.compile(r"Estimated CUDA graph memory: " + _NUM + r" ?GiB")),
    ("cuda_graph_gib", re.compile(r"Graph capturing finished in \S+ secs?, took " + _NUM + r" ?GiB")),
)
# The max model length and how many such requests fit in the KV cache at once.
CONCURRENCY_LINE = re.compile(MAX_CONCURRENCY + " " + _NUM + r" tokens per request: " + _NUM + r"x")
# Every line vLLM's own loggers print names the process: "(APIServer pid=17531) INFO 12-03 10:34:34
# [file.py:347] ...", "(EngineCore pid=19522) ...", "(Worker pid=20108) ..."; uvicorn's lines have none.
PROCESS_PREFIX = re.compile(r"^\((?P<process>[A-Za-z_][\w-]*) pid=(?P<pid>\d+)\) ")
# The shortest max model length the KV cache holds, when it can't hold the one asked for.
ESTIMATED_MAX_LEN = re.compile(r"the estimated maximum model length is ([0-9][0-9,]*)")
# An ordinary stop: a signal reached the API server (Ctrl-C, SIGTERM). Errors
# printed after it are part of shutting down, not a crash.
SHUTDOWN_LINE = re.compile(r"\[shutdown\] API server: shutdown triggered|Received (?:SIGINT|SIGTERM|signal)"
                           r"|KeyboardInterrupt: terminated")


def log_source(line: str) -> tuple[str, int | None, str]:
    """(process, pid, rest) of a vLLM log line; ("", None, line) without a prefix."""
    m = PROCESS_PREFIX.match(line)
    if not m:
        return "", None, line
    return m.group("process"), int(m.group("pid")), line[m.end():]



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

    metric_prefix = "vllm:"
    metric_names = {
        "prompt_tokens_total": (("vllm:prompt_tokens_total",), "sum"),
        "generation_tokens_total": (("vllm:generation_tokens_total",), "sum"),
        "requests_running": (("vllm:num_requests_running",), "sum"),
        "requests_waiting": (("vllm:num_requests_waiting",), "sum"),
        "requests_success_total": (("vllm:request_success_total",), "sum"),
        "kv_cache_usage": (("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), "max"),
        "prefix_cache_queries_total": (("vllm:prefix_cache_queries_total",
                                        "vllm:gpu_prefix_cache_queries_total"), "sum"),
        "prefix_cache_hits_total": (("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"), "sum"),
        "preemptions_total": (("vllm:num_preemptions_total",), "sum"),
        "spec_drafts_total": (("vllm:spec_decode_num_drafts_total",), "sum"),
        "spec_draft_tokens_total": (("vllm:spec_decode_num_draft_tokens_total",), "sum"),
        "spec_accepted_tokens_total": (("vllm:spec_decode_num_accepted_tokens_total",), "sum"),
        # Old vLLM (V0) only: the engine's own averages over its log interval.
        "prompt_tokens_per_s_gauge": (("vllm:avg_prompt_throughput_toks_per_s",), "sum"),
        "generation_tokens_per_s_gauge": (("vllm:avg_generation_throughput_toks_per_s",), "sum"),
        "spec_acceptance_gauge": (("vllm:spec_decode_draft_acceptance_rate",), "max"),
    }

    phase_rules = (
        (PHASE_READY, re.compile(READY_LINE)),
        (PHASE_COMPILING, re.compile(r"torch\.compile took|Compiling a graph|Dynamo bytecode transform|"
                                     r"Warming up model for the compilation|Initial profiling/warmup run|"
                                     r"Capturing CUDA graph|Graph capturing finished|" + KV_CACHE_MEMORY + "|"
                                     + KV_CACHE_SIZE + r": [\d,]+ tokens|" + MAX_CONCURRENCY
                                     + r"|init engine \(profile")),
        (PHASE_LOADING, re.compile(r"Starting to load model|Loading model from scratch|"
                                   r"Loading safetensors checkpoint shards|Loading weights took|" + MODEL_LOADING)),
        (PHASE_STARTING, re.compile(r"vLLM API server version|non-default args|Initializing a V1 LLM engine")),
    )
    failure_rules = (
        rule("bf16_unsupported", r"Bfloat16 is only supported on GPUs with compute capability of at least 8\.0",
             gettext_noop("This GPU has no bf16 (V100 is compute capability 7.0): set dtype to half."), fatal=True),
        rule("no_kv_cache_memory", r"No available memory for the cache blocks",
             gettext_noop("Nothing is left for the KV cache after the weights: raise GPU memory utilization, "
             "use more GPUs (tensor parallel) or a smaller / more quantized model."), fatal=True),
        rule("max_model_len_too_long", r"the estimated maximum model length is ([0-9][0-9,]*)",
             gettext_noop("The KV cache can't hold the max model length: lower max model len to the estimate in "
             "this line, or give the KV cache more memory (GPU memory utilization on a GPU; on a CPU host the "
             "VLLM_CPU_KVCACHE_SPACE variable, in GiB)."), fatal=True),
        rule("gpu_memory_taken", r"less than desired GPU memory utilization|not enough GPU memory",
             gettext_noop("Not enough free GPU memory: another process holds the GPU, or GPU memory utilization is "
             "set too high. Check the GPU's processes or lower the utilization.")),
        rule("no_kernel_image", r"no kernel image is available for execution on the device",
             gettext_noop("This vLLM/torch build has no kernels for this GPU's architecture (stock wheels dropped "
             "sm70/V100): use a build compiled for it, e.g. an older vLLM or 1Cat-vLLM on V100."), fatal=True),
        rule("cuda_oom", r"CUDA out of memory|torch\.OutOfMemoryError",
             gettext_noop("The GPU ran out of memory: lower max model len / max num seqs or GPU memory utilization, "
             "or add GPUs.")),
        rule("unknown_argument", r"unrecognized arguments|error: argument",
             gettext_noop("This vLLM version does not accept one of the flags: check the extra arguments against "
             "`vllm serve --help` of the installed version."), fatal=True),
        rule("port_in_use", r"Address already in use|error while attempting to bind on address",
             gettext_noop("The port is taken: leave the port empty so the panel picks a free one.")),
        rule("engine_core_failed", r"Engine core initialization failed",
             gettext_noop("The engine failed while starting; the lines above this one name the cause.")),
        # Fatal: no setting of this build runs that quantization on this GPU.
        rule("quantization_unsupported_gpu",
             r"quantization method (\S+) is not supported for the current GPU\. Minimum capability: (\d+)\. "
             r"Current capability: (\d+)",
             gettext_noop("This vLLM build has no kernels for that quantization on this GPU: choose another quantization "
             "(GPTQ runs on compute capability 6.0+) or install a build for this GPU from the Runtimes page's "
             "catalog (on a V100: an sm70 build such as 1Cat-vLLM)."), fatal=True),
        rule("max_model_len_above_model",
             r"User-specified max_model_len \(([0-9,]+)\) is greater than the derived max_model_len",
             gettext_noop("Max model len is above what the model was trained for (max_position_embeddings in its "
             "config.json): lower it, or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in the profile's environment if "
             "you know the model extrapolates."), fatal=True),
        rule("model_not_found",
             r"Repo id must be in the form|Invalid repository ID or local directory|"
             r"does not appear to have a file named config\.json|Can't load the configuration of",
             gettext_noop("vLLM found no model at that path on this host: check the profile's model path (a folder with "
             "config.json), or download the model on the Models page."), fatal=True),
        rule("cpu_kv_cache_space",
             r"Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE",
             gettext_noop("The CPU KV cache does not fit in free memory: lower VLLM_CPU_KVCACHE_SPACE (GiB) in the profile's "
             "environment."), fatal=True),
        # After this the API server shuts down and exits with status 0: still a
        # crash (the engine died), not a stop.
        rule("engine_died",
             r"EngineCore encountered (?:a fatal error|an issue)|EngineDeadError|"
             r"engine core exited unexpectedly",
             gettext_noop("The engine core died while serving (the server then exits with status 0; that is a crash, not a "
             "stop). Kiln restarts it; the lines above name the cause.")),
    )

    def classify_line(self, line: str):
        if SHUTDOWN_LINE.search(line):
            return LogEvent(shutdown=True, line=line.rstrip("\n"))
        return super().classify_line(line)

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

    def launch_env(self, launch_dir: str) -> dict[str, str]:
        # Without these vLLM leaves 5-7 ZMQ socket files per launch in the temp
        # dir and its torch.compile cache in ~/.cache/vllm.
        # TMPDIR: vLLM's gloo rendezvous file (vllm_dist_<uuid>) goes to the temp dir too.
        return {"VLLM_RPC_BASE_PATH": f"{launch_dir}/rpc", "VLLM_CACHE_ROOT": f"{launch_dir}/cache",
                "TMPDIR": f"{launch_dir}/tmp"}

    def detect_version(self, runtime: Runtime, timeout: float = 60.0) -> VersionInfo:
        if runtime.kind == "docker":
            return VersionInfo(detail="version of a Docker image is read from its tag; not probed", ok=False)
        python = None
        if runtime.kind == "venv":
            python = venv_bin(runtime, "python")
        else:
            # An executable installed by pip starts with "#!/path/to/python".
            python = shebang_python(runtime.path)
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


def _last_version(out: str) -> str:
    found = re.findall(r"\b(\d+\.\d+(?:\.\d+)?(?:[.+\-][0-9A-Za-z.+\-]*)?)\b", out or "")
    return found[-1] if found else ""
