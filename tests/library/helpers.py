"""Shared pieces of the model library tests: a fake hub with a few repos, a
clean MODELS_DIR, signed-in clients and a restartable real Celery worker."""
import json
import shutil
import subprocess
import sys

import pytest
from django.conf import settings

from tests.conftest import REPO, child_env, stop_group, wait_until
from tests.fakehub import FakeFile, FakeHub
from tests.library.test_modelmeta import make_gguf

MiB = 1 << 20
TOKEN = "hf_good_token"
LLAMA_CONFIG = json.dumps({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2,
    "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 4096, "torch_dtype": "float16", "vocab_size": 1000}).encode()


class ListedOnly(FakeFile):
    """A file the hub lists but nobody should fetch (its hashes are made up, not computed)."""

    @property
    def sha256(self):
        return "ab" * 32

    @property
    def git_sha1(self):
        return "cd" * 20


@pytest.fixture
def models_dir():
    """MODELS_DIR emptied before and after (the worker process shares it through DATA_DIR)."""
    root = settings.MODELS_DIR
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)


@pytest.fixture
def hub(tmp_path):
    h = FakeHub(token=TOKEN)
    h.add_repo("org/Tiny", {
        "config.json": FakeFile.of_bytes(LLAMA_CONFIG),
        "model.safetensors": FakeFile.generated(3 * MiB + 777, seed=21),
        "tokenizer.json": FakeFile.of_bytes(b'{"version": "1.0"}'),
    })
    gguf = make_gguf(tmp_path / "tiny.gguf")
    with open(gguf, "rb") as fh:
        h.add_repo("org/Tiny-GGUF", {
            "tiny-Q8_0.gguf": FakeFile.of_bytes(fh.read(), lfs=True),
            "tiny-F16.gguf": FakeFile.generated(2 * MiB, seed=3),
            "README.md": FakeFile.of_bytes(b"# tiny"),
        })
    h.add_repo("org/Big", {"big.gguf": FakeFile.generated(64 * MiB, seed=5), "config.json": FakeFile.of_bytes(LLAMA_CONFIG)})
    h.add_repo("org/Gated", {"model.safetensors": FakeFile.generated(MiB, seed=8)}, gated=True)
    h.add_repo("org/Huge", {"model.safetensors": ListedOnly(size=1 << 50)})
    h.add_repo("org/Evil", {"config.json": FakeFile.of_bytes(b"{}")}, extra_listing=["../../escape.bin"])
    with h:
        yield h


def served(hub, repo, path, rev="main"):
    return hub.repos[repo].revisions[rev][path]


def login(client, user):
    assert client.post("/login/", {"username": user.username, "password": user.plain_password}).status_code == 302
    return client


class Worker:
    """A real Celery worker (solo pool, like the shared fixture) that a test may kill and start again."""

    def __init__(self, log_path):
        self.log_path = log_path
        self.process = None

    def start(self):
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "dashboard", "worker", "-Q", f"default,host.{settings.HOST_NAME}",
             "-n", f"test@{settings.HOST_NAME}", "--pool", "solo", "--without-mingle", "--without-gossip", "-l", "INFO"],
            cwd=REPO, env=child_env(), stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: b" ready." in self.log_path.read_bytes()[start:] or self.process.poll() is not None, 60, "worker start")
        assert self.process.poll() is None, self.log_path.read_text()
        return self

    def kill(self):
        import os
        import signal
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self):
        if self.process is not None:
            stop_group(self.process)
        self.log.close()

    def text(self):
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def worker(transactional_db, redis_clean, tmp_path):
    w = Worker(tmp_path / "worker.log").start()
    yield w
    w.stop()
