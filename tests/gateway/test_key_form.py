"""The Keys page's form: what a database cannot keep is refused with the reason, never a
500 (PostgreSQL refuses NUL in text and JSON, and its integer column ends at 2**31 - 1)."""
import pytest

from inference.gateway import keys
from inference.models import ApiKey


@pytest.mark.parametrize("form, message", [
    ({"name": "ci\x00", "rate_limit": "60"}, "The key's name must not contain a NUL character"),
    ({"name": "ci", "rate_limit": "60", "allowed_extra": "gemma\x00"}, "A model name must not contain a NUL"),
    ({"name": "ci", "rate_limit": str(2**31)}, "The rate limit is at most 1,000,000 requests per minute"),
    ({"name": "ci", "rate_limit": str(2**70)}, "The rate limit is at most 1,000,000 requests per minute"),
])
def test_a_key_the_database_cannot_keep_is_refused_with_the_reason(operator_page_client, form, message):
    answer = operator_page_client.post("/keys/new", form, follow=True)
    assert answer.status_code == 200
    assert message in answer.content.decode().replace("&#x27;", "'")
    assert not ApiKey.objects.exists()


def test_the_highest_rate_limit_is_kept(operator):
    key, _ = keys.key_create(user=operator, name="fast", rate_limit=keys.MAX_RATE_LIMIT)
    assert ApiKey.objects.get(pk=key.pk).rate_limit == 1_000_000
