"""Batch jobs against the stub engine: Kiln's batch runner vs a plain asyncio client, in one run.

Starts on 127.0.0.1 with throw-away state: the counting stub engine
(tests/batches/stub.py, its own process; every request takes --delay s, as a
model answering would), then, side by side:

1. plain: an aiohttp client with an asyncio.Semaphore(--concurrency) posts
   the same N chat requests to the stub (what a hand-written loop does);
2. kiln: the batch runner (inference/batches/runner.py) on the same N lines,
   in a fresh process with its own SQLite database, as the Celery task runs
   it: lines claimed, sent through the gateway's routing and engine pool,
   results recorded once with fsync, usage counted. Run at 1k and at N lines.

Targets, each printed PASS or FAIL at the end:
(a) concurrency: the engine is kept at the set concurrency: the stub's peak
    requests in flight equals it in every kiln run (never above, never short),
    and its time-averaged number in flight (the stub's in-flight seconds over
    the run's wall time) is >= 90% of it;
(b) throughput: the median of the rounds' kiln/plain throughput ratios is >= 95%;
(c) memory: the worker process's RSS stays flat: its peak (ru_maxrss: the
    claim, writing the lines' rows and the run) at N lines is within 5% of
    its peak at 1k lines, and so is its peak while running (sampled from
    /proc/self/statm every 0.1 s). The upload is checked in another process,
    as the web server does it;
(d) output as lines complete: at half of the run's wall time, >= 40% of the
    N lines are in the output file on disk (each round).

Run: python bench/batch.py [--lines 10000] [--concurrency 4] [--delay 0.02] [--rounds 3]

On a shared, busy host the rounds alternate plain and kiln runs and the median
ratio counts, so load from elsewhere slows both sides alike; the load average
is printed before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
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

CONCURRENCY_AVG_MIN = 0.90
THROUGHPUT_MIN = 0.95
RSS_GROWTH_MAX = 0.05
HALF_WAY_MIN = 0.40


def line(i: int) -> dict:
    return {"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "stub", "max_tokens": 16,
                     "messages": [{"role": "user", "content": f"Summarise document {i}: lorem ipsum dolor"}]}}


def stats(port: int, reset: bool = False) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats{'?reset' if reset else ''}") as r:
        return json.loads(r.read())


def in_flight_avg(before: dict, after: dict) -> float:
    """The engine's time-averaged requests in flight between two reads of its counters (its own clock)."""
    return (after["busy_s"] - before["busy_s"]) / max(1e-9, after["now"] - before["now"])


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def commit() -> str:
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "inference/batches", "inference/gateway", "bench/batch.py",
                "tests/batches/stub.py")
    return head + (" (with uncommitted changes to the runner, gateway or bench)" if dirty else "")


# ---------------------------------------------------------------- plain asyncio client
async def plain(port: int, n: int, concurrency: int) -> dict:
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one(i):
            async with sem:
                async with session.post(url, json=line(i)["body"]) as r:
                    await r.read()
        before = stats(port)
        start, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
        after = stats(port)
    return {"wall": wall, "cpu_ms_per_line": 1000 * cpu / n, "in_flight_avg": in_flight_avg(before, after)}


# ---------------------------------------------------------------- the kiln runner, in its own process
def upload_child(port: int, n: int, concurrency: int) -> None:
    """The web side, in its own process: a throw-away panel database, the input file
    uploaded (streamed and checked as an upload is) and the batch's row."""
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from inference.batches import services, storage
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
    print("BATCH " + batch.pk, flush=True)


def kiln_child(port: int, batch_id: str, n: int) -> None:
    """The worker side, in a fresh process (as the Celery task runs it): claim the batch,
    write the lines' rows, run it; print figures as JSON. Its RSS is the worker's alone:
    the upload's duplicate check (a set of custom_ids) lived in the web process."""
    import resource
    import threading

    import django

    django.setup()
    from inference.batches import services
    from inference.batches.runner import Runner
    from inference.models import Batch

    assert services.claim_batch(batch_id, "bench")
    services.prepare_lines(Batch.objects.get(pk=batch_id))
    batch = Batch.objects.select_related("input_file", "output_file", "error_file").get(pk=batch_id)
    services.recover(batch)
    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * page

    rss_start = rss()
    samples = []  # (time, output bytes on disk); lines counted after the run, off the clock
    rss_peak = [rss_start]
    stop = threading.Event()

    def watch():
        tick = 0
        while not stop.wait(0.1):
            rss_peak[0] = max(rss_peak[0], rss())
            tick += 1
            if tick % 2 == 0:
                samples.append((time.perf_counter(), os.path.getsize(batch.output_file.path)))

    watcher = threading.Thread(target=watch, daemon=True)
    before = stats(port)
    cpu0 = time.process_time()
    start = time.perf_counter()
    watcher.start()
    asyncio.run(Runner(batch).run())
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    after = stats(port)
    stop.set()
    watcher.join()
    rss_peak[0] = max(rss_peak[0], rss())
    lifetime_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # before reading the output back below
    services.finish(batch.pk)
    batch.refresh_from_db()
    with open(batch.output_file.path, "rb") as out:
        done = out.read()
    mid = [done[:size].count(b"\n") for t, size in samples if t - start >= wall / 2]
    print("RESULT " + json.dumps({
        "wall": wall, "cpu_ms_per_line": 1000 * cpu / n, "completed": batch.completed, "failed": batch.failed,
        "status": batch.status, "in_flight_avg": in_flight_avg(before, after),
        "rss_start_mb": rss_start / 2**20, "rss_run_peak_mb": rss_peak[0] / 2**20,
        "rss_lifetime_peak_mb": lifetime_peak / 1024, "lines_on_disk_half_way": mid[0] if mid else None,
    }), flush=True)


