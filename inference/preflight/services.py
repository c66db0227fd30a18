"""Preflight for the panel: the launch form's values in, findings + the VRAM fit out.

The plain cores (inference/preflight/fit.py, inference/preflight/rules.py, inference/preflight/capacity.py)
know nothing of the panel's rows (of Django they use gettext only). This module turns the rows into their inputs:

    preflight_for(profile_values=form.cleaned_data, model=artifact, runtime=runtime, gpus=gpus)
      -> {"findings": [...], "fit": FitReport.as_dict() | None, "has_errors": bool, ...}

    launch_allowed(result, override)      the launch service asks this before starting
    record_capacity(deployment, log)      the watch loop hands vLLM's start-up lines here
    estimate_vs_actual(deployment)        rows for the deployment page

GPUs come from the monitor's Gpu rows (gpus_for_host) or, when the panel is not on
the machine that will serve, from a planning target (PLANNING_TARGETS) so that the
V100 presets can be planned from a laptop.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from inference.deployments.presets import PRESET_META_DIR
from inference.preflight import fit
from inference.preflight import rules as preflight
from inference.preflight.fit import GPU, GiB, MiB, FitError, LaunchSettings
from inference.preflight.catalog import catalog_findings, with_catalog
from inference.preflight.rules import Finding, RuntimeInfo
from inference.preflight.capacity import (compare_llamacpp, compare_with_estimate, parse_actual_usage,
                                          parse_llamacpp_memory, parse_vllm_capacity)



# ---------------------------------------------------------------------------
# Hardware to plan for
# ---------------------------------------------------------------------------

def host_ram_bytes() -> int:
    """This machine's RAM (what a CPU-only llama.cpp run may use)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 16 * GiB


@dataclass(frozen=True)
class PlanningTarget:
    slug: str
    label: str
    gpu_name: str
    memory_mib: int           # what nvidia-smi reports as total for that card
    compute_capability: str | None
    count: int = 1

    def gpus(self) -> list[GPU]:
        if self.compute_capability is None:
            return [GPU(cpu_name(), host_ram_bytes(), None)]
        return [GPU(self.gpu_name, self.memory_mib * MiB, self.compute_capability) for _ in range(self.count)]


# Totals as nvidia-smi shows them (a little under the nominal size: the driver keeps some).
PLANNING_TARGETS: tuple[PlanningTarget, ...] = (
    PlanningTarget("v100-32gb-x1", "1× V100 32GB (sm70)", "Tesla V100-SXM2-32GB", 32510, "7.0"),
    PlanningTarget("v100-32gb-x2", "2× V100 32GB (sm70)", "Tesla V100-SXM2-32GB", 32510, "7.0", 2),
    PlanningTarget("v100-32gb-x4", "4× V100 32GB (sm70)", "Tesla V100-SXM2-32GB", 32510, "7.0", 4),
    PlanningTarget("v100-16gb-x1", "1× V100 16GB (sm70)", "Tesla V100-PCIE-16GB", 16160, "7.0"),
    PlanningTarget("rtx3090-x1", "1× RTX 3090 24GB (sm86)", "NVIDIA GeForce RTX 3090", 24576, "8.6"),
    PlanningTarget("rtx4090-x1", "1× RTX 4090 24GB (sm89)", "NVIDIA GeForce RTX 4090", 24564, "8.9"),
    PlanningTarget("a100-80gb-x1", "1× A100 80GB (sm80)", "NVIDIA A100-SXM4-80GB", 81920, "8.0"),
    PlanningTarget("h200-x1", "1× H200 141GB (sm90)", "NVIDIA H200", 143771, "9.0"),
    PlanningTarget("cpu", gettext_lazy("CPU only (this machine's RAM)"), "CPU", 0, None),
)


def cpu_name() -> str:
    """This machine's RAM as the one "GPU" of a CPU run, named for the page."""
    return _("CPU (%(ram).0f GiB RAM)") % {"ram": host_ram_bytes() / GiB}


