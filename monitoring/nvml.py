"""NVIDIA GPU readings through NVML.

This is the only module in Kiln that imports ``pynvml`` (package
``nvidia-ml-py``). Everything else gets plain dicts from here.

Rules this module keeps:

* Any field may be unsupported on some card or driver (fan speed on passive
  V100s, remapped rows before Ampere, PCIe byte counters before Hopper...).
  Such a field reads ``None`` (the UI shows "n/a"), its name is listed under
  ``unsupported``, and it is never asked for again: NotSupported does not
  change while the driver is loaded. Any other NVML error also gives ``None``
  for that sample and is counted, never raised.
* A sample must stay cheap (DESIGN.md: ~77 us for 9 calls on an H200, against
  ~23 ms for one ``nvidia-smi``). Static facts (name, max clocks, max PCIe
  link) are read once; error counters, limits, PCIe width and throughput
  (rare changes or dear calls: see SLOW_FIELDS) are re-read every
  ``slow_interval_s`` and reused in between. The energy counter costs ~4.3 ms
  of CPU per read on an H200 (the driver spins), so it is read every
  ``energy_interval_s`` and integrated from the power readings in between.
* Tests inject a fake module: ``Nvml(lib=fake_pynvml)``.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

# Clocks-event ("throttle") reason bits, from nvml.h. Kept here rather than
# read from pynvml so that decoding works the same with any pynvml version.
CLOCKS_EVENT_REASONS = [
    (0x0000000000000001, "idle"),
    (0x0000000000000002, "application clocks"),
    (0x0000000000000004, "power cap"),
    (0x0000000000000008, "HW slowdown"),
    (0x0000000000000010, "sync boost"),
    (0x0000000000000020, "thermal (software)"),
    (0x0000000000000040, "thermal (hardware)"),
    (0x0000000000000080, "power brake"),
    (0x0000000000000100, "display clocks"),
]
# Reasons that mean the GPU is running slower than it should for the work it
# has: the UI colours these. Idle, app-clock and sync-boost are normal.
SLOWDOWN_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80

# A few Xid codes worth a human sentence; the rest show their number.
XID_MEANINGS = {
    13: "graphics engine exception (often an application bug)",
    31: "GPU memory page fault (often an application bug)",
    43: "GPU stopped processing",
    45: "preemptive cleanup after a previous error",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    68: "video processor exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}

# Under this GPU utilization a lower PCIe generation is treated as power
# saving, not as a fault (see _pcie_downgraded).
PCIE_LOAD_UTIL_PCT = 50

# nvmlDeviceGetFieldValues ids for the cumulative PCIe byte counters (nvml.h).
FI_PCIE_COUNT_TX_BYTES = 197
FI_PCIE_COUNT_RX_BYTES = 198

MIN_SLOW_INTERVAL_S = 0.25


def decode_clocks_event_reasons(bits: int | None) -> list[str] | None:
    """Turn a clocks-event bitmask into words, e.g. 0x44 -> ['power cap', 'thermal (hardware)']."""
    if bits is None:
        return None
    words = [word for bit, word in CLOCKS_EVENT_REASONS if bits & bit]
    known = 0
    for bit, _ in CLOCKS_EVENT_REASONS:
        known |= bit
    if bits & ~known:
        words.append(f"other (0x{bits & ~known:x})")
    return words


def describe_xid(xid: int) -> str:
    meaning = XID_MEANINGS.get(xid)
    return f"Xid {xid}: {meaning}" if meaning else f"Xid {xid}"


def _text(value: Any) -> str:
    """pynvml returns bytes in old releases and str in new ones."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


@dataclass
class NvmlStatus:
    """What ``Nvml.init()`` found. ``ok`` False is a normal answer, not an error."""

    ok: bool
    message: str
    gpu_count: int = 0
    driver_version: str | None = None
    cuda_driver_version: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class GpuInfo:
    """Facts about one GPU that do not change while the driver is loaded."""

    index: int
    name: str | None
    uuid: str | None
    pci_bus_id: str | None
    compute_capability: str | None  # "7.0" for V100
    memory_total_bytes: int | None
    sm_clock_max_mhz: int | None
    mem_clock_max_mhz: int | None
    pcie_gen_max: int | None  # highest generation this GPU *and* board allow
    pcie_width_max: int | None
    power_limit_max_w: float | None
    unsupported: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


