import json
import os
import socket
import sys
import textwrap
import time
import urllib.request

import pytest

from inference.engines import get_engine
from inference.deployments.supervisor import (
    FAILED,
    READY,
    RESTARTING,
    HealthResult,
    LogFollower,
    Observation,
    PortUnavailable,
    ProcessHandle,
    RestartPolicy,
    SpawnError,
    WatchConfig,
    Watcher,
    WatchState,
    adopt,
    group_members,
    is_running,
    pick_free_port,
    port_is_free,
    probe_health,
    read_log_tail,
    spawn,
    stop,
    watch_step,
)
from tests.helpers import LLAMA_WRAPPER, demo_model_path, free_port, needs_llama, wait_until

PY = sys.executable
pytestmark = pytest.mark.timeout(120)


def script(tmp_path, name, body):
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return str(p)


# A child that logs, starts a grandchild that ignores SIGTERM, and sleeps.
FAMILY = """
    import signal, subprocess, sys, time
    print("parent up", flush=True)
    kid = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('grandchild up', flush=True); time.sleep(600)"])
    print("grandchild pid", kid.pid, flush=True)
    time.sleep(600)
"""


def test_spawn_runs_detached_logs_output_and_stop_leaves_no_process(tmp_path):
    log = tmp_path / "logs" / "engine.log"
    h = spawn([PY, script(tmp_path, "family.py", FAMILY)], dict(os.environ), log)
    try:
        assert is_running(h.pid, h.start_time)
        assert h.pgid == h.pid and os.getpgid(h.pid) == h.pid  # own process group
        assert os.getsid(h.pid) == h.pid  # own session: survives the panel
        wait_until(lambda: "grandchild up" in log.read_text(), 10, "the grandchild's log line", interval=0.05)
        grandchild = int(next(ln.split()[-1] for ln in log.read_text().splitlines()
                              if ln.startswith("grandchild pid")))
        assert grandchild in group_members(h.pgid)
        t0 = time.monotonic()
        result = stop(h, grace_s=1.0)
        assert result.was_running and result.survivors == []
        assert result.killed  # the grandchild ignored SIGTERM, so SIGKILL was needed
        assert time.monotonic() - t0 < 8
        assert group_members(h.pgid, h.start_time) == []
        assert not os.path.exists(f"/proc/{grandchild}") or open(f"/proc/{grandchild}/stat").read().split(
            ")")[-1].split()[0] == "Z"
    finally:
        stop(h, grace_s=0.1)


def test_a_polite_engine_stops_on_sigterm_without_sigkill(tmp_path):
    h = spawn([PY, "-c", "import time; time.sleep(600)"], None, tmp_path / "e.log")
    result = stop(h, grace_s=5.0)
    assert result.was_running and not result.killed and result.survivors == []
    assert not is_running(h.pid, h.start_time)
    assert stop(h).was_running is False  # stopping twice is harmless


def test_a_reused_pid_is_not_mistaken_for_the_engine(tmp_path):
    h = spawn([PY, "-c", "import time; time.sleep(600)"], None, tmp_path / "e.log")
    try:
        # Same PID, different start time: what a reused PID looks like.
        impostor = ProcessHandle(h.pid, h.start_time + 1000, h.pgid, h.log_path)
        assert not is_running(impostor.pid, impostor.start_time)
        assert adopt(impostor.pid, impostor.start_time) is None
        assert stop(impostor, grace_s=0.2).was_running is False
        assert is_running(h.pid, h.start_time)  # the real process was left alone
    finally:
        stop(h, grace_s=1.0)


def test_an_engine_is_readopted_from_pid_and_start_time_after_a_panel_restart(tmp_path):
    h = spawn([PY, "-c", "import time; print('serving', flush=True); time.sleep(600)"], None, tmp_path / "e.log")
    row = {"pid": h.pid, "start_time": h.start_time, "pgid": h.pgid, "log": h.log_path}  # what the DB keeps
    del h
    again = adopt(row["pid"], row["start_time"], row["pgid"], row["log"])
    assert again is not None and again.pid == row["pid"]
    wait_until(lambda: "serving" in "\n".join(read_log_tail(again.log_path)), 10, "the adopted engine's log",
               interval=0.05)
    assert stop(again, grace_s=2.0).survivors == []
    assert adopt(row["pid"], row["start_time"], row["pgid"]) is None  # gone now


