"""Live messages in each reader's language.

The monitor and the workers publish status changes without a request, so their
status labels (and a deployment's phases and hint) are English. The websocket
consumer knows each tab's reader: it rewrites those few fields in the reader's
language before forwarding. Samples (the monitor's pre-encoded "text") carry no
labels and pass untouched.
"""
from django.conf import settings
from django.utils import translation
from django.utils.translation import gettext, trans_real


def _choices():
    from inference.models import Batch, BenchmarkRun, Deployment, EngineRuntime, Experiment, ModelArtifact

    # message type -> (the field holding the status, its choices)
    return {"deployment": ("status", Deployment.Status), "runtime": ("install_status", EngineRuntime.InstallStatus),
            "download": ("status", ModelArtifact.Status), "benchmark": ("status", BenchmarkRun.Status),
            "experiment": ("status", Experiment.Status), "batch": ("status", Batch.Status)}


def reader_language(user, cookies: dict, headers) -> str:
    """As a page request decides it: the account's saved language, the language
    cookie, then the browser's Accept-Language, then the default."""
    from dashboard.middleware import user_language

    supported = dict(settings.LANGUAGES)
    chosen = user_language(user) if user is not None else ""
    if chosen in supported:
        return chosen
    cookie = cookies.get(settings.LANGUAGE_COOKIE_NAME, "")
    if cookie in supported:
        return cookie
    accept = dict(headers).get(b"accept-language", b"").decode("latin-1")
    for code, _q in trans_real.parse_accept_lang_header(accept):
        try:
            return trans_real.get_supported_language_variant(code)
        except LookupError:
            continue
    return settings.LANGUAGE_CODE


def relabel(payload: dict, language: str) -> dict:
    """The message with its status label (and a deployment's phases and hint) in `language`."""
    kind = _choices().get(payload.get("type"))
    if kind is None:
        return payload
    field, choices = kind
    out = dict(payload)
    with translation.override(language):
        status = payload.get(field)
        if status in choices.values:
            out["status_label"] = str(choices(status).label)
        if payload.get("type") == "deployment":
            from inference.deployments import phases

            out["phase_label"] = phases.label(payload.get("phase", ""))
            out["phases"] = phases.labelled(payload.get("phases"))
            if payload.get("hint"):
                out["hint"] = gettext(payload["hint"])  # engine hints are msgids (gettext_noop in the plugins)
    return out