class _GpuState:
    """Per-GPU bookkeeping between samples."""

    def __init__(self, index: int, handle: Any):
        self.index = index
        self.handle = handle
        self.unsupported: set[str] = set()
        self.slow: dict[str, Any] = {}
        self.slow_read_at: float | None = None
        self.pcie_counters: tuple[float, int, int] | None = None  # (time, tx, rx)
        self.energy_j: float | None = None       # counter reading + power integrated since
        self.energy_read_at: float | None = None
        self.last_power: tuple[float, float] | None = None  # (time, watts)
        self.info: GpuInfo | None = None


# Fields refreshed only every slow_interval_s: limits, error counters and link
# width change rarely, and PCIe throughput is a dear call (measured on an H200:
# PCIe byte counters ~0.5 ms, link width 25-35 us, against ~50 us for the rest).
SLOW_FIELDS = frozenset((
    "pcie_width",
    "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s",
    "power_limit_w",
    "fan_pct",
    "ecc_corrected_volatile",
    "ecc_uncorrected_volatile",
    "retired_pages_sbe",
    "retired_pages_dbe",
    "retired_pages_pending",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
    "remapped_rows_failure",
))


class Nvml:
    """One NVML session for the GPUs of this host.

    >>> nvml = Nvml()
    >>> status = nvml.init()
    >>> if status.ok:
    ...     samples = nvml.sample_all()
    """

    def __init__(self, lib: Any = None, *, slow_interval_s: float = 10.0,
                 energy_interval_s: float = 120.0, clock: Callable[[], float] = time.monotonic):
        for name, value in (("slow_interval_s", slow_interval_s), ("energy_interval_s", energy_interval_s)):
            if value < MIN_SLOW_INTERVAL_S:
                raise ValueError(f"{name}={value} is too short: use at least {MIN_SLOW_INTERVAL_S} s")
        self._lib = lib
        self.slow_interval_s = slow_interval_s
        self.energy_interval_s = energy_interval_s
        self._clock = clock
        self.status = NvmlStatus(ok=False, message="NVML not initialised yet: call init()")
        self._gpus: list[_GpuState] = []
        # Errors other than NotSupported, per field name: shown on a health page.
        self.error_counts: dict[str, int] = {}
        self._initialised = False

    # ---------------------------------------------------------------- start-up

    def init(self) -> NvmlStatus:
        """Load NVML and read static facts. Never raises for a missing GPU or driver."""
        if self._lib is None:
            try:
                import pynvml  # the only import of pynvml in Kiln
            except ImportError:
                self.status = NvmlStatus(
                    ok=False,
                    message="No NVIDIA GPU monitoring: the Python package nvidia-ml-py is not installed.")
                return self.status
            self._lib = pynvml
        lib = self._lib
        try:
            lib.nvmlInit()
        except lib.NVMLError as exc:
            self.status = NvmlStatus(ok=False, message=self._init_failure_message(exc))
            return self.status
        self._initialised = True

        try:
            count = lib.nvmlDeviceGetCount()
        except lib.NVMLError as exc:
            self.status = NvmlStatus(ok=False, message=f"No NVIDIA GPU found: NVML could not count GPUs ({exc}).")
            return self.status

        driver = self._static(lambda: _text(lib.nvmlSystemGetDriverVersion()))
        cuda = self._static(lambda: self._cuda_version(lib))
        self._gpus = []
        for index in range(count):
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(index)
            except lib.NVMLError as exc:
                self._count_error("handle", exc)
                continue
            state = _GpuState(index, handle)
            state.info = self._read_info(state)
            self._gpus.append(state)

        if not self._gpus:
            message = "No NVIDIA GPU found: the driver is loaded but reports no usable GPU."
            self.status = NvmlStatus(ok=False, message=message, gpu_count=0,
                                     driver_version=driver, cuda_driver_version=cuda)
        else:
            names = ", ".join(sorted({g.info.name or "unknown GPU" for g in self._gpus}))
            self.status = NvmlStatus(ok=True, message=f"{len(self._gpus)} NVIDIA GPU(s): {names}",
                                     gpu_count=len(self._gpus), driver_version=driver,
                                     cuda_driver_version=cuda)
        return self.status

    def _init_failure_message(self, exc: Exception) -> str:
        lib = self._lib
        if isinstance(exc, getattr(lib, "NVMLError_LibraryNotFound", ())):
            return ("No NVIDIA GPU/driver found: libnvidia-ml.so could not be loaded. "
                    "Install the NVIDIA driver on this host to see GPU readings.")
        if isinstance(exc, getattr(lib, "NVMLError_DriverNotLoaded", ())):
            return ("No NVIDIA GPU/driver found: the NVIDIA kernel driver is not loaded "
                    "(check `nvidia-smi`; a reboot after a driver update is often needed).")
        if isinstance(exc, getattr(lib, "NVMLError_NoPermission", ())):
            return "NVIDIA driver found, but this user may not read it (NVML: insufficient permissions)."
        return f"No NVIDIA GPU/driver found: NVML failed to start ({exc})."

    @staticmethod
    def _cuda_version(lib: Any) -> str:
        # 12080 -> "12.8"
        fn = getattr(lib, "nvmlSystemGetCudaDriverVersion_v2", None) or lib.nvmlSystemGetCudaDriverVersion
        version = int(fn())
        return f"{version // 1000}.{(version % 1000) // 10}"

    def _static(self, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except self._lib.NVMLError as exc:
            self._count_error("static", exc)
            return None

    def _read_info(self, gpu: _GpuState) -> GpuInfo:
        lib, h = self._lib, gpu.handle

        def cc():
            major, minor = lib.nvmlDeviceGetCudaComputeCapability(h)
            return f"{major}.{minor}"

        limit_max = self._read(gpu, "power_limit_max_w",
                               lambda: lib.nvmlDeviceGetPowerManagementLimitConstraints(h)[1] / 1000.0)
        info = GpuInfo(
            index=gpu.index,
            name=self._read(gpu, "name", lambda: _text(lib.nvmlDeviceGetName(h))),
            uuid=self._read(gpu, "uuid", lambda: _text(lib.nvmlDeviceGetUUID(h))),
            pci_bus_id=self._read(gpu, "pci_bus_id", lambda: _text(lib.nvmlDeviceGetPciInfo(h).busId)),
            compute_capability=self._read(gpu, "compute_capability", cc),
            memory_total_bytes=self._read(gpu, "memory_total_bytes",
                                          lambda: int(lib.nvmlDeviceGetMemoryInfo(h).total)),
            sm_clock_max_mhz=self._read(gpu, "sm_clock_max_mhz",
                                        lambda: lib.nvmlDeviceGetMaxClockInfo(h, lib.NVML_CLOCK_SM)),
            mem_clock_max_mhz=self._read(gpu, "mem_clock_max_mhz",
                                         lambda: lib.nvmlDeviceGetMaxClockInfo(h, lib.NVML_CLOCK_MEM)),
            pcie_gen_max=self._read(gpu, "pcie_gen_max", lambda: lib.nvmlDeviceGetMaxPcieLinkGeneration(h)),
            pcie_width_max=self._read(gpu, "pcie_width_max", lambda: lib.nvmlDeviceGetMaxPcieLinkWidth(h)),
            power_limit_max_w=limit_max,
        )
        info.unsupported = sorted(gpu.unsupported)
        return info

    # ------------------------------------------------------------------ reads

    def _count_error(self, name: str, exc: Exception) -> None:
        key = f"{name}: {type(exc).__name__}"
        self.error_counts[key] = self.error_counts.get(key, 0) + 1

    def _read(self, gpu: _GpuState, name: str, read: Callable[[], Any]) -> Any:
        """One NVML read: its value, or None when unsupported or failing."""
        if name in gpu.unsupported:
            return None
        lib = self._lib
        try:
            return read()
        except lib.NVMLError as exc:
            if self._is_unsupported(exc):
                gpu.unsupported.add(name)
            else:
                self._count_error(name, exc)
            return None

    def _is_unsupported(self, exc: Exception) -> bool:
        lib = self._lib
        kinds = tuple(k for k in (getattr(lib, "NVMLError_NotSupported", None),
                                  getattr(lib, "NVMLError_FunctionNotFound", None)) if k)
        return isinstance(exc, kinds)

    @property
    def gpus(self) -> list[GpuInfo]:
        return [g.info for g in self._gpus]

    def gpu_info(self) -> list[dict]:
        """Static facts for every GPU, as plain dicts (for a GPU row in the database)."""
        return [g.info.to_dict() for g in self._gpus]

    def sample_all(self, now: float | None = None) -> list[dict]:
        return [self.sample(g.index, now=now) for g in self._gpus]

    def sample(self, index: int, now: float | None = None) -> dict:
        """Live readings of one GPU as a JSON-ready dict; unsupported fields are None."""
        gpu = self._state(index)
        lib, h = self._lib, gpu.handle
        now = self._clock() if now is None else now
        info = gpu.info
        read = self._read

        util = read(gpu, "utilization", lambda: lib.nvmlDeviceGetUtilizationRates(h))
        mem = read(gpu, "memory", lambda: lib.nvmlDeviceGetMemoryInfo(h))
        power_mw = read(gpu, "power_w", lambda: lib.nvmlDeviceGetPowerUsage(h))
        reasons = read(gpu, "clocks_event_reasons", lambda: lib.nvmlDeviceGetCurrentClocksEventReasons(h))
        gpu_util = util.gpu if util is not None else None

        sample = {
            "index": gpu.index,
            "uuid": info.uuid,
            "name": info.name,
            "time": time.time(),
            "gpu_util_pct": gpu_util,
            "mem_util_pct": util.memory if util is not None else None,
            "memory_used_bytes": int(mem.used) if mem is not None else None,
            "memory_total_bytes": int(mem.total) if mem is not None else info.memory_total_bytes,
            "temperature_c": read(gpu, "temperature_c",
                                  lambda: lib.nvmlDeviceGetTemperature(h, lib.NVML_TEMPERATURE_GPU)),
            "power_w": power_mw / 1000.0 if power_mw is not None else None,
            "sm_clock_mhz": read(gpu, "sm_clock_mhz", lambda: lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM)),
            "sm_clock_max_mhz": info.sm_clock_max_mhz,
            "mem_clock_mhz": read(gpu, "mem_clock_mhz",
                                  lambda: lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_MEM)),
            "mem_clock_max_mhz": info.mem_clock_max_mhz,
            "clocks_event_bits": reasons,
            "clocks_event_reasons": decode_clocks_event_reasons(reasons),
            "slowed_down": bool(reasons & SLOWDOWN_BITS) if reasons is not None else None,
            "pcie_gen": read(gpu, "pcie_gen", lambda: lib.nvmlDeviceGetCurrPcieLinkGeneration(h)),
            "pcie_gen_max": info.pcie_gen_max,
            "pcie_width_max": info.pcie_width_max,
            "performance_state": read(gpu, "performance_state", lambda: lib.nvmlDeviceGetPerformanceState(h)),
            "processes": self._processes(gpu),
        }
        sample.update(self._slow_fields(gpu, now))
        sample["pcie_downgraded"] = _pcie_downgraded(sample)
        sample["energy_j"] = self._energy(gpu, sample["power_w"], now)
        sample["unsupported"] = sorted(gpu.unsupported | set(info.unsupported))
        return sample

    def _state(self, index: int) -> _GpuState:
        for gpu in self._gpus:
            if gpu.index == index:
                return gpu
        raise ValueError(f"No GPU with index {index}: this host has indexes {[g.index for g in self._gpus]}")

    def _processes(self, gpu: _GpuState) -> list[dict] | None:
        lib, h = self._lib, gpu.handle
        procs = self._read(gpu, "processes", lambda: lib.nvmlDeviceGetComputeRunningProcesses(h))
        if procs is None:
            return None
        return [{"pid": int(p.pid),
                 "used_memory_bytes": int(p.usedGpuMemory) if p.usedGpuMemory is not None else None}
                for p in procs]

    def _pcie_throughput(self, gpu: _GpuState, now: float) -> dict:
        """PCIe bytes/s, from the cumulative byte counters where the driver has them.

        nvmlDeviceGetPcieThroughput measures over a 20 ms window and blocks for
        it (21 ms measured on an H200); the cumulative counters (Hopper-era
        drivers) cost one call (~0.6 ms there) and give the exact average rate
        between two slow refreshes. Older cards fall back to the 20 ms window.
        """
        lib, h = self._lib, gpu.handle
        none = {"pcie_tx_bytes_per_s": None, "pcie_rx_bytes_per_s": None}
        if "pcie_byte_counters" not in gpu.unsupported:
            values = self._read(gpu, "pcie_byte_counters", lambda: lib.nvmlDeviceGetFieldValues(
                h, [FI_PCIE_COUNT_TX_BYTES, FI_PCIE_COUNT_RX_BYTES]))
            if values is None and "pcie_byte_counters" not in gpu.unsupported:
                return none  # a passing error: try again next time
            if values is not None:
                if all(v.nvmlReturn == lib.NVML_SUCCESS for v in values):
                    tx, rx = int(values[0].value.ullVal), int(values[1].value.ullVal)
                    previous, gpu.pcie_counters = gpu.pcie_counters, (now, tx, rx)
                    if previous is None or now <= previous[0] or tx < previous[1] or rx < previous[2]:
                        return none
                    dt = now - previous[0]
                    return {"pcie_tx_bytes_per_s": (tx - previous[1]) / dt,
                            "pcie_rx_bytes_per_s": (rx - previous[2]) / dt}
                if not any(v.nvmlReturn == lib.NVML_ERROR_NOT_SUPPORTED for v in values):
                    self._count_error("pcie_byte_counters", RuntimeError("field read failed"))
                    return none
                gpu.unsupported.add("pcie_byte_counters")
        tx = self._read(gpu, "pcie_throughput",
                        lambda: lib.nvmlDeviceGetPcieThroughput(h, lib.NVML_PCIE_UTIL_TX_BYTES))
        rx = self._read(gpu, "pcie_throughput",
                        lambda: lib.nvmlDeviceGetPcieThroughput(h, lib.NVML_PCIE_UTIL_RX_BYTES))
        return {"pcie_tx_bytes_per_s": tx * 1024.0 if tx is not None else None,  # KB/s
                "pcie_rx_bytes_per_s": rx * 1024.0 if rx is not None else None}

    def _slow_fields(self, gpu: _GpuState, now: float) -> dict:
        due = gpu.slow_read_at is None or now - gpu.slow_read_at >= self.slow_interval_s
        if due:
            gpu.slow_read_at = now
            gpu.slow = self._read_slow(gpu, now)
        return dict(gpu.slow)

    def _read_slow(self, gpu: _GpuState, now: float) -> dict:
        lib, h, read = self._lib, gpu.handle, self._read
        limit_mw = read(gpu, "power_limit_w", lambda: lib.nvmlDeviceGetEnforcedPowerLimit(h))

        def ecc(kind):
            return lambda: int(lib.nvmlDeviceGetTotalEccErrors(h, kind, lib.NVML_VOLATILE_ECC))

        def retired(cause):
            return lambda: len(lib.nvmlDeviceGetRetiredPages(h, cause))

        pending = read(gpu, "retired_pages_pending", lambda: lib.nvmlDeviceGetRetiredPagesPendingStatus(h))
        rows = read(gpu, "remapped_rows", lambda: lib.nvmlDeviceGetRemappedRows(h))
        slow = {
            "pcie_width": read(gpu, "pcie_width", lambda: lib.nvmlDeviceGetCurrPcieLinkWidth(h)),
            "power_limit_w": limit_mw / 1000.0 if limit_mw is not None else None,
            "fan_pct": read(gpu, "fan_pct", lambda: lib.nvmlDeviceGetFanSpeed(h)),
            "ecc_corrected_volatile": read(gpu, "ecc_corrected_volatile",
                                           ecc(lib.NVML_MEMORY_ERROR_TYPE_CORRECTED)),
            "ecc_uncorrected_volatile": read(gpu, "ecc_uncorrected_volatile",
                                             ecc(lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)),
            "retired_pages_sbe": read(gpu, "retired_pages_sbe", retired(
                lib.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)),
            "retired_pages_dbe": read(gpu, "retired_pages_dbe", retired(
                lib.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)),
            "retired_pages_pending": bool(pending) if pending is not None else None,
            "remapped_rows_correctable": rows[0] if rows is not None else None,
            "remapped_rows_uncorrectable": rows[1] if rows is not None else None,
            "remapped_rows_pending": bool(rows[2]) if rows is not None else None,
            "remapped_rows_failure": bool(rows[3]) if rows is not None else None,
        }
        slow.update(self._pcie_throughput(gpu, now))
        return slow

    def _energy(self, gpu: _GpuState, power_w: float | None, now: float) -> float | None:
        """Lifetime energy in joules: the driver's counter, integrated from power in between.

        nvmlDeviceGetTotalEnergyConsumption cost 4.3 ms of CPU per call on an
        H200 (80x the rest of a sample together), so the counter is read every
        energy_interval_s and the power readings (trapezoids over the sample
        interval) carry the figure between reads; each read puts it back on
        the counter, so the drift never outlives one interval.
        """
        due = gpu.energy_read_at is None or now - gpu.energy_read_at >= self.energy_interval_s
        if due and "energy_j" not in gpu.unsupported:
            lib, h = self._lib, gpu.handle
            energy_mj = self._read(gpu, "energy_j", lambda: lib.nvmlDeviceGetTotalEnergyConsumption(h))
            # A failed read waits for the next interval too: each try costs ~4 ms.
            gpu.energy_read_at = now
            if energy_mj is not None:
                gpu.energy_j = energy_mj / 1000.0
                gpu.last_power = (now, power_w) if power_w is not None else None
                return gpu.energy_j
        if gpu.energy_j is None:
            return None
        if power_w is not None:
            if gpu.last_power is not None and now > gpu.last_power[0]:
                t0, p0 = gpu.last_power
                gpu.energy_j += (p0 + power_w) / 2.0 * (now - t0)
            gpu.last_power = (now, power_w)
        return gpu.energy_j

    # ------------------------------------------------------------- Xid events

    def xid_watcher(self) -> "XidWatcher":
        if not self.status.ok:
            raise RuntimeError(f"Cannot watch Xid events: {self.status.message}")
        return XidWatcher(self)

    def shutdown(self) -> None:
        if self._initialised:
            try:
                self._lib.nvmlShutdown()
            except self._lib.NVMLError:
                pass
            self._initialised = False


