"""What the overview's JSON API (service status, jobs) returns."""
from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from dashboard.api import Schema


class RedisStatus(Schema):
    ok: bool
    error: Optional[str]


class Open(BaseModel):
    """Data another process wrote: keys beyond the declared ones pass through (a plain
    pydantic model, as ninja's Schema reads attributes and would drop them)."""

    model_config = ConfigDict(extra="allow")


class Nvml(Open):
    """What the monitor's NVML found on its host."""

    ok: bool
    message: str
    gpu_count: int = 0
    driver_version: Optional[str] = None
    cuda_driver_version: Optional[str] = None


class MonitorBeat(Open):
    """A monitor process's latest heartbeat as it wrote it to Redis (another version
    of the monitor may write more or fewer keys)."""

    host: str
    type: Optional[str] = None
    time: Optional[float] = None
    pid: Optional[int] = None
    interval: Optional[float] = None
    uptime_s: Optional[float] = None
    samples: Optional[int] = None
    nvml: Optional[Nvml] = None
    deployments: Optional[int] = None
    age_s: Optional[float] = None


class StatusOut(Schema):
    host: str
    redis: RedisStatus
    monitors: list[MonitorBeat]
    offline_hosts: list[str] = Field([], description="hosts whose monitor was seen but has stopped beating")
    workers: Optional[list[str]] = None


class Job(Schema):
    """A background job's row: what it is, where it ran, how it ended."""

    id: int
    kind: str
    status: str
    created: Optional[str]
    started: Optional[str]
    finished: Optional[str]
    worker: str
    result: Any
    error: str


class JobOut(Schema):
    job: Job
