"""Which hub the panel offers first: Hugging Face, a Hugging Face mirror, or ModelScope.

Many teams using Kiln are in China, where huggingface.co is often unreachable
and hf-mirror.com or ModelScope are what works. The choice is made once (the
Overview page asks on first start; PREFERRED_HUB sets a default) and decides the
hub a preset's "Download the model" link fills in, and the Models page's default.
An operator's choice is kept in DATA_DIR so that it survives restarts without a
database table for one word.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.utils.translation import gettext_lazy as _

HUGGINGFACE = "huggingface"
HF_MIRROR = "hf-mirror"
MODELSCOPE = "modelscope"
CHOICES = (HUGGINGFACE, HF_MIRROR, MODELSCOPE)
LABELS = {
    HUGGINGFACE: _("Hugging Face"),
    HF_MIRROR: _("Hugging Face mirror (hf-mirror.com)"),
    MODELSCOPE: _("ModelScope (魔搭)"),
}


def _path() -> Path:
    return Path(settings.DATA_DIR) / "preferred_hub"


def chosen_hub() -> str:
    """The operator's saved choice, else PREFERRED_HUB, else "" (not chosen yet)."""
    try:
        saved = _path().read_text().strip()
    except OSError:
        saved = ""
    if saved in CHOICES:
        return saved
    return settings.PREFERRED_HUB or ""


def preferred_hub() -> str:
    return chosen_hub() or HUGGINGFACE


def set_preferred_hub(value: str) -> str:
    if value not in CHOICES:
        raise ValueError(f"{value!r} is not a hub Kiln knows: choose {', '.join(CHOICES)}.")
    path = _path()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(value + "\n")
    tmp.replace(path)
    return value


def hf_endpoint_for(hub: str) -> str:
    """The Hugging Face endpoint a download from `hub` should use."""
    if hub == HF_MIRROR and settings.HF_ENDPOINT == "https://huggingface.co":
        return settings.HF_MIRROR_ENDPOINT
    return settings.HF_ENDPOINT


@dataclass(frozen=True)
class HubPick:
    """Where to fetch a model: the Models page's hub field ("hf" / "modelscope"),
    the repository id on that hub, and the endpoint ("" = the setting's)."""

    form_hub: str
    repo_id: str
    endpoint: str = ""


def pick_hub(hf_id: str = "", modelscope_id: str = "", hub: str | None = None) -> HubPick:
    """The preferred hub where the model is listed there, else the other one."""
    hub = hub or preferred_hub()
    if hub == MODELSCOPE and modelscope_id:
        return HubPick("modelscope", modelscope_id)
    if hf_id:
        endpoint = hf_endpoint_for(hub) if hub == HF_MIRROR else ""
        return HubPick("hf", hf_id, endpoint if endpoint != settings.HF_ENDPOINT else "")
    return HubPick("modelscope", modelscope_id)


def unreachable_advice(hub: str, url: str = "") -> str:
    """What to try when `hub` ("huggingface" or "modelscope") at `url` cannot be reached."""
    from urllib.parse import urlsplit

    if hub == MODELSCOPE:
        return str(_("If ModelScope cannot be reached from here, download the model from Hugging Face or its "
                     "mirror %(mirror)s instead (choose the hub on the Models page).")
                   % {"mirror": settings.HF_MIRROR_ENDPOINT})
    host = urlsplit(url or settings.HF_ENDPOINT).hostname or ""
    if host != "huggingface.co":
        return str(_("If the mirror %(host)s cannot be reached, try ModelScope (hub: ModelScope), where most "
                     "Qwen models are listed, or another mirror (HF_ENDPOINT).") % {"host": host})
    return str(_("huggingface.co is often unreachable from mainland China: try the mirror %(mirror)s "
                  "(Endpoint field, or HF_ENDPOINT) or download the model from ModelScope (hub: ModelScope).")
               % {"mirror": settings.HF_MIRROR_ENDPOINT})
