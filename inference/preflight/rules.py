"""Preflight: catch at the launch form what would otherwise be a dead engine and a log line.

The rules are data, in ``rules.toml`` next to this file: a person reads
and extends them there. This module only knows how to evaluate each kind of
condition (PREDICATES) and fill in the message.

    findings = check(runtime, gpus, settings, model_meta)
    [Finding(level='error', code='bf16-needs-sm80',
             message='bfloat16 needs compute capability 8.0; Tesla V100-SXM2-32GB is 7.0.',
             fix='use --dtype half')]
"""
from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Mapping, Sequence

from django.utils.translation import gettext

from inference.preflight import fit
from inference.preflight.fit import GPU, LaunchSettings, parse_cc

RULES_PATH = os.path.join(os.path.dirname(__file__), "rules.toml")

# For a runtime outside the engine catalog: names that say it carries sm_70 kernels. Only that: what it
# runs on sm_70 (AWQ, NVFP4) comes from its catalog entry (build_runs_quantization).
SM70_BUILDS = ("1cat-vllm", "1cat_vllm", "vllm-sm70", "sm70")


@dataclass
class RuntimeInfo:
    """What a registered engine build says about itself."""

    engine: str                               # vllm | sglang | llamacpp
    version: str = ""                         # "0.33.1", "0.11.0rc2.dev12+g1234"
    cuda_version: str | None = None           # CUDA the build was compiled for, "12.8"
    cuda_arch_list: list[str] | None = None   # torch.cuda.get_arch_list(): ["sm_75", "sm_80", "compute_90"]
    name: str = ""                            # the build's name in Kiln, e.g. "1Cat-vLLM 0.10 sm70"
    sm70_build: bool | None = None            # None: guess from the name
    catalog_key: str = ""                     # the engine catalog build Kiln installed it from

    @property
    def build(self):
        """Its engine catalog entry (runtimes.Build): by catalog_key, else by name; None outside the catalog."""
        from inference.deployments.runtimes import build_of

        return build_of(self.catalog_key, self.name)

    @property
    def is_sm70_build(self) -> bool:
        if self.sm70_build is not None:
            return self.sm70_build
        build = self.build
        if build is not None:
            return build.hardware == "sm70"
        name = self.name.lower()
        return any(tag in name for tag in SM70_BUILDS)


@dataclass
class Finding:
    level: str          # "error" | "warning"
    code: str
    message: str
    fix: str

    def as_dict(self) -> dict:
        return {"level": self.level, "code": self.code, "message": self.message, "fix": self.fix}


@dataclass
class Rule:
    code: str
    level: str
    when: dict
    message: str
    fix: str


class RulesError(ValueError):
    """The rules file is malformed; the message names the rule and the problem."""


@lru_cache(maxsize=4)
def load_rules(path: str = RULES_PATH) -> tuple[Rule, ...]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RulesError(f"cannot read preflight rules {path}: {exc}") from exc
    rules = []
    for i, raw in enumerate(data.get("rule", [])):
        code = raw.get("code") or f"rule #{i + 1}"
        if raw.get("level") not in ("error", "warning"):
            raise RulesError(f"{path}: rule {code!r} needs level 'error' or 'warning'")
        unknown = set(raw.get("when", {})) - set(PREDICATES)
        if unknown:
            raise RulesError(f"{path}: rule {code!r} has unknown conditions {sorted(unknown)}; "
                             f"known: {sorted(PREDICATES)}")
        if not raw.get("message") or not raw.get("fix"):
            raise RulesError(f"{path}: rule {code!r} needs a message and a fix")
        rules.append(Rule(code, raw["level"], dict(raw.get("when", {})), raw["message"], raw["fix"]))
    return tuple(rules)


# ---------------------------------------------------------------------------
# The facts one rule looks at
# ---------------------------------------------------------------------------

@dataclass
class Context:
    runtime: RuntimeInfo
    settings: LaunchSettings
    model: Mapping[str, Any]
    gpu: GPU | None
    quant: str                      # awq gptq nvfp4 mxfp4 fp8 int8 bnb gguf none
    dtype: str                      # the weight dtype the engine will run
    lm_head_quantized: bool
    heads: int | None
    extra: dict = field(default_factory=dict)

    @property
    def cc(self) -> float | None:
        return self.gpu.cc if self.gpu else None


def _version_tuple(text: str) -> tuple[int, ...]:
    nums = re.findall(r"\d+", text.split("+")[0].split("rc")[0].split("dev")[0])
    return tuple(int(n) for n in nums[:3]) or (0,)


