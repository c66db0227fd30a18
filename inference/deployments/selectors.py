"""Reads for the deployment pages and API."""
from __future__ import annotations

import json
import os
import re
import shlex

from django.conf import settings
from django.http import Http404
from django.utils.translation import gettext

from inference.deployments import phases
from inference.deployments.services import preset_status
from inference.models import Deployment, EngineRuntime, LaunchProfile
from inference.deployments.presets import CHAT_COMPLETIONS, PRESETS, request_additions, request_defaults_for
from inference.deployments.supervisor import read_log_tail
from monitoring.liveness import offline_hosts


def deployment_list(host=None):
    rows = Deployment.objects.select_related("profile", "model")
    return rows.filter(host=host) if host else rows


def runtime_list():
    return EngineRuntime.objects.all()


def profile_list():
    return LaunchProfile.objects.select_related("runtime", "model")


def deployment_get_or_404(deployment_id: int) -> Deployment:
    dep = Deployment.objects.select_related("profile__runtime", "model").filter(pk=deployment_id).first()
    if dep is None:
        raise Http404(gettext("No deployment #%(id)s.") % {"id": deployment_id})
    mark_reachability([dep])
    return dep


def mark_reachability(deployments):
    """Mark the rows whose host is offline (its monitor stopped beating), so they are
    shown unreachable rather than as the status their host last wrote. Returns the list."""
    deployments = list(deployments)
    active = {d.host for d in deployments if d.status in Deployment.ACTIVE}
    offline = offline_hosts(active) if active else set()
    for d in deployments:
        d.host_offline = d.host in offline
    return deployments


def runtime_get_or_404(runtime_id: int) -> EngineRuntime:
    runtime = EngineRuntime.objects.filter(pk=runtime_id).first()
    if runtime is None:
        raise Http404(gettext("No runtime #%(id)s.") % {"id": runtime_id})
    return runtime


def profile_get_or_404(profile_id: int) -> LaunchProfile:
    profile = LaunchProfile.objects.select_related("runtime", "model").filter(pk=profile_id).first()
    if profile is None:
        raise Http404(gettext("No launch profile #%(id)s.") % {"id": profile_id})
    return profile


def preset_cards(host=None):
    return [preset_status(p, host or settings.HOST_NAME) for p in PRESETS]


def _ts(value):
    return value.isoformat() if value else None


def hint_shown(hint: str) -> str:
    """A failure hint in the reader's language. The worker stores an engine's hint in
    English (it has no request); the engines mark theirs with gettext_noop, so the
    catalogue has them. A hint put together from several pieces stays English."""
    return gettext(hint) if hint else ""


def deployment_dict(dep: Deployment) -> dict:
    return {
        "id": dep.pk, "name": dep.name, "host": dep.host, "engine": dep.engine,
        "profile": dep.profile_id, "model": dep.model_id,
        # What to show: "unreachable" while the host is offline; recorded_status is what the host last wrote.
        "status": dep.shown_status, "status_label": str(dep.shown_status_label), "colour": dep.colour,
        "recorded_status": dep.status, "host_online": not dep.host_offline,
        "phase": dep.phase, "phase_label": phases.label(dep.phase), "phases": phases.labelled(dep.phases),
        "pid": dep.pid, "port": dep.port,
        "bind_host": dep.bind_host, "base_url": dep.base_url, "openai_base_url": dep.openai_base_url,
        "served_model_name": dep.served_model_name, "api_key_set": bool(dep.api_key),
        "argv": ["<hidden>" if dep.api_key and a == dep.api_key else a for a in dep.argv or []],
        "command": dep.command, "restarts": dep.restarts,
        "failure": dep.failure, "hint": hint_shown(dep.hint), "log_tail": dep.log_tail,
        "created": _ts(dep.created), "started": _ts(dep.started), "ready_at": _ts(dep.ready_at),
        "stopped": _ts(dep.stopped),
    }