def kiln(port: int, n: int, concurrency: int) -> dict:
    data = tempfile.mkdtemp(prefix="kiln-bench-batch-")
    env = dict(os.environ, DATA_DIR=data, DJANGO_SETTINGS_MODULE="dashboard.settings", KILN_HOST_NAME="bench",
               REDIS_URL="redis://127.0.0.1:1/0", LOG_LEVEL="WARNING", PYTHONPATH=str(ROOT))
    env.pop("DATABASE_URL", None)

    def child(*args, mark):
        out = subprocess.run([sys.executable, __file__, *map(str, args)], env=env, cwd=ROOT, capture_output=True,
                             text=True, timeout=3600)
        for text in out.stdout.splitlines():
            if text.startswith(mark + " "):
                return text[len(mark) + 1:]
        raise SystemExit(f"the {args[0]} process failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")

    batch_id = child("--upload", port, n, concurrency, mark="BATCH")
    return json.loads(child("--child", port, batch_id, n, mark="RESULT"))


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--upload":
        upload_child(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kiln_child(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=10_000)
    ap.add_argument("--small", type=int, default=1000, help="lines of the run that memory at --lines is compared to")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--delay", type=float, default=0.02, help="seconds the stub takes per request")
    ap.add_argument("--rounds", type=int, default=3, help="alternating plain/kiln rounds; medians count")
    args = ap.parse_args()
    print(f"bench/batch.py on {dt.datetime.now().astimezone().isoformat(timespec='seconds')}, commit {commit()}, "
          f"{os.cpu_count()} CPUs, load average {load()} (1, 5, 15 min) before the run", flush=True)
    stub = subprocess.Popen([sys.executable, "-m", "tests.batches.stub", str(args.delay)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        port = int(stub.stdout.readline().split()[1])
        n, c, small_n = args.lines, args.concurrency, args.small
        ideal = c / args.delay
        print(f"stub engine: {args.delay * 1000:.0f} ms per request; concurrency {c} (ideal {ideal:.0f} req/s); "
              f"{args.rounds} rounds of plain {n} then kiln {n}, after one kiln run of {small_n}", flush=True)
        stats(port, reset=True)
        small = kiln(port, small_n, c)
        s = stats(port, reset=True)
        assert small["completed"] == small_n and s["requests"] == small_n, (small, s)
        small["peak"] = s["peak"]
        print(f"kiln {small_n}: {small_n / small['wall']:.1f} req/s, engine peak in flight {small['peak']}, "
              f"average {small['in_flight_avg']:.2f}; RSS {small['rss_start_mb']:.1f} MB at the start of the run, "
              f"peak {small['rss_run_peak_mb']:.1f} MB while running", flush=True)
        plains, kilns = [], []
        for round_ in range(args.rounds):  # alternating, so a busy neighbour slows both sides alike
            p = asyncio.run(plain(port, n, c))
            s = stats(port, reset=True)
            assert s["requests"] == n, s
            p["peak"] = s["peak"]
            r = kiln(port, n, c)
            s = stats(port, reset=True)
            assert r["completed"] == n and r["failed"] == 0 and s["requests"] == n, (r, s)
            r["peak"] = s["peak"]
            r["ratio"] = p["wall"] / r["wall"]
            plains.append(p)
            kilns.append(r)
            print(f"round {round_ + 1}: plain {n / p['wall']:.1f} req/s ({p['cpu_ms_per_line']:.2f} ms CPU per "
                  f"line, in flight peak {p['peak']} avg {p['in_flight_avg']:.2f}), kiln {n / r['wall']:.1f} req/s "
                  f"({r['cpu_ms_per_line']:.2f} ms CPU per line, in flight peak {r['peak']} avg "
                  f"{r['in_flight_avg']:.2f}) = {100 * r['ratio']:.1f}%; kiln RSS peak {r['rss_run_peak_mb']:.1f} MB, "
                  f"{r['lines_on_disk_half_way']}/{n} lines on disk half-way; load {load()}", flush=True)
        p_wall = statistics.median(p["wall"] for p in plains)
        k_wall = statistics.median(r["wall"] for r in kilns)
        ratios = [r["ratio"] for r in kilns]
        ratio = statistics.median(ratios)
        rounds_text = ", ".join(f"{100 * x:.1f}%" for x in ratios)
        avg = statistics.median(r["in_flight_avg"] for r in kilns)
        p_avg = statistics.median(p["in_flight_avg"] for p in plains)
        peaks = sorted({r["peak"] for r in kilns} | {small["peak"]})
        rss_big = max(r["rss_run_peak_mb"] for r in kilns)
        growth = rss_big / small["rss_run_peak_mb"] - 1
        life_big = max(r["rss_lifetime_peak_mb"] for r in kilns)
        life_growth = life_big / small["rss_lifetime_peak_mb"] - 1
        halves = [r["lines_on_disk_half_way"] or 0 for r in kilns]

        print(f"\n{'client':26} {'lines':>6} {'wall s':>7} {'req/s':>7} {'vs plain':>8} {'in flight':>10} "
              f"{'avg':>5} {'RSS MB':>7} {'on disk half-way':>16}")
        print(f"{'plain asyncio (aiohttp)':26} {n:>6} {p_wall:>7.1f} {n / p_wall:>7.1f} {'100%':>8} "
              f"{max(p['peak'] for p in plains):>10} {p_avg:>5.2f} {'-':>7} {'-':>16}")
        print(f"{'kiln batch runner':26} {small_n:>6} {small['wall']:>7.1f} {small_n / small['wall']:>7.1f} "
              f"{'':>8} {small['peak']:>10} {small['in_flight_avg']:>5.2f} {small['rss_run_peak_mb']:>7.1f} "
              f"{str(small['lines_on_disk_half_way']) + '/' + str(small_n):>16}")
        print(f"{'kiln batch runner':26} {n:>6} {k_wall:>7.1f} {n / k_wall:>7.1f} {100 * ratio:>7.1f}% "
              f"{max(r['peak'] for r in kilns):>10} {avg:>5.2f} {rss_big:>7.1f} "
              f"{str(min(halves)) + '/' + str(n):>16}")
        print("(wall and req/s: medians of the rounds; vs plain: median of the rounds' ratios; in flight: the "
              "engine's peak; avg: its time average; RSS: the worker's peak while running; on disk: the fewest "
              "of the rounds)")
        print(f"worker RSS: peak (ru_maxrss) {small['rss_lifetime_peak_mb']:.1f} MB at {small_n} lines, "
              f"{life_big:.1f} MB at {n}; while running {small['rss_start_mb']:.1f} -> "
              f"{small['rss_run_peak_mb']:.1f} MB at {small_n}, {max(r['rss_start_mb'] for r in kilns):.1f} -> "
              f"{rss_big:.1f} MB at {n}")
        print(f"load average after the run: {load()}")

        results = [
            ("(a) concurrency",
             peaks == [c] and avg >= CONCURRENCY_AVG_MIN * c,
             f"engine peak in flight {'/'.join(map(str, peaks))} (must be {c} in every kiln run); time-averaged "
             f"{avg:.2f} of {c} = {100 * avg / c:.1f}% (target >= {100 * CONCURRENCY_AVG_MIN:.0f}%; plain client "
             f"{p_avg:.2f})"),
            ("(b) throughput",
             ratio >= THROUGHPUT_MIN,
             f"kiln {n / k_wall:.1f} req/s vs plain {n / p_wall:.1f} req/s: {100 * ratio:.1f}% (median of "
             f"{args.rounds} rounds: {rounds_text}; target >= "
             f"{100 * THROUGHPUT_MIN:.0f}%)"),
            ("(c) memory flat",
             life_growth <= RSS_GROWTH_MAX and growth <= RSS_GROWTH_MAX,
             f"worker peak RSS {small['rss_lifetime_peak_mb']:.1f} MB at {small_n} lines, {life_big:.1f} MB at {n} "
             f"lines: {100 * life_growth:+.1f}%; while running {small['rss_run_peak_mb']:.1f} and {rss_big:.1f} MB: "
             f"{100 * growth:+.1f}% (target <= +{100 * RSS_GROWTH_MAX:.0f}% for both)"),
            ("(d) output as lines complete",
             min(halves) >= HALF_WAY_MIN * n,
             f"lines on disk at half the wall time: {', '.join(str(h) + '/' + str(n) for h in halves)} (target >= "
             f"{100 * HALF_WAY_MIN:.0f}% in every round)"),
        ]
        print()
        for name, ok, detail in results:
            print(f"{verdict(ok)}  {name}: {detail}")
        print(f"overall: {verdict(all(ok for _, ok, _ in results))}")
    finally:
        stub.terminate()
        stub.wait(5)


if __name__ == "__main__":
    main()
