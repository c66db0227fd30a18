import json
import os
import shutil

import pytest

from monitoring.nvml import SLOW_FIELDS, Nvml, attach_deployments, decode_clocks_event_reasons, owning_deployment
from tests.fakenvml import (FakeGpu, FakeNvml, NVMLError_DriverNotLoaded, NVMLError_GpuIsLost, NVMLError_Unknown,
                            NVMLError_LibraryNotFound, v100_on_x99)


def started(*gpus, **kwargs):
    fake = FakeNvml(list(gpus) or [FakeGpu()])
    nvml = Nvml(lib=fake, **kwargs)
    status = nvml.init()
    assert status.ok, status.message
    return fake, nvml


def test_no_driver_is_a_clear_answer_not_an_exception():
    for error, words in [(NVMLError_LibraryNotFound, "libnvidia-ml.so"),
                         (NVMLError_DriverNotLoaded, "driver is not loaded")]:
        status = Nvml(lib=FakeNvml(init_error=error)).init()
        assert status.ok is False
        assert "No NVIDIA GPU/driver found" in status.message
        assert words in status.message


def test_driver_without_gpus_says_so():
    status = Nvml(lib=FakeNvml([])).init()
    assert status.ok is False and status.gpu_count == 0
    assert "no usable GPU" in status.message
    assert status.driver_version == "580.159.04"


def test_static_info_and_versions():
    fake, nvml = started(FakeGpu(), v100_on_x99())
    assert nvml.status.gpu_count == 2
    assert nvml.status.cuda_driver_version == "13.0"
    v100 = nvml.gpu_info()[1]
    assert v100["name"] == "Tesla V100-PCIE-32GB"
    assert v100["compute_capability"] == "7.0"
    assert v100["pci_bus_id"] == "00000000:17:00.0"
    assert v100["pcie_width_max"] == 16 and v100["memory_total_bytes"] == 32 * 1024**3
    json.dumps(nvml.gpu_info())


def test_sample_is_plain_json_with_every_field():
    gpu = FakeGpu(gpu_util=87, mem_util=40, memory_used=10 * 1024**3, temperature=71, power_mw=512_345,
                  sm_clock=1980, clocks_event_bits=0x4, pstate=0, processes=[(4242, 8 * 1024**3)],
                  ecc_corrected=3, retired_dbe=[0x1000], remapped=(1, 0, 0, 0))
    fake, nvml = started(gpu)
    sample = nvml.sample(0)
    assert json.loads(json.dumps(sample)) == sample
    assert sample["gpu_util_pct"] == 87 and sample["mem_util_pct"] == 40
    assert sample["memory_used_bytes"] == 10 * 1024**3
    assert sample["temperature_c"] == 71
    assert sample["power_w"] == pytest.approx(512.345) and sample["power_limit_w"] == 700
    assert sample["energy_j"] == 1000
    assert sample["sm_clock_mhz"] == 1980 and sample["sm_clock_max_mhz"] == 1980
    assert sample["clocks_event_reasons"] == ["power cap"] and sample["slowed_down"] is True
    assert sample["performance_state"] == 0
    assert sample["processes"] == [{"pid": 4242, "used_memory_bytes": 8 * 1024**3}]
    assert sample["ecc_corrected_volatile"] == 3 and sample["retired_pages_dbe"] == 1
    assert sample["remapped_rows_correctable"] == 1 and sample["remapped_rows_failure"] is False
    assert sample["pcie_downgraded"] is False
    assert sample["unsupported"] == []


def test_throttle_reasons_in_words():
    assert decode_clocks_event_reasons(0x1) == ["idle"]
    assert decode_clocks_event_reasons(0x4 | 0x8 | 0x40) == ["power cap", "HW slowdown", "thermal (hardware)"]
    assert decode_clocks_event_reasons(0x20) == ["thermal (software)"]
    assert decode_clocks_event_reasons(0x10000) == ["other (0x10000)"]
    assert decode_clocks_event_reasons(None) is None


