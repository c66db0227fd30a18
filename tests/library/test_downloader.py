"""The downloader against the fake hub: every fault the issue lists."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from inference.library.downloader import (DownloadCancelled, DownloadFailed, NotEnoughDiskSpace,
                                          PART_SUFFIX, check_disk_space, download, target_path)
from inference.library.localfiles import import_local, verify_folder
from inference.library.hubs.base import RemoteFile, RetryPolicy, UnsafePathError
from inference.library.hubs.huggingface import HuggingFaceHub
from inference.library.hubs.modelscope import ModelScopeHub
from tests.fakehub import FakeFile, FakeHub

FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05)
TOKEN = "hf_good_token"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1 << 20


@pytest.fixture(autouse=True, params=["inline", "thread"])
def hash_mode(request, monkeypatch):
    """Every test runs with sha256 inline and on the second thread (_Sink)."""
    import inference.library.downloader as downloader

    monkeypatch.setenv("KILN_HASH_THREAD", "on" if request.param == "thread" else "off")
    monkeypatch.setattr(downloader, "THREADED_FROM", 0)
    return request.param


@pytest.fixture
def hub():
    h = FakeHub(token=TOKEN)
    h.add_repo("org/Model", {
        "config.json": FakeFile.of_bytes(b'{"architectures": ["LlamaForCausalLM"]}'),
        "model.safetensors": FakeFile.generated(3 * MiB + 12345, seed=11),
        "sub/extra.bin": FakeFile.generated(700_000, seed=12),
    })
    with h:
        yield h


def served(hub, path, repo="org/Model", rev="main"):
    return hub.repos[repo].revisions[rev][path]


def listing(hub, token=None, **kw):
    return HuggingFaceHub(endpoint=hub.url, token=token, retry=FAST).list_files("org/Model", **kw)


def sha256_of(path):
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def test_download_lands_verified_files_and_reports_progress(hub, tmp_path):
    lst = listing(hub, token=TOKEN)
    seen = []
    res = download(lst.files, str(tmp_path), headers=lst.headers, retry=FAST,
                   progress=seen.append, progress_interval=0)
    for f in lst.files:
        on_disk = tmp_path / f.path
        assert on_disk.read_bytes() == served(hub, f.path).content()
        assert not os.path.exists(str(on_disk) + PART_SUFFIX)
    assert res.recorded_hashes == {f.path: served(hub, f.path).sha256 for f in lst.files}
    assert {d.path: d.verified_by for d in res.files} == {
        "config.json": "git-sha1", "model.safetensors": "sha256", "sub/extra.bin": "sha256"}
    last = seen[-1]
    assert last.bytes_done == last.bytes_total == lst.total_size
    assert {f.status for f in last.files} == {"done"}
    assert any(0 < p.bytes_done < p.bytes_total for p in seen)
    assert res.bytes_transferred == lst.total_size


def test_token_goes_to_the_hub_but_not_to_the_cdn(hub, tmp_path):
    lst = listing(hub, token=TOKEN, include=["model.safetensors"])
    download(lst.files, str(tmp_path), headers=lst.headers, retry=FAST)
    hub_reqs = [r for r in hub.requests if r["role"] == "hub" and "/resolve/" in r["path"]]
    cdn_reqs = [r for r in hub.requests if r["role"] == "cdn"]
    assert hub_reqs and cdn_reqs
    assert all(r["auth"] == f"Bearer {TOKEN}" for r in hub_reqs)
    assert all(r["auth"] is None for r in cdn_reqs)


def test_modelscope_download(hub, tmp_path):
    hub.repos["org/Model"].revisions["master"] = hub.repos["org/Model"].revisions["main"]
    lst = ModelScopeHub(endpoint=hub.url, retry=FAST).list_files("org/Model")
    download(lst.files, str(tmp_path), retry=FAST)
    assert (tmp_path / "sub/extra.bin").read_bytes() == served(hub, "sub/extra.bin").content()


def test_resume_from_part_file_sends_only_the_rest(hub, tmp_path):
    lst = listing(hub, include=["model.safetensors"])
    f = served(hub, "model.safetensors")
    half = f.size // 2
    (tmp_path / "model.safetensors.part").write_bytes(f.content()[:half])
    res = download(lst.files, str(tmp_path), retry=FAST)
    assert sha256_of(tmp_path / "model.safetensors") == f.sha256
    assert hub.bytes_sent["model.safetensors"] == f.size - half
    assert res.bytes_transferred == f.size - half
    assert any(r["range"] == f"bytes={half}-" for r in hub.requests)


def test_server_that_ignores_range_restarts_cleanly(hub, tmp_path):
    lst = listing(hub, include=["model.safetensors"])
    f = served(hub, "model.safetensors")
    (tmp_path / "model.safetensors.part").write_bytes(f.content()[:1000])
    hub.ignore_range.add("model.safetensors")
    download(lst.files, str(tmp_path), retry=FAST)
    assert sha256_of(tmp_path / "model.safetensors") == f.sha256
    assert hub.bytes_sent["model.safetensors"] == f.size


def test_connection_cut_mid_file_resumes_with_range(hub, tmp_path):
    lst = listing(hub, include=["model.safetensors"])
    f = served(hub, "model.safetensors")
    hub.cut_after["model.safetensors"] = [f.size // 3, 2 * f.size // 3]
    download(lst.files, str(tmp_path), retry=FAST)
    assert sha256_of(tmp_path / "model.safetensors") == f.sha256
    # Every byte crossed the wire once: nothing was fetched twice.
    assert hub.bytes_sent["model.safetensors"] == f.size
    ranges = [r["range"] for r in hub.requests if r["role"] == "cdn"]
    assert ranges[0] is None and ranges[1] == f"bytes={f.size // 3}-"


def test_429_waits_for_retry_after(hub, tmp_path):
    lst = listing(hub, include=["sub/extra.bin"])
    hub.rate_limit["sub/extra.bin"] = (1, "1")
    t0 = time.monotonic()
    download(lst.files, str(tmp_path), retry=FAST)
    assert time.monotonic() - t0 >= 0.9
    assert sha256_of(tmp_path / "sub/extra.bin") == served(hub, "sub/extra.bin").sha256


def test_stalled_server_times_out_and_is_retried(hub, tmp_path):
    lst = listing(hub, include=["sub/extra.bin"])
    hub.stall["sub/extra.bin"] = (1, 3.0)
    t0 = time.monotonic()
    download(lst.files, str(tmp_path), retry=FAST, timeout=0.4)
    assert time.monotonic() - t0 < 2.5  # did not sit out the stall
    assert sha256_of(tmp_path / "sub/extra.bin") == served(hub, "sub/extra.bin").sha256
    assert sum(1 for r in hub.requests if r["role"] == "cdn") == 2


def test_5xx_is_retried_then_gives_up_with_a_message(hub, tmp_path):
    lst = listing(hub, include=["sub/extra.bin"])
    hub.server_error["sub/extra.bin"] = 2
    download(lst.files, str(tmp_path), retry=FAST)
    assert (tmp_path / "sub/extra.bin").exists()
    os.remove(tmp_path / "sub/extra.bin")
    os.remove(tmp_path / ".kiln-verified.json")
    hub.server_error["sub/extra.bin"] = 100
    with pytest.raises(DownloadFailed) as e:
        download(lst.files, str(tmp_path), retry=FAST)
    assert "sub/extra.bin" in str(e.value) and "HTTP 503" in str(e.value)


def test_wrong_byte_is_retried_once(hub, tmp_path):
    lst = listing(hub, include=["model.safetensors"])
    hub.corrupt["model.safetensors"] = 1
    download(lst.files, str(tmp_path), retry=FAST)
    f = served(hub, "model.safetensors")
    assert sha256_of(tmp_path / "model.safetensors") == f.sha256
    assert hub.bytes_sent["model.safetensors"] == 2 * f.size


def test_wrong_byte_twice_fails_with_both_hashes_and_deletes(hub, tmp_path):
    lst = listing(hub, include=["model.safetensors"])
    hub.corrupt["model.safetensors"] = 2
    with pytest.raises(DownloadFailed) as e:
        download(lst.files, str(tmp_path), retry=FAST)
    msg = str(e.value)
    f = served(hub, "model.safetensors")
    assert f.sha256 in msg
    bad = bytearray(f.content())
    bad[f.size // 2] ^= 0xFF
    assert hashlib.sha256(bad).hexdigest() in msg
    assert not (tmp_path / "model.safetensors").exists()
    assert not (tmp_path / "model.safetensors.part").exists()


def test_gated_file_without_token_fails_with_the_hub_code(hub, tmp_path):
    lst = listing(hub, token=TOKEN, include=["config.json"])
    hub.repos["org/Model"].gated = True
    with pytest.raises(DownloadFailed) as e:
        download(lst.files, str(tmp_path), retry=FAST)  # no token given
    assert "HTTP 401 (GatedRepo)" in str(e.value) and "token" in str(e.value)
    assert not (tmp_path / "config.json").exists()


def test_missing_file_is_a_404_with_a_message(hub, tmp_path):
    gone = RemoteFile("gone.bin", 10, f"{hub.url}/org/Model/resolve/main/gone.bin",
                      sha256="0" * 64)
    with pytest.raises(DownloadFailed) as e:
        download([gone], str(tmp_path), retry=FAST)
    assert "HTTP 404 (EntryNotFound)" in str(e.value)


@pytest.mark.parametrize("evil", ["../../etc/passwd", "/etc/passwd", "a/../../x", "..\\x"])
def test_unsafe_path_is_refused_at_write_time(hub, tmp_path, evil):
    dest = tmp_path / "model"
    f = RemoteFile(evil, 10, f"{hub.url}/org/Model/resolve/main/config.json", sha256="0" * 64)
    ok = listing(hub, include=["config.json"]).files
    with pytest.raises(UnsafePathError):
        download(ok + [f], str(dest), retry=FAST)
    # Refused before any byte: not even the good file was fetched.
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == []
    assert hub.requests == [r for r in hub.requests if "/tree/" in r["path"]]


def test_symlink_inside_the_folder_cannot_lead_outside(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "model" / "sub")
    with pytest.raises(UnsafePathError):
        target_path(str(tmp_path / "model"), "sub/x.bin")


def test_files_download_in_parallel(hub, tmp_path):
    hub.add_repo("org/Par", {f"s{i}.bin": FakeFile.generated(MiB, seed=i) for i in range(3)})
    files = HuggingFaceHub(endpoint=hub.url, retry=FAST).list_files("org/Par").files
    hub.throttle_bps = MiB  # per connection: one file takes ~1 s
    t0 = time.monotonic()
    download(files, str(tmp_path), concurrency=3, retry=FAST)
    took = time.monotonic() - t0
    assert took < 2.5, f"3 files of 1 s each took {took:.2f} s: not parallel"
    assert all(sha256_of(tmp_path / f.path) == f.sha256 for f in files)


def test_cancel_keeps_the_part_and_resume_finishes(hub, tmp_path):
    lst = listing(hub, include=["model.safetensors"])
    f = served(hub, "model.safetensors")
    hub.throttle_bps = 2 * MiB
    cancel = threading.Event()

    def on_progress(p):
        if p.bytes_done >= MiB:
            cancel.set()

    with pytest.raises(DownloadCancelled):
        download(lst.files, str(tmp_path), retry=FAST, cancel=cancel, progress=on_progress,
                 progress_interval=0)
    part = tmp_path / "model.safetensors.part"
    assert part.exists() and MiB <= part.stat().st_size < f.size
    assert not (tmp_path / "model.safetensors").exists()
    kept = part.stat().st_size
    hub.throttle_bps = 0
    res = download(lst.files, str(tmp_path), retry=FAST)
    assert sha256_of(tmp_path / "model.safetensors") == f.sha256
    assert res.bytes_transferred == f.size - kept
    assert hub.bytes_sent["model.safetensors"] <= f.size * 1.05


def test_killed_downloader_process_resumes_without_refetching(hub, tmp_path):
    size = 32 * MiB
    hub.add_repo("org/Big", {"big.gguf": FakeFile.generated(size, seed=5)})
    files = HuggingFaceHub(endpoint=hub.url, retry=FAST).list_files("org/Big").files
    manifest = tmp_path / "files.json"
    manifest.write_text(json.dumps([f.to_dict() for f in files]))
    dest = tmp_path / "dest"
    hub.throttle_bps = 16 * MiB
    proc = subprocess.Popen([sys.executable, "-m", "inference.library.downloader", str(manifest),
                             str(dest)], cwd=ROOT, stdout=subprocess.PIPE)
    part = dest / "big.gguf.part"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if part.exists() and part.stat().st_size >= size // 2:
            break
        assert proc.poll() is None, "downloader ended before it could be killed"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    kept = part.stat().st_size
    assert size // 2 <= kept < size
    hub.throttle_bps = 0
    res = download(files, str(dest), retry=FAST)
    assert res.files[0].sha256 == hub.repos["org/Big"].revisions["main"]["big.gguf"].sha256
    assert sha256_of(dest / "big.gguf") == res.files[0].sha256
    assert hub.bytes_sent["big.gguf"] <= size * 1.05, hub.bytes_sent["big.gguf"] / size


def test_finished_files_are_not_fetched_again(hub, tmp_path):
    lst = listing(hub)
    download(lst.files, str(tmp_path), retry=FAST)
    sent = hub.total_sent()
    res = download(lst.files, str(tmp_path), retry=FAST)
    assert hub.total_sent() == sent and res.bytes_transferred == 0
    assert res.recorded_hashes["model.safetensors"] == served(hub, "model.safetensors").sha256


def test_a_changed_final_file_is_not_trusted(hub, tmp_path):
    lst = listing(hub, include=["sub/extra.bin"])
    download(lst.files, str(tmp_path), retry=FAST)
    target = tmp_path / "sub/extra.bin"
    data = bytearray(target.read_bytes())
    data[5] ^= 1
    target.write_bytes(bytes(data))
    download(lst.files, str(tmp_path), retry=FAST)
    assert sha256_of(target) == served(hub, "sub/extra.bin").sha256


def test_disk_space_check_counts_what_is_on_disk(hub, tmp_path):
    lst = listing(hub)
    f = served(hub, "model.safetensors")
    (tmp_path / "model.safetensors.part").write_bytes(f.content()[:MiB])
    check = check_disk_space(lst.files, str(tmp_path))
    assert check.total == lst.total_size and check.already_on_disk == MiB
    assert check.still_needed == lst.total_size - MiB and check.fits
    huge = [RemoteFile("huge.gguf", 1 << 60, "http://127.0.0.1:1/x")]
    with pytest.raises(NotEnoughDiskSpace) as e:
        check_disk_space(huge, str(tmp_path / "not-yet-created"))
    assert "needs" in str(e.value) and "GiB" in str(e.value) and "free" in str(e.value)
    assert e.value.check.free > 0


def test_verify_folder_reports_changed_and_missing_files(hub, tmp_path):
    lst = listing(hub)
    res = download(lst.files, str(tmp_path), retry=FAST)
    report = verify_folder(str(tmp_path), res.recorded_hashes)
    assert report.ok and report.checked == 3
    with open(tmp_path / "model.safetensors", "r+b") as fh:
        fh.seek(100)
        fh.write(b"X")
    os.remove(tmp_path / "config.json")
    report = verify_folder(str(tmp_path), res.recorded_hashes)
    assert not report.ok and report.missing == ["config.json"]
    assert [c["path"] for c in report.changed] == ["model.safetensors"]
    assert report.changed[0]["expected"] == served(hub, "model.safetensors").sha256
    assert "model.safetensors changed" in report.summary()


def test_import_local_folder_and_gguf(tmp_path):
    folder = tmp_path / "m"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_bytes(b"{}")
    (folder / "sub" / "w.safetensors").write_bytes(b"abc" * 1000)
    (folder / "w.safetensors.part").write_bytes(b"leftover")
    model = import_local(str(folder))
    assert model.kind == "folder"
    assert model.recorded_hashes == {"config.json": hashlib.sha256(b"{}").hexdigest(),
                                     "sub/w.safetensors": hashlib.sha256(b"abc" * 1000).hexdigest()}
    assert verify_folder(str(folder), model.recorded_hashes).ok
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 100)
    one = import_local(str(gguf))
    assert one.kind == "gguf" and one.files[0].sha256 == sha256_of(gguf)


def test_import_local_refuses_what_is_not_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(Exception) as e:
        import_local(str(tmp_path))
    assert "does not look like a model folder" in str(e.value)
    with pytest.raises(Exception) as e:
        import_local(str(tmp_path / "notes.txt"))
    assert "not a GGUF file" in str(e.value)
    with pytest.raises(Exception) as e:
        import_local(str(tmp_path / "nope"))
    assert "does not exist" in str(e.value)


def test_a_disk_write_error_stops_the_file_with_a_message_and_is_not_retried(tmp_path, hash_mode):
    from inference.library.downloader import DiskWriteError, _Hashes, _Sink

    f = RemoteFile("x.bin", 3 * MiB, "http://unused")
    fd = os.open(tmp_path / "ro", os.O_RDONLY | os.O_CREAT)  # writes fail with EBADF
    sink = _Sink(fd, _Hashes(f), threaded=hash_mode == "thread")
    with pytest.raises(DiskWriteError, match="cannot write the download to disk"):
        for _ in range(8):
            buf = sink.buffer()
            sink.submit(buf, len(buf))
        sink.finish()
    os.close(fd)


def test_the_hash_covers_every_buffer_in_order(tmp_path, hash_mode):
    from inference.library.downloader import _Hashes, _Sink

    data = os.urandom(5 * MiB + 17)
    f = RemoteFile("x.bin", len(data), "http://unused")
    fd = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
    hashes = _Hashes(f)
    sink = _Sink(fd, hashes, threaded=hash_mode == "thread")
    pos = 0
    while pos < len(data):
        buf = sink.buffer()
        n = min(len(buf), 300_000, len(data) - pos)  # short reads, as sockets give
        buf[:n] = data[pos:pos + n]
        sink.submit(buf, n)
        pos += n
    sink.finish()
    os.close(fd)
    assert (tmp_path / "out").read_bytes() == data
    assert hashes.sha256.hexdigest() == hashlib.sha256(data).hexdigest()
