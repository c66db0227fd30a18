"""How cheap is Kiln's monitoring? Prints figures measured side by side in one run.

1. Parsing a ~54 KB vLLM /metrics page: Kiln's parser vs prometheus_client's.
2. With the fake NVML (tests/fakenvml.py): 8 GPUs sampled at 1 Hz, CPU time the
   sampler uses per second of wall time, including JSON-encoding the message
   and handing it to ``publish`` -- the hook where the lead's channel-layer
   group_send (the websocket fan-out) plugs in.
3. Where a real NVIDIA GPU exists: cost of one per-GPU sample with pynvml vs
   one ``nvidia-smi --query-gpu`` call, per NVML call breakdown, and
   (--dump FILE) a JSON dump of what NVML read, including NotSupported fields.

    python bench/monitoring.py [--seconds 10] [--dump out.json]
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

from monitoring.enginemetrics import ENGINE_PREFIXES, parse_prometheus_text  # noqa: E402
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
    nvml = Nvml(slow_interval_s=5.0)
    status = nvml.init()
    print(f"[real GPU] {status.message}; driver {status.driver_version}, CUDA {status.cuda_driver_version}")
    if not status.ok:
        return
    nvml.sample_all()  # warm up: first reads, NotSupported discovered
    # Fast path only: between slow refreshes, as 4 of 5 samples at 1 Hz are.
    per_gpu = best_of(lambda: nvml.sample(0), 5, 200)
    # Worst tick: slow fields re-read too.
    nvml.slow_interval_s = 10**9
    def with_slow():
        nvml._gpus[0].slow_read_at = None
        nvml.sample(0)
    per_gpu_slow = best_of(with_slow, 5, 50)
    nvml.slow_interval_s = 5.0

    cmd = ["nvidia-smi", f"--query-gpu={SMI_QUERY}", "--format=csv,noheader"]
    smi_out = subprocess.run(cmd, capture_output=True, text=True).stdout
    smi = best_of(lambda: subprocess.run(cmd, capture_output=True, check=True), 5, 2)
    print(f"[real GPU] per-GPU sample {per_gpu*1e6:.0f} us (with slow fields {per_gpu_slow*1e6:.0f} us) vs one "
          f"nvidia-smi --query-gpu {smi*1e3:.1f} ms -> {smi/per_gpu:.0f}x cheaper ({smi/per_gpu_slow:.0f}x worst tick)")

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
    results["real"] = {"status": status.to_dict(), "per_gpu_sample_us": per_gpu * 1e6,
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10, help="length of the 1 Hz fake-NVML run (default 10)")
    ap.add_argument("--dump", help="on a GPU host, write what NVML read to this JSON file")
    args = ap.parse_args()
    results: dict = {}
    bench_parser(results)
    bench_fake(results, args.seconds)
    bench_real(results, args.dump)
    print(json.dumps({k: v for k, v in results.items() if k != "real"}, indent=1))


if __name__ == "__main__":
    main()
