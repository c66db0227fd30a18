"""What POST /api/preflight takes and returns.

The request is the launch form's fields plus what to check them against (see
inference.preflight.forms): here each is checked for its type (a number where a number
goes, no NUL, an id a database column holds); the form then checks the values as the
plan page and the launch form do, and names every field it refuses at once.
"""
from __future__ import annotations

from typing import Annotated, Optional, Union

from dashboard.api import Blank, Schema, Text
from inference.deployments.schemas import EngineFields

# Bytes and tokens come from the fit's arithmetic: whole numbers mostly, a float where a
# ratio went into them; each is passed on as it was computed.
Number = Union[int, float]


class PreflightRequest(EngineFields):
    """The launch form's engine fields (others, such as name or port, are ignored) and what to plan with."""

    engine: Optional[Text] = None
    engine_version: Optional[Text] = None
    sm70_build: Annotated[Optional[bool], Blank] = None
    preset: Optional[Text] = None
    target: Optional[Text] = None


class Finding(Schema):
    level: str  # "error" | "warning"
    code: str
    message: str
    fix: str
    install_url: str = ""  # the Runtimes page at the engine build to install (catalog findings)
    notes_url: str = ""  # the Runtimes page at a build Kiln does not install: its notes say how to build it


class GpuBudget(Schema):
    name: str
    total_bytes: Number
    budget_bytes: Number
    weights_bytes: Number
    overhead_bytes: Number
    kv_cache_bytes: Number  # what is left for the cache (may be negative)
    free_bytes: Number
    # the overhead's parts as vLLM's "Actual usage is ..." line names them (0 where not estimated)
    activation_bytes: Number = 0
    non_torch_bytes: Number = 0
    cudagraph_bytes: Number = 0


class FitReport(Schema):
    """Will it fit: memory per GPU, cache capacity, and what to change when it does not."""

    fits: bool
    engine: str
    gpus: list[GpuBudget]
    weights_bytes: Number
    weights_source: str
    kv_bytes_per_token: Number
    sliding_kv_bytes_per_token: Number
    sliding_window: Optional[int]
    state_bytes_per_sequence: Number
    kv_cache_tokens: Number
    max_model_len: Number
    max_num_seqs: Number
    max_context_at_concurrency: Number
    max_concurrency_at_context: Number
    concurrency_ratio: Number
    errors: list[str]
    suggestions: list[str]
    notes: list[str]


class GpuFacts(Schema):
    name: str
    total_bytes: Number
    compute_capability: Optional[str]


class RuntimeFacts(Schema):
    engine: str
    version: Optional[str]
    name: Optional[str]
    sm70_build: bool


class PreflightOut(Schema):
    findings: list[Finding]
    fit: Optional[FitReport]
    has_errors: bool
    gpus: list[GpuFacts]
    cpu_only: bool
    runtime: RuntimeFacts
    where: str
