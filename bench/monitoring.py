"""How cheap is Kiln's monitoring? Prints figures measured side by side in one run.

1. Parsing a ~54 KB vLLM /metrics page: Kiln's parser vs prometheus_client's.
2. With the fake NVML (tests/fakenvml.py): 8 GPUs sampled at 1 Hz, CPU time the
   sampler uses per second of wall time, including JSON-encoding the message
   and handing it to ``publish`` -- the hook where the lead's channel-layer
   group_send (the websocket fan-out) plugs in.
3. Where a real NVIDIA GPU exists: cost of one per-GPU sample with pynvml vs
   one ``nvidia-smi --query-gpu`` call, per NVML call breakdown, and
   (--dump FILE) a JSON dump of what NVML read, including NotSupported fields.

4. The whole live path (--clients 50): the real ``manage.py monitor`` on the
   fake NVML with 8 GPUs at 1 Hz (history writes on), a real Redis channel
   layer, the real ASGI app under uvicorn and 50 signed-in websocket clients.
   Reports the monitor process's CPU % of one core (from /proc) and the
   sample-to-client latency p50/p99 (sample time in the message vs arrival).

    python bench/monitoring.py [--seconds 10] [--dump out.json] [--clients 50 --live-seconds 30]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inference.engines.metrics import ENGINE_PREFIXES, parse_prometheus_text  # noqa: E402
from monitoring.nvml import Nvml  # noqa: E402
from tests.fakenvml import FakeGpu, FakeNvml  # noqa: E402

SMI_QUERY = ("utilization.gpu,utilization.memory,memory.used,memory.total,temperature.gpu,power.draw,"
             "power.limit,clocks.sm,clocks.mem,clocks_event_reasons.active,pcie.link.gen.current,"
             "pcie.link.width.current,pstate")


def best_of(fn, repeat, number):
    """Median seconds per call over `repeat` rounds of `number` calls."""
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        rounds.append((time.perf_counter() - start) / number)
    return statistics.median(rounds)


def bench_parser(results):
    from prometheus_client.parser import text_string_to_metric_families

    text = (ROOT / "tests/monitoring/fixtures/vllm_v1.txt").read_text()
    ours = best_of(lambda: parse_prometheus_text(text), 5, 20)
    ours_filtered = best_of(lambda: parse_prometheus_text(text, prefixes=tuple(ENGINE_PREFIXES.values())), 5, 20)
    theirs = best_of(lambda: [list(f.samples) for f in text_string_to_metric_families(text)], 5, 5)
    print(f"[parser] {len(text)} B vLLM page: ours {ours*1e3:.2f} ms, ours engine-only {ours_filtered*1e3:.2f} ms, "
          f"prometheus_client {theirs*1e3:.2f} ms -> {theirs/ours:.1f}x / {theirs/ours_filtered:.1f}x faster")
    results["parser"] = {"bytes": len(text), "ours_ms": ours * 1e3, "ours_filtered_ms": ours_filtered * 1e3,
                         "prometheus_client_ms": theirs * 1e3}


def publish_nowhere(message: str) -> None:
    """Default fan-out hook. The monitor command passes a function that
    group_sends ``message`` to the channel layer (one send per sample)."""


def run_sampler(nvml: Nvml, seconds: float, interval: float, publish=publish_nowhere) -> dict:
    """Sample all GPUs every `interval` s for `seconds`; return CPU and timing figures.

    Ticks are scheduled on absolute times (start + k*interval) so a slow
    sample does not push every later one back.
    """
    ticks = int(seconds / interval)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    costs = []
    for k in range(ticks):
        due = wall0 + k * interval
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t0 = time.perf_counter()
        message = json.dumps({"type": "gpu.sample", "gpus": nvml.sample_all()})
        publish(message)
        costs.append(time.perf_counter() - t0)
    end = wall0 + ticks * interval  # count the last interval's idle time too
    if end > time.perf_counter():
        time.sleep(end - time.perf_counter())
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    return {"ticks": ticks, "wall_s": wall, "cpu_s": cpu, "cpu_pct_of_one_core": 100 * cpu / wall,
            "tick_cost_ms_median": statistics.median(costs) * 1e3, "tick_cost_ms_max": max(costs) * 1e3}


def bench_fake(results, seconds):
    gpus = [FakeGpu(uuid=f"GPU-fake-{i}", gpu_util=80, processes=[(1000 + i, 1 << 30)]) for i in range(8)]
    nvml = Nvml(lib=FakeNvml(gpus))
    assert nvml.init().ok
    per_gpu = best_of(lambda: nvml.sample(0), 5, 200)
    figures = run_sampler(nvml, seconds=seconds, interval=1.0)
    figures["per_gpu_sample_us"] = per_gpu * 1e6
    print(f"[fake NVML] 8 GPUs at 1 Hz for {figures['wall_s']:.1f} s: CPU {figures['cpu_pct_of_one_core']:.2f}% "
          f"of one core; one tick (8 samples + JSON) {figures['tick_cost_ms_median']:.2f} ms median; "
          f"one fake per-GPU sample {per_gpu*1e6:.0f} us (Python overhead of the sampler itself)")
    results["fake_8gpu_1hz"] = figures


class TimedLib:
    """Wraps pynvml to time each NVML function the sampler calls."""

    def __init__(self, lib):
        self._lib = lib
        self.times: dict[str, list[float]] = {}

    def __getattr__(self, name):
        attr = getattr(self._lib, name)
        if not callable(attr) or not name.startswith("nvml") or isinstance(attr, type):
            return attr
        times = self.times.setdefault(name, [])

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                times.append(time.perf_counter() - t0)
        return timed


def bench_real(results, dump_path):
    if shutil.which("nvidia-smi") is None:
        print("[real GPU] no nvidia-smi here: skipped (run this on a GPU host for the ≥100x comparison)")
        return
    nvml = Nvml()  # the monitor's defaults: slow fields every 10 s, energy counter every 120 s
    status = nvml.init()
    print(f"[real GPU] {status.message}; driver {status.driver_version}, CUDA {status.cuda_driver_version}")
    if not status.ok:
        return
    nvml.sample_all()  # warm up: first reads, NotSupported discovered

    # The headline: the mean cost of one per-GPU sample over 4 minutes of 1 Hz
    # samples (virtual time), so the slow-field and energy-counter reads are
    # counted at the share the monitor really pays for them.
    def four_minutes():
        gpu = nvml._gpus[0]
        gpu.slow_read_at = gpu.energy_read_at = None
        t0 = time.perf_counter()
        for t in range(240):
            nvml.sample(0, now=1e6 + t)
        return (time.perf_counter() - t0) / 240
    per_gpu_mean = statistics.median(four_minutes() for _ in range(5))
    # Fast path only: a tick between slow refreshes (9 of 10 at 1 Hz).
    per_gpu = best_of(lambda: nvml.sample(0), 5, 200)
    # Worst tick: slow fields and the energy counter re-read in the same sample.
    def worst_tick():
        gpu = nvml._gpus[0]
        gpu.slow_read_at = gpu.energy_read_at = None
        nvml.sample(0)
    per_gpu_slow = best_of(worst_tick, 5, 20)

    cmd = ["nvidia-smi", f"--query-gpu={SMI_QUERY}", "--format=csv,noheader"]
    smi_out = subprocess.run(cmd, capture_output=True, text=True).stdout
    smi = best_of(lambda: subprocess.run(cmd, capture_output=True, check=True), 5, 2)
    print(f"[real GPU] per-GPU sample, mean over 240 ticks at 1 Hz {per_gpu_mean*1e6:.0f} us vs one "
          f"nvidia-smi --query-gpu {smi*1e3:.1f} ms -> {smi/per_gpu_mean:.0f}x cheaper "
          f"(fast tick {per_gpu*1e6:.0f} us = {smi/per_gpu:.0f}x; worst tick, every dear field re-read, "
          f"{per_gpu_slow*1e6:.0f} us = {smi/per_gpu_slow:.0f}x)")

    timed_lib = TimedLib(nvml._lib)
    timed = Nvml(lib=timed_lib)
    timed.init()
    timed.sample_all()
    timed_lib.times.clear()
    for _ in range(100):
        timed.sample(0)
    breakdown = {name: statistics.median(v) * 1e6 for name, v in timed_lib.times.items()}
    print("[real GPU] NVML calls per fast sample, median us: " +
          ", ".join(f"{k.replace('nvmlDevice', '')} {v:.1f}" for k, v in sorted(breakdown.items(), key=lambda kv: -kv[1])))
    pcie_window = None
    try:
        lib = nvml._lib
        h = nvml._gpus[0].handle
        pcie_window = best_of(lambda: lib.nvmlDeviceGetPcieThroughput(h, lib.NVML_PCIE_UTIL_TX_BYTES), 3, 3)
        print(f"[real GPU] nvmlDeviceGetPcieThroughput (not on the fast path): {pcie_window*1e3:.1f} ms per call")
    except Exception as exc:  # noqa: BLE001 - a reading, not a failure
        print(f"[real GPU] nvmlDeviceGetPcieThroughput: {exc}")

    figures = run_sampler(nvml, seconds=5, interval=1.0)
    print(f"[real GPU] {status.gpu_count} GPU(s) at 1 Hz: CPU {figures['cpu_pct_of_one_core']:.2f}% of one core")
    results["real"] = {"status": status.to_dict(), "per_gpu_sample_mean_us": per_gpu_mean * 1e6,
                       "ratio_mean": smi / per_gpu_mean, "per_gpu_sample_us": per_gpu * 1e6,
                       "per_gpu_sample_with_slow_us": per_gpu_slow * 1e6, "nvidia_smi_ms": smi * 1e3,
                       "ratio": smi / per_gpu, "ratio_worst_tick": smi / per_gpu_slow,
                       "call_breakdown_us": breakdown, "pcie_throughput_call_ms":
                           pcie_window * 1e3 if pcie_window else None, "sampler_1hz": figures,
                       "nvidia_smi_output": smi_out}

    if dump_path:
        samples = []
        for _ in range(3):
            samples.append(nvml.sample_all())
            time.sleep(1.0)
        watcher = nvml.xid_watcher()
        xids = watcher.poll(timeout_ms=200)
        dump = {"status": status.to_dict(), "gpu_info": nvml.gpu_info(), "samples": samples,
                "unsupported": {s["index"]: s["unsupported"] for s in samples[-1]},
                "error_counts": nvml.error_counts,
                "xid": {"watched": watcher.watched, "unwatched": watcher.unwatched, "events_in_200ms": xids},
                "bench": results}
        watcher.close()
        Path(dump_path).write_text(json.dumps(dump, indent=2))
        print(f"[real GPU] dump written to {dump_path}; NotSupported: {dump['unsupported']}")
    nvml.shutdown()


# ----------------------------------------------------------------- live path


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (Linux /proc)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise SystemExit(f"bench: {what} did not come up in {timeout} s")


TIME_RE = __import__("re").compile(r'"type": "(\w+)", "host": "[^"]*", "time": ([0-9.]+)')


async def live_client(url, headers, on_message, *, compression="deflate", on_first_connect=None,
                      on_closed=None, retry_s=0.5):
    """One browser tab on /ws/live/: connects, reads until closed, reconnects after
    ``retry_s`` as kiln.js does, forever (cancel the task to end it).

    ``on_message(kind, sampled_at, arrived_at, raw)`` for each message whose head names its
    type and sample time; ``on_closed(exc)`` after each lost connection or refused handshake
    (``exc`` None for a clean close). Only the head of a message is parsed (type, host, time
    come first): many clients share one process and must not slow each other down.
    """
    import asyncio

    import websockets

    first = True
    while True:
        error = None
        try:
            async with websockets.connect(url, additional_headers=headers, max_size=2**24,
                                          compression=compression) as ws:
                if first:
                    first = False
                    if on_first_connect:
                        on_first_connect()
                async for raw in ws:
                    arrived = time.time()
                    head = TIME_RE.search(raw, 0, 300)
                    if head:
                        on_message(head.group(1), float(head.group(2)), arrived, raw)
        except websockets.ConnectionClosedOK:
            pass
        except (websockets.ConnectionClosed, websockets.InvalidHandshake, OSError, asyncio.TimeoutError) as exc:
            error = exc
        if on_closed:
            on_closed(error)
        await asyncio.sleep(retry_s)


def bench_live(results, clients: int, seconds: float, gpus_factory: str = "tests.fakenvml:eight_gpus",
               deflate: bool = True, server_deflate: bool = False):
    import asyncio
    import os
    import signal
    import tempfile

    import httpx
    import redis

    from dashboard.standalone import find_redis_server

    # Browsers offer permessage-deflate and servers accept it by default, so the
    # clients offer it too unless --no-deflate.
    compression = "deflate" if deflate else None
    work = Path(tempfile.mkdtemp(prefix="kiln-bench-live-"))
    redis_port, web_port = _free_port(), _free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1", DJANGO_SETTINGS_MODULE="dashboard.settings", DATA_DIR=str(work),
               REDIS_URL=f"redis://127.0.0.1:{redis_port}/0", KILN_HOST_NAME="bench", DEBUG="0")
    env.pop("DATABASE_URL", None)
    procs = []

    def spawn(name, argv, extra=None):
        log = (work / f"{name}.log").open("wb")
        proc = subprocess.Popen(argv, cwd=ROOT, env=dict(env, **(extra or {})), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(proc)
        return proc

    try:
        spawn("redis", [find_redis_server(), "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no", "--dir", str(work)])
        r = redis.Redis(port=redis_port)

        def redis_up():
            try:
                return r.ping()
            except redis.RedisError:
                return False
        _wait(redis_up, 10, "redis-server")
        manage = [sys.executable, "manage.py"]
        subprocess.run(manage + ["migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
        cookie = subprocess.run(manage + ["shell", "-c", (
            "from django.contrib.auth.models import User; from django.test import Client; "
            "u = User.objects.create_user('bench', password='bench-password-1'); c = Client(); c.force_login(u); "
            "print(c.cookies['sessionid'].value)")], cwd=ROOT, env=env, check=True, capture_output=True,
            text=True).stdout.strip().splitlines()[-1]
        web = spawn("web", [sys.executable, "-m", "uvicorn", "dashboard.asgi:application", "--host", "127.0.0.1",
                      "--port", str(web_port), "--log-level", "warning",
                      # as production's worker class (dashboard/workers.py) unless --deflate
                      "--ws-per-message-deflate", "true" if server_deflate else "false"])

        def web_up():
            try:
                return httpx.get(f"http://127.0.0.1:{web_port}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False
        _wait(web_up, 60, "uvicorn")

        async def listen():
            latencies, sizes, per_client = [], [], [0] * clients
            ready = asyncio.Event()
            measuring = {"on": False}
            url = f"ws://127.0.0.1:{web_port}/ws/live/"
            headers = {"Cookie": f"sessionid={cookie}", "Origin": f"http://127.0.0.1:{web_port}"}

            def client(i):
                def connected_once():
                    connected[0] += 1
                    if connected[0] == clients:
                        ready.set()

                def on_message(kind, sampled, arrived, raw):
                    if kind == "monitor":
                        first_message.set()
                        if measuring["on"]:
                            latencies.append(arrived - sampled)
                            per_client[i] += 1
                            sizes.append(len(raw))

                def on_closed(exc):
                    reconnects[0] += 1
                return live_client(url, headers, on_message, compression=compression, on_first_connect=connected_once,
                                   on_closed=on_closed)

            connected, reconnects, other_cpu = [0], [0], {}
            first_message = asyncio.Event()
            tasks = [asyncio.create_task(client(i)) for i in range(clients)]
            await asyncio.wait_for(ready.wait(), 60)
            # The web process's own cost with the clients connected and no monitor yet.
            idle0, idle_wall0 = _proc_cpu_s(web.pid), time.perf_counter()
            await asyncio.sleep(5)
            other_cpu["web_idle"] = 100 * (_proc_cpu_s(web.pid) - idle0) / (time.perf_counter() - idle_wall0)
            monitor = spawn("monitor", manage + ["monitor", "--interval", "1"],
                            {"KILN_NVML_LIB": gpus_factory})
            await asyncio.wait_for(first_message.wait(), 120)
            await asyncio.sleep(3)  # past start-up and the first history flush
            measuring["on"] = True
            cpu0, web0, me0, wall0 = _proc_cpu_s(monitor.pid), _proc_cpu_s(web.pid), time.process_time(), \
                time.perf_counter()
            await asyncio.sleep(seconds)
            cpu1, web1, me1, wall1 = _proc_cpu_s(monitor.pid), _proc_cpu_s(web.pid), time.process_time(), \
                time.perf_counter()
            other_cpu["web"] = 100 * (web1 - web0) / (wall1 - wall0)
            other_cpu["clients"] = 100 * (me1 - me0) / (wall1 - wall0)
            measuring["on"] = False
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return latencies, sizes, per_client, 100 * (cpu1 - cpu0) / (wall1 - wall0), reconnects[0], other_cpu

        latencies, sizes, per_client, cpu_pct, reconnects, other_cpu = asyncio.run(listen())
        if not latencies:
            raise SystemExit(f"bench: no monitor message arrived; see {work}/monitor.log")
        latencies.sort()
        q = lambda p: latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1e3  # noqa: E731
        figures = {"server_permessage_deflate": server_deflate, "clients": clients, "gpus": 8, "interval_s": 1.0, "seconds": seconds,
                   "monitor_cpu_pct_of_one_core": cpu_pct, "latency_ms_p50": q(0.50), "latency_ms_p99": q(0.99),
                   "latency_ms_max": latencies[-1] * 1e3, "messages_received": len(latencies),
                   "messages_per_client_min": min(per_client), "message_bytes": statistics.median(sizes),
                   "reconnects": reconnects, "load_average_1m": os.getloadavg()[0],
                   "web_cpu_pct_of_one_core": other_cpu["web"], "clients_cpu_pct_of_one_core": other_cpu["clients"],
                   "web_idle_cpu_pct_of_one_core": other_cpu["web_idle"]}
        print(f"[live] monitor (8 fake GPUs, 1 Hz, history on) -> Redis channel layer -> uvicorn -> {clients} "
              f"websocket clients for {seconds:.0f} s: monitor CPU {cpu_pct:.2f}% of one core; sample-to-client "
              f"latency p50 {figures['latency_ms_p50']:.1f} ms, p99 {figures['latency_ms_p99']:.1f} ms "
              f"(max {figures['latency_ms_max']:.1f} ms); {len(latencies)} messages of "
              f"{figures['message_bytes'] / 1024:.1f} KiB, every client got >= {min(per_client)}; "
              f"{reconnects} reconnects; web process CPU {other_cpu['web']:.1f}% "
              f"({other_cpu['web_idle']:.1f}% before the monitor started), the clients' {other_cpu['clients']:.1f}%; "
              f"machine load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        results["live_ws"] = figures
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10, help="length of the 1 Hz fake-NVML run (default 10)")
    ap.add_argument("--dump", help="on a GPU host, write what NVML read to this JSON file")
    ap.add_argument("--clients", type=int, default=50, help="websocket clients of the live-path run (0 = skip)")
    ap.add_argument("--live-seconds", type=float, default=30, help="measured length of the live-path run")
    ap.add_argument("--only-live", action="store_true", help="run only the live-path measurement")
    ap.add_argument("--no-deflate", action="store_true", help="live-path clients do not offer permessage-deflate")
    ap.add_argument("--server-deflate", action="store_true",
                    help="the web server accepts permessage-deflate (uvicorn's default; Kiln's worker turns it off)")
    args = ap.parse_args()
    results: dict = {}
    if not args.only_live:
        bench_parser(results)
        bench_fake(results, args.seconds)
        bench_real(results, args.dump)
    if args.clients:
        bench_live(results, args.clients, args.live_seconds, deflate=not args.no_deflate,
                   server_deflate=args.server_deflate)
    print(json.dumps({k: v for k, v in results.items() if k != "real"}, indent=1))


if __name__ == "__main__":
    main()
