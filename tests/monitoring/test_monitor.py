"""The monitor loop end to end, in process: fake NVML, real Redis channel layer,
real websocket consumers, real database writes on the monitor's own thread."""
import subprocess
import sys

import redis as redis_lib
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from dashboard.asgi import application
from dashboard.services import MONITOR_HEARTBEAT_KEY
from monitoring.models import EngineSample, Gpu, GpuSample, Tier, XidEvent
from monitoring.nvml import Nvml
from monitoring.sampler import Monitor
from monitoring.targets import engine_targets
from tests.helpers import REPO, child_env, free_port, stop_group, wait_until
from tests.fakenvml import FakeGpu, FakeNvml, NVMLError_LibraryNotFound, v100_on_x99

ORIGIN = (b"origin", b"http://localhost")


def session_cookie(user):
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def fake_nvml(gpus=None, **kwargs):
    fake = FakeNvml(gpus if gpus is not None else [FakeGpu(uuid="GPU-a", gpu_util=80),
                                                    v100_on_x99(uuid="GPU-b", gpu_util=90)], **kwargs)
    nvml = Nvml(lib=fake)
    nvml.init()
    return fake, nvml


def run_monitor(nvml, *, count=3, interval=0.25, targets=(), clients=(), record_history=True):
    """Run the monitor for `count` ticks while websocket clients listen; returns
    (messages each client received of type 'monitor', the monitor)."""
    cookies = list(clients)

    async def scenario():
        comms = []
        for cookie in cookies:
            comm = WebsocketCommunicator(application, "/ws/live/", headers=[ORIGIN, (b"host", b"localhost"),
                                                                              (b"cookie", cookie)])
            connected, _ = await comm.connect()
            assert connected
            comms.append(comm)
        monitor = Monitor(nvml=nvml, host=settings.HOST_NAME, interval=interval, layer=get_channel_layer(),
                          targets=list(targets), flush_interval=0.5, record_history=record_history)
        await monitor.run(count=count)
        received = []
        for comm in comms:
            got = []
            # Read exactly what was published (a receive timeout would cancel the consumer).
            while len(got) < monitor.seq:
                msg = await comm.receive_json_from(timeout=5)
                if msg["type"] == "monitor":
                    got.append(msg)
            received.append(got)
            await comm.disconnect()
        return received, monitor

    return async_to_sync(scenario)()


def test_several_clients_receive_the_same_samples(transactional_db, redis_clean, operator, viewer):
    _, nvml = fake_nvml()
    received, monitor = run_monitor(nvml, count=3, clients=[session_cookie(operator), session_cookie(viewer),
                                                            session_cookie(operator)])
    assert monitor.seq == 3
    assert [[m["seq"] for m in got] for got in received] == [[1, 2, 3]] * 3
    assert received[0] == received[1] == received[2]
    first = received[0][0]
    assert first["nvml"]["ok"] is True
    assert [g["name"] for g in first["gpus"]] == ["NVIDIA H200", "Tesla V100-PCIE-32GB"]
    assert first["gpus"][0]["gpu_util_pct"] == 80


def test_not_supported_fields_arrive_as_none_and_the_downgraded_link_is_flagged(transactional_db, redis_clean,
                                                                                operator):
    _, nvml = fake_nvml()
    received, _ = run_monitor(nvml, count=1, clients=[session_cookie(operator)])
    v100 = received[0][0]["gpus"][1]
    assert v100["fan_pct"] is None and v100["remapped_rows_correctable"] is None
    assert "fan_pct" in v100["unsupported"]
    assert v100["pcie_downgraded"] is True  # x8 in an x16 slot


def test_gpus_are_recorded_at_start_for_other_features(transactional_db, redis_clean):
    _, nvml = fake_nvml()
    run_monitor(nvml, count=1)
    gpus = list(Gpu.objects.filter(host=settings.HOST_NAME).order_by("index"))
    assert [(g.index, g.uuid, g.compute_capability) for g in gpus] == [(0, "GPU-a", "9.0"), (1, "GPU-b", "7.0")]
    assert gpus[1].memory_total_bytes == 32 * 1024**3 and gpus[1].pcie_width_max == 16
    assert gpus[0].driver_version == "580.159.04" and gpus[0].cuda_driver_version == "13.0"


def test_xid_event_is_published_recorded_and_shown(transactional_db, redis_clean, operator):
    fake, nvml = fake_nvml()
    fake.queue_xid(1, 79)
    received, _ = run_monitor(nvml, count=2, clients=[session_cookie(operator)])
    xids = [x for m in received[0] for x in m["xids"]]
    assert [(x["gpu_index"], x["xid"]) for x in xids] == [(1, 79)]
    row = XidEvent.objects.get()
    assert (row.host, row.gpu_index, row.xid, row.gpu.uuid) == (settings.HOST_NAME, 1, 79, "GPU-b")
    assert "fallen off the bus" in row.description

    client = Client()
    client.force_login(operator)
    page = client.get("/monitoring/").content.decode()
    assert "Xid 79: GPU has fallen off the bus" in page


