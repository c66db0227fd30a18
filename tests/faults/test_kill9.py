"""kill -9 anywhere (issue 19): the real standalone runner (embedded Redis, web, worker,
monitor) runs a download from the fake hub, a launch of the real llama-server with the
Gemma demo, a benchmark and a batch against a stub engine, and a job queued a moment
before the kill; each Kiln process in turn (web, worker, monitor, Redis, the runner
itself) is killed with SIGKILL at a random point inside those operations' running
windows, the runner is started again, and what each operation became is checked:

- download: resumes and verifies (each final file's sha256 is the hub's, no .part
  left, nothing in the verified-files record that does not hash to what it says);
- launch: the engine re-adopted (same pid, Ready), or launched again when the kill
  came before its pid was recorded; never a second engine of one deployment;
- benchmark: succeeded with every request measured, or failed as interrupted with
  the reason and no results; never left running, never succeeded with partial data;
- batch: completed, every line's result exactly once;
- queued job (a benchmark queued just before the kill): it runs after the restart.

The seed of the random points is printed (KILN_KILL_SEED=N repeats a run;
KILN_KILL_PROCESSES=worker,redis runs some rows only); the
matrix process x operation -> outcome is printed and written to
test-artifacts/kill9_matrix.md.
"""
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from django.conf import settings

from tests.fakehub import FakeFile, FakeHub
from tests.helpers import LLAMA_WRAPPER, REPO, child_env, demo_model_path, free_port, needs_llama, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.engine, needs_llama, pytest.mark.timeout(900)]

PROCESSES = ("web", "worker", "monitor", "redis", "runner")
OPERATIONS = ("download", "launch", "benchmark", "batch", "queued job")
MiB = 1 << 20
FILE_SIZE = 10 * MiB  # two files at THROTTLE each: about 7 s of downloading
THROTTLE = int(1.5 * MiB)
BENCH_PROMPTS, BENCH_TOKENS = 8, 40  # 40 tokens 0.02 s apart: about 0.8 s a request, 6-7 s a run
BATCH_LINES = 160  # 0.1 s a line, two at a time: about 8 s
ARTIFACT = REPO / "test-artifacts" / "kill9_matrix.md"
# What the restarted worker's start sweeps log (shown under the matrix).
SWEPT = r"queued again|marked interrupted|interrupted model job|interrupted batch|deployments of host|" \
        r"previous runner was killed"


class Runner:
    """`manage.py standalone` on the test database (its own embedded Redis)."""

    def __init__(self, port):
        env = child_env()
        env.pop("REDIS_URL")  # the embedded Redis, with its append-only file in DATA_DIR/redis
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "standalone", "--port", str(port), "--web-workers", "1"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self):
        return "\n".join(self.lines)

    def wait_up(self, timeout=240):
        def up():
            if self.process.poll() is not None:
                raise AssertionError(f"the runner exited with {self.process.returncode}:\n{self.output[-4000:]}")
            return "Kiln is up at" in self.output

        wait_until(up, timeout, f"the runner is up:\n{self.output[-4000:]}", interval=0.2)
        redis_url = re.findall(r"embedded Redis on (redis://\S+)", self.output)[-1]
        point_celery_at(redis_url)
        self.children = {}
        for child in psutil.Process(self.process.pid).children():
            line = " ".join(child.cmdline())
            for name, part in (("redis", "redis-server"), ("web", "gunicorn"), ("worker", "celery"),
                               ("monitor", "manage.py monitor")):
                if part in line:
                    self.children[name] = child.pid
        assert set(self.children) == {"redis", "web", "worker", "monitor"}, self.children
        # The worker has swept (worker_ready) once it says ready.
        wait_until(lambda: "ready." in self.output, 60, "the worker is ready")

    def pid_of(self, name):
        return self.process.pid if name == "runner" else self.children[name]


def point_celery_at(url):
    """This process enqueues through the services too: send to the embedded Redis of now
    (a new port at each start)."""
    from dashboard.celery import app

    app.conf.broker_url = url
    app._pool = None
    if "amqp" in app.__dict__:
        app.__dict__["amqp"]._producer_pool = None


