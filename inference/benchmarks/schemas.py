"""What the benchmarks' JSON API takes and returns.

A run's overrides are bounded by services.OVERRIDE_LIMITS (the one table of
limits; the service checks them again for callers outside the API), so the
OpenAPI document shows the same bounds the service enforces.
"""
from __future__ import annotations

import math
from typing import Annotated, Any, Optional, Union

from django.utils.translation import gettext as _
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, WrapValidator
from pydantic_core import PydanticCustomError

from dashboard.api import Blank, RowId, Schema, Text
from inference.benchmarks.services import OVERRIDE_LIMITS

# ---------------------------------------------------------------- input


def _not_given(value):
    """An HTML form posts an empty field as "": that means "keep the preset's value"."""
    if isinstance(value, bool):  # JSON true/false is not a number, whatever Python thinks
        raise PydanticCustomError("int_type", _("Input should be a valid integer"))
    return None if value in ("", None) else value


def _between(low: int, high: int):
    def check(value, handler):
        try:
            return handler(value)
        except ValidationError as exc:
            if any(e["type"] in ("greater_than_equal", "less_than_equal") for e in exc.errors()):
                # Worded here, at validation time: the request's language is active now, not at import.
                raise PydanticCustomError("out_of_range", _("must be between %(low)s and %(high)s, not %(value)s")
                                          % {"low": low, "high": high, "value": value}) from None
            raise

    return WrapValidator(check)


def override(name: str):
    """An optional whole number within OVERRIDE_LIMITS[name]."""
    low, high = OVERRIDE_LIMITS[name]
    return Annotated[Optional[Annotated[int, Field(ge=low, le=high), _between(low, high)]],
                     BeforeValidator(_not_given)]


NumPrompts = override("num_prompts")
NumWarmups = override("num_warmups")
PromptTokens = override("prompt_tokens")
OutputTokens = override("output_tokens")
Concurrency = override("concurrency")
CONCURRENCY = OVERRIDE_LIMITS["concurrency"]
Level = Annotated[int, Field(ge=CONCURRENCY[0], le=CONCURRENCY[1])]


def _sweep(value, handler):
    """A list of levels or "1,2,4"; the messages are the ones the service gives."""
    if value in ("", None, []):
        return None
    if isinstance(value, str):
        value = [v for v in value.replace(" ", "").split(",") if v]
    whole_numbers = PydanticCustomError("sweep", _("give concurrency levels as whole numbers, e.g. 1,2,4"))
    if isinstance(value, list) and any(isinstance(v, bool) for v in value):
        raise whole_numbers
    try:
        return handler(value)
    except ValidationError as exc:
        if value and all(e["type"] in ("greater_than_equal", "less_than_equal") for e in exc.errors()):
            raise PydanticCustomError("out_of_range", _("every concurrency level must be between %(low)s and %(high)s")
                                      % {"low": CONCURRENCY[0], "high": CONCURRENCY[1]}) from None
        raise whole_numbers from None


class RunStart(Schema):
    """A new run: a preset scenario against a ready deployment, with the form's overrides."""

    deployment: RowId
    scenario: Text = ""
    label: Text = ""
    num_prompts: NumPrompts = None
    num_warmups: NumWarmups = None
    prompt_tokens: PromptTokens = None
    output_tokens: OutputTokens = None
    concurrency: Concurrency = None
    sweep: Annotated[Optional[list[Level]], WrapValidator(_sweep),
                     Field(description="Concurrency levels, as a list or a comma-separated text: 1,2,4")] = None
    goodput: Annotated[Union[dict[str, Any], Text, None],
                       Field(description="Goodput SLOs in milliseconds, as `vllm bench serve --goodput` takes them "
                                         "(\"ttft:500 tpot:50 e2el:5000\") or as an object ({\"tpot\": 50}); a "
                                         "request counts when it meets every SLO given. Empty: goodput is not "
                                         "measured.")] = None


def _ids(value):
    """?ids=3,5 (or ?ids=3&ids=5) as a list of run ids."""
    out = []
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, str):
            out.extend(part for part in item.replace(" ", "").split(",") if part)
        else:
            out.append(item)
    return out


# Query parameters (each its own, so a refusal names it as the URL spells it).
RunIds = Annotated[list[RowId], BeforeValidator(_ids)]
Baseline = Annotated[Optional[RowId], Blank]
Bandwidth = Annotated[Optional[Annotated[float, Field(gt=0, lt=100000)]], Blank]


# ---------------------------------------------------------------- output


def _metric(value):
    """A number as a result file holds it; anything else (text, NaN, Infinity) reads as null."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


Metric = Annotated[Union[int, float, None], BeforeValidator(_metric)]


class Headline(Schema):
    """The step with the highest output throughput; {} while a run has no result."""

    output_throughput: Metric = None
    median_ttft_ms: Metric = None
    median_tpot_ms: Metric = None
    max_concurrency: Metric = None
    completed: Metric = None
    failed: Metric = None


class Progress(BaseModel):
    """Where a run is; a running one also counts requests. Keys beyond these pass
    through (a plain pydantic model: ninja's Schema reads attributes and drops them)."""

    model_config = ConfigDict(extra="allow")

    phase: Optional[str] = None
    percent: Metric = None
    completed: Metric = None
    failed: Metric = None
    total: Metric = None
    step: Metric = None
    steps: Metric = None
    concurrency: Metric = None
    elapsed_s: Metric = None


class RunRow(Schema):
    """A run on the history list (and in its live message)."""

    id: int
    label: str
    title: str
    scenario: str
    source: str
    status: str
    colour: str
    progress: Progress
    error: str
    cancel_requested: bool
    deployment: Optional[int]
    model: str
    engine: str
    gpu: str
    created: Optional[str]
    started: Optional[str]
    finished: Optional[str]
    created_by: Optional[str]
    headline: Headline


class RunDetail(RunRow):
    """Everything about a run: the scenario as run, what was measured, one result per sweep step."""

    config: dict[str, Any]
    snapshot: dict[str, Any]
    result: list[dict[str, Any]]


class RunList(Schema):
    runs: list[RunRow]


class RunOut(Schema):
    run: RunRow


class RunDetailOut(Schema):
    run: RunDetail


class CompareRow(Schema):
    metric: str
    better: str
    values: list[Metric]
    ratios: list[Metric]
    verdicts: list[str]


class CompareTable(Schema):
    columns: list[str]
    baseline: int
    rows: list[CompareRow]
    launch_args: dict[str, list[Union[bool, str, None]]]
    run_ids: list[int]


class Series(Schema):
    """One run's chart lines (values per sweep step)."""

    id: int
    name: str
    concurrency: list[Metric]
    output_throughput: list[Metric]
    total_token_throughput: list[Metric]
    prompt_len: list[Metric]
    mean_ttft_ms: list[Metric]
    request_points: list[list[Metric]]
    percentiles: dict[str, dict[str, Metric]]


class Charts(Schema):
    series: list[Series]


class Roofline(Schema):
    """Measured batch-1 decode against weight bytes / memory bandwidth."""

    measured: Metric
    weight_bytes: Metric
    bandwidth_gbps: Metric
    limit: Metric
    efficiency: Metric
    note: str


class Comparison(Schema):
    table: CompareTable
    charts: Charts
    rooflines: list[Roofline]
