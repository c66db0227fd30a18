"""The model library end to end: the JSON API, a real Celery worker, the fake hub on loopback."""
import hashlib
import os
from datetime import timedelta

from django.utils import timezone

from inference.models import ModelArtifact
from tests.helpers import wait_until
from tests.library.helpers import TOKEN, MiB, login, served


def start(client, hub, repo, **extra):
    body = {"hub": "hf", "repo_id": repo, "endpoint": hub.url, **extra}
    return client.post("/api/models/", body, content_type="application/json")


def wait_status(pk, statuses, timeout=60):
    def done():
        row = ModelArtifact.objects.get(pk=pk)
        return row if row.status in statuses else None

    try:
        return wait_until(done, timeout, f"model #{pk} to reach {statuses}")
    except AssertionError:
        row = ModelArtifact.objects.get(pk=pk)
        raise AssertionError(f"model #{pk} stuck: {row.status} {row.job} {row.error!r} claim={row.claim!r}") from None


def sha256_of(path):
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def test_download_through_the_api_lands_verified_files_and_metadata(client, operator, worker, hub, models_dir):
    login(client, operator)
    preview = client.post("/api/models/preview", {"hub": "hf", "repo_id": "org/Tiny", "endpoint": hub.url,
                                                  "include": "*.safetensors *.json"}, content_type="application/json")
    assert preview.status_code == 200, preview.content
    p = preview.json()["preview"]
    assert sorted(f["path"] for f in p["files"]) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert p["total_size"] == 3 * MiB + 777 + len(served(hub, "org/Tiny", "config.json").data) + 18
    assert p["fits"] is True and p["space"]["free"] > 0 and p["space"]["already_on_disk"] == 0

    response = start(client, hub, "org/Tiny", include="*.safetensors *.json")
    assert response.status_code == 202, response.content
    pk = response.json()["model"]["id"]
    row = wait_status(pk, {"ready", "failed"})
    assert row.status == "ready", row.error
    folder = models_dir / "huggingface" / "org" / "Tiny" / "main"
    assert row.folder == str(folder) and row.path == str(folder)
    for rel in ("config.json", "model.safetensors", "tokenizer.json"):
        assert sha256_of(folder / rel) == served(hub, "org/Tiny", rel).sha256
        assert row.recorded_hashes[rel] == served(hub, "org/Tiny", rel).sha256
        assert not (folder / (rel + ".part")).exists()
    assert row.meta["architecture"] == "LlamaForCausalLM" and row.meta["num_kv_heads"] == 2
    assert row.format == "safetensors" and row.bytes_done == row.bytes_total == p["total_size"]
    assert row.verified_at is not None and row.hub_token == ""
    detail = client.get(f"/api/models/{pk}").json()["model"]
    assert detail["status"] == "ready" and detail["meta"]["num_layers"] == 2
    assert "hub_token" not in detail
    page = client.get(f"/models/{pk}/").content.decode()
    assert served(hub, "org/Tiny", "model.safetensors").sha256 in page and "LlamaForCausalLM" in page


def test_single_gguf_download_points_at_the_file_and_reads_its_header(client, operator, worker, hub, models_dir):
    login(client, operator)
    pk = start(client, hub, "org/Tiny-GGUF", include="*Q8_0.gguf").json()["model"]["id"]
    row = wait_status(pk, {"ready", "failed"})
    assert row.status == "ready", row.error
    assert row.path.endswith("/org/Tiny-GGUF/main/tiny-Q8_0.gguf") and os.path.isfile(row.path)
    assert row.name == "org/Tiny-GGUF · tiny-Q8_0.gguf" and row.format == "gguf"
    assert row.meta["architecture"] == "llama" and row.meta["name"] == "Tiny Test"
    assert list(row.recorded_hashes) == ["tiny-Q8_0.gguf"]


