"""Monitoring history: averaging into 10 s and 1 min tiers, batch writes, retention.

The monitor keeps the averaging buckets in memory (no read-back queries) and
hands finished rows to ``write_rows`` in one transaction every
MONITOR_FLUSH_INTERVAL seconds; ``prune`` deletes what each tier's retention
no longer covers. Reads for the history page and CSV export are here too.
"""
from __future__ import annotations

import csv
import datetime as dt
import math
from typing import Iterable, Iterator

from django.conf import settings
from django.db import transaction
from django.utils.translation import gettext_lazy

from monitoring.models import EngineSample, Gpu, GpuSample, Tier, XidEvent

DOWNSAMPLE_TIERS = (Tier.TEN_SECONDS, Tier.ONE_MINUTE)

# Field -> how a bucket combines its samples.
GPU_FIELDS = {
    "gpu_util_pct": "mean",
    "mem_util_pct": "mean",
    "memory_used_bytes": "mean",
    "temperature_c": "mean",
    "power_w": "mean",
    "power_max_w": "max",
    "sm_clock_mhz": "mean",
    "pcie_tx_bytes_per_s": "mean",
    "pcie_rx_bytes_per_s": "mean",
    "slowed_down": "any",
}
ENGINE_FIELDS = {
    "prompt_tokens_per_s": "mean",
    "generation_tokens_per_s": "mean",
    "requests_running": "mean",
    "requests_waiting": "mean",
    "kv_cache_usage": "mean",
    "prefix_cache_hit_rate": "mean",
    "preemptions_total": "max",
    "spec_decode_acceptance_rate": "mean",
}
INTEGER_FIELDS = {"memory_used_bytes", "preemptions_total"}


def retention_seconds(tier: int) -> int:
    return {
        Tier.RAW: settings.MONITOR_RAW_RETENTION,
        Tier.TEN_SECONDS: settings.MONITOR_10S_RETENTION,
        Tier.ONE_MINUTE: settings.MONITOR_1M_RETENTION,
    }[tier]


def as_datetime(epoch: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch, tz=dt.timezone.utc)


def gpu_values(sample: dict) -> dict:
    """The history fields of one live GPU sample (monitoring.nvml)."""
    values = {name: sample.get(name) for name in GPU_FIELDS}
    values["power_max_w"] = sample.get("power_w")
    return values


def engine_values(snapshot: dict) -> dict:
    """The history fields of one engine snapshot (monitoring.enginemetrics)."""
    return {name: snapshot.get(name) for name in ENGINE_FIELDS}


class _Bucket:
    __slots__ = ("start", "sums", "counts", "extreme", "anys")

    def __init__(self, start: float):
        self.start = start
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.extreme: dict[str, float] = {}
        self.anys: dict[str, bool] = {}

    def add(self, values: dict, fields: dict) -> None:
        for name, how in fields.items():
            value = values.get(name)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            if how == "mean":
                self.sums[name] = self.sums.get(name, 0.0) + value
                self.counts[name] = self.counts.get(name, 0) + 1
            elif how == "max":
                self.extreme[name] = max(self.extreme.get(name, value), value)
            else:  # any
                self.anys[name] = self.anys.get(name, False) or bool(value)

    def result(self, fields: dict) -> dict:
        out = {}
        for name, how in fields.items():
            if how == "mean":
                n = self.counts.get(name)
                value = self.sums[name] / n if n else None
            elif how == "max":
                value = self.extreme.get(name)
            else:
                value = self.anys.get(name)
            if value is not None and name in INTEGER_FIELDS:
                value = int(round(value))
            out[name] = value
        return out


