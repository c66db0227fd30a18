"""Listing models on the fake Hugging Face and ModelScope hubs."""
import time

import pytest

from inference.library.hubs.base import (HubError, RemoteFile, RetryPolicy, UnsafePathError,
                                 filter_files, retry_after_seconds, safe_relative_path)
from inference.library.hubs.huggingface import HuggingFaceHub
from inference.library.hubs.modelscope import ModelScopeHub
from tests.fakehub import FakeFile, FakeHub

FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)
TOKEN = "hf_good_token"


@pytest.fixture
def hub():
    h = FakeHub(token=TOKEN)
    h.add_repo("Qwen/Tiny", {
        "config.json": FakeFile.of_bytes(b'{"architectures": ["X"]}'),
        "model-00001-of-00002.safetensors": FakeFile.generated(3000, seed=1),
        "model-00002-of-00002.safetensors": FakeFile.generated(2000, seed=2),
        "gguf/tiny-Q4_K_M.gguf": FakeFile.generated(1500, seed=3),
        "gguf/tiny-Q8_0.gguf": FakeFile.generated(2500, seed=4),
    })
    h.repos["Qwen/Tiny"].revisions["master"] = h.repos["Qwen/Tiny"].revisions["main"]
    with h:
        yield h


def hf(hub, token=None):
    return HuggingFaceHub(endpoint=hub.url, token=token, retry=FAST)


def ms(hub, token=None):
    return ModelScopeHub(endpoint=hub.url, token=token, retry=FAST)


def test_hf_listing_gives_sizes_and_hashes(hub):
    listing = hf(hub).list_files("Qwen/Tiny")
    by_path = {f.path: f for f in listing.files}
    assert set(by_path) == set(hub.repos["Qwen/Tiny"].revisions["main"])
    big = by_path["model-00001-of-00002.safetensors"]
    served = hub.repos["Qwen/Tiny"].revisions["main"]["model-00001-of-00002.safetensors"]
    assert big.size == 3000 and big.sha256 == served.sha256 and big.git_sha1 is None
    small = by_path["config.json"]
    # A small non-LFS file has only its git blob sha1.
    assert small.sha256 is None and small.git_sha1 == hub.repos["Qwen/Tiny"].revisions["main"]["config.json"].git_sha1
    assert big.url == f"{hub.url}/Qwen/Tiny/resolve/main/model-00001-of-00002.safetensors"
    assert listing.total_size == 3000 + 2000 + 1500 + 2500 + len(b'{"architectures": ["X"]}')


def test_hf_listing_follows_pagination(hub):
    hub.page_size = 2
    listing = hf(hub).list_files("Qwen/Tiny")
    assert len(listing.files) == 5
    assert sum(1 for r in hub.requests if "/tree/" in r["path"]) >= 3


