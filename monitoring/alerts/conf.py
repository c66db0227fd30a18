"""Alert thresholds, from the environment (README "Alerts" lists them)."""
import os


def _float(name, default):
    raw = os.environ.get(name)
    try:
        return float(raw) if raw not in (None, "") else default
    except ValueError:
        return default


SLOWDOWN_S = _float("ALERT_SLOWDOWN_SECONDS", 30.0)  # thermal / HW slowdown lasting this long
PCIE_S = _float("ALERT_PCIE_SECONDS", 10.0)  # a link below its maximum for this long
UNHEALTHY_S = _float("ALERT_UNHEALTHY_SECONDS", 20.0)  # a ready deployment failing health checks
MEMORY_FULL_PCT = _float("ALERT_GPU_MEMORY_PCT", 98.0)  # vLLM takes 90 % by design: only near 100 % matters
MEMORY_FULL_S = _float("ALERT_GPU_MEMORY_SECONDS", 60.0)
DISK_FREE_GB = _float("ALERT_DISK_FREE_GB", 20.0)  # in MODELS_DIR or DATA_DIR
MONITOR_SILENT_S = _float("ALERT_MONITOR_SILENT_SECONDS", 30.0)
HOST_CHECK_EVERY_S = _float("ALERT_HOST_CHECK_SECONDS", 30.0)
RETENTION_DAYS = _float("ALERT_RETENTION_DAYS", 90.0)  # alert history kept (open incidents always)
