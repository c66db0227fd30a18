"""Fixtures of the model library tests: a fake hub with a few repos, a clean
MODELS_DIR and a restartable real Celery worker."""
import json
import shutil

import pytest
from django.conf import settings

from tests.fakehub import FakeFile, FakeHub
from tests.library.helpers import TOKEN, MiB, Worker
from tests.library.test_modelmeta import make_gguf

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


@pytest.fixture
def worker(transactional_db, redis_clean, tmp_path):
    w = Worker(tmp_path / "worker.log").start()
    yield w
    w.stop()