def planning_target(slug: str) -> PlanningTarget:
    for t in PLANNING_TARGETS:
        if t.slug == slug:
            return t
    raise KeyError(f"no planning target {slug!r}; known: {', '.join(t.slug for t in PLANNING_TARGETS)}")


def gpus_for_host(host: str, gpu_indices) -> list[GPU]:
    """The GPUs `gpu_indices` of `host`, from the monitor's Gpu rows.

    Empty indices mean a CPU run: this machine's RAM. Returns [] when the monitor
    has not described that host (or the monitoring app has no Gpu model yet);
    the caller then says so and offers a planning target.
    """
    indices = [int(i) for i in (gpu_indices or [])]
    if not indices:
        return [GPU(cpu_name(), host_ram_bytes(), None)]
    from monitoring.models import Gpu

    rows = {}
    # a replaced card leaves its old row behind (present=False): the present one wins
    for g in Gpu.objects.filter(host=host, index__in=indices).order_by("present"):
        rows[g.index] = g
    out = []
    for i in indices:
        row = rows.get(i)
        if row is None:
            return []
        out.append(GPU(row.name or f"GPU {i}", int(row.memory_total_bytes or 0), row.compute_capability or None,
                       driver_cuda_version=row.cuda_driver_version or None))
    return out


# ---------------------------------------------------------------------------
# Runtimes and models, as the cores see them
# ---------------------------------------------------------------------------

def runtime_info(runtime) -> RuntimeInfo:
    """RuntimeInfo from an EngineRuntime row (the name tells an sm70 build: '1Cat-vLLM ...')."""
    return RuntimeInfo(engine=runtime.engine, version=runtime.version or "", cuda_version=runtime.torch_cuda or None,
                       cuda_arch_list=list(runtime.cuda_archs) or None, name=runtime.name,
                       catalog_key=runtime.catalog_key or "")


def host_runtime_infos(runtime) -> list[RuntimeInfo]:
    """The other runtimes of the same engine registered on a saved runtime's host, as preflight sees
    them (one may run what this one cannot); installs not finished are left out."""
    from inference.models import EngineRuntime

    if not isinstance(runtime, EngineRuntime) or runtime.pk is None:
        return []
    Status = EngineRuntime.InstallStatus
    others = (EngineRuntime.objects.filter(host=runtime.host, engine=runtime.engine)
              .filter(install_status__in=(Status.NONE, Status.INSTALLED)).exclude(pk=runtime.pk))
    return [runtime_info(r) for r in others]


def adhoc_runtime_info(*, engine: str, version: str = "", sm70_build: bool = False) -> RuntimeInfo:
    """For planning without a registered runtime: an engine, a version and the 'sm70 build' box."""
    name = f"{engine} {version}".strip() + (" (sm70 build)" if sm70_build else "")
    return RuntimeInfo(engine=engine, version=version or "", name=name, sm70_build=True if sm70_build else None)


def preset_model(slug: str) -> dict:
    """{"meta": config.json or GGUF metadata, "weight_bytes": int|None, "source": str} for a preset."""
    return dict(_preset_model(slug))


@lru_cache(maxsize=16)
def _preset_model(slug: str) -> dict:
    path = PRESET_META_DIR / f"{slug}.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise KeyError(f"no model metadata for preset {slug!r} in {PRESET_META_DIR}") from None
    if "meta" in data and "_source" in data:
        return {"meta": data["meta"], "weight_bytes": data.get("weight_bytes"), "source": data["_source"]}
    return {"meta": data, "weight_bytes": None, "source": f"config.json ({path.name})"}


def model_meta(model) -> tuple[dict, int | None]:
    """(config.json or GGUF metadata, weight bytes) for a ModelArtifact.

    The row's meta is a summary (inference.library.modelmeta); the full config.json or GGUF
    header is read from disk when this machine has the files, since the fit needs
    fields the summary drops (DeltaNet dims, the quantization groups).
    """
    weight = int(model.weight_bytes or 0) or None
    raw = _raw_meta_from_disk(model.path or "")
    if raw is not None:
        return raw, weight
    return _meta_from_summary(model.meta or {}), weight