def test_cancel_keeps_the_part_and_resume_finishes_without_refetching(client, operator, worker, hub, models_dir):
    login(client, operator)
    f = served(hub, "org/Big", "big.gguf")
    hub.throttle_bps = 8 * MiB
    pk = start(client, hub, "org/Big", include="big.gguf").json()["model"]["id"]
    wait_until(lambda: ModelArtifact.objects.get(pk=pk).bytes_done >= 8 * MiB, 60, "some progress")
    assert client.post(f"/api/models/{pk}/cancel").status_code == 202
    row = wait_status(pk, {"cancelled", "failed", "ready"}, 30)
    assert row.status == "cancelled", row.error
    part = models_dir / "huggingface/org/Big/main/big.gguf.part"
    kept = part.stat().st_size
    assert 8 * MiB <= kept < f.size and not part.with_suffix("").exists()
    assert row.bytes_done >= 8 * MiB
    assert client.get(f"/api/models/{pk}").json()["model"]["actions"]["resume"] is True

    hub.throttle_bps = 0
    assert client.post(f"/api/models/{pk}/resume").status_code == 202
    row = wait_status(pk, {"ready", "failed"})
    assert row.status == "ready", row.error
    assert row.recorded_hashes["big.gguf"] == f.sha256
    assert hub.bytes_sent["big.gguf"] <= f.size * 1.05, hub.bytes_sent["big.gguf"] / f.size


def test_killed_worker_download_resumes_when_a_worker_starts_again(client, operator, worker, hub, models_dir):
    login(client, operator)
    f = served(hub, "org/Big", "big.gguf")
    hub.throttle_bps = 16 * MiB
    pk = start(client, hub, "org/Big", include="big.gguf").json()["model"]["id"]
    wait_until(lambda: ModelArtifact.objects.get(pk=pk).bytes_done >= f.size * 0.4, 60, "40% downloaded")
    worker.kill()
    row = ModelArtifact.objects.get(pk=pk)
    assert row.status == "downloading"  # nobody told the row: the worker died
    part = models_dir / "huggingface/org/Big/main/big.gguf.part"
    assert part.stat().st_size >= f.size * 0.4
    hub.throttle_bps = 0
    worker.start()  # its start-up sweep sees the claim's process is gone and queues the row again
    row = wait_status(pk, {"ready", "failed"})
    assert row.status == "ready", row.error + worker.text()
    assert sha256_of(row.path) == f.sha256
    assert hub.bytes_sent["big.gguf"] <= f.size * 1.05, hub.bytes_sent["big.gguf"] / f.size


def test_a_downloading_row_whose_worker_died_is_resumable_once_stale(client, operator, redis_clean, models_dir):
    login(client, operator)
    row = ModelArtifact.objects.create(
        name="org/X", source="hf", repo_id="org/X", revision="main", host="testhost", folder=str(models_dir / "x"),
        path=str(models_dir / "x"), status="downloading", claim="abc", heartbeat=timezone.now(),
        files=[{"path": "a.bin", "size": 10, "url": "http://127.0.0.1:9/a.bin", "sha256": None, "git_sha1": None}])
    refused = client.post(f"/api/models/{row.pk}/resume")
    assert refused.status_code == 400 and "cannot be resumed" in refused.json()["error"]["message"]
    ModelArtifact.objects.filter(pk=row.pk).update(heartbeat=timezone.now() - timedelta(seconds=120))
    listed = client.get("/api/models/").json()["models"][0]
    assert listed["stale"] is True and listed["actions"]["resume"] is True
    response = client.post(f"/api/models/{row.pk}/resume")
    assert response.status_code == 202, response.content
    row.refresh_from_db()
    assert row.status == "queued" and row.claim == ""


def test_listing_errors_are_clear_form_errors(client, operator, hub, models_dir):
    login(client, operator)
    missing = client.post("/api/models/preview", {"repo_id": "org/Nope", "endpoint": hub.url}, content_type="application/json")
    assert missing.status_code == 400
    assert "Model org/Nope was not found" in missing.json()["error"]["message"]
    gated = client.post("/api/models/preview", {"repo_id": "org/Gated", "endpoint": hub.url}, content_type="application/json")
    assert gated.status_code == 400 and gated.json()["error"]["code"] == "GatedRepo"
    assert "gated model" in gated.json()["error"]["message"]
    with_token = client.post("/api/models/preview", {"repo_id": "org/Gated", "endpoint": hub.url, "token": TOKEN},
                             content_type="application/json")
    assert with_token.status_code == 200
    assert TOKEN not in with_token.content.decode()
    bad_rev = client.post("/api/models/preview", {"repo_id": "org/Tiny", "revision": "v9", "endpoint": hub.url},
                          content_type="application/json")
    assert "Revision 'v9' does not exist" in bad_rev.json()["error"]["message"]
    ms = client.post("/api/models/preview", {"hub": "modelscope", "repo_id": "org/Nope", "endpoint": hub.url},
                     content_type="application/json")
    assert ms.status_code == 400 and "does not exist on ModelScope" in ms.json()["error"]["message"]
    assert ModelArtifact.objects.count() == 0