@pytest.fixture(autouse=True)
def _celery_back_on_the_test_redis():
    """Point this process's Celery back where it was: the later tests of the run enqueue
    through it, and the runner's embedded Redis is gone with the runner."""
    from dashboard.celery import app

    before = app.conf.broker_url
    yield
    point_celery_at(before)


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MiB), b""):
            h.update(block)
    return h.hexdigest()


@pytest.fixture
def stub_engine(transactional_db):
    """The stub engine as a process, recorded as a ready deployment the monitor can watch."""
    from inference.deployments.supervisor import process_start_time
    from inference.models import Deployment

    process = subprocess.Popen([sys.executable, "-m", "tests.faults.engine_stub", "--token-delay", "0.02",
                                "--delay", "0.1"], cwd=REPO, stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        port = int(process.stdout.readline().split()[1])
        yield Deployment.objects.create(
            name="stub engine", host=settings.HOST_NAME, engine_name="vllm", status="ready", phase="ready",
            port=port, served_model_name="stub", pid=process.pid, start_time=process_start_time(process.pid),
            pgid=process.pid)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture
def gemma_profile(transactional_db):
    from inference.deployments import services as deployments
    from inference.deployments.presets import GEMMA_DEMO
    from inference.models import ModelArtifact

    ModelArtifact.objects.create(name="Gemma 3 270M (demo)", source="local", repo_id=GEMMA_DEMO.model.repo_id,
                                 host=settings.HOST_NAME, path=demo_model_path(), format="gguf", status="ready",
                                 weight_bytes=Path(demo_model_path()).stat().st_size)
    deployments.ensure_demo_runtime()
    profile = deployments.preset_profile(preset_slug=GEMMA_DEMO.slug)
    profile.extra_args = list(profile.extra_args or []) + ["-t", "1"]  # two shared cores
    profile.save()
    return profile


class Case:
    """One row of the matrix: the operations of one kill and what each became."""

    def __init__(self, process, hub, stub, profile, operator, rng):
        self.process, self.hub, self.stub, self.profile, self.operator, self.rng = \
            process, hub, stub, profile, operator, rng
        self.at_kill = {}
        self.outcome = {}
        self.lost = {}
        self.left = []
        self.restart_s = 0.0
        self.sweeps = []

    def start(self):
        from inference.batches import services as batches
        from inference.benchmarks import services as benchmarks
        from inference.library import services as library

        repo = f"kill9/{self.process}"
        self.files = {name: FakeFile.generated(FILE_SIZE, seed=hash((self.process, name)) & 0xFFFF)
                      for name in ("a.bin", "b.bin")}
        self.hub.add_repo(repo, self.files)
        self.sent_before = sum(self.hub.bytes_sent.values())
        self.model = library.model_download_start(user=None, source="hf", repo_id=repo, endpoint=self.hub.url)
        lines = "".join(json.dumps({"custom_id": f"{self.process}-{i}", "method": "POST",
                                    "url": "/v1/chat/completions",
                                    "body": {"model": "stub", "messages": [{"role": "user", "content": f"line {i}"}],
                                             "max_tokens": 4}}) + "\n" for i in range(BATCH_LINES))
        upload = batches.file_from_text(lines, user=self.operator)
        self.batch = batches.batch_create(user=self.operator, input_file=upload, endpoint="/v1/chat/completions",
                                          deployment=self.stub, concurrency=2)
        self.benches = [self.benchmark(1)]

    def benchmark(self, i):
        from inference.benchmarks import services as benchmarks

        return benchmarks.benchmark_start(
            deployment=self.stub, scenario="decode-single-stream", user=None, label=f"kill -9 {self.process} #{i}",
            overrides={"num_prompts": BENCH_PROMPTS, "num_warmups": 0, "output_tokens": BENCH_TOKENS})

    def wait_running(self):
        from inference.models import Batch, BenchmarkRun, ModelArtifact

        wait_until(lambda: ModelArtifact.objects.filter(pk=self.model.pk, status="downloading",
                                                        bytes_done__gt=0).exists(), 60, "the download runs")
        wait_until(lambda: BenchmarkRun.objects.filter(pk=self.benches[0].pk, status="running").exists(), 60,
                   "the benchmark runs")
        wait_until(lambda: Batch.objects.filter(pk=self.batch.pk, status="in_progress", completed__gt=0).exists(),
                   60, "the batch runs")

    def launch_and_kill(self, runner):
        from inference.benchmarks import services as benchmarks
        from inference.deployments import services as deployments

        from inference.models import BenchmarkRun, Deployment

        time.sleep(self.rng.uniform(0.0, 2.0))  # a random point in the download's, benchmark's and batch's runs
        self.dep = deployments.deployment_launch(profile=self.profile)
        # ... and in the launch's: for the worker, its part (queued -> claimed -> spawned -> pid recorded,
        # a fraction of a second); for the others the engine's start that the monitor follows to Ready.
        if self.process == "worker":
            time.sleep(self.rng.uniform(0.0, 0.12))
        else:
            wait_until(lambda: Deployment.objects.filter(pk=self.dep.pk).exclude(pid=None).exists(), 30,
                       "the engine spawned")
            # A second run fills the worker's fourth slot (download, batch, first run), so that the job
            # queued just before the kill waits in Redis's queue.
            self.benches.append(self.benchmark(2))
            time.sleep(self.rng.uniform(0.2, 1.5))
        self.record_state()
        self.queued = benchmarks.benchmark_start(
            deployment=self.stub, scenario="decode-single-stream", user=None, label=f"queued, {self.process}",
            overrides={"num_prompts": 2, "num_warmups": 0, "output_tokens": 8})
        victim = runner.pid_of(self.process)
        os.kill(victim, signal.SIGKILL)
        self.killed_at = time.monotonic()
        self.at_kill["queued job"] = BenchmarkRun.objects.get(pk=self.queued.pk).status
        left = []
        if self.process == "runner":
            runner.process.wait(10)
            time.sleep(1)
            left = [name for name, pid in runner.children.items() if psutil.pid_exists(pid)
                    and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        else:
            runner.process.wait(60)  # the runner stops the others and exits when a child dies
        return left

    def record_state(self):
        from inference.models import Batch, BenchmarkRun, Deployment, ModelArtifact

        m = ModelArtifact.objects.get(pk=self.model.pk)
        self.at_kill["download"] = f"{m.status} {m.progress_percent:.0f}%"
        d = Deployment.objects.get(pk=self.dep.pk)
        self.pid_at_kill = d.pid
        self.at_kill["launch"] = f"{d.status}" + (f", pid {d.pid}" if d.pid else ", no pid yet")
        self.at_kill["benchmark"] = ", ".join(
            f"{b.status} {(b.progress or {}).get('completed', 0)}/{BENCH_PROMPTS}"
            for b in BenchmarkRun.objects.filter(pk__in=[b.pk for b in self.benches]).order_by("pk"))
        batch = Batch.objects.get(pk=self.batch.pk)
        self.at_kill["batch"] = f"{batch.completed}/{BATCH_LINES} lines"

    def check(self):
        for name, check in (("download", self.check_download), ("launch", self.check_launch),
                            ("benchmark", self.check_benchmark), ("batch", self.check_batch),
                            ("queued job", self.check_queued)):
            try:
                self.outcome[name] = check()
            except AssertionError as exc:
                self.outcome[name] = f"LOST: {str(exc).splitlines()[0][:160]}"
                self.lost[name] = str(exc)

    def check_download(self):
        from inference.library.downloader import PART_SUFFIX, VERIFIED_MANIFEST
        from inference.models import ModelArtifact

        m = wait_until(lambda: (m := ModelArtifact.objects.get(pk=self.model.pk)).status in ("ready", "failed")
                       and m, 90, "the download ends")
        assert m.status == "ready", f"download {m.status}: {m.error}"
        folder = Path(m.folder)
        for name, f in self.files.items():
            assert sha256_of(folder / name) == f.sha256, f"{name}: sha256 differs from the hub's"
            assert m.recorded_hashes.get(name) == f.sha256, f"{name}: recorded hash differs"
            assert not (folder / (name + PART_SUFFIX)).exists(), f"{name}{PART_SUFFIX} left behind"
        manifest = json.loads((folder / VERIFIED_MANIFEST).read_text())
        for rel, entry in manifest.items():
            assert sha256_of(folder / rel) == entry["sha256"], f"{rel} recorded as verified but hashes otherwise"
        sent = sum(self.hub.bytes_sent.values()) - self.sent_before
        return f"ready, sha256 verified (hub sent {sent / MiB:.1f} of {2 * FILE_SIZE / MiB:.0f} MiB)"

    def check_launch(self):
        from inference.deployments import supervisor
        from inference.deployments.services import launch_dir_for
        from inference.models import Deployment

        d = wait_until(lambda: (d := Deployment.objects.get(pk=self.dep.pk)).status in ("ready", "failed") and d,
                       120, "the launch ends")
        assert d.status == "ready", f"deployment {d.status}: {d.failure} {d.hint}"
        group = set(supervisor.group_members(d.pgid, d.start_time)) | {d.pid}
        strays = [p for p in supervisor.marked_processes(str(launch_dir_for(d.pk))) if p not in group]
        assert not strays, f"engine processes of this deployment outside its recorded group: {strays}"
        if self.pid_at_kill:
            assert d.pid == self.pid_at_kill, f"pid {self.pid_at_kill} at the kill, {d.pid} now: not re-adopted"
            return f"re-adopted: same pid {d.pid}, Ready"
        return f"launched after the restart: pid {d.pid}, Ready" + (f" ({d.hint[:60]})" if d.hint else "")

    def check_benchmark(self):
        return "; ".join(self.one_benchmark(b.pk) for b in self.benches)

    def one_benchmark(self, pk):
        from inference.models import BenchmarkRun

        b = wait_until(lambda: (b := BenchmarkRun.objects.get(pk=pk)).is_finished and b, 60,
                       f"benchmark #{pk} is no longer queued or running")
        if b.status == "succeeded":
            done = sum(s.get("completed") or 0 for s in b.result)
            assert done == BENCH_PROMPTS, f"succeeded with {done} of {BENCH_PROMPTS} requests: partial data"
            return f"succeeded {done}/{BENCH_PROMPTS} (finished before its worker stopped)"
        assert b.status == "failed" and b.error.startswith("Interrupted"), f"benchmark {b.status}: {b.error}"
        assert b.result == [], "an interrupted run keeps results"
        return "interrupted, no results kept"

    def check_batch(self):
        from inference.models import Batch, BatchLine

        b = wait_until(lambda: (b := Batch.objects.get(pk=self.batch.pk)).status in Batch.FINISHED and b, 90,
                       "the batch ends")
        assert b.status == "completed", f"batch {b.status}: {b.reason}"
        ids = [json.loads(x)["custom_id"] for x in Path(b.output_file.path).read_text().splitlines()]
        assert sorted(ids) == sorted(f"{self.process}-{i}" for i in range(BATCH_LINES)), "lines lost or twice"
        assert BatchLine.objects.filter(batch=b, status="done").count() == BATCH_LINES
        return f"completed, {BATCH_LINES}/{BATCH_LINES} results once each"

    def check_queued(self):
        from inference.models import BenchmarkRun

        q = wait_until(lambda: (q := BenchmarkRun.objects.get(pk=self.queued.pk)).is_finished and q, 60,
                       "the queued benchmark ran")
        if q.status == "failed" and q.error.startswith("Interrupted"):
            return "interrupted (it had started before the kill)"
        assert q.status == "succeeded", f"queued job {q.status}: {q.error}"
        return "ran after the restart" if self.at_kill["queued job"] == "queued" else "ran"

    def cleanup(self):
        from inference.deployments import services as deployments

        deployments.deployment_stop_process(deployment_id=self.dep.pk, grace_s=5)


def matrix_text(cases, seed, wall_s):
    head = "| process killed | " + " | ".join(OPERATIONS) + " |"
    rule = "|" + "---|" * (len(OPERATIONS) + 1)
    rows = []
    for c in cases:
        cells = [f"{c.outcome.get(op, '-')} (at the kill: {c.at_kill.get(op, '-')})" for op in OPERATIONS]
        rows.append(f"| {c.process} | " + " | ".join(cells) + " |")
    notes = []
    for c in cases:
        notes.append(f"- {c.process}: back up {c.restart_s:.1f} s after the kill"
                     + (f"; the killed runner left {', '.join(c.left)} running, which the restart stopped"
                        if c.left else ""))
        notes.extend(f"  - {line}" for line in c.sweeps)
    return "\n".join([f"kill -9 matrix, seed {seed}, {wall_s:.0f} s", "", head, rule, *rows, "", *notes]) + "\n"


def test_kill9_matrix_nothing_lost(stub_engine, gemma_profile, operator):
    seed = int(os.environ.get("KILN_KILL_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"\nkill -9 matrix: seed {seed} (KILN_KILL_SEED={seed} repeats these points)")
    rng = random.Random(seed)
    t0 = time.monotonic()
    cases = []
    port = free_port()
    with FakeHub() as hub:
        hub.throttle_bps = THROTTLE
        runner = Runner(port)
        try:
            runner.wait_up()
            for process in os.environ.get("KILN_KILL_PROCESSES", ",".join(PROCESSES)).split(","):
                case = Case(process, hub, stub_engine, gemma_profile, operator, rng)
                cases.append(case)
                case.start()
                case.wait_running()
                case.left = case.launch_and_kill(runner)
                if process == "runner":
                    assert case.left, "the killed runner's children were expected to outlive it"
                runner = Runner(port)
                runner.wait_up()
                case.restart_s = time.monotonic() - case.killed_at
                case.sweeps = [re.sub(r"^.*? INFO [\w.]+: |^kiln: ", "", line) for line in runner.lines
                               if re.search(SWEPT, line)]
                if process == "runner":
                    assert "a previous runner was killed and left" in runner.output, runner.output[-3000:]
                case.check()
                case.cleanup()
        finally:
            wall = time.monotonic() - t0
            text = matrix_text(cases, seed, wall)
            print("\n" + text)
            ARTIFACT.parent.mkdir(exist_ok=True)
            ARTIFACT.write_text(text)
            if runner.process.poll() is None:
                runner.process.send_signal(signal.SIGINT)
                try:
                    runner.process.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(runner.process.pid, signal.SIGKILL)
    lost = {f"{c.process} x {op}": why for c in cases for op, why in c.lost.items()}
    assert not lost, "\n".join(f"{k}: {v}" for k, v in lost.items())


def test_redis_killed_under_a_running_worker_loses_no_queued_job(transactional_db, tmp_path):
    """Outside the standalone runner (compose, systemd) the worker outlives a Redis crash. Here
    that Redis keeps nothing (no append-only file: the worst case), and a queued run's message
    is gone with it: the worker sees the new Redis and queues the run again from its row."""
    from dashboard.standalone import find_redis_server
    from inference.benchmarks import services as benchmarks
    from inference.models import BenchmarkRun, Deployment
    from tests.sse_stub import StubScript, running_stub

    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"

    def redis():
        return subprocess.Popen([find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL,
                                start_new_session=True)

    server = redis()
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "dashboard", "worker", "-Q", f"default,host.{settings.HOST_NAME}",
         "-n", f"kill9@{settings.HOST_NAME}", "--concurrency", "2", "--without-mingle", "--without-gossip",
         "-l", "INFO"], cwd=REPO, env=child_env(REDIS_URL=url), stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        wait_until(lambda: b" ready." in log.read_bytes() or worker.poll() is not None, 60, "worker start")
        assert worker.poll() is None, log.read_text()
        with running_stub(StubScript(token_delay=0.005)) as stub:
            dep = Deployment.objects.create(name="stub", host=settings.HOST_NAME, engine_name="vllm",
                                            status="ready", port=stub.port, served_model_name="stub")
            scenario = benchmarks.scenario_with_overrides("decode-single-stream", {
                "num_prompts": 2, "num_warmups": 0, "output_tokens": 8})
            run = benchmarks.benchmark_row(deployment=dep, scenario=scenario, label="queued, message lost")
            time.sleep(2)  # queued in the database, nothing in Redis: nobody runs it
            assert BenchmarkRun.objects.get(pk=run.pk).status == "queued"
            os.kill(server.pid, signal.SIGKILL)
            server.wait()
            server = redis()
            done = wait_until(lambda: (r := BenchmarkRun.objects.get(pk=run.pk)).is_finished and r, 60,
                              f"the queued run ran after Redis came back:\n{log.read_text()[-3000:]}")
        assert done.status == "succeeded", done.error
        assert "Redis restarted: queued again" in log.read_text()
        line = "redis killed under a running worker (no persistence): the queued benchmark's message was lost " \
               "with it; the worker saw the new Redis and queued it again from its row: succeeded"
        print("\n" + line)
        ARTIFACT.parent.mkdir(exist_ok=True)
        with (REPO / "test-artifacts" / "kill9_redis_under_worker.txt").open("w") as f:
            f.write(line + "\n")
    finally:
        for p in (worker, server):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