class Downsampler:
    """Averages samples per key into buckets of 10 s and 1 min, aligned to the clock.

    ``add`` returns the buckets that a later sample closed, as
    ``(tier, key, bucket_start_epoch, values)``; ``close_all`` returns the
    unfinished ones (at shutdown, so a stop loses nothing).
    """

    def __init__(self, fields: dict, tiers: Iterable[int] = DOWNSAMPLE_TIERS):
        self.fields = fields
        self.tiers = tuple(int(t) for t in tiers)
        self._open: dict[tuple[int, object], _Bucket] = {}

    def add(self, key, epoch: float, values: dict) -> list[tuple[int, object, float, dict]]:
        done = []
        for tier in self.tiers:
            start = math.floor(epoch / tier) * tier
            bucket = self._open.get((tier, key))
            if bucket is not None and bucket.start != start:
                if start > bucket.start:
                    done.append((tier, key, bucket.start, bucket.result(self.fields)))
                    bucket = None
                else:
                    continue  # a sample from before the open bucket (clock stepped back): drop it
            if bucket is None:
                bucket = self._open[(tier, key)] = _Bucket(start)
            bucket.add(values, self.fields)
        return done

    def close_all(self) -> list[tuple[int, object, float, dict]]:
        done = [(tier, key, b.start, b.result(self.fields)) for (tier, key), b in self._open.items()]
        self._open.clear()
        return done


class HistoryBuffer:
    """Rows the monitor collected since its last flush; ``take()`` empties it."""

    def __init__(self, host: str, gpu_ids: dict[int, int]):
        self.host = host
        self.gpu_ids = gpu_ids  # GPU index -> Gpu.pk
        self.gpu_rows: list[GpuSample] = []
        self.engine_rows: list[EngineSample] = []
        self.xid_rows: list[XidEvent] = []
        self._gpu_down = Downsampler(GPU_FIELDS)
        self._engine_down = Downsampler(ENGINE_FIELDS)
        self._engine_meta: dict[int, tuple[str, str]] = {}

    def add_tick(self, epoch: float, gpus: list[dict], engines: list[dict], xids: list[dict]) -> None:
        when = as_datetime(epoch)
        for sample in gpus:
            gpu_id = self.gpu_ids.get(sample["index"])
            if gpu_id is None:
                continue
            values = gpu_values(sample)
            self.gpu_rows.append(GpuSample(gpu_id=gpu_id, tier=Tier.RAW, time=when, **values))
            for tier, key, start, avg in self._gpu_down.add(gpu_id, epoch, values):
                self.gpu_rows.append(GpuSample(gpu_id=key, tier=tier, time=as_datetime(start), **avg))
        for snap in engines:
            dep = snap.get("deployment_id")
            if dep is None or snap.get("engine") is None:
                continue  # unreachable engine: no point rather than a row of None
            self._engine_meta[dep] = (snap.get("name") or "", snap.get("engine") or "")
            values = engine_values(snap)
            self.engine_rows.append(self._engine_row(dep, Tier.RAW, when, values))
            for tier, key, start, avg in self._engine_down.add(dep, epoch, values):
                self.engine_rows.append(self._engine_row(key, tier, as_datetime(start), avg))
        for event in xids:
            index = event.get("gpu_index")
            self.xid_rows.append(XidEvent(
                host=self.host, gpu_id=self.gpu_ids.get(index), gpu_index=index, uuid=event.get("uuid") or "",
                xid=event["xid"], description=event["description"][:300], time=as_datetime(event["time"])))

    def _engine_row(self, dep, tier, when, values):
        name, engine = self._engine_meta.get(dep, ("", ""))
        return EngineSample(host=self.host, deployment_id=dep, deployment_name=name, engine=engine,
                            tier=tier, time=when, **values)

    def close(self) -> None:
        """Emit the unfinished averaging buckets (the monitor is stopping)."""
        for tier, key, start, avg in self._gpu_down.close_all():
            self.gpu_rows.append(GpuSample(gpu_id=key, tier=tier, time=as_datetime(start), **avg))
        for tier, key, start, avg in self._engine_down.close_all():
            self.engine_rows.append(self._engine_row(key, tier, as_datetime(start), avg))

    def take(self) -> tuple[list, list, list]:
        rows = (self.gpu_rows, self.engine_rows, self.xid_rows)
        self.gpu_rows, self.engine_rows, self.xid_rows = [], [], []
        return rows

    def __len__(self):
        return len(self.gpu_rows) + len(self.engine_rows) + len(self.xid_rows)