def _raw_meta_from_disk(path: str) -> dict | None:
    try:
        if path.endswith(".gguf") and os.path.isfile(path):
            st = os.stat(path)
            return _gguf_meta(path, st.st_mtime_ns)
        cfg = os.path.join(path, "config.json")
        if path and os.path.isfile(cfg):
            with open(cfg, encoding="utf-8") as fh:
                data = json.load(fh)
            return data if isinstance(data, dict) else None
    except (OSError, ValueError, FitError):
        return None
    return None


@lru_cache(maxsize=32)
def _gguf_meta(path: str, mtime_ns: int) -> dict:
    meta, tensors = fit.read_gguf(path)
    shape = fit.shape_from_gguf(meta, tensors)
    arch = meta["general.architecture"]
    meta = {k: v for k, v in meta.items() if not isinstance(v, list) or k.startswith(arch)}
    meta.setdefault(f"{arch}.vocab_size", shape.vocab_size)
    meta["_exact_weight_bytes"] = shape.exact_weight_bytes
    return meta


def _meta_from_summary(s: Mapping[str, Any]) -> dict:
    """A config.json / GGUF-keyed dict rebuilt from modelmeta's summary (lossy: no DeltaNet dims)."""
    if s.get("format") == "gguf" or ("general.architecture" in s):
        if "general.architecture" in s:
            return dict(s)
        arch = s.get("architecture") or "unknown"
        out = {"general.architecture": arch, "general.file_type": s.get("file_type")}
        for key, name in (("block_count", "num_layers"), ("context_length", "context_length"),
                          ("embedding_length", "embedding_length"), ("attention.head_count", "num_attention_heads"),
                          ("attention.head_count_kv", "num_kv_heads"), ("attention.key_length", "head_dim"),
                          ("attention.value_length", "head_dim")):
            if s.get(name) is not None:
                out[f"{arch}.{key}"] = s[name]
        if s.get("parameter_count") and s.get("embedding_length"):
            out["_exact_weight_bytes"] = s.get("tensor_bytes")
        return out
    if "num_hidden_layers" in s or "text_config" in s:
        return dict(s)          # already a config.json
    cfg = {"architectures": [s["architecture"]] if s.get("architecture") else [],
           "model_type": s.get("text_model_type") or s.get("model_type"),
           "num_hidden_layers": s.get("num_layers"), "hidden_size": s.get("hidden_size"),
           "num_attention_heads": s.get("num_attention_heads"), "num_key_value_heads": s.get("num_kv_heads"),
           "head_dim": s.get("head_dim"), "max_position_embeddings": s.get("max_position_embeddings"),
           "torch_dtype": s.get("torch_dtype"), "vocab_size": s.get("vocab_size"),
           "intermediate_size": s.get("intermediate_size")}
    full, layers = s.get("full_attention_layers"), s.get("num_layers")
    if full and layers and full < layers and layers % full == 0:
        cfg["full_attention_interval"] = layers // full
    q = s.get("quantization")
    if isinstance(q, dict) and q:
        q = dict(q)
        if q.get("weight_type") == "float" and q.get("bits") == 4:
            q.setdefault("quant_algo", "NVFP4")
        cfg["quantization_config"] = q
    # what vLLM derives the model's maximum from besides max_position_embeddings, where the summary keeps it
    for key in (*fit.MAX_LEN_KEYS, "rope_scaling", "rope_parameters", "original_max_position_embeddings"):
        if s.get(key) is not None:
            cfg[key] = s[key]
    return {k: v for k, v in cfg.items() if v is not None}


# ---------------------------------------------------------------------------
# The launch form's values -> LaunchSettings
# ---------------------------------------------------------------------------

PROFILE_FIELDS = ("tensor_parallel_size", "dtype", "quantization", "max_model_len", "gpu_memory_utilization",
                  "kv_cache_dtype", "attention_backend", "max_num_seqs", "speculative_config", "extra_args", "gpus",
                  "enable_prefix_caching")


def _values(profile_values) -> dict:
    if hasattr(profile_values, "_meta"):         # a LaunchProfile (saved or not)
        return {f: getattr(profile_values, f, None) for f in PROFILE_FIELDS}
    return dict(profile_values or {})


