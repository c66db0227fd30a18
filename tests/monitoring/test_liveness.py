"""Which hosts are offline, and what that does to their deployments: shown unreachable
(never written as failed) on the pages and the API, skipped by the gateway.
The whole story with real hosts is tests/hosts/test_multihost.py (root only)."""
import json
import time

import pytest
import redis as redis_lib
from django.conf import settings
from django.test import Client

from inference.gateway import keys, routing
from inference.models import Deployment
from monitoring.liveness import KNOWN_HOSTS_KEY, MONITOR_HEARTBEAT_KEY, offline_hosts
from tests.helpers import free_port


@pytest.fixture
def r(redis_clean):
    client = redis_lib.Redis.from_url(settings.REDIS_URL)
    routing.forget()
    yield client
    routing.forget()


def seen(r, host, beating):
    r.hset(KNOWN_HOSTS_KEY, host, time.time())
    if beating:
        r.set(MONITOR_HEARTBEAT_KEY.format(host=host), json.dumps({"host": host, "time": time.time()}), ex=5)


def test_a_host_is_offline_once_seen_and_its_heartbeat_gone(r):
    seen(r, "gpu-a", beating=True)
    seen(r, "gpu-b", beating=False)
    assert offline_hosts() == {"gpu-b"}
    assert offline_hosts(["gpu-a", "never-seen"]) == set()  # a host without a monitor is not "offline"
    r.set(MONITOR_HEARTBEAT_KEY.format(host="gpu-b"), "{}", ex=5)
    assert offline_hosts() == set()


def test_no_answer_from_redis_is_not_taken_for_an_outage():
    dead = redis_lib.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5, socket_timeout=0.5)
    assert offline_hosts(["gpu-a"], client=dead) == set()


def dep(name, host, status="ready", bind_host="10.9.9.9", model="far-model"):
    return Deployment.objects.create(name=name, host=host, engine_name="llamacpp", status=status, port=8000,
                                     bind_host=bind_host, served_model_name=model, pid=4321)


def test_an_offline_hosts_active_deployments_are_shown_unreachable_not_failed(r, operator):
    seen(r, "gpu-b", beating=False)
    seen(r, "gpu-c", beating=True)
    ready = dep("on b", "gpu-b")
    stopped = dep("old one", "gpu-b", status="stopped")
    elsewhere = dep("on c", "gpu-c")
    c = Client()
    c.force_login(operator)

    d = c.get(f"/api/deployments/{ready.pk}").json()["deployment"]
    assert (d["status"], d["recorded_status"], d["host_online"], d["colour"]) == ("unreachable", "ready", False,
                                                                                  "amber")
    assert d["status_label"] == "Unreachable"
    rows = {x["id"]: x for x in c.get("/api/deployments/").json()["deployments"]}
    assert rows[ready.pk]["status"] == "unreachable"
    assert rows[stopped.pk]["status"] == "stopped"  # nothing runs there: nothing to be unreachable
    assert rows[elsewhere.pk]["status"] == "ready" and rows[elsewhere.pk]["host_online"] is True
    page = c.get(f"/deployments/{ready.pk}/").content.decode()
    assert 'data-status="unreachable"' in page and "The monitor on gpu-b has stopped reporting" in page
    assert 'data-status="unreachable"' in c.get("/deployments/").content.decode()
    assert ">Unreachable</span>" in c.get("/").content.decode()  # the overview's running deployments
    assert c.get("/api/status").json()["offline_hosts"] == ["gpu-b"]
    assert 'data-offline-host="gpu-b"' in c.get("/monitoring/").content.decode()
    ready.refresh_from_db()
    assert ready.status == "ready"  # shown, never written

    r.set(MONITOR_HEARTBEAT_KEY.format(host="gpu-b"), "{}", ex=5)  # the host is back
    d = c.get(f"/api/deployments/{ready.pk}").json()["deployment"]
    assert (d["status"], d["host_online"]) == ("ready", True)


def test_the_gateway_does_not_try_an_engine_on_an_offline_host(transactional_db, r, operator):
    _, secret = keys.key_create(user=operator, name="t", rate_limit=0)
    seen(r, "gpu-b", beating=False)
    dep("on b", "gpu-b")  # 10.9.9.9: a connection there would hang for the connect timeout
    started = time.monotonic()
    resp = Client().post("/v1/chat/completions", json.dumps({"model": "far-model", "messages": [
        {"role": "user", "content": "hi"}]}), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "deployment_unreachable", resp.content
    assert "stopped reporting" in resp.json()["error"]["message"]
    assert time.monotonic() - started < 3
    table = routing._read_table()
    assert table.ready == {} and table.statuses == {"far-model": ["unreachable"]}


def test_a_loopback_engine_on_a_silent_host_is_still_routed(transactional_db, r):
    # Its own machine: it answers or refuses at once, so a restarting monitor costs no request.
    seen(r, settings.HOST_NAME, beating=False)
    local = dep("local", settings.HOST_NAME, bind_host="127.0.0.1", model="near-model")
    table = routing._read_table()
    assert [u.deployment_id for u in table.ready["near-model"]] == [local.pk]