def test_not_supported_fields_read_none_are_listed_and_not_asked_again():
    fake, nvml = started(v100_on_x99(unsupported={"nvmlDeviceGetFanSpeed", "nvmlDeviceGetRemappedRows",
                                                   "nvmlDeviceGetTotalEnergyConsumption",
                                                   "nvmlDeviceGetCurrentClocksEventReasons"}), slow_interval_s=1)
    first = nvml.sample(0, now=100.0)
    assert first["fan_pct"] is None and first["energy_j"] is None
    assert first["remapped_rows_correctable"] is None and first["clocks_event_reasons"] is None
    assert first["slowed_down"] is None
    assert {"fan_pct", "remapped_rows", "energy_j", "clocks_event_reasons"} <= set(first["unsupported"])
    calls = fake.calls["nvmlDeviceGetTotalEnergyConsumption"] + fake.calls["nvmlDeviceGetFanSpeed"]
    nvml.sample(0, now=105.0)
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] + fake.calls["nvmlDeviceGetFanSpeed"] == calls
    assert nvml.error_counts == {}


def test_other_errors_are_counted_and_retried_never_raised():
    gpu = FakeGpu(failing={"nvmlDeviceGetTemperature": NVMLError_GpuIsLost})
    fake, nvml = started(gpu)
    assert nvml.sample(0)["temperature_c"] is None
    del gpu.failing["nvmlDeviceGetTemperature"]
    assert nvml.sample(0)["temperature_c"] == 31
    assert nvml.error_counts == {"temperature_c: NVMLError_GpuIsLost": 1}


def test_every_field_unsupported_still_samples():
    names = [n for n in dir(FakeNvml) if n.startswith("nvmlDeviceGet") and n not in (
        "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex")]
    fake = FakeNvml([FakeGpu(unsupported=set(names))])
    nvml = Nvml(lib=fake)
    assert nvml.init().ok
    sample = nvml.sample(0)
    json.dumps(sample)
    assert sample["gpu_util_pct"] is None and sample["pcie_downgraded"] is None
    assert sample["processes"] is None and sample["pcie_tx_bytes_per_s"] is None


def test_static_facts_are_read_once():
    fake, nvml = started(FakeGpu())
    for t in range(5):
        nvml.sample(0, now=float(t))
    assert fake.calls["nvmlDeviceGetName"] == 1
    assert fake.calls["nvmlDeviceGetMaxPcieLinkGeneration"] == 1
    assert fake.calls["nvmlDeviceGetMaxClockInfo"] == 2


def test_dear_calls_stay_off_the_per_second_path():
    # Measured on an H200: energy 4.3 ms, PCIe counters ~0.5 ms, link width 25-35 us
    # vs ~50 us for the rest of a sample.
    fake, nvml = started(FakeGpu(), slow_interval_s=5, energy_interval_s=60)
    for t in range(10):
        sample = nvml.sample(0, now=float(t))
    assert SLOW_FIELDS <= set(sample)
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1
    assert fake.calls["nvmlDeviceGetFieldValues"] == 2
    assert fake.calls["nvmlDeviceGetCurrPcieLinkWidth"] == 2
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 10


def test_energy_is_integrated_from_power_between_counter_reads():
    gpu = FakeGpu(energy_mj=5_000_000, power_mw=100_000)
    fake, nvml = started(gpu, energy_interval_s=60)
    assert nvml.sample(0, now=0.0)["energy_j"] == 5000
    gpu.power_mw = 300_000
    assert nvml.sample(0, now=2.0)["energy_j"] == 5000 + (100 + 300) / 2 * 2
    assert nvml.sample(0, now=3.0)["energy_j"] == 5400 + 300
    # The next counter read replaces the estimate, so drift never outlives an interval.
    gpu.energy_mj = 9_000_000
    assert nvml.sample(0, now=60.0)["energy_j"] == 9000
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 2


