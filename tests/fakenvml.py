"""A stand-in for the ``pynvml`` module, for tests and the CPU-only benchmark.

It mimics the function names, constants and exception classes of
nvidia-ml-py that monitoring/nvml.py uses. Each GPU is a ``FakeGpu`` whose
readings a test sets; names listed in ``FakeGpu.unsupported`` raise
NVMLError_NotSupported (as passive cards do for the fan, or pre-Ampere cards
for remapped rows), names in ``FakeGpu.failing`` raise the given error, and
Xid events queued with ``FakeNvml.queue_xid`` come out of nvmlEventSetWait_v2.

    fake = FakeNvml([FakeGpu(name="Tesla V100-SXM2-32GB")])
    nvml = Nvml(lib=fake)
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    value = 999

    def __init__(self, value=None):
        if value is not None:
            self.value = value
        super().__init__(self.value)

    def __str__(self):
        return f"{type(self).__name__} ({self.value})"


def _error(name, code):
    return type(name, (NVMLError,), {"value": code})


NVMLError_Uninitialized = _error("NVMLError_Uninitialized", 1)
NVMLError_NotSupported = _error("NVMLError_NotSupported", 3)
NVMLError_NoPermission = _error("NVMLError_NoPermission", 4)
NVMLError_DriverNotLoaded = _error("NVMLError_DriverNotLoaded", 9)
NVMLError_Timeout = _error("NVMLError_Timeout", 10)
NVMLError_LibraryNotFound = _error("NVMLError_LibraryNotFound", 12)
NVMLError_FunctionNotFound = _error("NVMLError_FunctionNotFound", 13)
NVMLError_GpuIsLost = _error("NVMLError_GpuIsLost", 15)
NVMLError_Unknown = _error("NVMLError_Unknown", 999)


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    bus_id: str = "00000000:17:00.0"
    compute_capability: tuple = (9, 0)
    memory_total: int = 143771 * 1024 * 1024
    memory_used: int = 512 * 1024 * 1024
    gpu_util: int = 0
    mem_util: int = 0
    temperature: int = 31
    power_mw: int = 75_000
    power_limit_mw: int = 700_000
    power_limit_max_mw: int = 700_000
    energy_mj: int = 1_000_000
    fan_pct: int = 30
    sm_clock: int = 345
    sm_clock_max: int = 1980
    mem_clock: int = 3201
    mem_clock_max: int = 3201
    clocks_event_bits: int = 0x1
    pcie_gen: int = 5
    pcie_gen_max: int = 5
    pcie_width: int = 16
    pcie_width_max: int = 16
    pcie_tx_bytes: int = 0
    pcie_rx_bytes: int = 0
    pcie_throughput_kb: int = 100
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    retired_sbe: list = field(default_factory=list)
    retired_dbe: list = field(default_factory=list)
    retired_pending: int = 0
    remapped: tuple = (0, 0, 0, 0)
    pstate: int = 0
    processes: list = field(default_factory=list)  # [(pid, used_bytes)]
    supported_events: int = 0x8 | 0x2 | 0x1
    # Function names (e.g. "nvmlDeviceGetFanSpeed") that raise NotSupported;
    # "field:197" makes that nvmlDeviceGetFieldValues id report NotSupported.
    unsupported: set = field(default_factory=set)
    failing: dict = field(default_factory=dict)  # function name -> exception class


class FakeNvml:
    """Module-like object: pass it as ``Nvml(lib=...)``."""

    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_Unknown = NVMLError_Unknown

    NVML_SUCCESS = 0
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_VOLATILE_ECC = 0
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    nvmlEventTypeSingleBitEccError = 0x1
    nvmlEventTypeDoubleBitEccError = 0x2
    nvmlEventTypeXidCriticalError = 0x8

    def __init__(self, gpus=None, *, init_error=None, driver="580.159.04", cuda=13000):
        self.gpus = list(gpus if gpus is not None else [FakeGpu()])
        self.init_error = init_error
        self.driver = driver
        self.cuda = cuda
        self.calls = collections.Counter()
        self.events = collections.deque()
        self.registered = []  # (gpu, event types)
        self.initialised = False

    # -- helpers for tests
    def queue_xid(self, gpu_index, xid):
        self.events.append(SimpleNamespace(device=self.gpus[gpu_index], eventType=self.nvmlEventTypeXidCriticalError,
                                           eventData=xid, gpuInstanceId=0, computeInstanceId=0))

    def _enter(self, name, gpu=None):
        self.calls[name] += 1
        if not self.initialised and name != "nvmlInit":
            raise NVMLError_Uninitialized()
        if gpu is not None:
            if name in gpu.unsupported:
                raise NVMLError_NotSupported()
            if name in gpu.failing:
                raise gpu.failing[name]()

    # -- system
    def nvmlInit(self):
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise self.init_error()
        self.initialised = True

    def nvmlShutdown(self):
        self._enter("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self):
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self):
        self._enter("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda

    def nvmlDeviceGetCount(self):
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._enter("nvmlDeviceGetHandleByIndex")
        return self.gpus[index]

    # -- static
    def nvmlDeviceGetName(self, g):
        self._enter("nvmlDeviceGetName", g)
        return g.name

    def nvmlDeviceGetUUID(self, g):
        self._enter("nvmlDeviceGetUUID", g)
        return g.uuid

    def nvmlDeviceGetPciInfo(self, g):
        self._enter("nvmlDeviceGetPciInfo", g)
        return SimpleNamespace(busId=g.bus_id.encode())

    def nvmlDeviceGetCudaComputeCapability(self, g):
        self._enter("nvmlDeviceGetCudaComputeCapability", g)
        return g.compute_capability

    def nvmlDeviceGetMaxClockInfo(self, g, kind):
        self._enter("nvmlDeviceGetMaxClockInfo", g)
        return g.sm_clock_max if kind == self.NVML_CLOCK_SM else g.mem_clock_max

    def nvmlDeviceGetMaxPcieLinkGeneration(self, g):
        self._enter("nvmlDeviceGetMaxPcieLinkGeneration", g)
        return g.pcie_gen_max

    def nvmlDeviceGetMaxPcieLinkWidth(self, g):
        self._enter("nvmlDeviceGetMaxPcieLinkWidth", g)
        return g.pcie_width_max

    def nvmlDeviceGetPowerManagementLimitConstraints(self, g):
        self._enter("nvmlDeviceGetPowerManagementLimitConstraints", g)
        return (100_000, g.power_limit_max_mw)

    # -- live
    def nvmlDeviceGetUtilizationRates(self, g):
        self._enter("nvmlDeviceGetUtilizationRates", g)
        return SimpleNamespace(gpu=g.gpu_util, memory=g.mem_util)

    def nvmlDeviceGetMemoryInfo(self, g):
        self._enter("nvmlDeviceGetMemoryInfo", g)
        return SimpleNamespace(total=g.memory_total, used=g.memory_used, free=g.memory_total - g.memory_used)

    def nvmlDeviceGetTemperature(self, g, sensor):
        self._enter("nvmlDeviceGetTemperature", g)
        return g.temperature

    def nvmlDeviceGetPowerUsage(self, g):
        self._enter("nvmlDeviceGetPowerUsage", g)
        return g.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, g):
        self._enter("nvmlDeviceGetEnforcedPowerLimit", g)
        return g.power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, g):
        self._enter("nvmlDeviceGetTotalEnergyConsumption", g)
        return g.energy_mj

    def nvmlDeviceGetFanSpeed(self, g):
        self._enter("nvmlDeviceGetFanSpeed", g)
        return g.fan_pct

    def nvmlDeviceGetClockInfo(self, g, kind):
        self._enter("nvmlDeviceGetClockInfo", g)
        return g.sm_clock if kind == self.NVML_CLOCK_SM else g.mem_clock

    def nvmlDeviceGetCurrentClocksEventReasons(self, g):
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", g)
        return g.clocks_event_bits

    def nvmlDeviceGetCurrPcieLinkGeneration(self, g):
        self._enter("nvmlDeviceGetCurrPcieLinkGeneration", g)
        return g.pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, g):
        self._enter("nvmlDeviceGetCurrPcieLinkWidth", g)
        return g.pcie_width

    def nvmlDeviceGetFieldValues(self, g, field_ids):
        self._enter("nvmlDeviceGetFieldValues", g)
        out = []
        for fid in field_ids:
            value = {197: g.pcie_tx_bytes, 198: g.pcie_rx_bytes}.get(fid, 0)
            ret = self.NVML_ERROR_NOT_SUPPORTED if f"field:{fid}" in g.unsupported else self.NVML_SUCCESS
            out.append(SimpleNamespace(fieldId=fid, nvmlReturn=ret, value=SimpleNamespace(ullVal=value)))
        return out

    def nvmlDeviceGetPcieThroughput(self, g, counter):
        self._enter("nvmlDeviceGetPcieThroughput", g)
        return g.pcie_throughput_kb

    def nvmlDeviceGetTotalEccErrors(self, g, kind, counter):
        self._enter("nvmlDeviceGetTotalEccErrors", g)
        return g.ecc_corrected if kind == self.NVML_MEMORY_ERROR_TYPE_CORRECTED else g.ecc_uncorrected

    def nvmlDeviceGetRetiredPages(self, g, cause):
        self._enter("nvmlDeviceGetRetiredPages", g)
        return list(g.retired_sbe if cause == 0 else g.retired_dbe)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, g):
        self._enter("nvmlDeviceGetRetiredPagesPendingStatus", g)
        return g.retired_pending

    def nvmlDeviceGetRemappedRows(self, g):
        self._enter("nvmlDeviceGetRemappedRows", g)
        return tuple(g.remapped)

    def nvmlDeviceGetPerformanceState(self, g):
        self._enter("nvmlDeviceGetPerformanceState", g)
        return g.pstate

    def nvmlDeviceGetComputeRunningProcesses(self, g):
        self._enter("nvmlDeviceGetComputeRunningProcesses", g)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in g.processes]

    # -- events
    def nvmlEventSetCreate(self):
        self._enter("nvmlEventSetCreate")
        return object()

    def nvmlDeviceGetSupportedEventTypes(self, g):
        self._enter("nvmlDeviceGetSupportedEventTypes", g)
        return g.supported_events

    def nvmlDeviceRegisterEvents(self, g, types, event_set):
        self._enter("nvmlDeviceRegisterEvents", g)
        self.registered.append((g, types))

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        self._enter("nvmlEventSetWait_v2")
        if not self.events:
            # The real call blocks up to timeout_ms; tests need no real wait.
            raise NVMLError_Timeout()
        return self.events.popleft()

    def nvmlEventSetFree(self, event_set):
        self._enter("nvmlEventSetFree")


def v100_on_x99(**overrides) -> FakeGpu:
    """A passive V100 whose link trained at x8 on an old board: the real fault."""
    values = dict(name="Tesla V100-PCIE-32GB", uuid="GPU-v100-0", compute_capability=(7, 0),
                  memory_total=32 * 1024**3, sm_clock_max=1380, mem_clock_max=877,
                  pcie_gen=3, pcie_gen_max=3, pcie_width=8, pcie_width_max=16,
                  power_limit_mw=250_000, power_limit_max_mw=250_000,
                  unsupported={"nvmlDeviceGetFanSpeed", "nvmlDeviceGetRemappedRows", "field:197", "field:198"})
    values.update(overrides)
    return FakeGpu(**values)


# --------------------------------------------------------------------------
# Factories for the `monitor` command run as a process (tests, bench): the
# command loads one through KILN_NVML_LIB="tests.fakenvml:two_gpus"; nothing
# outside tests/ imports this module.


class LiveFakeNvml(FakeNvml):
    """Readings that move with time, so live charts have something to draw."""

    def nvmlDeviceGetUtilizationRates(self, g):
        import math
        import time

        t = time.time()
        phase = self.gpus.index(g)
        g.gpu_util = int(50 + 45 * math.sin(t / 7 + phase))
        g.mem_util = int(30 + 20 * math.sin(t / 5 + phase))
        g.temperature = 40 + g.gpu_util // 3
        g.power_mw = int(g.power_limit_mw * (0.2 + 0.7 * g.gpu_util / 100))
        g.memory_used = int(g.memory_total * (0.3 + 0.2 * math.sin(t / 11 + phase)))
        return super().nvmlDeviceGetUtilizationRates(g)


def two_gpus():
    """An H200 and a passive V100 whose link trained at x8 (fan, remapped rows: NotSupported)."""
    return LiveFakeNvml([FakeGpu(uuid="GPU-fake-h200-0", processes=[(4242, 20 * 1024**3)]),
                         v100_on_x99(uuid="GPU-fake-v100-1")])


def one_v100():
    """A single passive V100 (another GPU host than two_gpus' in the multi-host test)."""
    return LiveFakeNvml([v100_on_x99(uuid="GPU-fake-v100-c0", bus_id="00000000:3b:00.0")])


def eight_gpus():
    return LiveFakeNvml([FakeGpu(uuid=f"GPU-fake-{i}", processes=[(1000 + i, 1 << 30)]) for i in range(8)])


def no_driver():
    return FakeNvml(init_error=NVMLError_DriverNotLoaded)


class ControlledFakeNvml(FakeNvml):
    """A fake whose readings a test changes from outside the `monitor` process:
    the JSON file named by KILN_FAKE_NVML_CONTROL holds
    {"gpus": {"0": {"clocks_event_bits": 64, "pcie_width": 8, ...}}, "xids": [[gpu_index, xid], ...]}.
    Attribute overrides are applied on each read; each Xid in the list is
    delivered once through nvmlEventSetWait_v2 (new entries are appended)."""

    def __init__(self, gpus, control_path):
        super().__init__(gpus)
        self.control_path = control_path
        self.xids_delivered = 0
        self._mtime = None

    def _apply(self):
        import json
        import os

        try:
            mtime = os.stat(self.control_path).st_mtime_ns
        except FileNotFoundError:
            return
        if mtime == self._mtime:
            return
        try:
            with open(self.control_path, encoding="utf-8") as f:
                control = json.load(f)
        except ValueError:
            return  # being written: read it next time
        self._mtime = mtime
        for index, fields in (control.get("gpus") or {}).items():
            for name, value in fields.items():
                setattr(self.gpus[int(index)], name, tuple(value) if name == "remapped" else value)
        for gpu_index, xid in (control.get("xids") or [])[self.xids_delivered:]:
            self.queue_xid(int(gpu_index), int(xid))
            self.xids_delivered += 1

    def nvmlDeviceGetUtilizationRates(self, g):
        self._apply()
        return super().nvmlDeviceGetUtilizationRates(g)

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        self._apply()
        return super().nvmlEventSetWait_v2(event_set, timeout_ms)


def controlled():
    """Two GPUs (an H200 and a V100 at full link width) steered by KILN_FAKE_NVML_CONTROL."""
    import os

    return ControlledFakeNvml([FakeGpu(uuid="GPU-ctl-h200-0"),
                               v100_on_x99(uuid="GPU-ctl-v100-1", pcie_width=16)],
                              os.environ["KILN_FAKE_NVML_CONTROL"])
