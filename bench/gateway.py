"""What does the gateway cost? Direct to the engine vs through the panel, in one run.

Starts, on 127.0.0.1 with throw-away state: a redis-server, the SSE stub
(tests/sse_stub.py, its own process), the panel as production runs it
(gunicorn + uvicorn worker, one worker, SQLite) with a key and a ready
deployment pointing at the stub, and, with --llama, the Gemma demo on a real
llama-server. Then, part by part, alternating direct and gateway runs
(several rounds, the median of the rounds counts, so a noisy neighbour hits
both sides):

1. TTFT added: one stream at a time, the stub answers at once, so the
   difference of median TTFT (first chunk with a choice, as vllm bench serve)
   is what the gateway adds. Target < 2 ms.
2. Throughput at 64 concurrent streams with the stub pacing tokens like an
   engine (--token-delay s per token): output tokens/s through the gateway
   over direct. Target >= 95%.
3. For information: the same 64 streams with no pacing at all, which only
   measures how many SSE events per second this machine's CPUs can relay.

Run: python bench/gateway.py [--rounds 5] [--parts ttft,paced,flat] [--llama]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{proc.args[:3]} exited with {proc.returncode}")
        try:
            with opener.open(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer within {timeout} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--token-delay", type=float, default=0.02, help="stub pacing, s per token (0.02 = 50 tok/s)")
    parser.add_argument("--ttft-requests", type=int, default=200)
    parser.add_argument("--workers", type=int, default=1, help="gunicorn workers for the panel")
    parser.add_argument("--parts", default="ttft,paced,flat", help="which measurements, comma-separated")
    parser.add_argument("--llama", action="store_true", help="also compare against the Gemma demo on llama-server")
    args = parser.parse_args()

    load0 = os.getloadavg()[0]
    data_dir = tempfile.mkdtemp(prefix="kiln-bench-gateway-")
    redis_port = free_port()
    env = dict(os.environ, DATA_DIR=data_dir, REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
               DJANGO_SETTINGS_MODULE="dashboard.settings", LOG_LEVEL="WARNING", KILN_HOST_NAME="bench")
    os.environ.update({k: env[k] for k in ("DATA_DIR", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "LOG_LEVEL",
                                           "KILN_HOST_NAME")})
    import django

    django.setup()
    from django.core.management import call_command

    from dashboard.standalone import find_redis_server
    from inference.benchmarks.harness import BenchmarkConfig, LoadShape, RequestSpec, run_benchmark

    procs: list[subprocess.Popen] = []
    llama = None
    try:
        procs.append(subprocess.Popen([find_redis_server(), "--port", str(redis_port), "--bind", "127.0.0.1",
                                       "--save", "", "--appendonly", "no", "--dir", data_dir],
                                      stdout=subprocess.DEVNULL, start_new_session=True))
        call_command("migrate", verbosity=0)
        stub = subprocess.Popen([sys.executable, str(ROOT / "tests" / "sse_stub.py")], stdout=subprocess.PIPE,
                                text=True, start_new_session=True)
        procs.append(stub)
        stub_url = f"http://127.0.0.1:{stub.stdout.readline().split()[1]}"

        from django.contrib.auth import get_user_model

        from inference.gateway.keys import key_create
        from inference.models import Deployment

        user = get_user_model().objects.create_user("bench", password="bench-password-1")
        _, secret = key_create(user=user, name="bench", rate_limit=0)
        Deployment.objects.create(name="stub", host="bench", status="ready", port=int(stub_url.rsplit(":", 1)[1]),
                                  served_model_name="stub")
        if args.llama:
            llama = start_llama(Deployment)

        web_port = free_port()
        web = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "dashboard.asgi:application", "-k", "uvicorn_worker.UvicornWorker",
             "-b", f"127.0.0.1:{web_port}", "-w", str(args.workers), "--log-level", "warning"],
            cwd=ROOT, env=env, start_new_session=True)
        procs.append(web)
        gateway = f"http://127.0.0.1:{web_port}"
        wait_http(gateway + "/healthz", 60, web)

        import psutil

        def gateway_cpu() -> float:
            procs_ = [psutil.Process(web.pid)] + psutil.Process(web.pid).children(recursive=True)
            return sum(p.cpu_times().user + p.cpu_times().system for p in procs_)

        def run(base: str, model: str, streams: int, n: int, tokens: int, stub_script: dict | None,
                key: str | None, strict: bool = True) -> dict:
            config = BenchmarkConfig(base, model, load=LoadShape("concurrency", streams), api_key=key,
                                     scrape_metrics=False, continuous_usage=False,
                                     extra_body={"stub": stub_script} if stub_script is not None else {})
            warm = [RequestSpec("warm up", 4) for _ in range(min(streams, 16))]
            run_benchmark(config, warm)
            cpu0 = gateway_cpu()
            result = run_benchmark(config, [RequestSpec(f"prompt number {i} for the gateway", tokens)
                                            for i in range(n)])
            m = result.metrics
            m["gateway_cpu_s"] = gateway_cpu() - cpu0
            m["events"] = sum(len(r.chunk_times) for r in result.records)
            m["duration"] = result.duration
            if m["failed"] and strict:
                raise SystemExit(f"{m['failed']} requests failed against {base}: {m['error_counts']}")
            return m

        sides = {"direct": (stub_url, None), "gateway": (gateway, secret)}
        ttft = {s: [] for s in sides}
        paced = {s: [] for s in sides}
        flat = {s: [] for s in sides}
        parts = set(args.parts.split(","))
        # One part after the other; within a part, direct and gateway alternate
        # round by round, so drift of the host's speed hits both sides.
        for _ in range(args.rounds if "ttft" in parts else 0):
            for side, (base, key) in sides.items():
                ttft[side].append(run(base, "stub", 1, args.ttft_requests, 8, {}, key))
        for _ in range(args.rounds if "paced" in parts else 0):
            for side, (base, key) in sides.items():
                paced[side].append(run(base, "stub", args.streams, args.streams * 4, args.tokens,
                                       {"token_delay": args.token_delay, "first_delay": args.token_delay}, key))
        for _ in range(args.rounds if "flat" in parts else 0):
            for side, (base, key) in sides.items():
                flat[side].append(run(base, "stub", args.streams, args.streams * 4, args.tokens, {}, key))

        med = statistics.median
        print(f"gateway bench: gunicorn + {args.workers} uvicorn worker(s), SQLite, Redis; stub in its own "
              f"process; {os.cpu_count()} CPUs, load average before the run {load0:.1f}; {args.rounds} rounds, "
              f"median of rounds")
        if "ttft" in parts:
            report_ttft(args, ttft)
        for label, runs, note in (
                ("2.", paced, f"stub paced at {1 / args.token_delay:.0f} tok/s per stream like an engine"),
                ("3.", flat, "stub unpaced: CPU-bound, for information")):
            if not runs["direct"]:
                continue
            d = med(m["output_throughput"] for m in runs["direct"])
            g = med(m["output_throughput"] for m in runs["gateway"])
            td = med(m["median_ttft_ms"] for m in runs["direct"])
            tg = med(m["median_ttft_ms"] for m in runs["gateway"])
            print(f"\n{label} {args.streams} concurrent streams, {args.streams * 4} requests x {args.tokens} tokens, {note}")
            print(f"   output tokens/s direct {d:,.0f}, through gateway {g:,.0f} -> {100 * g / d:.1f}% of direct"
                  + (" (target >= 95%)" if label == "2." else ""))
            print(f"   median TTFT direct {td:.2f} ms, through gateway {tg:.2f} ms")
            g_runs = runs["gateway"]
            per_event = med(m["gateway_cpu_s"] / max(1, m["events"]) for m in g_runs) * 1e6
            busy = med(m["gateway_cpu_s"] / m["duration"] for m in g_runs) if "duration" in g_runs[0] else None
            print(f"   gateway CPU {per_event:.0f} us per relayed event (request set-up included)"
                  + (f", {busy:.2f} CPU-s per s" if busy is not None else ""))
        if llama is not None:
            url, handle = llama
            lr = {side: [] for side in sides}
            lsides = {"direct": (url, None), "gateway": (gateway, secret)}
            for _ in range(args.rounds):
                for side, (base, key) in lsides.items():
                    # llama-server drops keep-alive connections now and then; a
                    # failed request is counted and shown, not fatal.
                    lr[side].append(run(base, "gemma-3-270m", 4, 8, 32, None, key, strict=False))
            print("\n4. Gemma 3 270M on llama-server (CPU), 4 concurrent streams, 8 requests x 32 tokens")
            for side in lsides:
                print(f"   {side:8} median TTFT {med(m['median_ttft_ms'] for m in lr[side]):8.1f} ms, "
                      f"output {med(m['output_throughput'] for m in lr[side]):6.1f} tok/s, "
                      f"failed {sum(m['failed'] for m in lr[side])} of {sum(m['failed'] + m['completed'] for m in lr[side])}")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        if llama is not None:
            from inference.deployments import supervisor

            supervisor.stop(llama[1], grace_s=5)
    return 0


def report_ttft(args, ttft):
    med = statistics.median
    t_d = med(m["median_ttft_ms"] for m in ttft["direct"])
    t_g = med(m["median_ttft_ms"] for m in ttft["gateway"])
    # Each round runs direct then gateway back to back; the median of the
    # per-round differences is steadier than a difference of medians when
    # the host's speed drifts between rounds (a shared VM's does).
    added = med(g["median_ttft_ms"] - d["median_ttft_ms"] for d, g in zip(ttft["direct"], ttft["gateway"]))
    p99_d = med(m["p99_ttft_ms"] for m in ttft["direct"])
    p99_g = med(m["p99_ttft_ms"] for m in ttft["gateway"])
    cpu = med(m["gateway_cpu_s"] / m["completed"] for m in ttft["gateway"]) * 1000
    print(f"\n1. TTFT, 1 stream, {args.ttft_requests} requests x 8 tokens, instant stub; gateway CPU "
          f"{cpu:.2f} ms per request (whole request: auth, routing, 10 events relayed, usage)")
    print(f"   median TTFT direct {t_d:.2f} ms, through gateway {t_g:.2f} ms -> added {added:.2f} ms "
          f"(median of {len(ttft['direct'])} rounds' differences; target < 2 ms); p99 {p99_d:.2f} -> {p99_g:.2f} ms")


def start_llama(Deployment):
    from inference.deployments import supervisor
    from inference.engines import Runtime, get_engine
    from inference.deployments.presets import GEMMA_DEMO
    from tests.helpers import LLAMA_WRAPPER as wrapper
    from tests.helpers import demo_model_path

    model = demo_model_path()
    engine = get_engine("llamacpp")
    spec = GEMMA_DEMO.spec(model, extra_args=["--threads", "2"])
    started = supervisor.launch(engine, spec, Runtime("llamacpp", "executable", str(wrapper)),
                                Path(tempfile.mkdtemp(prefix="kiln-bench-llama-")) / "llama.log")
    wait_http(engine.health_url("127.0.0.1", started.port), 180)
    Deployment.objects.create(name="gemma", host="bench", status="ready", port=started.port,
                              served_model_name="gemma-3-270m", pid=started.handle.pid)
    return f"http://127.0.0.1:{started.port}", started.handle


if __name__ == "__main__":
    sys.exit(main())
