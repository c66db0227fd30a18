"""Per-launch directories, orphaned engine helpers and whose answer /health is,
with real processes standing in for vLLM's API server and its EngineCore."""
import http.server
import os
import signal
import sys
import threading
import time
from pathlib import Path

from inference.deployments import supervisor
from inference.engines import LaunchSpec, Runtime, get_engine
from tests.helpers import free_port, pid_alive, wait_until

# An "API server" that starts a retitled helper (like VLLM::EngineCore) which
# outlives it, then serves /health on --port.
FAKE_VLLM = """\
import http.server, os, sys, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
if os.fork() == 0:  # retitled as vLLM's setproctitle does: the command line reads VLLM::EngineCore
    os.execv(sys.executable, ["VLLM::EngineCore", "-c", "import time\\nwhile True: time.sleep(1)"])
print("(APIServer pid=%d) INFO non-default args: {}" % os.getpid(), flush=True)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
print("INFO:     Application startup complete.", flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def fake_vllm(tmp_path) -> Runtime:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    script = venv / "bin" / "vllm"
    script.write_text(f"#!{sys.executable}\n" + FAKE_VLLM)
    script.chmod(0o755)
    return Runtime(engine="vllm", kind="venv", path=str(venv), env={"VLLM_CPU_KVCACHE_SPACE": "1"}, cpu_only=True)


def test_a_long_launch_dir_is_reached_through_a_short_link_and_cleaned(tmp_path):
    real = tmp_path / ("x" * 60) / "run" / "deployment-7"
    given = supervisor.prepare_launch_dir(real)
    assert len(given) <= supervisor.MAX_LAUNCH_DIR_CHARS and Path(given).resolve() == real.resolve()
    (Path(given) / "rpc").mkdir()
    assert (real / "rpc").is_dir()
    supervisor.clean_launch_dir(real)
    assert not real.exists() and not Path(given).is_symlink()
    supervisor.clean_launch_dir("")  # never the working directory
    assert Path(".").resolve().exists()


def test_kill_9_of_the_server_leaves_its_engine_core_which_kiln_finds_ends_and_names(tmp_path):
    engine = get_engine("vllm")
    runtime = fake_vllm(tmp_path)
    launch_dir = tmp_path / "run" / "deployment-1"
    launched = supervisor.launch(engine, LaunchSpec(model="/m", port=free_port()), runtime, tmp_path / "log",
                                 launch_dir=str(launch_dir))
    assert "VLLM_CPU_KVCACHE_SPACE=1" in launched.command and "VLLM_RPC_BASE_PATH=" in launched.command
    for sub in ("rpc", "cache", "tmp"):
        assert (launch_dir / sub).is_dir()
    w = supervisor.Watcher(launched.handle, engine, engine.health_url("127.0.0.1", launched.port),
                           launch_dir=str(launch_dir))
    try:
        _kill_and_watch(w, launched, launch_dir)
    finally:  # nothing left behind, even after a failed assertion
        supervisor.stop(launched.handle, grace_s=2, launch_dir=str(launch_dir))
        supervisor.clean_launch_dir(launch_dir)
    assert not launch_dir.exists()


def _kill_and_watch(w, launched, launch_dir):
    wait_until(lambda: "ready" in [a.kind for a in w.tick()], 20, "the fake server to be ready", interval=0.2)
    marked = supervisor.marked_processes(str(launch_dir))
    core = [p for p in marked if p != launched.handle.pid]
    assert len(core) == 1 and supervisor.process_name(core[0]).startswith("VLLM::EngineCore")

    os.kill(launched.handle.pid, signal.SIGKILL)
    wait_until(lambda: not supervisor.is_running(launched.handle.pid, launched.handle.start_time), 10, "leader gone")
    assert pid_alive(core[0])  # orphaned, still running
    actions = w.tick()
    crashed = [a for a in actions if a.kind == "crashed"]
    assert crashed and "VLLM::EngineCore" in crashed[0].hint and "ended them" in crashed[0].hint
    wait_until(lambda: not supervisor.marked_processes(str(launch_dir)), 5, "the orphan to be gone")


def test_a_200_from_another_program_on_the_port_is_not_the_engine_being_ready(tmp_path):
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    squatter = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    port = squatter.server_address[1]
    engine = get_engine("vllm")
    sleeper = supervisor.spawn([sys.executable, "-c", "import time; time.sleep(30)"], None, tmp_path / "log")
    try:
        w = supervisor.Watcher(sleeper, engine, engine.health_url("127.0.0.1", port))
        for _ in range(3):
            assert "ready" not in [a.kind for a in w.tick()]
            time.sleep(0.1)
        assert w.state.status == "starting"
        docker = supervisor.Watcher(sleeper, engine, engine.health_url("127.0.0.1", port), check_port_owner=False)
        assert "ready" in [a.kind for a in docker.tick()]  # Docker's proxy holds a published port
    finally:
        supervisor.stop(sleeper, grace_s=2)
        squatter.shutdown()
