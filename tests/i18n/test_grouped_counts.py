"""Token and line counts on the keys and batch pages carry the language's thousands
separator (12,345), as the other pages' numbers do (kiln_format's `grouped`)."""
import datetime as dt

from django.test import Client
from django.utils import timezone

from inference.gateway import keys
from inference.models import Batch, BatchLine, UsageRecord

ZH = "zh-CN,zh;q=0.9,en;q=0.8"


def signed_in(user):
    client = Client()
    client.force_login(user)
    return client


def test_the_keys_page_groups_token_counts(operator):
    key, _secret = keys.key_create(user=operator, name="notebook", rate_limit=1500)
    UsageRecord.objects.create(minute=timezone.now().replace(second=0, microsecond=0) - dt.timedelta(minutes=1),
                               key=key, user=operator, model_name="m", requests=1234, errors=0,
                               prompt_tokens=12345, completion_tokens=1234567)
    client = signed_in(operator)
    for language in ("en", ZH):
        page = client.get("/keys/", HTTP_ACCEPT_LANGUAGE=language).content.decode()
        # per key and per deployment (one row each): requests, prompt and completion tokens
        assert page.count("<td>12,345</td>") == 2 and page.count("<td>1,234,567</td>") == 2, page
        assert page.count("<td>1,234</td>") == 2 and "1,500" in page  # the key's rate limit


def test_the_batch_page_groups_its_counts(operator):
    batch = Batch.objects.create(user=operator, endpoint="/v1/chat/completions", host="testhost",
                                 status=Batch.Status.COMPLETED, total=23456, completed=12345, failed=11111,
                                 prompt_tokens=1234567, completion_tokens=98765)
    BatchLine.objects.create(batch=batch, line=1, custom_id="req-1", offset=0, length=10, status="done",
                             status_code=200, tokens=54321)
    client = signed_in(operator)
    page = client.get(f"/batches/{batch.pk}/").content.decode()
    assert '<td id="batch-done">12,345</td>' in page and '<td id="batch-failed">11,111</td>' in page
    assert '<td id="batch-tokens">1,234,567 + 98,765</td>' in page
    assert "<td>54,321</td>" in page
    listing = client.get("/batches/").content.decode()
    assert "12,345" in listing and "23,456" in listing
