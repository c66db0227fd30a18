import pytest

from tests.alerts.receivers import Receiver


@pytest.fixture
def receiver():
    r = Receiver().start()
    yield r
    r.stop()