def test_settings_endpoint_and_token_are_used_but_the_token_stays_with_its_endpoint(client, operator, hub, models_dir, settings):
    login(client, operator)
    settings.HF_ENDPOINT, settings.HF_TOKEN = hub.url, TOKEN
    ok = client.post("/api/models/preview", {"repo_id": "org/Gated"}, content_type="application/json")
    assert ok.status_code == 200, ok.content
    settings.HF_ENDPOINT = "http://127.0.0.1:9"  # the token belongs to this endpoint, not to the typed one
    other = client.post("/api/models/preview", {"repo_id": "org/Gated", "endpoint": hub.url}, content_type="application/json")
    assert other.status_code == 400 and other.json()["error"]["code"] == "GatedRepo"


def test_not_enough_disk_is_refused_with_the_numbers(client, operator, hub, models_dir):
    login(client, operator)
    preview = client.post("/api/models/preview", {"repo_id": "org/Huge", "endpoint": hub.url}, content_type="application/json")
    p = preview.json()["preview"]
    assert p["fits"] is False and "Not enough disk space" in p["message"]
    response = start(client, hub, "org/Huge")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "not_enough_disk"
    assert "1048576.00 GiB" in error["message"] and "free" in error["message"]
    assert error["space"]["still_needed"] == 1 << 50 and error["space"]["free"] > 0
    assert ModelArtifact.objects.count() == 0


def test_path_traversal_in_a_listing_is_refused_and_nothing_is_written(client, operator, hub, models_dir, tmp_path):
    login(client, operator)
    before = sorted(models_dir.rglob("*"))
    for url in ("/api/models/preview", "/api/models/"):
        response = client.post(url, {"repo_id": "org/Evil", "endpoint": hub.url}, content_type="application/json")
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "UnsafePath"
        assert "outside the model's folder" in response.json()["error"]["message"]
    assert sorted(models_dir.rglob("*")) == before
    assert not (models_dir.parent / "escape.bin").exists() and not (models_dir / "huggingface/escape.bin").exists()
    assert ModelArtifact.objects.count() == 0
    assert not [r for r in hub.requests if "/resolve/" in r["path"]]


def test_reverify_reports_a_changed_byte_and_resume_repairs_it(client, operator, worker, hub, models_dir):
    login(client, operator)
    pk = start(client, hub, "org/Tiny").json()["model"]["id"]
    row = wait_status(pk, {"ready", "failed"})
    assert row.status == "ready", row.error
    assert client.post(f"/api/models/{pk}/reverify").status_code == 202
    row = wait_status(pk, {"ready", "failed"})
    assert row.status == "ready" and row.verify_report["ok"] is True and row.verify_report["checked"] == 3

    target = os.path.join(row.folder, "model.safetensors")
    with open(target, "r+b") as fh:
        fh.seek(12345)
        byte = fh.read(1)
        fh.seek(12345)
        fh.write(bytes([byte[0] ^ 1]))
    assert client.post(f"/api/models/{pk}/reverify").status_code == 202
    row = wait_status(pk, {"ready", "failed"})
    assert row.status == "failed"
    assert [c["path"] for c in row.verify_report["changed"]] == ["model.safetensors"]
    assert "model.safetensors changed" in row.error
    page = client.get(f"/models/{pk}/").content.decode()
    assert "model.safetensors changed" in page and sha256_of(target) in page

    assert client.post(f"/api/models/{pk}/resume").status_code == 202  # a repair: only the changed file comes again
    row = wait_status(pk, {"ready", "failed"})
    assert row.status == "ready", row.error
    assert sha256_of(target) == served(hub, "org/Tiny", "model.safetensors").sha256


