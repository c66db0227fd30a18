"""Local import: what it may read. Links never lead out of the folder, /proc,
/sys and /dev are refused, IMPORT_ROOTS limits where imports come from, and a
refusal says nothing about paths outside the roots or about the processes."""
import hashlib
import json
import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.test import override_settings

from inference.library import localfiles, services
from inference.library.localfiles import ImportRefused, LocalLink, import_local
from inference.models import ModelArtifact
from tests.helpers import REPO, child_env, wait_until
from tests.library.helpers import MiB, Worker, login

SECRET = b"kiln-test-host\n"  # stands in for /etc/hostname
SECRET_SHA = hashlib.sha256(SECRET).hexdigest()


def make_model(folder):
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes(b'{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}')
    (folder / "model.safetensors").write_bytes(os.urandom(MiB))
    return folder


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "outside" / "hostname"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


def post_import(client, path):
    return client.post("/api/models/import", {"path": str(path)}, content_type="application/json")


def error_of(response):
    assert response.status_code == 400, response.content
    return response.json()["error"]


def test_a_link_out_of_the_folder_is_refused_by_name_and_never_hashed(client, operator, tmp_path, secret):
    login(client, operator)
    folder = make_model(tmp_path / "m")
    (folder / "sub").mkdir()
    os.symlink(secret, folder / "sub" / "hostname")
    error = error_of(post_import(client, folder))
    assert error["code"] == "link_outside"
    assert "sub/hostname is a link that leads out of the folder" in error["message"]
    assert str(secret) not in error["message"] and str(secret.parent) not in error["message"]
    assert not ModelArtifact.objects.exists()

    with pytest.raises(ImportRefused) as refused:
        import_local(str(folder))
    assert refused.value.rel == "sub/hostname"
    # A link to a device is refused the same way: nothing outside the folder is opened.
    os.remove(folder / "sub" / "hostname")
    os.symlink("/dev/zero", folder / "weights.bin")
    assert error_of(post_import(client, folder))["code"] == "link_outside"


def test_a_file_turned_into_a_link_after_the_request_fails_in_the_worker_unhashed(client, operator, tmp_path,
                                                                                   secret):
    login(client, operator)
    folder = make_model(tmp_path / "m")
    response = post_import(client, folder)  # checked and queued (in a test transaction: not sent)
    assert response.status_code == 202, response.content
    pk = response.json()["model"]["id"]
    os.remove(folder / "model.safetensors")
    os.symlink(secret, folder / "model.safetensors")

    services.model_import_run(artifact_id=pk, worker="test")
    row = ModelArtifact.objects.get(pk=pk)
    assert row.status == "failed"
    assert "model.safetensors is a link that leads out of the folder" in row.error
    assert row.recorded_hashes == {}
    shown = client.get(f"/api/models/{pk}").content.decode()
    assert SECRET_SHA not in shown and str(secret) not in shown


def test_a_file_swapped_for_a_link_between_the_check_and_the_hash_is_not_read(tmp_path, secret, monkeypatch):
    folder = make_model(tmp_path / "m")
    checked = localfiles._scan

    def scan_then_swap(path, roots):
        model, fd = checked(path, roots)
        os.remove(folder / "model.safetensors")
        os.symlink(secret, folder / "model.safetensors")
        return model, fd

    monkeypatch.setattr(localfiles, "_scan", scan_then_swap)
    hashed = []
    with pytest.raises(ImportRefused) as refused:
        import_local(str(folder), on_bytes=hashed.append)
    assert refused.value.code == "link_changed" and refused.value.rel == "model.safetensors"
    assert sum(hashed) == len(b'{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}')  # config.json only


def test_a_link_inside_the_folder_is_recorded_as_a_link_not_hashed_twice(client, operator, tmp_path):
    login(client, operator)
    folder = make_model(tmp_path / "m")
    os.symlink("model.safetensors", folder / "alias.safetensors")
    os.symlink(".", folder / "self")
    local = import_local(str(folder))
    assert local.links == [LocalLink("alias.safetensors", "model.safetensors"), LocalLink("self", ".")]
    assert set(local.recorded_hashes) == {"config.json", "model.safetensors"}

    response = post_import(client, folder)
    assert response.status_code == 202, response.content
    pk = response.json()["model"]["id"]
    services.model_import_run(artifact_id=pk, worker="test")
    row = ModelArtifact.objects.get(pk=pk)
    assert row.status == "ready", row.error
    assert {"path": "alias.safetensors", "size": 0, "link": "model.safetensors"} in row.files
    assert set(row.recorded_hashes) == {"config.json", "model.safetensors"}
    assert row.weight_bytes == MiB  # the link is not a second copy of the weights


@pytest.mark.parametrize("path", ["/proc/self", "/proc/self/environ", "/sys", "/sys/kernel", "/dev/null", "/dev"])
def test_system_trees_are_refused_and_the_message_names_no_process(client, operator, path):
    login(client, operator)
    error = error_of(post_import(client, path))
    assert error["code"] == "system_path"
    assert error["message"] == "Imports never read from /proc, /sys or /dev."
    assert str(os.getpid()) not in json.dumps(error)