def test_spawn_refuses_a_missing_program_with_a_clear_message(tmp_path):
    with pytest.raises(SpawnError, match="does not exist or is not executable"):
        spawn(["/nonexistent/vllm", "serve"], None, tmp_path / "e.log")
    with pytest.raises(SpawnError, match="not on PATH"):
        spawn(["kiln-no-such-program"], {"PATH": "/nonexistent"}, tmp_path / "e.log")
    with pytest.raises(SpawnError, match="list of strings"):
        spawn("vllm serve", None, tmp_path / "e.log")


def test_an_occupied_port_is_refused_or_another_one_picked():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert not port_is_free("127.0.0.1", port)
        with pytest.raises(PortUnavailable, match="already in use"):
            pick_free_port("127.0.0.1", preferred=port)
        other = pick_free_port("127.0.0.1", first=port, last=min(port + 50, 65535))
        assert other != port and port_is_free("127.0.0.1", other)
        assert pick_free_port("127.0.0.1", first=port, last=port + 50, exclude={other}) != other
    with pytest.raises(PortUnavailable, match="this machine"):
        port_is_free("192.0.2.1", 8000)  # TEST-NET address, not ours: never contacted, bind fails


def test_health_probe_reports_status_or_why_nothing_answered(tmp_path):
    port = free_port()
    r = probe_health(f"http://127.0.0.1:{port}/health", timeout=1.0)
    assert r.status is None and r.error
    server = script(tmp_path, "srv.py", """
        import http.server, sys
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                code = 200 if self.headers.get("Authorization") == "Bearer k" else 401
                self.send_response(code); self.end_headers(); self.wfile.write(b"ok")
            def log_message(self, *a): pass
        http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """)
    h = spawn([PY, server, str(port)], None, tmp_path / "s.log")
    try:
        wait_until(lambda: probe_health(f"http://127.0.0.1:{port}/health", 0.5).answered, 10, "a health answer",
                   interval=0.05)
        assert probe_health(f"http://127.0.0.1:{port}/health", 1.0).status == 401
        ok = probe_health(f"http://127.0.0.1:{port}/health", 1.0, api_key="k")
        assert ok.status == 200 and ok.body == "ok"
    finally:
        stop(h, grace_s=1.0)


def test_log_follower_yields_each_new_line_once_and_resumes_from_its_offset(tmp_path):
    log = tmp_path / "e.log"
    log.write_text("one\ntwo\npart")
    f = LogFollower(log)
    assert f.read_new() == ["one", "two"]
    assert f.read_new() == []  # "part" is not finished yet
    with open(log, "a") as fh:
        fh.write("ial\nLoading: 10%\rLoading: 50%\r")
    assert f.read_new() == ["partial", "Loading: 10%", "Loading: 50%"]
    resumed = LogFollower(log, offset=f.offset)
    with open(log, "a") as fh:
        fh.write("three\n")
    assert resumed.read_new() == ["three"]
    log.write_text("new run\n")  # truncated / replaced: start over
    assert resumed.read_new() == ["new run"]
    assert read_log_tail(log, 5) == ["new run"]
    assert read_log_tail(tmp_path / "missing.log") == []


def test_restart_policy_backs_off_exponentially_and_gives_up_on_a_crash_loop():
    now = [1000.0]
    p = RestartPolicy(max_failures=3, window_s=300, base_delay_s=2, clock=lambda: now[0])
    d1 = p.record_failure()
    now[0] += 10
    d2 = p.record_failure()
    assert (d1.give_up, d1.delay_s, d2.give_up, d2.delay_s) == (False, 2, False, 4)
    now[0] += 10
    assert p.record_failure().give_up  # 3 failures within 5 minutes
    q = RestartPolicy(max_failures=3, window_s=300, base_delay_s=2, clock=lambda: now[0])
    q.record_failure()
    now[0] += 301  # the old failure leaves the window
    q.record_failure()
    now[0] += 1
    d = q.record_failure()
    assert not d.give_up and d.failures_in_window == 2
    again = RestartPolicy.from_dict(json.loads(json.dumps(q.to_dict())), clock=lambda: now[0])
    assert again.record_failure().give_up  # the history survives being stored


def test_watch_step_follows_phases_then_ready_from_health():
    vllm = get_engine("vllm")
    st = WatchState(started_at=0.0)
    acts = watch_step(st, Observation(True, HealthResult(None, error="refused"),
                                      ("INFO ... Starting to load model /m ...",)), 1.0, vllm)
    assert [(a.kind, a.phase) for a in acts] == [("phase", "loading_weights")]
    acts = watch_step(st, Observation(True, HealthResult(200), ("INFO:     Application startup complete.",)),
                      2.0, vllm)
    assert [a.kind for a in acts] == ["phase", "ready"] and st.status == READY and st.ready_at == 2.0