def _flag(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def launch_settings(values: Mapping[str, Any], engine: str) -> LaunchSettings:
    args = [str(a) for a in (values.get("extra_args") or [])]
    batched = _flag(args, "--max-num-batched-tokens")
    spec = values.get("speculative_config") or None
    if isinstance(spec, str):
        try:
            spec = json.loads(spec) if spec.strip() else None
        except ValueError:
            spec = None
    return LaunchSettings(
        engine=engine,
        dtype=(values.get("dtype") or "auto"),
        kv_cache_dtype=(values.get("kv_cache_dtype") or "auto"),
        tensor_parallel_size=int(values.get("tensor_parallel_size") or 1),
        gpu_memory_utilization=float(values.get("gpu_memory_utilization") or 0.9),
        max_model_len=int(values["max_model_len"]) if values.get("max_model_len") else None,
        max_num_seqs=int(values.get("max_num_seqs") or 1),
        max_num_batched_tokens=int(batched) if batched and batched.isdigit() else None,
        enforce_eager="--enforce-eager" in args,
        quantization=(values.get("quantization") or None),
        attention_backend=(values.get("attention_backend") or None),
        speculative_config=spec if isinstance(spec, dict) else None,
        engine_max_num_seqs=int(values["max_num_seqs"]) if values.get("max_num_seqs") else None,
        enable_prefix_caching=values.get("enable_prefix_caching"),
        language_model_only=_text_only(args),
    )


def _text_only(args: list[str]) -> bool:
    """--language-model-only, or --limit-mm-per-prompt with every modality at 0: no vision tower."""
    if "--language-model-only" in args:
        return True
    limits = _flag(args, "--limit-mm-per-prompt")
    try:
        parsed = json.loads(limits) if limits else None
    except ValueError:
        return False
    return isinstance(parsed, dict) and bool(parsed) and not any(parsed.values())


# ---------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------

def preflight_for(*, profile_values, model=None, runtime=None, gpus: list[GPU],
                  model_meta_override: dict | None = None, weight_bytes: int | None = None) -> dict:
    """Run the fit and the preflight rules for a launch.

    profile_values: the launch form's cleaned values (or a LaunchProfile).
    model: a ModelArtifact, or None (then model_meta_override, e.g. a preset's config).
    runtime: an EngineRuntime or a RuntimeInfo (None: vLLM of unknown version).
    gpus: fit.GPU list (gpus_for_host or a planning target); [] = unknown hardware.

    Returns {"findings": [Finding.as_dict()...], "fit": FitReport.as_dict() | None,
    "has_errors": bool, "gpus": [...], "runtime": {...}, "cpu_only": bool}.
    """
    values = _values(profile_values)
    if isinstance(runtime, RuntimeInfo):
        info = runtime
    elif runtime is not None:
        info = runtime_info(runtime)
    else:
        info = RuntimeInfo(engine=values.get("engine") or "vllm")
    settings = launch_settings(values, info.engine)

    meta: dict = {}
    if model is not None:
        meta, weight_bytes = model_meta(model)
    elif model_meta_override is not None:
        meta = dict(model_meta_override)
    exact = meta.pop("_exact_weight_bytes", None) if meta else None
    weight_bytes = weight_bytes or exact

    findings: list[Finding] = []
    report = None
    gpus = list(gpus or [])
    if info.engine == "llamacpp" and meta and "general.architecture" not in meta:
        # A Hugging Face folder (config.json + safetensors): llama-server loads only GGUF files.
        findings.append(Finding("error", "llamacpp-needs-gguf",
                                _("llama.cpp loads GGUF files; this model is a safetensors (Hugging Face) folder."),
                                _("launch it with vLLM or SGLang, or download a GGUF of this model "
                                  "(for example its *Q4_K_M*.gguf file)")))
    if not gpus and _host_has_no_gpu(profile_values):
        findings.append(Finding("error", "host-has-no-gpu",
                                _("%(host)s has no GPU (its monitor reports none), but GPUs %(gpus)s are chosen.")
                                % {"host": _host_of(profile_values),
                                   "gpus": ",".join(str(i) for i in _values(profile_values).get("gpus") or [])},
                                _("leave the GPU list empty to run on the CPU, or pick a planning target")))
    elif not gpus:
        findings.append(Finding("warning", "no-gpu-facts",
                                _("Kiln has no description of these GPUs (the monitor has not reported them)."),
                                _("start the monitor on that host, or pick a planning target")))
    elif not meta:
        findings.append(Finding("warning", "no-model-meta",
                                _("No model metadata: the memory fit cannot be estimated."),
                                _("choose a downloaded model or a preset's model")))
    else:
        try:
            shape = fit.shape_from_gguf(meta) if "general.architecture" in meta else fit.shape_from_config(
                meta, vllm_version=info.version if info.engine == "vllm" else None)
            if exact and not shape.exact_weight_bytes:
                shape.exact_weight_bytes = int(exact)
            if settings.tensor_parallel_size > len(gpus) and gpus[0].compute_capability is not None:
                raise FitError(_("tensor parallel size %(tp)s needs %(tp)s GPUs; %(count)s chosen")
                               % {"tp": settings.tensor_parallel_size, "count": len(gpus)})
            report = fit.check_fit(shape, gpus if gpus[0].compute_capability is not None else gpus[:1],
                                   _cpu_safe(settings, gpus), weight_file_bytes=weight_bytes)
        except FitError as exc:
            # Told by the values, not the (translated) message: a GPU count short of the tensor parallel size.
            tp = settings.tensor_parallel_size
            short = tp < 1 or (tp > len(gpus) and gpus[0].compute_capability is not None)
            findings.append(Finding("error", "fit-input", str(exc),
                                    _("choose as many GPUs as the tensor parallel size") if short
                                    else _("check the model and the values in the form")))
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            findings.append(Finding("warning", "fit-unavailable",
                                    _("the model's metadata is incomplete for a memory estimate (%(error)s).")
                                    % {"error": exc},
                                    _("re-verify the model so that its config.json or GGUF header is read again")))
    if report is not None:
        _tidy_suggestions(report)
        if settings.engine != "llamacpp":   # llama.cpp takes a longer --ctx-size (the rules warn)
            _tidy_for_model_max(report, shape.max_context)
        _tidy_for_hardware(report, cpu=bool(gpus) and gpus[0].compute_capability is None)
    try:
        findings = preflight.check(info, gpus, settings, meta, fit_report=report) + findings
        # which catalog build to install (or registered runtime to choose) for this launch on this hardware
        findings = with_catalog(findings, catalog_findings(info, gpus, meta, settings,
                                                           host_runtimes=host_runtime_infos(runtime)))
    except preflight.RulesError as exc:
        findings.append(Finding("error", "rules-file", str(exc), "fix inference/preflight/rules.toml"))
    findings.sort(key=lambda f: f.level != "error")
    return {
        "findings": [f.as_dict() for f in findings],
        "fit": report.as_dict() if report else None,
        "has_errors": preflight.has_errors(findings),
        "gpus": [{"name": g.name, "total_bytes": g.total_memory_bytes,
                  "compute_capability": str(g.compute_capability) if g.compute_capability else None}
                 for g in gpus],
        "cpu_only": bool(gpus) and gpus[0].compute_capability is None,
        "runtime": {"engine": info.engine, "version": info.version, "name": info.name,
                    "sm70_build": info.is_sm70_build},
    }


def _host_of(profile_values) -> str:
    from django.conf import settings as django_settings

    host = getattr(profile_values, "host", None) or _values(profile_values).get("host")
    return host or django_settings.HOST_NAME


def _host_has_no_gpu(profile_values) -> bool:
    """GPUs were chosen, and the host's monitor says it has none (NVML found no GPU or no driver)."""
    if not _values(profile_values).get("gpus"):
        return False
    from dashboard.services import monitor_heartbeats

    try:
        beats = {b["host"]: b for b in monitor_heartbeats()}
    except Exception:  # Redis down: no heartbeat to go by, the warning stands
        return False
    beat = beats.get(_host_of(profile_values))
    if beat is None:
        return False
    nvml = beat.get("nvml") or {}
    return not nvml.get("ok") or not nvml.get("gpu_count")


def _weights_exceed_the_card(report: fit.FitReport) -> bool:
    return any(b.weights_bytes > b.total_bytes for b in report.gpus)


def _tidy_for_hardware(report: fit.FitReport, cpu: bool) -> None:
    """Advice in terms of the hardware planned: when the weights alone are more than
    a card holds, lowering activation or cache memory cannot help; say so. On the CPU
    there are no GPUs, and one request is one request."""
    if not report.fits and report.gpus and _weights_exceed_the_card(report):
        b = max(report.gpus, key=lambda g: g.weights_bytes)
        values = {"weights": b.weights_bytes / GiB, "total": b.total_bytes / GiB}
        if cpu:
            alone = _("the weights alone (%(weights).1f GiB) are more than this machine's RAM holds "
                      "(%(total).1f GiB)") % values
        else:
            alone = _("the weights alone (%(weights).1f GiB per GPU) are more than %(where)s holds "
                      "(%(total).1f GiB)") % {**values, "where": b.name}
        report.errors = [alone] + [e for e in report.errors if report.error_kinds.get(e) != fit.ERROR_NO_KV_ROOM]
        more = [s for s in report.suggestions if s.startswith("--tensor-parallel-size")]
        room = b.budget_bytes - b.overhead_bytes
        if not more and not cpu and room > 0:
            total_weights = b.weights_bytes * len(report.gpus)
            n = 2
            while n <= 8 and total_weights / n >= room * 0.8:  # leave the KV cache a fifth at least
                n *= 2
            if n <= 8:
                more = [_("--tensor-parallel-size %(n)s over %(n)s such GPUs (each holds 1/%(n)s of the weights)")
                        % {"n": n}]
        report.suggestions = more + [_("a smaller quantization of this model (4-bit AWQ, GPTQ or a GGUF such as "
                                       "Q4_K_M), or GPUs with more memory")]
    if cpu:  # fit.check_fit words its errors and notes for the RAM itself (no "per GPU")
        gpu_only = ("--gpu-memory-utilization", "--enforce-eager", "--max-num-batched-tokens", "--kv-cache-dtype fp8")
        report.suggestions = [s for s in report.suggestions if not s.startswith(gpu_only)]


def _tidy_suggestions(report: fit.FitReport) -> None:
    """Drop a '--max-model-len N' that repeats the current value; say instead what length
    lets the planned number of requests run at once."""
    out = []
    for s in report.suggestions:
        if s.startswith("--max-model-len ") and s.split()[1] == str(report.max_model_len):
            ctx = report.max_context_at_concurrency
            if report.max_num_seqs > 1 and 256 <= ctx < report.max_model_len:
                s = fit.suggestion(f"--max-model-len {ctx}",
                                   ngettext("lets %(count)s request of that length run at once",
                                            "lets %(count)s requests of that length run at once",
                                            report.max_num_seqs) % {"count": report.max_num_seqs})
            else:
                continue
        out.append(s)
    report.suggestions = out


def _tidy_for_model_max(report: fit.FitReport, model_max: int | None) -> None:
    """A context above the model's maximum: the advice is the maximum (the rule
    max-model-len-above-model says why), not memory changes, when the cache holds the requests anyway."""
    if not model_max or report.max_model_len <= int(model_max):
        return
    rest = report.suggestions
    if report.max_concurrency_at_context >= 1:
        # fit.check_fit's advice for a context longer than the room it finds (the model's maximum caps that room)
        advice = fit.context_advice()
        rest = [s for s in rest if not (s.startswith("--max-model-len ") or s in advice)]
    report.suggestions = [fit.suggestion(f"--max-model-len {int(model_max)}", _("the model's maximum"))] + rest


def preflight_for_profile(profile) -> dict:
    """preflight_for a LaunchProfile on its own host's GPUs (what the launch service checks)."""
    return preflight_for(profile_values=profile, model=profile.model, runtime=profile.runtime,
                         gpus=gpus_for_host(profile.host or profile.runtime.host, profile.gpus or []))


def _cpu_safe(settings: LaunchSettings, gpus: list[GPU]) -> LaunchSettings:
    if gpus and gpus[0].compute_capability is None and settings.tensor_parallel_size != 1:
        settings.tensor_parallel_size = 1       # a CPU run has no tensor parallel
    return settings


def launch_allowed(preflight_result: Mapping[str, Any] | None, override: bool) -> tuple[bool, str]:
    """(allowed, reason). Errors need the operator's explicit override; warnings never block."""
    if not preflight_result or not preflight_result.get("has_errors"):
        return True, ""
    errors = [f for f in preflight_result.get("findings", []) if f.get("level") == "error"]
    if override:
        return True, _("launched despite %(count)s preflight error(s) (override)") % {"count": len(errors)}
    first = errors[0] if errors else {"message": _("preflight found errors"), "fix": ""}
    values = {"message": first["message"], "fix": first["fix"], "more": len(errors) - 1}
    if len(errors) > 1:
        return False, _("Preflight: %(message)s Fix: %(fix)s (and %(more)s more). Tick 'launch anyway' to "
                        "override.") % values
    return False, _("Preflight: %(message)s Fix: %(fix)s. Tick 'launch anyway' to override.") % values


def record_preflight(deployment, preflight_result: Mapping[str, Any] | None, override: bool) -> None:
    """Store what preflight said (and whether it was overridden) on the Deployment row."""
    result = dict(preflight_result or {})
    type(deployment).objects.filter(pk=deployment.pk).update(
        preflight={"findings": result.get("findings", []), "has_errors": bool(result.get("has_errors"))},
        preflight_overridden=bool(override and result.get("has_errors")),
        fit_estimate=result.get("fit") or {})
    deployment.refresh_from_db(fields=["preflight", "preflight_overridden", "fit_estimate"])


# ---------------------------------------------------------------------------
# After a real start: vLLM's own figures
# ---------------------------------------------------------------------------

def record_capacity(deployment, log_text_or_lines) -> dict:
    """Parse vLLM's start-up lines and merge what they say into Deployment.capacity.

    Safe to call on every new chunk of log: figures found earlier are kept, new
    ones added (for tensor parallel the limiting rank wins, as in the parser).
    Returns the stored dict; {} and no write when the text holds none of them.
    """
    if getattr(deployment, "engine", "vllm") == "llamacpp":
        # llama-server's own figures: buffer sizes that add up over devices and caches
        merged = parse_llamacpp_memory(log_text_or_lines, deployment.capacity or {})
        if merged != (deployment.capacity or {}):
            type(deployment).objects.filter(pk=deployment.pk).update(capacity=merged)
            deployment.capacity = merged
        return dict(merged)
    found = parse_vllm_capacity(log_text_or_lines)
    found.update(parse_actual_usage(log_text_or_lines))
    if not found:
        return dict(deployment.capacity or {})
    merged = dict(deployment.capacity or {})
    for key, value in found.items():
        old = merged.get(key)
        if old is None or key in ("started", "max_model_len", "max_concurrency", "kv_cache_tokens", "gpu_blocks"):
            merged[key] = value
        elif key == "available_kv_cache_gib":
            merged[key] = min(old, value)
        else:
            merged[key] = max(old, value)
    if merged != (deployment.capacity or {}):
        type(deployment).objects.filter(pk=deployment.pk).update(capacity=merged)
        deployment.capacity = merged
    return merged


def estimate_vs_actual(deployment) -> list[dict]:
    """compare_with_estimate rows for the deployment page ([] before there is anything to compare)."""
    if not deployment.fit_estimate and not deployment.capacity:
        return []
    if getattr(deployment, "engine", "vllm") == "llamacpp":
        return compare_llamacpp(deployment.fit_estimate, deployment.capacity or {})
    if not deployment.fit_estimate:
        return [{"what": k, "estimate": None, "actual": v, "unit": "", "ratio": None}
                for k, v in deployment.capacity.items() if k != "started"]
    return compare_with_estimate(deployment.fit_estimate, deployment.capacity or {})