def test_history_rows_are_written_in_batches_with_downsampled_tiers(transactional_db, redis_clean):
    _, nvml = fake_nvml()
    run_monitor(nvml, count=4)
    raw = GpuSample.objects.filter(tier=Tier.RAW)
    assert raw.count() == 8  # 2 GPUs x 4 ticks
    # The unfinished 10 s and 1 min buckets are written when the monitor stops.
    assert GpuSample.objects.filter(tier=Tier.TEN_SECONDS).count() >= 2
    assert GpuSample.objects.filter(tier=Tier.ONE_MINUTE).count() >= 2
    assert {round(v) for v in GpuSample.objects.filter(tier=Tier.ONE_MINUTE).values_list("gpu_util_pct", flat=True)} \
        == {80, 90}


def test_unreachable_engine_is_a_message_not_a_crash(transactional_db, redis_clean, operator):
    _, nvml = fake_nvml([FakeGpu()])
    port = free_port()  # nothing listens there
    target = {"deployment_id": 7, "name": "ghost", "engine": "vllm", "metrics_url": f"http://127.0.0.1:{port}/metrics",
              "pid": None}
    received, _ = run_monitor(nvml, count=2, targets=[target], clients=[session_cookie(operator)])
    engine = received[0][-1]["engines"][0]
    assert engine["deployment_id"] == 7 and engine["generation_tokens_per_s"] is None
    assert "cannot read" in engine["problem"]
    assert EngineSample.objects.count() == 0  # no rows of nothing


def test_engine_targets_are_this_hosts_ready_deployments(db):
    from django.conf import settings

    from inference.models import Deployment

    ready = Deployment.objects.create(name="gemma", host=settings.HOST_NAME, engine_name="llamacpp",
                                      status="ready", port=8123, pid=4242, bind_host="0.0.0.0")
    Deployment.objects.create(name="loading", host=settings.HOST_NAME, engine_name="vllm", status="starting", port=8124)
    Deployment.objects.create(name="elsewhere", host="other-host", engine_name="vllm", status="ready", port=8125)
    assert engine_targets() == [{"deployment_id": ready.pk, "name": "gemma", "engine": "llamacpp",
                                 "metrics_url": "http://127.0.0.1:8123/metrics", "pid": 4242, "api_key": ""}]


def test_no_gpu_state_is_published_and_shown_with_the_reason(transactional_db, redis_clean, operator, tmp_path):
    """The real command as a process, on a machine without the driver (fake NVML that cannot load)."""
    log = tmp_path / "monitor.log"
    process = subprocess.Popen(
        [sys.executable, "manage.py", "monitor", "--interval", "0.25"], cwd=REPO,
        env=child_env(KILN_NVML_LIB="tests.fakenvml:no_driver"), stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        client = redis_lib.Redis.from_url(settings.REDIS_URL)
        key = MONITOR_HEARTBEAT_KEY.format(host=settings.HOST_NAME)
        wait_until(lambda: client.get(key) or process.poll() is not None, 60, "monitor heartbeat")
        assert process.poll() is None, log.read_text()
        web = Client()
        web.force_login(operator)
        page = web.get("/monitoring/").content.decode()
        assert "No NVIDIA GPU/driver found" in page
        assert "kernel driver is not loaded" in page
        assert 'id="no-gpu" hidden' not in page
    finally:
        stop_group(process)
    assert process.returncode == 0, log.read_text()
    assert "kernel driver is not loaded" in log.read_text()


def test_interval_below_a_quarter_second_is_refused():
    result = subprocess.run([sys.executable, "manage.py", "monitor", "--interval", "0.1"], cwd=REPO,
                            env=child_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "out of range: use 0.25 to 60 seconds" in result.stderr


def test_library_not_found_reason(db):
    nvml = Nvml(lib=FakeNvml(init_error=NVMLError_LibraryNotFound))
    status = nvml.init()
    assert status.ok is False and "No NVIDIA GPU/driver found" in status.message


def test_redis_away_does_not_stop_sampling_or_history(transactional_db):
    from channels_redis.core import RedisChannelLayer

    _, nvml = fake_nvml()
    dead = RedisChannelLayer(hosts=[f"redis://127.0.0.1:{free_port()}/0"])

    async def scenario():
        monitor = Monitor(nvml=nvml, host=settings.HOST_NAME, interval=0.25, layer=dead, flush_interval=0.5)
        await monitor.run(count=3)
        return monitor

    monitor = async_to_sync(scenario)()
    assert monitor.seq == 3 and monitor.publish_failing == 3
    assert GpuSample.objects.filter(tier=Tier.RAW).count() == 6