def test_watch_step_restarts_an_engine_that_stops_answering_health():
    vllm = get_engine("vllm")
    st = WatchState(status=READY, phase="ready", started_at=0.0)
    cfg = WatchConfig(unhealthy_ticks_to_restart=3, base_delay_s=1.0)
    kinds = []
    for t in range(1, 4):
        kinds += [a.kind for a in watch_step(st, Observation(True, HealthResult(503)), float(t), vllm, cfg)]
    assert kinds == ["stop_process", "crashed"] and st.status == RESTARTING
    assert watch_step(st, Observation(False), 3.5, vllm, cfg) == []  # still waiting out the delay
    assert [a.kind for a in watch_step(st, Observation(False), 4.1, vllm, cfg)] == ["restart"]


def test_watch_step_gives_up_when_start_up_hangs():
    st = WatchState(started_at=0.0)
    cfg = WatchConfig(start_timeout_s=60, max_failures=1)
    acts = watch_step(st, Observation(True, HealthResult(None, error="refused")), 61.0, get_engine("vllm"), cfg)
    assert [a.kind for a in acts] == ["stop_process", "failed"] and "did not become ready" in acts[-1].hint


CRASHER = """
    import sys, time
    print("INFO starting", flush=True)
    time.sleep(0.2)
    print(sys.argv[1], flush=True)
    sys.exit(1)
"""


def run_watcher(tmp_path, message, cfg, max_ticks=200):
    """Drive a real crashing process through Watcher ticks, restarting on
    request like the monitor does. Returns the actions seen, in order."""
    engine = get_engine("vllm")
    argv = [PY, script(tmp_path, "crash.py", CRASHER), message]
    log = tmp_path / "engine.log"
    h = spawn(argv, None, log)
    w = Watcher(h, engine, f"http://127.0.0.1:{free_port()}/health", config=cfg, health_timeout_s=0.2)
    seen = []
    crashes_at = []
    for _ in range(max_ticks):
        for a in w.tick():
            seen.append(a)
            if a.kind == "crashed":
                crashes_at.append(time.monotonic())
            if a.kind == "restart":
                w.restarted(spawn(argv, None, log))
        if w.state.status == FAILED:
            break
        time.sleep(0.05)
    return seen, w


def test_a_crashing_engine_is_restarted_with_backoff_until_the_crash_loop_marks_it_failed(tmp_path):
    cfg = WatchConfig(max_failures=3, window_s=30, base_delay_s=0.1, max_delay_s=1)
    t0 = time.monotonic()
    seen, w = run_watcher(tmp_path, "RuntimeError: Engine core initialization failed. See root cause above.", cfg)
    kinds = [a.kind for a in seen if a.kind in ("crashed", "restart", "failed")]
    assert kinds == ["crashed", "restart", "crashed", "restart", "failed"]
    delays = [a.delay_s for a in seen if a.kind == "crashed"]
    assert delays == [0.1, 0.2]  # exponential
    failed = seen[-1]
    assert "3 failures" in failed.reason and failed.hint
    assert any("Engine core initialization failed" in ln for ln in failed.log_tail)
    assert w.state.status == FAILED and time.monotonic() - t0 < 30


def test_a_fatal_failure_fails_at_once_with_its_hint(tmp_path):
    cfg = WatchConfig(max_failures=3, window_s=30, base_delay_s=0.1)
    seen, w = run_watcher(tmp_path, "ValueError: Bfloat16 is only supported on GPUs with compute capability "
                                    "of at least 8.0. Your Tesla V100 GPU has compute capability 7.0.", cfg)
    kinds = [a.kind for a in seen if a.kind in ("crashed", "restart", "failed")]
    assert kinds == ["failed"]
    assert "half" in seen[-1].hint and seen[-1].reason == "bf16_unsupported"


def test_a_crash_is_noticed_within_two_seconds(tmp_path):
    h = spawn([PY, "-c", "import time; time.sleep(0.3); raise SystemExit(3)"], None, tmp_path / "e.log")
    w = Watcher(h, get_engine("vllm"), f"http://127.0.0.1:{free_port()}/health",
                config=WatchConfig(base_delay_s=5), health_timeout_s=0.2)
    t_exit = time.monotonic() + 0.3
    crashed_at = None
    for _ in range(100):
        if any(a.kind == "crashed" for a in w.tick()):
            crashed_at = time.monotonic()
            break
        time.sleep(0.1)
    assert crashed_at is not None and crashed_at - t_exit < 2.0


