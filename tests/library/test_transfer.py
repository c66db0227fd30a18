"""The file-bytes transport: proxies from the environment, as httpx reads them."""
import http.client

import pytest

from inference.library.transfer import Connections, Origin, TransferError, open_get


def test_environment_proxies_and_no_proxy_are_honoured(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://user:p%40ss@proxy.local:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.local:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,.internal")
    conns = Connections(timeout=5)
    tunnel = conns._new(Origin("https", "hf-mirror.com", 443))
    assert isinstance(tunnel.http, http.client.HTTPSConnection)
    assert (tunnel.http.host, tunnel.http.port) == ("proxy.local", 3128)
    assert tunnel.http._tunnel_host == "hf-mirror.com"
    assert tunnel.http._tunnel_headers["Proxy-Authorization"].startswith("Basic ")
    plain = conns._new(Origin("http", "cdn.example", 80))
    assert plain.absolute and plain.http.host == "proxy.local"
    direct = conns._new(Origin("http", "127.0.0.1", 8000))
    assert not direct.absolute and direct.http.host == "127.0.0.1"
    assert conns._new(Origin("https", "hub.internal", 443)).http.host == "hub.internal"


def test_unusable_urls_and_proxies_are_clear_errors(monkeypatch):
    with pytest.raises(TransferError, match="not an http"):
        Origin.of("ftp://example.com/x")
    monkeypatch.setenv("HTTPS_PROXY", "https://secure-proxy.local:443")
    with pytest.raises(TransferError, match="only http:// proxies"):
        open_get(Connections(timeout=5), "https://huggingface.co/x", {})
