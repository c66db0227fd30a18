"""What the monitor keeps: the GPUs of each host, their sample history in
three tiers, engine throughput history, and Xid errors.

Row counts are what decide the shape (8 GPUs at 1 Hz on SQLite): raw samples
live for MONITOR_RAW_RETENTION (1 h: ~29k rows), 10 s averages for a day
(~69k), 1 min averages for 30 days (~345k). The monitor writes them in batches
and prunes each tier by its retention (monitoring/history.py).
"""
from django.db import models
from django.utils.translation import gettext_lazy as _


class Tier(models.IntegerChoices):
    """Seconds per history point; 0 is every sample."""

    RAW = 0, _("every sample")
    TEN_SECONDS = 10, _("10 s averages")
    ONE_MINUTE = 60, _("1 min averages")


class Gpu(models.Model):
    """One GPU of one host, as NVML described it when the monitor last started.

    Other features (preflight, launch forms) read the GPUs of a host from here.
    """

    host = models.CharField(max_length=100)
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=100)
    name = models.CharField(max_length=200, blank=True)
    pci_bus_id = models.CharField(max_length=40, blank=True)
    memory_total_bytes = models.BigIntegerField(null=True, blank=True)
    compute_capability = models.CharField(max_length=10, blank=True)  # "7.0" for a V100
    pcie_gen_max = models.PositiveSmallIntegerField(null=True, blank=True)
    pcie_width_max = models.PositiveSmallIntegerField(null=True, blank=True)
    sm_clock_max_mhz = models.PositiveIntegerField(null=True, blank=True)
    power_limit_max_w = models.FloatField(null=True, blank=True)
    driver_version = models.CharField(max_length=40, blank=True)
    cuda_driver_version = models.CharField(max_length=20, blank=True)
    present = models.BooleanField(default=True, help_text="seen by the monitor's last start")
    updated = models.DateTimeField()

    class Meta:
        ordering = ["host", "index"]
        constraints = [models.UniqueConstraint(fields=["host", "uuid"], name="gpu_unique_uuid_per_host")]

    def __str__(self):
        return f"{self.host} GPU {self.index} ({self.name})"

    @property
    def memory_total_gib(self):
        return None if self.memory_total_bytes is None else self.memory_total_bytes / 1024**3


class GpuSample(models.Model):
    """One point of a GPU's history: a sample (tier 0) or an average over 10 s / 1 min.

    Only the numbers worth a history chart are kept; the live page has the rest.
    """

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="samples")
    tier = models.PositiveSmallIntegerField(choices=Tier.choices, default=Tier.RAW)
    time = models.DateTimeField()  # sample time, or the start of the averaging bucket
    gpu_util_pct = models.FloatField(null=True)
    mem_util_pct = models.FloatField(null=True)
    memory_used_bytes = models.BigIntegerField(null=True)
    temperature_c = models.FloatField(null=True)
    power_w = models.FloatField(null=True)
    power_max_w = models.FloatField(null=True)  # the highest sample in the bucket
    sm_clock_mhz = models.FloatField(null=True)
    pcie_tx_bytes_per_s = models.FloatField(null=True)
    pcie_rx_bytes_per_s = models.FloatField(null=True)
    slowed_down = models.BooleanField(null=True)  # any sample of the bucket was throttled

    class Meta:
        indexes = [models.Index(fields=["tier", "gpu", "time"]), models.Index(fields=["tier", "time"])]


class EngineSample(models.Model):
    """One point of a deployment's throughput history (same tiers as GpuSample).

    ``deployment_id`` is a plain number, not a foreign key: the history of a
    deleted deployment stays readable, and this app does not depend on the
    Deployment model's migrations.
    """

    host = models.CharField(max_length=100)
    deployment_id = models.BigIntegerField()
    deployment_name = models.CharField(max_length=200)
    engine = models.CharField(max_length=20, blank=True)
    tier = models.PositiveSmallIntegerField(choices=Tier.choices, default=Tier.RAW)
    time = models.DateTimeField()
    prompt_tokens_per_s = models.FloatField(null=True)
    generation_tokens_per_s = models.FloatField(null=True)
    requests_running = models.FloatField(null=True)
    requests_waiting = models.FloatField(null=True)
    kv_cache_usage = models.FloatField(null=True)
    prefix_cache_hit_rate = models.FloatField(null=True)
    preemptions_total = models.BigIntegerField(null=True)
    spec_decode_acceptance_rate = models.FloatField(null=True)

    class Meta:
        indexes = [models.Index(fields=["tier", "deployment_id", "time"]), models.Index(fields=["tier", "time"])]


class XidEvent(models.Model):
    """An Xid critical error NVML reported: a driver-level fault worth a human's look."""

    host = models.CharField(max_length=100)
    gpu = models.ForeignKey(Gpu, null=True, blank=True, on_delete=models.SET_NULL, related_name="xid_events")
    gpu_index = models.PositiveSmallIntegerField(null=True, blank=True)
    uuid = models.CharField(max_length=100, blank=True)
    xid = models.PositiveIntegerField()
    description = models.CharField(max_length=300)
    time = models.DateTimeField()

    class Meta:
        ordering = ["-time"]
        indexes = [models.Index(fields=["host", "-time"])]

    def __str__(self):
        return f"{self.host} GPU {self.gpu_index}: {self.description}"


# Alert channels, rules, events and deliveries live with the alerts code; the
# app label stays "monitoring".
from monitoring.alerts.models import AlertChannel, AlertDelivery, AlertEvent, AlertRule  # noqa: E402,F401
