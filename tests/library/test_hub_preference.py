"""China-first hubs: an unreachable hub's error names the mirror or hub to try, and a model
listed on both hubs is proven by the same sha256 from either."""
import socket

import pytest

from inference.library.hubs.base import HubError, RetryPolicy
from inference.library.hubs.huggingface import HuggingFaceHub
from inference.library.hubs.modelscope import ModelScopeHub
from tests.fakehub import FakeFile, FakeHub

FAST = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02)


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("hub_class, advice", [
    (HuggingFaceHub, ["ModelScope"]),       # a mirror at 127.0.0.1 is down: try ModelScope
    (ModelScopeHub, ["Hugging Face", "hf-mirror.com"]),
])
def test_an_unreachable_hub_says_which_hub_or_mirror_to_try(hub_class, advice):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(HubError) as e:
        hub_class(endpoint=endpoint, retry=FAST).list_files("Qwen/Tiny")
    assert e.value.code == "Unavailable"
    assert all(a in str(e.value) for a in advice), str(e.value)


def test_the_advice_for_huggingface_itself_names_the_mirror_and_modelscope(settings):
    from inference.library.hubs.preference import unreachable_advice

    text = unreachable_advice("huggingface", "https://huggingface.co/api/models/x")
    assert "hf-mirror.com" in text and "ModelScope" in text


def test_a_model_on_both_hubs_lists_the_same_sha256_from_either():
    files = {"model.safetensors": FakeFile.generated(4000, seed=7), "tiny-Q4_K_M.gguf": FakeFile.generated(2000, seed=8)}
    with FakeHub() as hub:
        hub.add_repo("Qwen/Both", files)
        hub.repos["Qwen/Both"].revisions["master"] = hub.repos["Qwen/Both"].revisions["main"]
        from_hf = {f.path: f.sha256 for f in HuggingFaceHub(endpoint=hub.url, retry=FAST).list_files("Qwen/Both").files}
        from_ms = {f.path: f.sha256 for f in ModelScopeHub(endpoint=hub.url, retry=FAST).list_files("Qwen/Both").files}
    assert from_hf == from_ms == {p: f.sha256 for p, f in files.items()}