def test_a_failing_energy_counter_is_not_retried_every_second():
    gpu = FakeGpu(energy_mj=1_000_000, power_mw=100_000)
    gpu.failing["nvmlDeviceGetTotalEnergyConsumption"] = NVMLError_Unknown
    fake, nvml = started(gpu, energy_interval_s=60)
    for t in range(5):
        assert nvml.sample(0, now=float(t))["energy_j"] is None
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1
    del gpu.failing["nvmlDeviceGetTotalEnergyConsumption"]
    assert nvml.sample(0, now=60.0)["energy_j"] == 1000
    assert nvml.error_counts == {"energy_j: NVMLError_Unknown": 1}


def test_energy_integration_skips_a_missing_power_reading():
    gpu = FakeGpu(energy_mj=1_000_000, power_mw=200_000)
    fake, nvml = started(gpu, energy_interval_s=60)
    nvml.sample(0, now=0.0)
    gpu.failing["nvmlDeviceGetPowerUsage"] = NVMLError_Unknown
    assert nvml.sample(0, now=1.0)["energy_j"] == 1000  # no power: the figure holds
    del gpu.failing["nvmlDeviceGetPowerUsage"]
    assert nvml.sample(0, now=2.0)["energy_j"] == 1000 + 200 * 2


def test_slow_fields_refresh_on_their_interval():
    gpu = FakeGpu(ecc_corrected=0)
    fake, nvml = started(gpu, slow_interval_s=5)
    assert nvml.sample(0, now=0.0)["ecc_corrected_volatile"] == 0
    gpu.ecc_corrected = 7
    assert nvml.sample(0, now=1.0)["ecc_corrected_volatile"] == 0  # cached
    assert nvml.sample(0, now=5.0)["ecc_corrected_volatile"] == 7
    assert fake.calls["nvmlDeviceGetEnforcedPowerLimit"] == 2


def test_pcie_width_below_max_is_flagged_even_when_idle():
    fake, nvml = started(v100_on_x99(gpu_util=0))
    assert nvml.sample(0)["pcie_downgraded"] is True


def test_pcie_gen_drop_at_idle_is_power_saving_but_under_load_is_a_fault():
    gpu = FakeGpu(pcie_gen=1, pcie_gen_max=5, gpu_util=0)
    fake, nvml = started(gpu)
    assert nvml.sample(0)["pcie_downgraded"] is False
    gpu.gpu_util = 95
    assert nvml.sample(0)["pcie_downgraded"] is True
    gpu.pcie_gen = 5
    assert nvml.sample(0)["pcie_downgraded"] is False


def test_pcie_throughput_from_byte_counters():
    gpu = FakeGpu(pcie_tx_bytes=1_000, pcie_rx_bytes=0)
    fake, nvml = started(gpu, slow_interval_s=2)
    assert nvml.sample(0, now=10.0)["pcie_tx_bytes_per_s"] is None  # needs two readings
    gpu.pcie_tx_bytes += 4_000_000
    gpu.pcie_rx_bytes += 1_000_000
    assert nvml.sample(0, now=11.0)["pcie_tx_bytes_per_s"] is None  # not re-read between slow refreshes
    second = nvml.sample(0, now=12.0)
    assert second["pcie_tx_bytes_per_s"] == 2_000_000 and second["pcie_rx_bytes_per_s"] == 500_000
    assert fake.calls["nvmlDeviceGetFieldValues"] == 2
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0


def test_pcie_throughput_falls_back_to_the_slow_window_without_counters():
    fake, nvml = started(v100_on_x99(pcie_throughput_kb=2), slow_interval_s=1)
    assert nvml.sample(0, now=0.0)["pcie_tx_bytes_per_s"] == 2048
    nvml.sample(0, now=0.5)
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 2  # one tx+rx read per slow refresh
    assert nvml.sample(0, now=1.0)["pcie_rx_bytes_per_s"] == 2048
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 4
    assert fake.calls["nvmlDeviceGetFieldValues"] == 1  # counters found unsupported once, never asked again


