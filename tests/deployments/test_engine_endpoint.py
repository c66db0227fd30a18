"""Where an engine listens and with which key (inference.deployments.services.engine_endpoint):
unchanged on a single host; on a GPU host of a larger panel, on the host's address with a key."""
import pytest
from django.test import override_settings

from dashboard.env import ConfigError, envaddress
from inference.deployments.services import engine_endpoint


def test_a_single_host_panel_keeps_the_profiles_address_and_key():
    with override_settings(HOST_ADDRESS="127.0.0.1"):
        assert engine_endpoint("127.0.0.1", "") == ("127.0.0.1", "")
        assert engine_endpoint("0.0.0.0", "k") == ("0.0.0.0", "k")


@pytest.mark.parametrize("bind_host", ["127.0.0.1", "0.0.0.0", "::", "localhost", "", "::1"])
def test_on_another_host_loopback_and_wildcard_become_its_address_with_a_fresh_key(bind_host):
    with override_settings(HOST_ADDRESS="10.1.2.3"):
        host, key = engine_endpoint(bind_host, "")
        assert host == "10.1.2.3"
        assert len(key) >= 40 and key != engine_endpoint(bind_host, "")[1]


def test_on_another_host_a_named_address_and_a_given_key_are_kept():
    with override_settings(HOST_ADDRESS="10.1.2.3"):
        assert engine_endpoint("192.168.7.7", "mine") == ("192.168.7.7", "mine")
        assert engine_endpoint("0.0.0.0", "mine") == ("10.1.2.3", "mine")


@pytest.mark.parametrize("value,expected", [("10.0.0.5", "10.0.0.5"), ("[fd00::5]", "fd00::5"), ("", "127.0.0.1"),
                                            ("gpu1", None), ("0.0.0.0", None), ("10.0.0.5:8000", None)])
def test_kiln_host_address_must_be_an_ip_address(monkeypatch, value, expected):
    monkeypatch.setenv("KILN_HOST_ADDRESS", value)
    if expected:
        assert envaddress("KILN_HOST_ADDRESS", "127.0.0.1") == expected
    else:
        with pytest.raises(ConfigError, match="KILN_HOST_ADDRESS=.* (is not an IP address|is the wildcard)"):
            envaddress("KILN_HOST_ADDRESS", "127.0.0.1")