def runtime_dict(rt: EngineRuntime) -> dict:
    return {
        "id": rt.pk, "name": rt.name, "host": rt.host, "engine": rt.engine, "kind": rt.kind, "path": rt.path,
        "image": rt.image, "version": rt.version, "torch_cuda": rt.torch_cuda, "cuda_archs": rt.cuda_archs,
        "detect_status": rt.detect_status, "detect_detail": rt.detect_detail, "detected_at": _ts(rt.detected_at),
        # A managed runtime's install job (empty for one registered by hand).
        "catalog_key": rt.catalog_key, "status": rt.install_status, "status_label": rt.get_install_status_display(),
        "colour": rt.install_colour, "install_step": rt.install_step, "install_progress": rt.install_progress,
        "install_log": rt.install_log, "install_error": rt.install_error,
        "install_started": _ts(rt.install_started), "install_finished": _ts(rt.install_finished),
        "install_bytes": rt.install_bytes,
    }


def catalog_rows(host=None) -> list[dict]:
    """The engine catalog as the Runtimes page shows it: each build, and whether it is installed here."""
    from inference.deployments.runtimes import HARDWARE, catalog

    host = host or settings.HOST_NAME
    installed = {}
    for rt in EngineRuntime.objects.filter(host=host).exclude(catalog_key=""):
        installed.setdefault(rt.catalog_key, rt)
    order = {h: i for i, h in enumerate(HARDWARE)}
    return [{"build": b, "runtime": installed.get(b.key)}
            for b in sorted(catalog().values(), key=lambda b: (order[b.hardware], not b.installable))]


LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)")


def deployment_log_with_offsets(dep: Deployment, lines=200, max_bytes=256 * 1024):
    """The log's last complete lines, each line's end offset, and the offset
    after the last one -- split as the monitor's LogFollower splits, so the
    page can tell which live lines it already shows."""
    try:
        with open(dep.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            start = max(0, size - max_bytes)
            f.seek(start)
            data = f.read()
    except OSError:
        return (dep.log_tail or "").splitlines()[-lines:], [], 0
    out, ends = [], []
    end = start
    for m in LINE.finditer(data):
        end = start + m.end()
        text = m.group(0).decode("utf-8", "replace").rstrip("\r\n")
        if text.strip():
            out.append(text)
            ends.append(end)
    if start and out:  # the first line is probably cut
        out, ends = out[1:], ends[1:]
    return out[-lines:], ends[-lines:], end


def deployment_log(dep: Deployment, lines=200) -> list[str]:
    """The log's last lines (the file lives on the engine's host; the stored tail otherwise)."""
    if dep.log_path:
        out = read_log_tail(dep.log_path, lines)
        if out:
            return out
    return (dep.log_tail or "").splitlines()[-lines:]


SNIPPET_PLACEHOLDER = "http://127.0.0.1:PORT/v1"


def snippets(dep: Deployment, show_key: bool) -> dict:
    """Copyable curl and openai-python examples for a deployment's endpoint."""
    key = (dep.api_key if show_key else "<API key>") if dep.api_key else ""
    model = dep.served_model_name or "default"
    # Before the port is chosen the snippets say PORT; the live page swaps in
    # the endpoint once the engine has one.
    base = dep.openai_base_url or SNIPPET_PLACEHOLDER
    request = {"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 64}
    # The snippets call the engine itself, not the gateway, so they carry what the
    # gateway would add for this preset (the demo's stop at the next "User:" turn).
    preset = dep.profile.preset if dep.profile_id and dep.profile else ""
    added = request_additions(request_defaults_for(preset).get(CHAT_COMPLETIONS), request)
    body = json.dumps({**request, **added})
    url = f"{base}/chat/completions"
    curl = ["curl", url, "-H", "Content-Type: application/json"]
    if key:
        curl += ["-H", f"Authorization: Bearer {key}"]
    curl += ["-d", body]
    python = (
        "from openai import OpenAI\n\n"
        f"client = OpenAI(base_url={base!r}, "
        f"api_key={key or 'none'!r})\n"
        f"reply = client.chat.completions.create(\n"
        f"    model={model!r},\n"
        f"    messages=[{{\"role\": \"user\", \"content\": \"Hello!\"}}],\n"
        f"    max_tokens=64,\n"
        + "".join(f"    {name}={value!r},\n" for name, value in added.items())
        + ")\n"
        "print(reply.choices[0].message.content)\n"
    )
    return {"curl": " ".join(shlex.quote(a) for a in curl), "python": python,
            "placeholder": "" if dep.openai_base_url else SNIPPET_PLACEHOLDER}
