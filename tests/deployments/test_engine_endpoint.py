"""Where an engine listens and with which key (inference.deployments.services.engine_endpoint):
unchanged on a single host; on a GPU host of a larger panel, on the host's address with a key."""
import dataclasses
import re

import pytest
from django.test import override_settings

from dashboard.env import ConfigError, envaddress
from inference.deployments.services import engine_endpoint
from inference.engines import get_engine
from inference.engines.base import LaunchSpec


def test_a_single_host_panel_keeps_the_profiles_address_and_key():
    with override_settings(HOST_ADDRESS="127.0.0.1"):
        assert engine_endpoint("127.0.0.1", "") == ("127.0.0.1", "")
        assert engine_endpoint("0.0.0.0", "k") == ("0.0.0.0", "k")


@pytest.mark.parametrize("bind_host", ["127.0.0.1", "0.0.0.0", "::", "localhost", "", "::1"])
def test_on_another_host_loopback_and_wildcard_become_its_address_with_a_fresh_key(bind_host):
    with override_settings(HOST_ADDRESS="10.1.2.3"):
        host, key = engine_endpoint(bind_host, "")
        assert host == "10.1.2.3"
        assert re.fullmatch(r"[0-9a-f]{48}", key) and key != engine_endpoint(bind_host, "")[1]


def test_a_generated_key_is_one_every_engine_takes():
    # A URL-safe token starting with "-" once failed a launch: the engines refuse a key that reads as a flag.
    spec = LaunchSpec(model="/models/m.gguf", port=8000)
    with override_settings(HOST_ADDRESS="10.1.2.3"):
        for _ in range(300):
            host, key = engine_endpoint("127.0.0.1", "")
            for name in ("llamacpp", "vllm", "sglang"):
                problems = get_engine(name).check_spec(dataclasses.replace(spec, host=host, api_key=key), None)
                assert "api_key" not in problems and "host" not in problems, (name, key, problems)


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
