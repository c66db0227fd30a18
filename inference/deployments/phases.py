"""A deployment's phases (its timeline) as the reader reads them.

Rows keep the phase codes the supervisor and the watch loop write ("loading_weights",
"compiling", ...); pages, the API and live messages show these labels instead, in the
reader's language. A code without a label (an engine plugin's own) is shown as it is.
"""
from django.utils.translation import gettext_lazy as _

from inference.engines.base import PHASE_COMPILING, PHASE_LOADING, PHASE_READY, PHASE_STARTING

LABELS = {
    "queued": _("queued"),
    "waiting for the engine": _("waiting for the engine"),
    PHASE_STARTING: _("starting"),
    PHASE_LOADING: _("loading weights"),
    PHASE_COMPILING: _("compiling"),
    PHASE_READY: _("ready"),
    "restarted": _("restarted"),
    "relaunched": _("launched again after a worker restart"),
    "crashed": _("crashed"),
    "failed": _("failed"),
    "stopping": _("stopping"),
    "stopped": _("stopped"),
}


def label(phase: str) -> str:
    """The phase in the active language ("" stays "")."""
    return str(LABELS.get(phase, phase or ""))


def labelled(phases) -> list[dict]:
    """A timeline ([{"phase", "at"}]) with each entry's label added."""
    return [{**p, "label": label(p.get("phase", ""))} for p in phases or []]