def test_a_link_that_resolves_into_proc_is_refused_without_the_pid(client, operator, tmp_path):
    login(client, operator)
    os.symlink("/proc/self", tmp_path / "me")
    os.symlink("/dev/null", tmp_path / "null.gguf")
    for path in (tmp_path / "me", tmp_path / "me" / "environ", tmp_path / "null.gguf"):
        error = error_of(post_import(client, path))
        assert error["code"] == "system_path" and str(os.getpid()) not in error["message"]


def test_outside_the_roots_the_answer_is_the_same_whether_the_path_exists_or_not(client, operator, tmp_path,
                                                                                  secret):
    login(client, operator)
    root = tmp_path / "allowed"
    make_model(root / "m")
    outside = make_model(tmp_path / "elsewhere" / "m")
    with override_settings(IMPORT_ROOTS=[str(root)]):
        answers = {}
        for path in (outside, tmp_path / "elsewhere" / "nothing-here", secret, tmp_path / "no" / "such.gguf"):
            error = error_of(post_import(client, path))
            assert error["code"] == "outside_roots"
            answers[str(path)] = error["message"].replace(str(path), "PATH")
        assert len(set(answers.values())) == 1, answers
        assert answers[str(secret)] == (f"PATH is outside the folders that imports may come from: {root} "
                                        "(IMPORT_ROOTS).")
        # A link inside the roots is judged by where it leads.
        os.symlink(outside, root / "link-out")
        assert error_of(post_import(client, root / "link-out"))["code"] == "outside_roots"
        # Inside the roots, the usual answers.
        assert error_of(post_import(client, root / "missing"))["code"] == "not_found"
        assert post_import(client, root / "m").status_code == 202


def test_a_gguf_path_that_is_a_link_is_checked_where_it_leads(client, operator, tmp_path):
    login(client, operator)
    root = tmp_path / "allowed"
    root.mkdir()
    (tmp_path / "far.gguf").write_bytes(b"GGUF" + b"\0" * 64)
    (root / "near.gguf").write_bytes(b"GGUF" + b"\1" * 64)
    os.symlink(tmp_path / "far.gguf", root / "far-link.gguf")
    os.symlink(root / "near.gguf", root / "near-link.gguf")
    with override_settings(IMPORT_ROOTS=[str(root)]):
        assert error_of(post_import(client, root / "far-link.gguf"))["code"] == "outside_roots"
        response = post_import(client, root / "near-link.gguf")
        assert response.status_code == 202, response.content
        assert response.json()["model"]["path"] == str(root / "near.gguf")


def test_import_roots_hold_in_the_worker_end_to_end(client, operator, transactional_db, redis_clean, tmp_path,
                                                    monkeypatch):
    root = tmp_path / "allowed"
    folder = make_model(root / "m")
    outside = make_model(tmp_path / "elsewhere")
    monkeypatch.setenv("IMPORT_ROOTS", f"{tmp_path / 'unused'},{root}")
    worker = Worker(tmp_path / "worker.log").start()
    try:
        login(client, operator)
        with override_settings(IMPORT_ROOTS=[str(root)]):
            response = post_import(client, folder)
        assert response.status_code == 202, response.content
        good = response.json()["model"]["id"]
        # A row the web never checked (a path outside the roots): the worker refuses it itself.
        bad = ModelArtifact.objects.create(name="x", source="local", host=settings.HOST_NAME,
                                           path=str(outside), folder=str(outside), status="queued", job="import")
        services._enqueue(bad)

        def settled(pk):
            row = ModelArtifact.objects.get(pk=pk)
            return row if row.status in ("ready", "failed") else None

        row = wait_until(lambda: settled(good), 60, "the import")
        assert row.status == "ready", row.error
        assert set(row.recorded_hashes) == {"config.json", "model.safetensors"}
        row = wait_until(lambda: settled(bad.pk), 60, "the refused import")
        assert row.status == "failed" and "outside the folders that imports may come from" in row.error
        assert row.recorded_hashes == {}
    finally:
        worker.stop()


def test_import_roots_must_be_absolute_folders():
    env = child_env(IMPORT_ROOTS="models,/srv/models")
    done = subprocess.run([sys.executable, "-c", "import dashboard.settings"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "IMPORT_ROOTS='models,/srv/models'" in done.stderr
    env = child_env(IMPORT_ROOTS=f"/srv/models{os.pathsep}/data/models")
    done = subprocess.run([sys.executable, "-c", "from dashboard import settings; print(settings.IMPORT_ROOTS)"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([os.path.realpath("/srv/models"), os.path.realpath("/data/models")])


def test_re_verify_never_reads_a_file_that_became_a_link_out_of_the_folder(tmp_path, secret):
    from inference.library.localfiles import verify_folder

    folder = make_model(tmp_path / "m")
    model = import_local(str(folder))
    os.remove(folder / "model.safetensors")
    os.symlink(secret, folder / "model.safetensors")
    report = verify_folder(str(folder), model.recorded_hashes)
    assert not report.ok and report.checked == 1  # config.json only
    assert report.changed == [{"path": "model.safetensors", "expected": model.recorded_hashes["model.safetensors"],
                               "actual": "a link now (not followed)"}]
    assert hashlib.sha256(SECRET).hexdigest() not in report.summary()