class XidWatcher:
    """Catches Xid critical errors through NVML events.

    ``poll(timeout_ms)`` waits at most that long for the first event, then
    drains whatever else is queued without waiting, and returns the events as
    dicts. GPUs whose driver does not offer Xid events are listed in
    ``unwatched`` (the UI says so instead of pretending all is well).
    """

    def __init__(self, nvml: Nvml):
        self._nvml = nvml
        lib = nvml._lib
        self._lib = lib
        self._uuid_to_index = {g.info.uuid: g.index for g in nvml._gpus}
        self.watched: list[int] = []
        self.unwatched: dict[int, str] = {}
        self._set = lib.nvmlEventSetCreate()
        for gpu in nvml._gpus:
            try:
                supported = lib.nvmlDeviceGetSupportedEventTypes(gpu.handle)
                if not supported & lib.nvmlEventTypeXidCriticalError:
                    self.unwatched[gpu.index] = "this GPU/driver does not report Xid events"
                    continue
                lib.nvmlDeviceRegisterEvents(gpu.handle, lib.nvmlEventTypeXidCriticalError, self._set)
                self.watched.append(gpu.index)
            except lib.NVMLError as exc:
                self.unwatched[gpu.index] = f"cannot register for Xid events ({exc})"

    def poll(self, timeout_ms: int = 100, max_events: int = 100) -> list[dict]:
        if not self.watched:
            return []
        lib = self._lib
        events = []
        wait = int(timeout_ms)
        while len(events) < max_events:
            try:
                data = lib.nvmlEventSetWait_v2(self._set, wait)
            except lib.NVMLError as exc:
                if not isinstance(exc, getattr(lib, "NVMLError_Timeout", ())):
                    self._nvml._count_error("xid_wait", exc)
                break
            wait = 0  # drain the rest without blocking
            if not data.eventType & lib.nvmlEventTypeXidCriticalError:
                continue
            uuid = None
            try:
                uuid = _text(lib.nvmlDeviceGetUUID(data.device))
            except lib.NVMLError:
                pass
            xid = int(data.eventData)
            events.append({
                "gpu_index": self._uuid_to_index.get(uuid),
                "uuid": uuid,
                "xid": xid,
                "description": describe_xid(xid),
                "time": time.time(),
            })
        return events

    def close(self) -> None:
        try:
            self._lib.nvmlEventSetFree(self._set)
        except self._lib.NVMLError:
            pass