@transaction.atomic
def write_rows(gpu_rows: list, engine_rows: list, xid_rows: list) -> int:
    """One transaction, batch inserts: SQLite pays for commits, not rows."""
    GpuSample.objects.bulk_create(gpu_rows, batch_size=500)
    EngineSample.objects.bulk_create(engine_rows, batch_size=500)
    XidEvent.objects.bulk_create(xid_rows, batch_size=500)
    return len(gpu_rows) + len(engine_rows) + len(xid_rows)


def prune(now: float | None = None) -> dict[int, int]:
    """Delete history older than each tier's retention; returns rows deleted per tier."""
    now = dt.datetime.now(dt.timezone.utc).timestamp() if now is None else now
    deleted = {}
    for tier in Tier:
        cutoff = as_datetime(now - retention_seconds(tier))
        n_gpu, _ = GpuSample.objects.filter(tier=tier, time__lt=cutoff).delete()
        n_eng, _ = EngineSample.objects.filter(tier=tier, time__lt=cutoff).delete()
        deleted[int(tier)] = n_gpu + n_eng
    return deleted


def upsert_gpus(host: str, infos: list[dict], *, driver: str | None, cuda: str | None) -> dict[int, int]:
    """Record the GPUs NVML found at monitor start; returns {index: Gpu.pk}.

    GPUs of this host not seen this time stay (their history does too) but are
    marked not present.
    """
    now = dt.datetime.now(dt.timezone.utc)
    ids = {}
    with transaction.atomic():
        seen = []
        for info in infos:
            uuid = info.get("uuid") or f"index-{info['index']}"
            gpu, _ = Gpu.objects.update_or_create(host=host, uuid=uuid, defaults={
                "index": info["index"],
                "name": info.get("name") or "",
                "pci_bus_id": info.get("pci_bus_id") or "",
                "memory_total_bytes": info.get("memory_total_bytes"),
                "compute_capability": info.get("compute_capability") or "",
                "pcie_gen_max": info.get("pcie_gen_max"),
                "pcie_width_max": info.get("pcie_width_max"),
                "sm_clock_max_mhz": info.get("sm_clock_max_mhz"),
                "power_limit_max_w": info.get("power_limit_max_w"),
                "driver_version": driver or "",
                "cuda_driver_version": cuda or "",
                "present": True,
                "updated": now,
            })
            ids[info["index"]] = gpu.pk
            seen.append(gpu.pk)
        Gpu.objects.filter(host=host).exclude(pk__in=seen).update(present=False)
    return ids


# ------------------------------------------------------------------- reads

RANGES = {  # name -> (seconds, label)
    "15m": (15 * 60, gettext_lazy("last 15 minutes")),
    "1h": (3600, gettext_lazy("last hour")),
    "6h": (6 * 3600, gettext_lazy("last 6 hours")),
    "24h": (24 * 3600, gettext_lazy("last 24 hours")),
    "7d": (7 * 24 * 3600, gettext_lazy("last 7 days")),
    "30d": (30 * 24 * 3600, gettext_lazy("last 30 days")),
}


def pick_tier(start: dt.datetime, end: dt.datetime, now: dt.datetime | None = None) -> int:
    """The finest tier that still covers ``start`` and gives a chart of sane size."""
    now = now or dt.datetime.now(dt.timezone.utc)
    age = (now - start).total_seconds()
    span = (end - start).total_seconds()
    if age <= retention_seconds(Tier.RAW) and span <= 3600:
        return Tier.RAW
    if age <= retention_seconds(Tier.TEN_SECONDS) and span <= 2 * 24 * 3600:
        return Tier.TEN_SECONDS
    return Tier.ONE_MINUTE


