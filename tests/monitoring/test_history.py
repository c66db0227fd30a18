"""History: averaging into tiers, retention, the history page and CSV export."""
import csv
import datetime as dt
import io

import pytest
from django.test import Client
from django.utils import timezone

from monitoring import history
from monitoring.history import Downsampler, HistoryBuffer, prune, write_rows
from monitoring.models import EngineSample, Gpu, GpuSample, Tier


def test_buckets_average_on_clock_boundaries_and_keep_the_peak():
    down = Downsampler(history.GPU_FIELDS)
    finished = []
    for second in range(0, 125):  # 1 Hz from 1000 s: util = second, power peaks once
        values = {"gpu_util_pct": float(second), "power_w": 100.0, "power_max_w": 400.0 if second == 3 else 100.0,
                  "slowed_down": second == 61, "temperature_c": None}
        finished += down.add("gpu", 1_000_000 + second, values)
    ten = [(start, v) for tier, _, start, v in finished if tier == 10]
    minute = [(start, v) for tier, _, start, v in finished if tier == 60]
    assert [start for start, _ in ten][:3] == [1_000_000, 1_000_010, 1_000_020]
    assert ten[0][1]["gpu_util_pct"] == pytest.approx(4.5)  # mean of 0..9
    assert ten[0][1]["power_max_w"] == 400 and ten[1][1]["power_max_w"] == 100
    assert ten[0][1]["temperature_c"] is None  # never read: stays n/a, not 0
    # 1 000 000 is not a multiple of 60: the first minute bucket is partial (960..1019).
    assert [start for start, _ in minute] == [999_960, 1_000_020]
    assert minute[0][1]["gpu_util_pct"] == pytest.approx(9.5)  # mean of 0..19
    assert minute[1][1]["gpu_util_pct"] == pytest.approx(49.5)  # mean of 20..79
    assert minute[1][1]["slowed_down"] is True and minute[0][1]["slowed_down"] is False
    rest = down.close_all()
    assert {(tier, start) for tier, _, start, _ in rest} == {(10, 1_000_120), (60, 1_000_080)}


def make_gpu(index=0, host="testhost"):
    return Gpu.objects.create(host=host, index=index, uuid=f"GPU-{host}-{index}", name="Tesla V100-PCIE-32GB",
                              memory_total_bytes=32 * 1024**3, updated=timezone.now())


def sample(util, index=0):
    return {"index": index, "gpu_util_pct": util, "mem_util_pct": 10, "memory_used_bytes": 1024**3,
            "temperature_c": 50, "power_w": 120.5, "sm_clock_mhz": 1380, "pcie_tx_bytes_per_s": None,
            "pcie_rx_bytes_per_s": None, "slowed_down": False}


def test_retention_prunes_each_tier_by_its_own_setting(db, settings):
    settings.MONITOR_RAW_RETENTION = 600
    settings.MONITOR_10S_RETENTION = 3600
    settings.MONITOR_1M_RETENTION = 86400
    gpu = make_gpu()
    now = timezone.now().timestamp()
    buffer = HistoryBuffer("testhost", {0: gpu.pk})
    for age in (7200, 1800, 60):  # two hours, half an hour, a minute ago
        buffer.add_tick(now - age, [sample(50)], [{"deployment_id": 3, "name": "demo", "engine": "llamacpp",
                                                   "generation_tokens_per_s": 59.0}], [])
    buffer.close()
    write_rows(*buffer.take())
    assert GpuSample.objects.filter(tier=Tier.RAW).count() == 3
    deleted = prune(now)
    left = lambda model, tier: sorted(round(now - t.timestamp()) for t in  # noqa: E731
                                      model.objects.filter(tier=tier).values_list("time", flat=True))
    assert left(GpuSample, Tier.RAW) == [60]
    assert left(EngineSample, Tier.RAW) == [60]
    assert all(age <= 3600 for age in left(GpuSample, Tier.TEN_SECONDS))
    assert len(left(GpuSample, Tier.ONE_MINUTE)) == 3
    assert deleted[0] == 4 and deleted[60] == 0


def test_tier_is_chosen_by_range_and_retention(settings):
    now = timezone.now()
    ago = lambda s: now - dt.timedelta(seconds=s)  # noqa: E731
    assert history.pick_tier(ago(900), now, now) == Tier.RAW
    assert history.pick_tier(ago(6 * 3600), now, now) == Tier.TEN_SECONDS
    assert history.pick_tier(ago(7 * 86400), now, now) == Tier.ONE_MINUTE
    settings.MONITOR_RAW_RETENTION = 600  # raw rows of 15 minutes ago are gone by then
    assert history.pick_tier(ago(900), now, now) == Tier.TEN_SECONDS


@pytest.fixture
def recorded(db):
    gpu = make_gpu()
    now = timezone.now().timestamp()
    buffer = HistoryBuffer("testhost", {0: gpu.pk})
    for k in range(30):
        buffer.add_tick(now - 30 + k, [sample(float(k))], [{"deployment_id": 3, "name": "gemma demo",
                                                            "engine": "llamacpp", "generation_tokens_per_s": 59.0,
                                                            "prompt_tokens_per_s": 1200.0}], [])
    write_rows(*buffer.take())
    return gpu


def test_csv_export_of_gpu_history(recorded, viewer):
    client = Client()
    client.force_login(viewer)
    response = client.get("/monitoring/history.csv?range=15m")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment;" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert len(rows) == 30
    assert rows[0]["gpu_name"] == "Tesla V100-PCIE-32GB" and rows[0]["tier_s"] == "0"
    assert [float(r["gpu_util_pct"]) for r in rows] == [float(k) for k in range(30)]
    assert rows[0]["pcie_tx_bytes_per_s"] == ""  # n/a stays empty, not 0


def test_csv_export_of_deployment_history(recorded, viewer):
    client = Client()
    client.force_login(viewer)
    response = client.get("/monitoring/history.csv?range=15m&kind=engine")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert len(rows) == 30
    assert rows[0]["deployment_name"] == "gemma demo" and float(rows[0]["generation_tokens_per_s"]) == 59.0


def test_csv_export_explains_a_bad_range(db, viewer):
    client = Client()
    client.force_login(viewer)
    response = client.get("/monitoring/history.csv?range=2y")
    assert response.status_code == 400
    assert "range='2y' is not one Kiln offers" in response.json()["error"]["message"]
    response = client.get("/monitoring/history.csv?start=2026-01-02T10:00&end=2026-01-01T10:00")
    assert "before it starts" in response.json()["error"]["message"]


def test_history_page_shows_charts_for_the_chosen_range(recorded, viewer):
    client = Client()
    client.force_login(viewer)
    page = client.get("/monitoring/history?range=15m").content.decode()
    assert f'id="hist-gpu-{recorded.pk}"' in page
    assert "every sample" in page  # the tier used
    assert 'id="gpu-series"' in page and "gemma demo" in page
    empty = client.get("/monitoring/history?range=30d&start=2020-01-01T00:00&end=2020-01-02T00:00").content.decode()
    assert 'id="history-empty"' in empty and "1 min averages" in empty
    bad = client.get("/monitoring/history?start=yesterday")
    assert bad.status_code == 400 and "is not a date and time" in bad.content.decode()
