"""Batch jobs against the stub engine: Kiln's batch runner vs a plain asyncio client, in one run.

Starts on 127.0.0.1 with throw-away state: the counting stub engine
(tests/batches/stub.py, its own process; every request takes --delay s, as a
model answering would), then, side by side:

1. plain: an aiohttp client with an asyncio.Semaphore(--concurrency) posts
   the same N chat requests to the stub (what a hand-written loop does);
2. kiln: the batch runner (inference/batches/runner.py) on the same N lines,
   in a fresh process with its own SQLite database, as the Celery task runs
   it: lines claimed, sent through the gateway's relay, results recorded once
   with fsync, usage counted. Run at 1k and at N lines.

Printed: throughput of each and the ratio (target >= 95%), the stub's peak
requests in flight (must equal the concurrency: the engine is kept at the set
concurrency and never above it), the runner process's peak RSS at 1k and N
lines (flat: it must not grow with N), and how many output lines were on disk
half-way through the run (the output file is written as lines complete).

Run: python bench/batch.py [--lines 10000] [--concurrency 4] [--delay 0.02] [--rounds 3]

On a shared, busy host the rounds alternate plain and kiln runs and the medians
count, so load from elsewhere slows both sides alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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


def line(i: int) -> dict:
    return {"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "stub", "max_tokens": 16,
                     "messages": [{"role": "user", "content": f"Summarise document {i}: lorem ipsum dolor"}]}}


def stats(port: int, reset: bool = False) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats{'?reset' if reset else ''}") as r:
        return json.loads(r.read())


# ---------------------------------------------------------------- plain asyncio client
async def plain(port: int, n: int, concurrency: int) -> float:
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one(i):
            async with sem:
                async with session.post(url, json=line(i)["body"]) as r:
                    await r.read()
        start, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(i) for i in range(n)))
        plain.cpu_ms_per_line = 1000 * (time.process_time() - cpu0) / n
        return time.perf_counter() - start


# ---------------------------------------------------------------- the kiln runner, in its own process
def kiln_child(port: int, n: int, concurrency: int) -> None:
    """Runs in a fresh process: set up a throw-away panel database, run one batch, print figures as JSON."""
    import resource
    import threading

    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from inference.batches import services, storage
    from inference.batches.runner import Runner
    from inference.models import Batch, Deployment

    Deployment.objects.create(name="stub", host="bench", engine_name="vllm", status="ready", port=port,
                              served_model_name="stub")
    incoming = storage.Incoming("bench.jsonl")
    chunk = []
    for i in range(n):  # streamed in chunks, as an upload is
        chunk.append(json.dumps(line(i)).encode() + b"\n")
        if len(chunk) == 1000:
            incoming.write(b"".join(chunk))
            chunk = []
    incoming.write(b"".join(chunk))
    incoming.finish()
    f = services.file_store(incoming, user=None)
    batch = Batch.objects.create(endpoint="/v1/chat/completions", input_file=f, host="bench",
                                 concurrency=concurrency, total=f.lines)
    assert services.claim_batch(batch.pk, "bench")
    services.prepare_lines(Batch.objects.get(pk=batch.pk))
    batch = Batch.objects.select_related("input_file", "output_file", "error_file").get(pk=batch.pk)
    services.recover(batch)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    samples = []
    stop = threading.Event()

    def watch():  # bytes on disk while the run goes on (lines counted after the run, off the clock)
        while not stop.wait(0.5):
            samples.append((time.perf_counter(), os.path.getsize(batch.output_file.path)))

    watcher = threading.Thread(target=watch, daemon=True)
    cpu0 = time.process_time()
    start = time.perf_counter()
    watcher.start()
    asyncio.run(Runner(batch).run())
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # before reading the output back below
    stop.set()
    watcher.join()
    services.finish(batch.pk)
    batch.refresh_from_db()
    with open(batch.output_file.path, "rb") as out:
        done = out.read()
    mid = [done[:size].count(b"\n") for t, size in samples if t - start >= wall / 2]
    print("RESULT " + json.dumps({
        "wall": wall, "cpu_ms_per_line": 1000 * cpu / n, "completed": batch.completed, "failed": batch.failed, "status": batch.status,
        "rss_before_run_mb": rss_before / 1024, "peak_rss_mb": peak_rss / 1024,
        "lines_on_disk_half_way": mid[0] if mid else None,
    }), flush=True)


def kiln(port: int, n: int, concurrency: int) -> dict:
    data = tempfile.mkdtemp(prefix="kiln-bench-batch-")
    env = dict(os.environ, DATA_DIR=data, DJANGO_SETTINGS_MODULE="dashboard.settings", KILN_HOST_NAME="bench",
               REDIS_URL="redis://127.0.0.1:1/0", LOG_LEVEL="WARNING", PYTHONPATH=str(ROOT))
    env.pop("DATABASE_URL", None)
    out = subprocess.run([sys.executable, __file__, "--child", str(port), str(n), str(concurrency)], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=3600)
    for text in out.stdout.splitlines():
        if text.startswith("RESULT "):
            return json.loads(text[7:])
    raise SystemExit(f"the runner process failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kiln_child(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--delay", type=float, default=0.02, help="seconds the stub takes per request")
    ap.add_argument("--rounds", type=int, default=3, help="alternating plain/kiln rounds; medians count")
    args = ap.parse_args()
    stub = subprocess.Popen([sys.executable, "-m", "tests.batches.stub", str(args.delay)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        port = int(stub.stdout.readline().split()[1])
        n, c = args.lines, args.concurrency
        ideal = c / args.delay
        print(f"stub engine: {args.delay * 1000:.0f} ms per request; concurrency {c} (ideal {ideal:.0f} req/s)")
        stats(port, reset=True)
        small = kiln(port, 1000, c)  # peak RSS at 1k lines
        stats(port, reset=True)
        plain_walls, kiln_runs, peaks = [], [], []
        for round_ in range(args.rounds):  # alternating, so a busy neighbour slows both sides alike
            plain_walls.append(asyncio.run(plain(port, n, c)))
            plain_peak = stats(port, reset=True)["peak"]
            r = kiln(port, n, c)
            s = stats(port, reset=True)
            assert r["completed"] == n and s["requests"] == n, (r, s)
            kiln_runs.append(r)
            peaks.append((plain_peak, s["peak"]))
            print(f"round {round_ + 1}: plain {n / plain_walls[-1]:.1f} req/s ({plain.cpu_ms_per_line:.2f} ms CPU per "
                  f"line), kiln {n / r['wall']:.1f} req/s ({r['cpu_ms_per_line']:.2f} ms CPU per line) "
                  f"= {100 * plain_walls[-1] / r['wall']:.1f}%, engine peak in flight {plain_peak} / {s['peak']}",
                  flush=True)
        p_wall = statistics.median(plain_walls)
        k_wall = statistics.median(r["wall"] for r in kiln_runs)
        big = max(kiln_runs, key=lambda r: r["peak_rss_mb"])
        print(f"\n{'client':26} {'lines':>6} {'wall s':>7} {'req/s':>7} {'vs plain':>8} {'engine peak':>11} "
              f"{'peak RSS MB':>11} {'on disk half-way':>16}")
        print(f"{'plain asyncio (aiohttp)':26} {n:>6} {p_wall:>7.1f} {n / p_wall:>7.1f} {'100%':>8} "
              f"{max(p for p, _ in peaks):>11} {'-':>11} {'-':>16}")
        print(f"{'kiln batch runner':26} {1000:>6} {small['wall']:>7.1f} {1000 / small['wall']:>7.1f} {'':>8} "
              f"{'':>11} {small['peak_rss_mb']:>11.0f} {str(small['lines_on_disk_half_way']) + '/1000':>16}")
        print(f"{'kiln batch runner':26} {n:>6} {k_wall:>7.1f} {n / k_wall:>7.1f} {100 * p_wall / k_wall:>7.1f}% "
              f"{max(k for _, k in peaks):>11} {big['peak_rss_mb']:>11.0f} "
              f"{str(kiln_runs[-1]['lines_on_disk_half_way']) + '/' + str(n):>16}")
        ratio = p_wall / k_wall
        print(f"\nmedian of {args.rounds} rounds: kiln at {n} lines reaches {100 * ratio:.1f}% of the plain client's "
              f"throughput ({'meets' if ratio >= 0.95 else 'BELOW'} the 95% target); engine peak in flight "
              f"{max(k for _, k in peaks)} of {c}; runner peak RSS {small['peak_rss_mb']:.0f} MB at 1000 lines, "
              f"{big['peak_rss_mb']:.0f} MB at {n} lines (before the run: {small['rss_before_run_mb']:.0f} and "
              f"{big['rss_before_run_mb']:.0f} MB, after writing the lines' rows)")
    finally:
        stub.terminate()
        stub.wait(5)


if __name__ == "__main__":
    main()