CHART_GPU_FIELDS = ("gpu_util_pct", "mem_util_pct", "memory_used_bytes", "temperature_c", "power_w",
                    "power_max_w", "sm_clock_mhz")
CHART_ENGINE_FIELDS = ("generation_tokens_per_s", "prompt_tokens_per_s", "requests_running", "requests_waiting",
                       "kv_cache_usage")


def gpu_series(start, end, tier, host=None) -> list[dict]:
    """Per GPU: its facts and column lists (time as ISO text) for a Plotly chart."""
    gpus = Gpu.objects.all() if host is None else Gpu.objects.filter(host=host)
    by_id = {g.pk: {"id": g.pk, "host": g.host, "index": g.index, "name": g.name, "uuid": g.uuid,
                    "memory_total_bytes": g.memory_total_bytes, "time": [],
                    **{f: [] for f in CHART_GPU_FIELDS}} for g in gpus}
    rows = (GpuSample.objects.filter(tier=tier, time__gte=start, time__lte=end, gpu_id__in=by_id)
            .order_by("gpu_id", "time").values_list("gpu_id", "time", *CHART_GPU_FIELDS))
    for gpu_id, when, *values in rows.iterator(chunk_size=2000):
        series = by_id[gpu_id]
        series["time"].append(when.isoformat())
        for name, value in zip(CHART_GPU_FIELDS, values):
            series[name].append(value)
    return [s for s in by_id.values() if s["time"]]


def engine_series(start, end, tier, host=None) -> list[dict]:
    rows = EngineSample.objects.filter(tier=tier, time__gte=start, time__lte=end)
    if host is not None:
        rows = rows.filter(host=host)
    out: dict[int, dict] = {}
    for dep, name, engine, when, *values in rows.order_by("deployment_id", "time").values_list(
            "deployment_id", "deployment_name", "engine", "time", *CHART_ENGINE_FIELDS).iterator(chunk_size=2000):
        series = out.setdefault(dep, {"deployment_id": dep, "name": name, "engine": engine, "time": [],
                                      **{f: [] for f in CHART_ENGINE_FIELDS}})
        series["time"].append(when.isoformat())
        for field, value in zip(CHART_ENGINE_FIELDS, values):
            series[field].append(value)
    return list(out.values())


class _Echo:
    def write(self, value):
        return value


GPU_CSV_COLUMNS = ("time", "host", "gpu_index", "gpu_uuid", "gpu_name", "tier_s") + tuple(GPU_FIELDS)
ENGINE_CSV_COLUMNS = ("time", "host", "deployment_id", "deployment_name", "engine", "tier_s") + tuple(ENGINE_FIELDS)


def _csv_value(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


def gpu_csv_lines(start, end, tier, host=None) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(GPU_CSV_COLUMNS)
    rows = GpuSample.objects.filter(tier=tier, time__gte=start, time__lte=end).select_related("gpu")
    if host is not None:
        rows = rows.filter(gpu__host=host)
    fields = tuple(GPU_FIELDS)
    for row in rows.order_by("time", "gpu__index").iterator(chunk_size=2000):
        yield writer.writerow([row.time.isoformat(), row.gpu.host, row.gpu.index, row.gpu.uuid, row.gpu.name,
                               row.tier] + [_csv_value(getattr(row, f)) for f in fields])


def engine_csv_lines(start, end, tier, host=None) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(ENGINE_CSV_COLUMNS)
    rows = EngineSample.objects.filter(tier=tier, time__gte=start, time__lte=end)
    if host is not None:
        rows = rows.filter(host=host)
    fields = tuple(ENGINE_FIELDS)
    for row in rows.order_by("time", "deployment_id").iterator(chunk_size=2000):
        yield writer.writerow([row.time.isoformat(), row.host, row.deployment_id, row.deployment_name, row.engine,
                               row.tier] + [_csv_value(getattr(row, f)) for f in fields])