# ----------------------------------------------------------------------------- real llama-server

@needs_llama
@pytest.mark.engine
@pytest.mark.timeout(300)
def test_real_llama_server_with_the_gemma_demo_starts_answers_and_stops_cleanly(tmp_path):
    from inference.engines import Runtime
    from inference.deployments.presets import GEMMA_DEMO

    model = demo_model_path()
    engine = get_engine("llamacpp")
    port = pick_free_port("127.0.0.1", first=free_port(), last=65000)
    spec = GEMMA_DEMO.spec(model, port=port, extra_args=["--threads", "2"])
    runtime = Runtime("llamacpp", "executable", str(LLAMA_WRAPPER))
    h = spawn(engine.build_argv(spec, runtime), engine.build_env(spec), tmp_path / "llama.log")
    try:
        w = Watcher(h, engine, engine.health_url(spec.host, port))
        phases = []
        deadline = time.monotonic() + 180
        while w.state.status != READY and time.monotonic() < deadline:
            acts = w.tick()
            phases += [a.phase for a in acts if a.kind == "phase"]
            assert not any(a.kind in ("crashed", "failed") for a in acts), read_log_tail(h.log_path)
            time.sleep(0.25)
        assert w.state.status == READY, read_log_tail(h.log_path)
        assert phases.index("loading_weights") < phases.index("ready")
        # The log said "model loaded" before (or as) health turned 200.
        assert any(get_engine("llamacpp").classify_line(ln).phase == "ready"
                   for ln in read_log_tail(h.log_path) if get_engine("llamacpp").classify_line(ln))
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=json.dumps({"model": "gemma-3-270m", "max_tokens": 8,
                             "messages": [{"role": "user", "content": "Say hi"}]}).encode(),
            headers={"Content-Type": "application/json"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=60) as resp:
            answer = json.load(resp)
        assert answer["choices"][0]["message"]["content"] is not None
        assert answer["usage"]["completion_tokens"] >= 1
        assert probe_health(engine.metrics_url(spec.host, port)).status == 200
    finally:
        result = stop(h, grace_s=10)
    assert result.survivors == [] and group_members(h.pgid, h.start_time) == []
    assert port_is_free("127.0.0.1", port)


def test_launch_picks_a_free_port_and_refuses_a_taken_one(tmp_path):
    from inference.engines import LaunchSpec, Runtime
    from inference.deployments.supervisor import launch

    fake_server = tmp_path / "llama-server"
    fake_server.write_text(f"#!{PY}\nimport sys, time\nprint('args', sys.argv[1:], flush=True)\ntime.sleep(600)\n")
    fake_server.chmod(0o755)
    engine, runtime = get_engine("llamacpp"), Runtime("llamacpp", "executable", str(fake_server))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        with pytest.raises(PortUnavailable):
            launch(engine, LaunchSpec(model="/m.gguf", port=taken), runtime, tmp_path / "a.log")
        started = launch(engine, LaunchSpec(model="/m.gguf"), runtime, tmp_path / "b.log", exclude_ports={taken})
    try:
        assert started.port != taken and str(started.port) in started.argv
        wait_until(lambda: f"'{started.port}'" in (tmp_path / "b.log").read_text(), 10, "the port in the log",
                   interval=0.05)
        assert started.command.startswith("CUDA_VISIBLE_DEVICES=''")
    finally:
        assert stop(started.handle, grace_s=2).survivors == []


@needs_llama
@pytest.mark.engine
def test_real_llama_server_with_a_missing_model_fails_at_once_with_a_hint(tmp_path):
    from inference.engines import LaunchSpec, Runtime
    from inference.deployments.supervisor import launch

    engine = get_engine("llamacpp")
    started = launch(engine, LaunchSpec(model=str(tmp_path / "gone.gguf")),
                     Runtime("llamacpp", "executable", str(LLAMA_WRAPPER)), tmp_path / "llama.log")
    w = Watcher(started.handle, engine, engine.health_url("127.0.0.1", started.port), health_timeout_s=0.5)
    actions = []
    for _ in range(100):
        actions += w.tick()
        if w.state.status == FAILED:
            break
        time.sleep(0.1)
    assert [a.kind for a in actions if a.kind in ("crashed", "failed")] == ["failed"]
    assert actions[-1].reason == "model_missing" and "download" in actions[-1].hint
    assert any("gone.gguf" in ln for ln in actions[-1].log_tail)
    assert stop(started.handle, grace_s=1).survivors == []