def test_import_a_local_folder_without_copying_and_delete_keeps_its_files(client, operator, worker, models_dir, tmp_path):
    login(client, operator)
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_bytes(b'{"architectures": ["MistralForCausalLM"], "num_hidden_layers": 4, '
                                         b'"hidden_size": 128, "num_attention_heads": 8}')
    (folder / "model.safetensors").write_bytes(os.urandom(MiB))
    response = client.post("/api/models/import", {"path": str(folder), "name": "Mine"}, content_type="application/json")
    assert response.status_code == 202, response.content
    pk = response.json()["model"]["id"]
    row = wait_status(pk, {"ready", "failed"})
    assert row.status == "ready", row.error
    assert row.path == str(folder) and row.source == "local" and row.name == "Mine"
    assert row.recorded_hashes == {"config.json": sha256_of(folder / "config.json"),
                                   "model.safetensors": sha256_of(folder / "model.safetensors")}
    assert row.meta["architecture"] == "MistralForCausalLM" and row.bytes_total == MiB + (folder / "config.json").stat().st_size
    assert not any(p.is_file() for p in models_dir.rglob("*"))  # nothing copied
    again = client.post("/api/models/import", {"path": str(folder)}, content_type="application/json")
    assert again.status_code == 409 and "already in the library" in again.json()["error"]["message"]
    not_model = client.post("/api/models/import", {"path": str(tmp_path)}, content_type="application/json")
    assert not_model.status_code == 400 and "does not look like a model folder" in not_model.json()["error"]["message"]
    relative = client.post("/api/models/import", {"path": "models/x"}, content_type="application/json")
    assert relative.status_code == 400 and "absolute path" in relative.json()["error"]["message"]

    assert client.post(f"/api/models/{pk}/delete").status_code == 200
    assert (folder / "model.safetensors").exists() and (folder / "config.json").exists()
    assert not ModelArtifact.objects.filter(pk=pk).exists()


def test_delete_removes_downloaded_files_but_not_those_another_model_uses(client, operator, worker, hub, models_dir):
    login(client, operator)
    a = start(client, hub, "org/Tiny-GGUF", include="*Q8_0.gguf").json()["model"]["id"]
    assert wait_status(a, {"ready", "failed"}).status == "ready"
    b = start(client, hub, "org/Tiny-GGUF", include="*.gguf").json()["model"]["id"]
    row_b = wait_status(b, {"ready", "failed"})
    assert row_b.status == "ready", row_b.error
    folder = models_dir / "huggingface/org/Tiny-GGUF/main"
    assert client.post(f"/api/models/{b}/delete").status_code == 200
    assert (folder / "tiny-Q8_0.gguf").exists()  # model a still lists it
    assert not (folder / "tiny-F16.gguf").exists()
    assert client.delete(f"/api/models/{a}").status_code == 200
    assert not (models_dir / "huggingface").exists()  # empty folders pruned up to MODELS_DIR
    assert models_dir.exists()


def test_viewer_may_look_but_not_download_cancel_or_delete(client, viewer, hub, models_dir):
    row = ModelArtifact.objects.create(name="org/Tiny", source="hf", repo_id="org/Tiny", host="testhost",
                                       folder=str(models_dir / "t"), path=str(models_dir / "t"), status="ready")
    login(client, viewer)
    assert client.get("/api/models/").status_code == 200
    assert client.get("/models/").status_code == 200
    for url in ("/api/models/", "/api/models/preview", f"/api/models/{row.pk}/cancel", f"/api/models/{row.pk}/resume",
                f"/api/models/{row.pk}/reverify", f"/api/models/{row.pk}/delete", "/api/models/import"):
        response = client.post(url, {"repo_id": "org/Tiny", "endpoint": hub.url}, content_type="application/json")
        assert response.status_code == 403, url
        assert response.json()["error"]["code"] == "forbidden"
    assert client.delete(f"/api/models/{row.pk}").status_code == 403
    assert ModelArtifact.objects.filter(pk=row.pk).exists() and len(hub.requests) == 0


def test_modelscope_download_through_the_api(client, operator, worker, hub, models_dir):
    login(client, operator)
    response = client.post("/api/models/", {"hub": "modelscope", "repo_id": "org/Tiny-GGUF", "revision": "main",
                                            "include": "*Q8_0.gguf", "endpoint": hub.url}, content_type="application/json")
    assert response.status_code == 202, response.content
    row = wait_status(response.json()["model"]["id"], {"ready", "failed"})
    assert row.status == "ready", row.error
    assert row.path == str(models_dir / "modelscope/org/Tiny-GGUF/main/tiny-Q8_0.gguf")
    assert row.recorded_hashes["tiny-Q8_0.gguf"] == served(hub, "org/Tiny-GGUF", "tiny-Q8_0.gguf").sha256
    assert row.meta["architecture"] == "llama"
    assert any("/api/v1/models/org/Tiny-GGUF/repo?" in r["path"] for r in hub.requests)