# --------------------------------------------------------------------- helpers


def _pcie_downgraded(sample: dict) -> bool | None:
    """True when the PCIe link runs below what GPU and board allow.

    GPUs drop their PCIe generation when idle to save power (an idle H200 or
    V100 sits at Gen1), so a low generation alone is not a fault: it only
    counts while the GPU is busy (utilization >= PCIE_LOAD_UTIL_PCT). Link
    *width* does not change for power saving, so a narrower link (x4/x8 in an
    x16 slot: a bad riser, a dirty slot, the "V100 on an X99 board" case) is
    flagged at any load. None when the readings needed are unsupported.
    """
    gen, gen_max = sample["pcie_gen"], sample["pcie_gen_max"]
    width, width_max = sample["pcie_width"], sample["pcie_width_max"]
    if width is not None and width_max is not None and width < width_max:
        return True
    util = sample["gpu_util_pct"]
    if gen is not None and gen_max is not None and util is not None:
        return util >= PCIE_LOAD_UTIL_PCT and gen < gen_max
    if width is None or width_max is None:
        return None
    return False


def owning_deployment(pid: int, deployment_pids: dict[int, Any], *,
                      proc_root: str = "/proc", max_depth: int = 16) -> Any:
    """The deployment whose engine process is ``pid`` or one of its ancestors.

    vLLM and SGLang hold the GPU in worker child processes, not in the PID the
    supervisor started, so walk up the parent chain. Returns None when no
    ancestor is a known deployment (another user's job, or a PID from another
    PID namespace, e.g. a container: NVML reports host PIDs).
    """
    current = pid
    for _ in range(max_depth):
        if current in deployment_pids:
            return deployment_pids[current]
        parent = _parent_pid(current, proc_root)
        if parent is None or parent <= 1 or parent == current:
            return None
        current = parent
    return None


def _parent_pid(pid: int, proc_root: str) -> int | None:
    try:
        with open(os.path.join(proc_root, str(pid), "status"), encoding="utf-8") as f:
            for line in f:
                if line.startswith("PPid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def attach_deployments(samples: Iterable[dict], deployment_pids: dict[int, Any], *,
                       proc_root: str = "/proc") -> None:
    """Add ``deployment`` (or None) to every process in the samples, in place."""
    for sample in samples:
        for proc in sample.get("processes") or []:
            proc["deployment"] = owning_deployment(proc["pid"], deployment_pids, proc_root=proc_root)