def _arch_kernels_missing(ctx: Context) -> bool:
    arches = ctx.runtime.cuda_arch_list
    if not arches or ctx.cc is None:
        return False        # unknown: other rules (stock-vllm-dropped-sm70) speak then
    sm = int(round(ctx.cc * 10))
    have_sass = {int(a[3:]) for a in arches if a.startswith("sm_") and a[3:].isdigit()}
    have_ptx = {int(a[8:]) for a in arches if a.startswith("compute_") and a[8:].isdigit()}
    # SASS runs on its own major arch at an equal or higher minor; PTX JIT-compiles upward
    sass_ok = any(s // 10 == sm // 10 and s <= sm for s in have_sass)
    return not (sass_ok or any(p <= sm for p in have_ptx))


def _driver_below_runtime(ctx: Context) -> bool:
    drv = ctx.gpu.driver_cuda_version if ctx.gpu else None
    rt = ctx.runtime.cuda_version
    if not drv or not rt:
        return False
    return _version_tuple(str(drv)) < _version_tuple(str(rt))


def _spec_method(ctx: Context) -> str:
    spec = ctx.settings.speculative_config or {}
    return str(spec.get("method", "")).lower()


def _model_max(ctx: Context) -> int | None:
    """The model's maximum context as this runtime's vLLM derives it (RoPE scaling applied; for
    SGLang and llama.cpp the version does not count)."""
    return fit.model_max_len(ctx.model, ctx.runtime.version if ctx.runtime.engine == "vllm" else None)


def _above_model_max(ctx: Context) -> bool:
    """--max-model-len above the model's maximum (vLLM and SGLang refuse to start)."""
    top = _model_max(ctx)
    return bool(top and ctx.settings.max_model_len and int(ctx.settings.max_model_len) > top)


def _slots(settings: LaunchSettings) -> int:
    return max(1, int(settings.max_num_seqs or 1))


def _slot_context(settings: LaunchSettings) -> int | None:
    """What one llama-server slot gets: --ctx-size split evenly over the --parallel slots."""
    return int(settings.max_model_len) // _slots(settings) if settings.max_model_len else None


def _slot_above_model_max(ctx: Context) -> bool:
    """llama.cpp: a slot's share of --ctx-size above the context the model was trained for (its GGUF's
    context_length). llama.cpp starts all the same: it warns and caps each slot at that length."""
    top = _model_max(ctx)
    slot = _slot_context(ctx.settings)
    return bool(top and slot and slot > top)


def _runs_quantization(ctx: Context) -> bool:
    """The runtime's catalog entry lists the checkpoint's format. A runtime outside the catalog
    is taken for stock vLLM unless the planning form's 'sm70 build' box says otherwise."""
    build = ctx.runtime.build
    if build is not None and build.quantizations:
        return ctx.quant in build.quantizations
    return ctx.runtime.sm70_build is True


PREDICATES: dict[str, Callable[[Context, Any], bool]] = {
    "engine": lambda c, v: c.runtime.engine.lower() in [e.lower() for e in v],
    "gpu_cc_below": lambda c, v: c.cc is not None and c.cc < float(v),
    "gpu_cc_at_least": lambda c, v: c.cc is not None and c.cc >= float(v),
    "dtype": lambda c, v: c.dtype in v,
    "kv_cache_dtype_prefix": lambda c, v: str(c.settings.kv_cache_dtype or "").lower().startswith(v),
    "quantization": lambda c, v: c.quant in v,
    "sm70_build": lambda c, v: c.runtime.is_sm70_build == bool(v),
    "build_runs_quantization": lambda c, v: _runs_quantization(c) == bool(v),
    "max_model_len_above_model": lambda c, v: _above_model_max(c) == bool(v),
    "slot_context_above_model": lambda c, v: _slot_above_model_max(c) == bool(v),
    "arch_list_known": lambda c, v: bool(c.runtime.cuda_arch_list) == bool(v),
    "version_at_least": lambda c, v: bool(c.runtime.version)
    and _version_tuple(c.runtime.version) >= _version_tuple(str(v)),
    "attention_backend": lambda c, v: (c.settings.attention_backend or "") in v,
    "arch_kernels_missing": lambda c, v: _arch_kernels_missing(c) == bool(v),
    "driver_cuda_below_runtime": lambda c, v: _driver_below_runtime(c) == bool(v),
    "speculative_method": lambda c, v: _spec_method(c) in [m.lower() for m in v],
    "lm_head_quantized": lambda c, v: c.lm_head_quantized == bool(v),
    "heads_not_divisible_by_tp": lambda c, v: bool(c.heads)
    and (c.heads % max(1, c.settings.tensor_parallel_size) != 0) == bool(v),
}


def _quant_name(model: Mapping[str, Any], settings: LaunchSettings) -> tuple[str, bool]:
    """(format name, LM head quantized?) from the model's metadata."""
    if settings.quantization:
        return _normalise_quant(settings.quantization), False
    if "general.architecture" in model:
        return "gguf", False
    cfg = fit.text_config(model)
    q = cfg.get("quantization_config") or {}
    if not q:
        return "none", False
    try:
        fmt = fit.weight_format(cfg)
    except fit.FitError:
        return _normalise_quant(str(q.get("quant_method", "unknown"))), fit.lm_head_quantized(q)
    return _normalise_quant(fmt.name), fmt.lm_head_quantized


def launch_needs(model_meta: Mapping[str, Any] | None, settings: LaunchSettings | None
                 ) -> tuple[str | None, str | None]:
    """(checkpoint format, speculative method) a launch needs its engine build to run, by the names
    the engine catalog uses ("none": unquantized); None: no speculative decoding, or no model metadata."""
    settings = settings or LaunchSettings()
    model = model_meta or {}
    quant = _quant_name(model, settings)[0] if (model or settings.quantization) else None
    method = str((settings.speculative_config or {}).get("method", "")).lower() or None
    return quant, method


def _normalise_quant(name: str) -> str:
    n = name.lower()
    for key in ("awq", "gptq", "nvfp4", "mxfp4", "fp8", "bnb", "gguf"):
        if key in n:
            return key
    if n.startswith("int") or "w8a8" in n:
        return "int8"
    if "fp4" in n or "modelopt" in n:
        return "nvfp4"
    return n


def _effective_dtype(model: Mapping[str, Any], settings: LaunchSettings) -> str:
    d = str(settings.dtype or "auto").lower()
    if d in ("half", "float16", "fp16"):
        return "float16"
    if d in ("bf16", "bfloat16"):
        return "bfloat16"
    if d == "float32":
        return "float32"
    if "general.architecture" in model:
        return "float16"
    return fit.config_dtype(fit.text_config(model)).lower()


def check(runtime_info: RuntimeInfo, gpus: Sequence[GPU], settings: LaunchSettings | None,
          model_meta: Mapping[str, Any] | None, *, fit_report: "fit.FitReport | None" = None,
          rules_path: str = RULES_PATH) -> list[Finding]:
    """Evaluate every rule; errors first. `model_meta` is config.json or GGUF metadata."""
    settings = settings or LaunchSettings(engine=runtime_info.engine)
    model = model_meta or {}
    quant, lm_head_q = _quant_name(model, settings)
    dtype = _effective_dtype(model, settings)
    heads = None
    if "general.architecture" in model:
        h = model.get(f"{model['general.architecture']}.attention.head_count")
        heads = int(h) if isinstance(h, int) else None
    elif model:
        heads = fit.text_config(model).get("num_attention_heads")
    devices: list[GPU | None] = [g for g in gpus if g.compute_capability is not None] or [None]
    findings: list[Finding] = []
    for rule in load_rules(rules_path):
        for gpu in devices:
            ctx = Context(runtime_info, settings, model, gpu, quant, dtype, lm_head_q, heads)
            if all(PREDICATES[name](ctx, value) for name, value in rule.when.items()):
                # The wording is translated before the values go in (locale/: rules_messages.py lists them).
                findings.append(Finding(rule.level, rule.code, _fill(gettext(rule.message), ctx), _fill(gettext(rule.fix), ctx)))
                break       # one finding per rule, not one per GPU
    if fit_report is not None and not fit_report.fits:
        fix = fit_report.suggestions[0] if fit_report.suggestions else gettext("use more GPUs or a smaller checkpoint")
        cpu = bool(gpus) and all(g.compute_capability is None for g in gpus)
        nofit = gettext("the model does not fit in this machine's RAM") if cpu \
            else gettext("the model does not fit on these GPUs")
        # The rule says it with the fix; the fit's own line (fit.check_fit) would come with memory advice.
        too_long = any(f.code == "max-model-len-above-model" for f in findings)
        errors = [e for e in fit_report.errors
                  if not (too_long and fit_report.error_kinds.get(e) == fit.ERROR_ABOVE_MODEL_MAX)]
        if not errors and not too_long:
            errors = [nofit]
        for err in errors:
            findings.append(Finding("error", "does-not-fit", err, fix))
    findings.sort(key=lambda f: f.level != "error")
    return findings


def _fill(text: str, ctx: Context) -> str:
    cc = ctx.cc
    model_max = _model_max(ctx)
    values = {
        "gpu": ctx.gpu.name if ctx.gpu else "CPU",
        "cc": f"{cc:.1f}" if cc is not None else "none",
        "sm": f"sm_{int(round(cc * 10))}" if cc is not None else "cpu",
        "dtype": ctx.dtype, "quant": ctx.quant, "engine": ctx.runtime.engine,
        "version": ctx.runtime.version or "?", "runtime_cuda": ctx.runtime.cuda_version or "?",
        "driver_cuda": (ctx.gpu.driver_cuda_version if ctx.gpu else None) or "?",
        "backend": ctx.settings.attention_backend or "default",
        "tp": ctx.settings.tensor_parallel_size, "heads": ctx.heads or "?",
        "max_model_len": ctx.settings.max_model_len or "?", "model_max": model_max or "?",
        "slots": _slots(ctx.settings), "slot_context": _slot_context(ctx.settings) or "?",
        "ctx_for_slots": model_max * _slots(ctx.settings) if model_max else "?",
    }
    try:
        return text.format(**values)
    except (KeyError, IndexError):
        return text     # a placeholder we do not know stays as written


def has_errors(findings: Sequence[Finding]) -> bool:
    return any(f.level == "error" for f in findings)


__all__ = ["RuntimeInfo", "Finding", "check", "has_errors", "load_rules", "PREDICATES", "parse_cc"]
