"""The Users page: delete an account (asked first), never one's own; its audit rows stay;
and the hub preference asked on the Overview page."""
import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from dashboard.models import AuditEntry
from tests.dashboard.test_signin import sign_in, signed_in


def test_an_operator_deletes_a_user_whose_keys_stop_and_whose_audit_rows_stay(
        transactional_db, client, operator, viewer, redis_clean):
    from inference.gateway import keys

    key, secret = keys.key_create(user=viewer, name="script")
    laptop = Client()
    sign_in(laptop, viewer.username, viewer.plain_password)
    laptop.post("/password/", {})  # an audited action of theirs
    assert AuditEntry.objects.filter(username="victor").exists()
    assert Client().get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 200  # cached now

    sign_in(client, operator.username, operator.plain_password)
    page = client.get("/users/").content.decode()
    assert f'action="/users/{viewer.pk}/delete"' in page and "data-confirm=" in page
    assert f'action="/users/{operator.pk}/delete"' not in page  # no button for one's own account
    response = client.post(f"/users/{viewer.pk}/delete", follow=True)
    assert "victor is deleted" in response.content.decode()
    assert not get_user_model().objects.filter(pk=viewer.pk).exists()
    assert laptop.get("/").status_code == 302  # signed out
    assert Client().get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 401
    trail = AuditEntry.objects.filter(username="victor")
    assert trail.exists()  # their own actions stay
    assert AuditEntry.objects.filter(action="user.delete", username="olga", object_id=str(viewer.pk)).exists()

    refused = client.post(f"/users/{operator.pk}/delete", follow=True).content.decode()
    assert "cannot delete your own account" in refused
    assert get_user_model().objects.filter(pk=operator.pk).exists() and signed_in(client)


def test_a_viewer_cannot_delete_anyone(client, operator, viewer):
    sign_in(client, viewer.username, viewer.plain_password)
    assert client.post(f"/users/{operator.pk}/delete").status_code == 403
    assert get_user_model().objects.filter(pk=operator.pk).exists()


def test_the_overview_asks_for_the_hub_once_and_the_choice_fills_the_preset_download_link(
        client, operator, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    settings.PREFERRED_HUB = ""
    sign_in(client, operator.username, operator.plain_password)
    home = client.get("/").content.decode()
    assert 'id="hub-choice"' in home and 'value="modelscope"' in home
    client.post("/settings/hub", {"hub": "modelscope"})
    assert (tmp_path / "preferred_hub").read_text().strip() == "modelscope"
    assert 'id="hub-choice"' not in client.get("/").content.decode()

    from inference.deployments import presets
    from inference.deployments.services import download_url

    assert download_url(presets.QWEN_AWQ_TP2).startswith("/models/?repo=Qwen%2FQwen3.8-27B-AWQ&hub=modelscope")
    # Not on ModelScope: Hugging Face it is.
    assert "hub=hf" in download_url(presets.QWEN_NVFP4)
    client.post("/settings/hub", {"hub": "hf-mirror"})
    url = download_url(presets.QWEN_NVFP4)
    assert "hub=hf" in url and "endpoint=https%3A%2F%2Fhf-mirror.com" in url
    models = client.get(url).content.decode()
    assert 'value="nvidia/Qwen3.8-27B-NVFP4"' in models and 'value="https://hf-mirror.com"' in models
    assert 'value="*.safetensors *.json tokenizer* *.jinja *.txt"' in models
    bad = client.post("/settings/hub", {"hub": "gitee"}, follow=True).content.decode()
    assert "Unknown hub" in bad and (tmp_path / "preferred_hub").read_text().strip() == "hf-mirror"


def test_the_overview_shows_gpus_running_deployments_and_the_next_step(client, operator, viewer, settings, tmp_path):
    from django.utils import timezone

    from inference.models import Deployment
    from monitoring.models import Gpu

    settings.DATA_DIR = tmp_path
    sign_in(client, operator.username, operator.plain_password)
    first = client.get("/").content.decode()
    assert 'id="no-gpus"' in first and 'id="start-demo"' in first  # nothing yet: start the demo
    assert 'href="/deployments/plan"' in first and 'href="/playground/"' in first

    Gpu.objects.create(host=settings.HOST_NAME, index=0, uuid="GPU-1", name="Tesla V100-SXM2-32GB",
                       memory_total_bytes=34359738368, compute_capability="7.0", updated=timezone.now())
    Deployment.objects.create(name="qwen awq", host=settings.HOST_NAME, engine_name="vllm", status="ready", port=9)
    page = client.get("/").content.decode()
    assert "Tesla V100-SXM2-32GB" in page and "32 GiB" in page and "7.0" in page
    assert "qwen awq" in page and 'id="open-playground"' in page and 'id="start-demo"' not in page
    viewer_client = Client()
    sign_in(viewer_client, viewer.username, viewer.plain_password)
    assert 'id="hub-choice"' not in viewer_client.get("/").content.decode()  # operators choose