def test_xid_events_come_out_as_dicts():
    fake, nvml = started(FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b"))
    watcher = nvml.xid_watcher()
    assert watcher.watched == [0, 1]
    assert watcher.poll(timeout_ms=10) == []
    fake.queue_xid(1, 79)
    fake.queue_xid(0, 13)
    events = watcher.poll(timeout_ms=10)
    assert [(e["gpu_index"], e["xid"]) for e in events] == [(1, 79), (0, 13)]
    assert "fallen off the bus" in events[0]["description"]
    json.dumps(events)
    watcher.close()


def test_xid_unsupported_gpu_is_listed_as_unwatched():
    fake, nvml = started(FakeGpu(supported_events=0x1), FakeGpu(uuid="GPU-b"))
    watcher = nvml.xid_watcher()
    assert watcher.watched == [1]
    assert "does not report Xid" in watcher.unwatched[0]


def test_xid_watcher_refuses_without_gpus():
    nvml = Nvml(lib=FakeNvml(init_error=NVMLError_LibraryNotFound))
    nvml.init()
    with pytest.raises(RuntimeError, match="libnvidia-ml.so"):
        nvml.xid_watcher()


def test_bad_slow_interval_is_refused():
    with pytest.raises(ValueError, match="slow_interval_s=0.01 is too short: use at least 0.25"):
        Nvml(lib=FakeNvml(), slow_interval_s=0.01)
    with pytest.raises(ValueError, match="energy_interval_s=0 is too short"):
        Nvml(lib=FakeNvml(), energy_interval_s=0)


def test_unknown_gpu_index_is_a_clear_error():
    fake, nvml = started(FakeGpu())
    with pytest.raises(ValueError, match="No GPU with index 3"):
        nvml.sample(3)


def _fake_proc(tmp_path, parents):
    for pid, ppid in parents.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "status").write_text(f"Name:\tx\nPid:\t{pid}\nPPid:\t{ppid}\n")
    return str(tmp_path)


def test_gpu_processes_map_to_the_deployment_that_spawned_them(tmp_path):
    # vLLM: API server 100 (the PID Kiln started) -> EngineCore 200 -> worker 300 holds the GPU.
    proc = _fake_proc(tmp_path, {300: 200, 200: 100, 100: 1, 555: 1})
    assert owning_deployment(300, {100: "dep-7"}, proc_root=proc) == "dep-7"
    assert owning_deployment(555, {100: "dep-7"}, proc_root=proc) is None
    assert owning_deployment(999, {100: "dep-7"}, proc_root=proc) is None  # gone / other namespace
    samples = [{"processes": [{"pid": 300, "used_memory_bytes": 1}, {"pid": 555, "used_memory_bytes": 2}]},
               {"processes": None}]
    attach_deployments(samples, {100: "dep-7"}, proc_root=proc)
    assert [p["deployment"] for p in samples[0]["processes"]] == ["dep-7", None]


def test_real_processes_on_this_machine():
    # This very process is a child of the pytest runner's parent shell.
    assert owning_deployment(os.getpid(), {os.getppid(): "parent"}) == "parent"


# ------------------------------------------------------------- real NVIDIA GPU

real_gpu = pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no NVIDIA GPU on this machine")


@real_gpu
def test_real_gpu_samples_without_errors():
    nvml = Nvml()
    status = nvml.init()
    assert status.ok, status.message
    for sample in nvml.sample_all():
        json.dumps(sample)
        assert sample["memory_total_bytes"] > 0
        assert sample["name"]
        assert 0 <= (sample["gpu_util_pct"] or 0) <= 100
    assert nvml.error_counts == {}
    watcher = nvml.xid_watcher()
    assert watcher.poll(timeout_ms=50) == []  # a healthy GPU: no Xid in 50 ms
    watcher.close()
    nvml.shutdown()


@real_gpu
def test_real_gpu_matches_nvidia_smi():
    import subprocess

    out = subprocess.run(["nvidia-smi", "--query-gpu=uuid,memory.total,pcie.link.width.max",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True).stdout
    nvml = Nvml()
    assert nvml.init().ok
    rows = [line.split(", ") for line in out.strip().splitlines()]
    for info, (uuid, mem_mib, width) in zip(nvml.gpu_info(), rows):
        assert info["uuid"] == uuid
        assert info["memory_total_bytes"] // (1024 * 1024) == int(mem_mib)
        assert info["pcie_width_max"] == int(width)
