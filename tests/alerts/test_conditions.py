"""GPU conditions through the fake NVML: Xid, slowdown lasting N s, PCIe downgrade, ECC, memory."""
import pytest

from monitoring.alerts.checks import GpuConditions
from monitoring.nvml import Nvml
from tests.fakenvml import FakeGpu, FakeNvml


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def rig():
    fake = FakeNvml([FakeGpu(uuid="GPU-h200"), FakeGpu(uuid="GPU-v100", name="Tesla V100-PCIE-32GB")])
    nvml = Nvml(lib=fake, slow_interval_s=0.25)
    assert nvml.init().ok
    watcher = nvml.xid_watcher()
    raised = []
    clock = Clock()
    cond = GpuConditions("gpu1", raise_fn=lambda kind, **f: raised.append((kind, f)), clock=clock,
                         slowdown_s=30, pcie_s=10, memory_pct=98, memory_s=60)

    def tick(dt=1.0):
        clock.t += dt
        cond.observe(nvml.sample_all(now=clock.t), watcher.poll(timeout_ms=0))
        out = list(raised)
        raised.clear()
        return out

    yield fake, tick
    watcher.close()


def kinds(out):
    return [(k, bool(f.get("resolved"))) for k, f in out]


def test_xid_event_through_nvml_event_set(rig):
    fake, tick = rig
    assert tick() == []
    fake.queue_xid(1, 79)
    out = tick()
    assert kinds(out) == [("gpu_xid", False)]
    assert "fallen off the bus" in out[0][1]["subject"] and out[0][1]["details"]["uuid"] == "GPU-v100"


def test_thermal_slowdown_only_after_it_lasts(rig):
    fake, tick = rig
    fake.gpus[0].clocks_event_bits = 0x40 | 0x1  # thermal (hardware)
    for _ in range(30):  # first seen, then 29 s later: not yet
        assert tick() == []
    out = tick()  # 30 s after it was first seen
    assert kinds(out) == [("gpu_slowdown", False)]
    assert "thermal (hardware)" in out[0][1]["subject"]
    assert tick() == []  # still open: no second message
    fake.gpus[0].clocks_event_bits = 0x1
    assert kinds(tick()) == [("gpu_slowdown", True)]


def test_power_cap_is_not_a_slowdown_alert(rig):
    fake, tick = rig
    fake.gpus[0].clocks_event_bits = 0x4
    assert all(tick() == [] for _ in range(40))


def test_short_slowdown_never_alerts(rig):
    fake, tick = rig
    fake.gpus[0].clocks_event_bits = 0x20
    for _ in range(10):
        tick()
    fake.gpus[0].clocks_event_bits = 0
    assert tick() == []


def test_pcie_link_trained_narrow(rig):
    fake, tick = rig
    fake.gpus[1].pcie_width = 8  # an x16 card trained at x8 (a V100 on an old board)
    out = []
    for _ in range(12):
        out += tick()
    assert kinds(out) == [("gpu_pcie_downgraded", False)]
    assert "x8" in out[0][1]["subject"] and "x16" in out[0][1]["subject"]


def test_ecc_uncorrectable_and_remap_pending(rig):
    fake, tick = rig
    fake.gpus[0].ecc_uncorrected = 2
    assert kinds(tick()) == [("gpu_ecc", False)]
    fake.gpus[0].ecc_uncorrected = 0
    fake.gpus[0].remapped = (0, 0, 1, 0)  # pending
    assert tick() == []  # the same incident
    fake.gpus[0].remapped = (0, 0, 0, 0)
    assert kinds(tick()) == [("gpu_ecc", True)]


def test_memory_nearly_full(rig):
    fake, tick = rig
    fake.gpus[0].memory_used = int(fake.gpus[0].memory_total * 0.99)
    out = []
    for _ in range(61):
        out += tick()
    assert kinds(out) == [("gpu_memory_full", False)]


def test_a_broken_raise_never_breaks_the_tick(rig):
    fake, _ = rig
    nvml = Nvml(lib=fake)
    nvml.init()

    def boom(*a, **k):
        raise RuntimeError("database away")

    cond = GpuConditions("h", raise_fn=boom, slowdown_s=0)
    fake.gpus[0].clocks_event_bits = 0x40
    cond.observe(nvml.sample_all(), [{"uuid": "x", "xid": 79, "gpu_index": 0, "description": "Xid 79"}])
