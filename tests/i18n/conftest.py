import pytest
from django.conf import settings
from django.utils import translation


@pytest.fixture(autouse=True)
def back_to_the_default_language():
    """A request through the test client leaves its language active in this thread;
    the tests after these ones expect the default."""
    yield
    translation.activate(settings.LANGUAGE_CODE)