def test_include_exclude_patterns(hub):
    listing = hf(hub).list_files("Qwen/Tiny", include=["*.safetensors", "config.json"])
    assert sorted(f.path for f in listing.files) == [
        "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    one_gguf = hf(hub).list_files("Qwen/Tiny", include=["gguf/tiny-Q4_K_M.gguf"])
    assert [f.path for f in one_gguf.files] == ["gguf/tiny-Q4_K_M.gguf"]
    no_gguf = hf(hub).list_files("Qwen/Tiny", exclude=["*.gguf"])
    assert all(not f.path.endswith(".gguf") for f in no_gguf.files) and len(no_gguf.files) == 3


def test_modelscope_listing(hub):
    listing = ms(hub).list_files("Qwen/Tiny", include=["*.gguf"])
    assert sorted(f.path for f in listing.files) == ["gguf/tiny-Q4_K_M.gguf", "gguf/tiny-Q8_0.gguf"]
    f = listing.files[0]
    assert f.sha256 == hub.repos["Qwen/Tiny"].revisions["master"][f.path].sha256
    assert f.url.startswith(f"{hub.url}/api/v1/models/Qwen/Tiny/repo?Revision=master&FilePath=")
    assert listing.revision == "master"


def test_hf_errors_are_explained(hub):
    hub.add_repo("org/Gated", {"a.bin": FakeFile.generated(10)}, gated=True)
    hub.add_repo("org/Secret", {"a.bin": FakeFile.generated(10)}, private=True)
    with pytest.raises(HubError) as e:
        hf(hub).list_files("org/Gated")
    assert e.value.code == "GatedRepo" and e.value.status == 401
    assert "gated" in str(e.value) and "accept" in str(e.value)
    with pytest.raises(HubError) as e:
        hf(hub).list_files("org/Missing")
    assert e.value.code == "RepoNotFound" and "not found" in str(e.value)
    with pytest.raises(HubError) as e:
        hf(hub, token=TOKEN).list_files("org/Missing")
    assert e.value.code == "RepoNotFound" and e.value.status == 404
    with pytest.raises(HubError) as e:
        hf(hub).list_files("Qwen/Tiny", revision="v9")
    assert e.value.code == "RevisionNotFound" and "'v9'" in str(e.value)
    with pytest.raises(HubError) as e:
        hf(hub, token="hf_wrong").list_files("Qwen/Tiny")
    assert e.value.code == "InvalidToken" and "token" in str(e.value)
    # With the right token the private and gated repos list fine.
    assert hf(hub, token=TOKEN).list_files("org/Secret").files[0].path == "a.bin"
    assert hf(hub, token=TOKEN).list_files("org/Gated").files[0].path == "a.bin"


def test_hf_gated_with_token_not_accepted_is_403(hub):
    hub.add_repo("org/Gated-not-accepted", {"a.bin": FakeFile.generated(10)}, gated=True)
    with pytest.raises(HubError) as e:
        hf(hub, token=TOKEN).list_files("org/Gated-not-accepted")
    assert e.value.status == 403 and e.value.code == "GatedRepo"
    assert "no access yet" in str(e.value)


def test_modelscope_errors_are_explained(hub):
    hub.add_repo("org/Secret", {"a.bin": FakeFile.generated(10)}, private=True,
                 revision="master")
    with pytest.raises(HubError) as e:
        ms(hub).list_files("org/Missing")
    assert e.value.status == 404 and "does not exist on ModelScope" in str(e.value)
    with pytest.raises(HubError) as e:
        ms(hub).list_files("org/Secret")
    assert e.value.status == 401 and "token" in str(e.value)
    with pytest.raises(HubError) as e:
        ms(hub, token="wrong").list_files("org/Secret")
    assert e.value.status == 403 and "no access" in str(e.value)
    with pytest.raises(HubError) as e:
        ms(hub).list_files("Qwen/Tiny", revision="v9")
    assert "Revision 'v9'" in str(e.value)
    assert ms(hub, token=TOKEN).list_files("org/Secret").files[0].path == "a.bin"


def test_listing_retries_429_honouring_retry_after(hub):
    hub.rate_limit["__listing__"] = (1, "1")
    t0 = time.monotonic()
    listing = hf(hub).list_files("Qwen/Tiny")
    assert len(listing.files) == 5
    assert time.monotonic() - t0 >= 0.9


def test_listing_gives_up_on_persistent_5xx(hub):
    hub.server_error["__listing__"] = 10
    with pytest.raises(HubError) as e:
        ms(hub).list_files("Qwen/Tiny")
    assert e.value.code == "Unavailable" and "503" in str(e.value)


@pytest.mark.parametrize("evil", ["../../etc/passwd", "/etc/passwd", "a/../../x",
                                  "..\\..\\windows\\x", "C:/x", "a//b", "./a"])
def test_unsafe_listed_paths_are_refused_on_both_hubs(hub, evil):
    hub.add_repo("evil/Repo", {"ok.bin": FakeFile.generated(10)}, extra_listing=[evil])
    hub.repos["evil/Repo"].revisions["master"] = hub.repos["evil/Repo"].revisions["main"]
    for client in (hf(hub), ms(hub)):
        with pytest.raises(UnsafePathError) as e:
            client.list_files("evil/Repo")
        assert "outside the model's folder" in str(e.value)


def test_bad_repo_ids_are_refused_before_any_request(hub):
    for bad in ["", "a/b/c", "../x", "a b/c", "org/.."]:
        with pytest.raises(HubError) as e:
            hf(hub).list_files(bad)
        assert e.value.code == "BadRepoId"
    assert hub.requests == []


def test_safe_relative_path_accepts_plain_paths():
    assert safe_relative_path("a/b.safetensors") == "a/b.safetensors"
    assert safe_relative_path("..hidden-but-fine") == "..hidden-but-fine"


def test_filter_files_without_patterns_keeps_all():
    files = [RemoteFile("a.json", 1, "u"), RemoteFile("b/c.bin", 2, "u")]
    assert filter_files(files) == files
    assert filter_files(files, exclude=["b/*"]) == files[:1]


def test_retry_after_parses_seconds_and_dates():
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    when = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 <= retry_after_seconds(when) <= 31
