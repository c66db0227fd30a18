"""Benchmark runs as rows: start, execute (in the Celery task), cancel,
import, export, and the reads the pages need (history, compare, charts).

The measuring itself is inference/benchmarks/ (plain Python); this module
ties it to Deployments and BenchmarkRun rows.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from pathlib import Path

from django.forms.models import model_to_dict
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from dashboard import jobs
from dashboard.celery import host_queue
from inference.benchmarks import compare as compare_mod
from inference.benchmarks.harness import BenchmarkError, LoadShape
from inference.benchmarks.scenarios import SCENARIOS, Scenario, get_scenario, run_scenario
from inference.benchmarks.tasks import benchmark_run
from inference.models import BenchmarkRun, Deployment
from monitoring.models import Gpu

# What the "new run" form may change in a preset, with sane bounds (the API's
# schema, inference/benchmarks/schemas.py, takes its bounds from here too).
OVERRIDE_LIMITS = {
    "num_prompts": (1, 10000),
    "num_warmups": (0, 100),
    "prompt_tokens": (1, 1_000_000),
    "output_tokens": (1, 100_000),
    "concurrency": (1, 4096),
}
# Per-request lists kept in the row (charts); generated texts are not.
DROPPED_DETAIL = ("generated_texts", "tokens_per_chunk")
PROGRESS_INTERVAL_S = 0.5


class BenchmarkInputError(ValueError):
    """Bad input from the user; the message says what to change."""

    def __init__(self, message: str, code: str = "invalid"):
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------
# Goodput SLOs
# --------------------------------------------------------------------------

GOODPUT_METRICS = ("ttft", "tpot", "e2el")
GOODPUT_MAX_MS = 24 * 3600 * 1000.0


def goodput_slos(value) -> dict[str, float]:
    """The goodput SLOs as the harness takes them: {"ttft": ms, "tpot": ms, "e2el": ms},
    only those given. `value` is a dict, or text as `vllm bench serve --goodput`
    takes it ("ttft:500 tpot:50", spaces or commas between); empty gives {}.
    A request counts towards goodput when it meets every SLO given."""
    if value in (None, "", {}, []):
        return {}
    if isinstance(value, str):
        pairs = []
        for item in value.replace(",", " ").split():
            name, sep, number = item.partition(":")
            if not sep or not name or not number:
                raise BenchmarkInputError(_("Goodput SLO %(item)s: write NAME:MILLISECONDS, e.g. ttft:500 tpot:50 "
                                            "e2el:5000.") % {"item": item})
            pairs.append((name.strip().lower(), number.strip()))
    elif isinstance(value, dict):
        pairs = [(str(name).strip().lower(), number) for name, number in value.items()
                 if number not in (None, "")]
    else:
        raise BenchmarkInputError(_("Goodput SLOs: give text such as ttft:500 tpot:50, or an object such as "
                                    "{\"ttft\": 500}."))
    out: dict[str, float] = {}
    for name, number in pairs:
        if name not in GOODPUT_METRICS:
            raise BenchmarkInputError(_("Goodput SLO %(name)s: use ttft, tpot or e2el (milliseconds), e.g. "
                                        "ttft:500 tpot:50.") % {"name": name})
        if name in out:
            raise BenchmarkInputError(_("Goodput SLO %(name)s is given twice; give each of ttft, tpot and e2el "
                                        "at most once.") % {"name": name})
        try:
            ms = float(number) if not isinstance(number, bool) else math.nan
        except (TypeError, ValueError):
            ms = math.nan
        if not 0 < ms <= GOODPUT_MAX_MS:
            raise BenchmarkInputError(_("Goodput SLO %(name)s: give a positive number of milliseconds (at most a "
                                        "day), not %(value)s.") % {"name": name, "value": number})
        out[name] = ms
    return {name: out[name] for name in GOODPUT_METRICS if name in out}


def goodput_text(slos) -> str:
    """The SLOs as `--goodput` writes them: "ttft:500 tpot:50" ("" when none;
    an imported file's odd values are skipped)."""
    if not isinstance(slos, dict):
        return ""
    values = [(name, compare_mod._number(slos.get(name))) for name in GOODPUT_METRICS]
    return " ".join(f"{name}:{value:g}" for name, value in values if value is not None)


# --------------------------------------------------------------------------
# Scenario + overrides
# --------------------------------------------------------------------------


def scenario_with_overrides(name: str, overrides: dict | None = None) -> Scenario:
    """The preset `name` with the form's overrides (only OVERRIDE_LIMITS keys and
    `sweep`, a list of concurrency levels)."""
    if name not in SCENARIOS:  # get_scenario's message, in the reader's language
        raise BenchmarkInputError(_("Unknown benchmark scenario %(name)r; choose one of: %(names)s.")
                                  % {"name": name, "names": ", ".join(SCENARIOS)})
    scenario = get_scenario(name)
    changes: dict = {}
    for key, value in (overrides or {}).items():
        if value in (None, "", []):
            continue
        if key == "sweep":
            levels = value
            if isinstance(value, str):
                levels = [v for v in value.replace(" ", "").split(",") if v]
            try:
                levels = tuple(int(v) for v in levels)
            except (TypeError, ValueError):
                raise BenchmarkInputError(_("sweep: give concurrency levels as whole numbers, e.g. 1,2,4.")) from None
            low, high = OVERRIDE_LIMITS["concurrency"]  # a sweep's levels are concurrencies
            if not levels or any(not low <= v <= high for v in levels):
                raise BenchmarkInputError(_("sweep: every concurrency level must be between %(low)s and %(high)s.")
                                          % {"low": low, "high": high})
            changes["sweep"] = levels
            continue
        if key not in OVERRIDE_LIMITS:
            raise BenchmarkInputError(_("%(key)s: not something a run can override; use one of %(names)s or sweep.")
                                      % {"key": key, "names": ", ".join(sorted(OVERRIDE_LIMITS))})
        low, high = OVERRIDE_LIMITS[key]
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise BenchmarkInputError(_("%(key)s: %(value)r is not a whole number.")
                                      % {"key": key, "value": value}) from None
        if not low <= number <= high:
            raise BenchmarkInputError(_("%(key)s: must be between %(low)s and %(high)s, not %(value)s.")
                                      % {"key": key, "low": low, "high": high, "value": number})
        if key == "concurrency":
            changes["load"] = dataclasses.replace(scenario.load, concurrency=number)
        else:
            changes[key] = number
    if "prompt_tokens" in changes and scenario.shared_prefix_tokens >= changes["prompt_tokens"]:
        raise BenchmarkInputError(_("prompt_tokens: the prefix-cache scenario shares a %(tokens)s-token prefix; "
                                    "give a longer prompt.") % {"tokens": scenario.shared_prefix_tokens})
    return dataclasses.replace(scenario, **changes)


def scenario_from_config(config: dict) -> Scenario:
    """Rebuild the Scenario stored by scenario.to_dict() on the row."""
    data = dict(config)
    data.pop("goodput_slos", None)  # stored beside the scenario, given to the harness on its own
    load = dict(data.pop("load"))
    rate = load.get("request_rate", "inf")
    load["request_rate"] = float(rate)
    data["sweep"] = tuple(data.get("sweep") or ())
    return Scenario(load=LoadShape(**load), **data)


# --------------------------------------------------------------------------
# Snapshot: what exactly was measured
# --------------------------------------------------------------------------


def gpu_bandwidth_gbps(gpu_name: str) -> float | None:
    """Peak memory bandwidth for an NVML GPU name ("Tesla V100-SXM2-32GB",
    "NVIDIA H100 80GB HBM3"), from compare.GPU_MEMORY_BANDWIDTH_GBPS."""
    name = (gpu_name or "").upper().replace("NVIDIA", "").replace("TESLA", "").replace("GEFORCE", "").strip()
    table = compare_mod.GPU_MEMORY_BANDWIDTH_GBPS
    if not name or name == "CPU":
        return None
    if "V100S" in name:
        return table["V100S"]
    if "A100" in name:
        return table["A100-80GB"] if "80G" in name else table["A100-40GB"]
    if "H100" in name:
        return table["H100-PCIe"] if "PCIE" in name else table["H100-SXM"]
    for key in sorted(table, key=len, reverse=True):  # "L40S" before "L4"
        if key.upper() in name:
            return table[key]
    return None


def gpu_info(host: str, indices: list[int] | None) -> dict:
    """GPU model and driver from the monitor's Gpu rows; "CPU" when the
    deployment uses none (or the monitor has not described that host)."""
    indices = list(indices or [])
    if not indices:
        return {"name": "CPU", "driver": "", "count": 0, "indices": [], "bandwidth_gbps": None}
    rows = list(Gpu.objects.filter(host=host, index__in=indices, present=True).order_by("index"))
    if not rows:
        return {"name": "unknown GPU", "driver": "", "count": len(indices), "indices": indices,
                "bandwidth_gbps": None, "note": "the monitor has not described this host's GPUs"}
    names = sorted({r.name for r in rows})
    name = names[0] if len(names) == 1 else " + ".join(names)
    return {"name": f"{len(rows)}× {name}" if len(rows) > 1 else name, "model": names[0],
            "driver": rows[0].driver_version, "cuda_driver": rows[0].cuda_driver_version,
            "count": len(rows), "indices": indices, "bandwidth_gbps": gpu_bandwidth_gbps(names[0])}


def model_weight_bytes(artifact) -> int:
    """ModelArtifact.weight_bytes, else the sum of its listed file sizes, else
    what the files on this host's disk weigh."""
    if artifact is None:
        return 0
    if artifact.weight_bytes:
        return int(artifact.weight_bytes)
    listed = sum(int(f.get("size") or 0) for f in (artifact.files or []) if isinstance(f, dict))
    if listed:
        return listed
    path = Path(artifact.path or "")
    try:
        if path.is_file():
            return path.stat().st_size
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*")
                       if p.is_file() and p.suffix in (".safetensors", ".bin", ".gguf", ".pt"))
    except OSError:
        pass
    return 0


def deployment_snapshot(deployment: Deployment) -> dict:
    profile = deployment.profile
    runtime = profile.runtime if profile else None
    artifact = deployment.model or (profile.model if profile else None)
    profile_values = {}
    if profile is not None:
        profile_values = model_to_dict(profile, exclude=["id", "created_by", "api_key"])
        profile_values["api_key_set"] = bool(profile.api_key)
    argv = list(deployment.argv or [])
    secret = deployment.api_key or (profile.api_key if profile else "")
    if secret:
        argv = ["***" if a == secret else a for a in argv]
    model_name = (artifact.name if artifact else "") or deployment.served_model_name or (
        Path(profile.model_path).name if profile else "")
    return {
        "deployment": {"id": deployment.pk, "name": deployment.name, "host": deployment.host,
                       "base_url": deployment.base_url, "pid": deployment.pid},
        "profile": profile_values,
        "argv": argv,
        "engine": {"name": deployment.engine, "version": runtime.version if runtime else "",
                   "runtime": runtime.name if runtime else "", "kind": runtime.kind if runtime else ""},
        "model": {"name": model_name, "path": artifact.path if artifact else (profile.model_path if profile else ""),
                  "sha256": dict(artifact.recorded_hashes or {}) if artifact else {},
                  "weight_bytes": model_weight_bytes(artifact)},
        "gpu": gpu_info(deployment.host, profile.gpus if profile else []),
    }


# --------------------------------------------------------------------------
# Start / cancel (web side)
# --------------------------------------------------------------------------


def benchmark_start(*, deployment: Deployment, scenario: str, user, label: str = "",
                    overrides: dict | None = None, goodput=None) -> BenchmarkRun:
    """Queue a run of `scenario` against a ready deployment on its host's worker.
    `goodput`: SLOs as goodput_slos() takes them (none: goodput is not measured).
    The row records the outcome either way (a broker that does not answer fails it)."""
    if deployment.status != Deployment.Status.READY or not deployment.port:
        raise BenchmarkInputError(_("Deployment %(name)r is %(status)s; a benchmark needs a ready deployment. "
                                    "Launch it and wait for Ready.")
                                  % {"name": deployment.name, "status": deployment.get_status_display().lower()},
                                  code="not_ready")
    chosen = scenario_with_overrides(scenario, overrides)
    slos = goodput_slos(goodput)
    run = benchmark_row(deployment=deployment, scenario=chosen, label=label, user=user, goodput_slos=slos)
    jobs.enqueue(benchmark_run, run.pk, queue=host_queue(deployment.host), on_refused=_not_queued)
    return run


def benchmark_row(*, deployment: Deployment, scenario: Scenario, label: str = "", user=None,
                  goodput_slos: dict | None = None) -> BenchmarkRun:
    """The queued row of a run (what it will measure, and on what); whoever
    made it runs it: the Celery task, or an experiment's runner in-process.
    The goodput SLOs (checked by goodput_slos()) are kept in the row's config."""
    snapshot = deployment_snapshot(deployment)
    config = scenario.to_dict()
    if goodput_slos:
        config["goodput_slos"] = dict(goodput_slos)
    return BenchmarkRun.objects.create(
        # The preset's title in the starter's language: from then on the label is the run's own text.
        deployment=deployment, scenario=scenario.name, label=label.strip()[:200] or _(scenario.title),
        source=BenchmarkRun.Source.KILN, config=config, snapshot=snapshot,
        model_name=snapshot["model"]["name"], engine=deployment.engine, gpu_name=snapshot["gpu"]["name"],
        progress={"phase": "queued", "percent": 0}, created_by=user,
    )


def _not_queued(run_id: int, reason: str) -> None:
    _finish(run_id, BenchmarkRun.Status.FAILED, error=reason, only_from=(BenchmarkRun.Status.QUEUED,))


def benchmark_cancel(*, run: BenchmarkRun, user=None) -> BenchmarkRun:
    """A queued run is cancelled at once; a running one at its next progress
    check (the worker stops sending and keeps what finished)."""
    if run.is_finished:
        raise BenchmarkInputError(_("Run #%(id)s already %(status)s; nothing to cancel.")
                                  % {"id": run.pk, "status": run.get_status_display().lower()}, code="finished")
    if run.source != BenchmarkRun.Source.KILN:
        raise BenchmarkInputError(_("Imported results do not run; nothing to cancel."), code="finished")
    BenchmarkRun.objects.filter(pk=run.pk).update(cancel_requested=True)
    if _finish(run.pk, BenchmarkRun.Status.CANCELLED, error="", only_from=(BenchmarkRun.Status.QUEUED,)):
        _publish(run.pk)
    run.refresh_from_db()
    return run


def _finish(run_id: int, status: str, *, error: str = "", only_from=None, **fields) -> bool:
    qs = BenchmarkRun.objects.filter(pk=run_id)
    if only_from:
        qs = qs.filter(status__in=only_from)
    return qs.update(status=status, finished=timezone.now(), error=error, **fields) == 1


def _publish(run_id: int) -> None:
    """Tell open pages (one group_send; consumers only forward)."""
    run = BenchmarkRun.objects.filter(pk=run_id).first()
    if run is not None:
        jobs.publish({"type": "benchmark", "id": run.pk, "status": run.status, "colour": run.colour,
                      "progress": run.progress, "error": run.error})


# --------------------------------------------------------------------------
# Execute (worker side, called by the Celery task)
# --------------------------------------------------------------------------


def _progress_dict(update) -> dict:
    total = max(1, update.total)
    within = 0.0 if update.phase == "warmup" else (update.completed + update.failed) / total
    percent = 100.0 * (update.step + within) / max(1, update.steps)
    return {"phase": update.phase, "completed": update.completed, "failed": update.failed, "total": update.total,
            "step": update.step, "steps": update.steps, "concurrency": update.concurrency,
            "elapsed_s": round(update.elapsed_s, 2), "percent": round(min(100.0, percent), 1)}


def step_result(step, index: int, label: str) -> dict:
    data = compare_mod.vllm_result_json(step, label=label, detailed=True)
    for key in DROPPED_DETAIL:
        data.pop(key, None)
    data["source"] = "kiln"
    data["step"] = index
    return data


def sum_server_metrics(steps: list[dict]) -> dict | None:
    """The /metrics deltas over the whole run (all sweep steps)."""
    parts = [s.get("server_metrics") for s in steps if s.get("server_metrics")]
    if not parts:
        return None
    total: dict = {"counters": {}}
    for part in parts:
        for key, value in part.items():
            if key == "counters":
                for name, v in (value or {}).items():
                    total["counters"][name] = total["counters"].get(name, 0.0) + v
            elif key != "prefix_cache_hit_rate" and isinstance(value, (int, float)):
                total[key] = total.get(key, 0.0) + value
    queries, hits = total.get("prefix_cache_queries"), total.get("prefix_cache_hits")
    total["prefix_cache_hit_rate"] = hits / queries if queries else None
    return total


def benchmark_execute(run_id: int, worker: str = "") -> None:
    """Claim the queued row, run its scenario against the deployment, record it.

    The harness runs in a thread of its own (it owns an event loop, where
    the ORM may not be called); this thread writes progress to the row every
    half second, publishes it, and turns the row's cancel flag into the
    harness's cancel event.
    """
    queued = BenchmarkRun.objects.filter(pk=run_id, status=BenchmarkRun.Status.QUEUED, cancel_requested=False)
    row = queued.only("snapshot").first()
    if row is None:
        return
    # Who runs it, in the claim itself: a worker started after this one died tells from
    # this record that the run is orphaned (runs_interrupted_sweep).
    snapshot = {**(row.snapshot or {}), "runner": runner_record()}
    if not jobs.claim(queued, status=BenchmarkRun.Status.RUNNING, started=timezone.now(), worker=worker,
                      progress={"phase": "preparing", "percent": 0}, snapshot=snapshot):
        return
    run = BenchmarkRun.objects.select_related("deployment").get(pk=run_id)
    _publish(run_id)
    deployment = run.deployment
    if deployment is None or deployment.status != Deployment.Status.READY or not deployment.base_url:
        state = deployment.get_status_display().lower() if deployment else _("deleted")
        _finish(run_id, BenchmarkRun.Status.FAILED, error=_("The deployment is %(status)s, not ready: launch it "
                                                            "again and start a new run.") % {"status": state})
        _publish(run_id)
        return
    try:
        scenario = scenario_from_config(run.config)
    except (TypeError, ValueError, KeyError) as exc:
        _finish(run_id, BenchmarkRun.Status.FAILED, error=_("The stored scenario is not valid (%(error)s).")
                % {"error": exc})
        _publish(run_id)
        return

    latest: dict = {}
    outcome: dict = {}
    cancel = threading.Event()
    slos = dict((run.config or {}).get("goodput_slos") or {})
    model = deployment.served_model_name or (run.snapshot.get("model") or {}).get("name") or "default"

    def on_progress(update) -> None:  # called inside the harness's event loop: no ORM here
        latest["value"] = _progress_dict(update)

    def measure() -> None:
        try:
            outcome["run"] = run_scenario(scenario, deployment.base_url, model, engine=deployment.engine or None,
                                          api_key=deployment.api_key or None, goodput_slos=slos,
                                          progress=on_progress, cancel=cancel)
        except BaseException as exc:  # reported on the row below
            outcome["error"] = exc

    written = None

    def push() -> None:  # on this (the task's) thread: the ORM is fine here
        nonlocal written
        value = latest.get("value")
        if value is not None and value != written:
            BenchmarkRun.objects.filter(pk=run_id).update(progress=value)
            written = value
            _publish(run_id)
        if not cancel.is_set() and BenchmarkRun.objects.filter(pk=run_id, cancel_requested=True).exists():
            cancel.set()

    jobs.run_with_progress(measure, push=push, every=PROGRESS_INTERVAL_S, name=f"benchmark-{run_id}")
    _record(run, scenario, outcome, cancel.is_set(), latest.get("value") or {})
    _publish(run_id)


def _record(run: BenchmarkRun, scenario: Scenario, outcome: dict, cancelled: bool, progress: dict) -> None:
    error = outcome.get("error")
    if error is not None:
        message = error.translated(_) if isinstance(error, BenchmarkError) else f"{type(error).__name__}: {error}"
        _finish(run.pk, BenchmarkRun.Status.FAILED, error=message, progress={**progress, "phase": "failed"})
        return
    scenario_run = outcome["run"]
    steps = [step_result(step, i, f"{run.title} @c={step.config['load'].get('concurrency')}"
                         if scenario.sweep else run.title)
             for i, step in enumerate(scenario_run.steps)]
    snapshot = dict(run.snapshot)
    snapshot["server_metrics"] = sum_server_metrics(steps)
    snapshot["tokenizer_source"] = scenario_run.tokenizer_source
    snapshot["client"] = steps[0].get("client") if steps else None
    completed = sum(s.get("completed") or 0 for s in steps)
    if cancelled or scenario_run.cancelled:
        status, message = BenchmarkRun.Status.CANCELLED, ""
    elif completed == 0:
        errors: dict = {}
        for s in steps:
            for text, n in (s.get("error_counts") or {}).items():
                errors[text] = errors.get(text, 0) + n
        first = max(errors, key=errors.get) if errors else gettext_noop("no request finished")
        # The harness marks its own errors (stream.py) with gettext_noop; a server's text passes unchanged.
        status = BenchmarkRun.Status.FAILED
        message = _("Every request failed: %(error)s") % {"error": _(first) if first else first}
    else:
        status, message = BenchmarkRun.Status.SUCCEEDED, ""
    progress = {**progress, "phase": status, "percent": 100.0 if status == "succeeded" else progress.get("percent", 0)}
    _finish(run.pk, status, error=message, result=steps, snapshot=snapshot, progress=progress)


def runner_record() -> dict:
    """This process as the runner of a benchmark: host, pid and the pid's start time
    (a pid the kernel gave to another process later has another start time)."""
    import os

    from django.conf import settings

    from inference.deployments.supervisor import process_start_time

    pid = os.getpid()
    return {"host": settings.HOST_NAME, "pid": pid, "start_time": process_start_time(pid)}


def runner_gone(run: BenchmarkRun, host: str) -> bool:
    """Is the process that claimed this running run surely dead? Answerable on its own
    host only; a run claimed before runners were recorded counts as orphaned (this is
    asked when a worker starts, so whoever ran it then has gone)."""
    import os

    from inference.deployments.supervisor import is_running

    runner = (run.snapshot or {}).get("runner")
    if not isinstance(runner, dict) or not runner.get("pid"):
        return True
    if runner.get("host") != host:
        return False
    if runner["pid"] == os.getpid():
        return False
    start = runner.get("start_time")
    if start is None:
        try:
            os.kill(int(runner["pid"]), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    return not is_running(int(runner["pid"]), int(start))


# Shown on a run whose worker died mid-measurement; its partial figures are not kept.
INTERRUPTED = gettext_noop("Interrupted: the worker running this benchmark stopped (killed, crashed or restarted) "
                           "before it finished, so it has no results; start the run again.")


def runs_interrupted_sweep(*, host: str) -> tuple[int, int]:
    """At worker start (the database is the record, not Redis's queue): this host's runs
    whose runner died are marked failed as interrupted, never succeeded with partial
    data; queued runs are queued again, since their message may have gone with a killed
    worker or Redis (a second message is harmless: only one claim of a queued row wins).
    Runs of an experiment that is still going are left to the experiment's own resume
    (it records the cut run and measures again). Returns (interrupted, queued again)."""
    interrupted = requeued = 0
    mine = BenchmarkRun.objects.filter(deployment__host=host, source=BenchmarkRun.Source.KILN)
    running = mine.filter(status=BenchmarkRun.Status.RUNNING).exclude(
        experiment_steps__experiment__status__in=("queued", "running"))
    for run in running:
        if not runner_gone(run, host):
            continue
        progress = {**(run.progress or {}), "phase": "interrupted"}
        if _finish(run.pk, BenchmarkRun.Status.FAILED, error=_(INTERRUPTED), only_from=(BenchmarkRun.Status.RUNNING,),
                   progress=progress, result=[]):
            interrupted += 1
            _publish(run.pk)
    for run in mine.filter(status=BenchmarkRun.Status.QUEUED, experiment_steps__isnull=True).only("pk"):
        if jobs.send(benchmark_run, run.pk, queue=host_queue(host), on_refused=_not_queued):
            requeued += 1
    return interrupted, requeued


def benchmark_fail_unexpected(run_id: int, exc: BaseException) -> None:
    """The task's last resort: a row is never left running."""
    _finish(run_id, BenchmarkRun.Status.FAILED, error=_("The worker failed: %(error)s")
            % {"error": f"{type(exc).__name__}: {exc}"},
            only_from=(BenchmarkRun.Status.QUEUED, BenchmarkRun.Status.RUNNING))
    _publish(run_id)


# --------------------------------------------------------------------------
# Import / export
# --------------------------------------------------------------------------

MAX_IMPORT_BYTES = 50 * 1024 * 1024


def benchmark_import(*, data: bytes, file_name: str = "", user=None, label: str = "") -> BenchmarkRun:
    """A `vllm bench serve --save-result` file (JSON or --append-result JSONL)
    or a guidellm report as one finished row (one step per result in it)."""
    if not data:
        raise BenchmarkInputError(_("The file is empty: choose a vllm bench --save-result JSON or a guidellm "
                                    "report."))
    if len(data) > MAX_IMPORT_BYTES:
        raise BenchmarkInputError(_("The file is %(size)s MiB; results larger than %(limit)s MiB are not accepted.")
                                  % {"size": len(data) // 2**20, "limit": MAX_IMPORT_BYTES // 2**20})
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise BenchmarkInputError(_("%(file)s is not UTF-8 text: is it a result JSON?")
                                  % {"file": file_name or _("The file")}) from None
    try:
        parsed = json.loads(text)
    except ValueError:
        try:
            parsed = [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as exc:
            raise BenchmarkInputError(_("%(file)s is not JSON (%(error)s).")
                                      % {"file": file_name or _("The file"), "error": exc}) from None
    try:
        results = compare_mod.load_results(parsed)
    except compare_mod.ResultFormatError as exc:
        raise BenchmarkInputError(str(exc)) from None
    if not results:
        raise BenchmarkInputError(_("The file holds no results."))
    if not any(_measured(r) for r in results):
        # A result with no finished request (or no figures at all) is not a measurement: refused,
        # never shown as "Succeeded" beside real runs.
        raise BenchmarkInputError(_("The file holds no measured data: no result has a finished request with "
                                    "throughput or latency figures. Export the run again once it has finished."),
                                  code="no_data")
    guidellm = any(r.get("source") == "guidellm" for r in results)
    source = BenchmarkRun.Source.GUIDELLM if guidellm else BenchmarkRun.Source.VLLM_BENCH
    for i, r in enumerate(results):
        r["step"] = i
        r.setdefault("label", None)
    first = results[0]
    model = str(first.get("model_id") or "")
    name = label.strip() or (Path(file_name).stem if file_name else "") or f"{source} import"
    kiln = first.get("kiln") if isinstance(first.get("kiln"), dict) else {}
    snapshot = {"imported_from": file_name, "source": source, "server_metrics": sum_server_metrics(results)}
    for key in ("profile", "argv", "engine", "model", "gpu"):
        if kiln.get(key) is not None:
            snapshot[key] = kiln[key]
    snapshot.setdefault("model", {"name": model, "sha256": {}})
    engine = (kiln.get("engine") or {}).get("name") or ""
    gpu = (kiln.get("gpu") or {}).get("name") or ""
    now = timezone.now()
    return BenchmarkRun.objects.create(
        scenario=kiln.get("scenario", ""), label=name[:200], source=source, status=BenchmarkRun.Status.SUCCEEDED,
        progress={"phase": "imported", "percent": 100}, result=results, snapshot=snapshot,
        model_name=model or snapshot["model"].get("name", ""), engine=engine, gpu_name=gpu,
        started=now, finished=now, created_by=user,
    )


def _measured(result: dict) -> bool:
    completed = compare_mod._number(result.get("completed"))
    figures = [compare_mod._number(result.get(k)) for k in ("output_throughput", "request_throughput",
                                                             "mean_e2el_ms", "mean_ttft_ms")]
    return bool(completed) and any(v is not None and v > 0 for v in figures)


def benchmark_export(run: BenchmarkRun) -> dict | list:
    """The run as `vllm bench serve --save-result` JSON: one object, or a list
    for a sweep (vllm's --append-result holds one per line). Kiln's snapshot
    rides along under "kiln", which vLLM readers ignore."""
    kiln = {key: run.snapshot.get(key) for key in ("profile", "argv", "engine", "model", "gpu", "server_metrics")}
    kiln.update({"id": run.pk, "scenario": run.scenario, "status": run.status, "source": run.source})
    out = []
    for step in run.result or []:
        data = {k: v for k, v in step.items() if k not in ("source", "step")}
        data["kiln"] = kiln
        out.append(data)
    return out[0] if len(out) == 1 else out


# --------------------------------------------------------------------------
# Reads: history filters, compare, charts
# --------------------------------------------------------------------------


def runs_filtered(*, model: str = "", engine: str = "", gpu: str = ""):
    qs = BenchmarkRun.objects.select_related("deployment", "created_by")
    if model:
        qs = qs.filter(model_name=model)
    if engine:
        qs = qs.filter(engine=engine)
    if gpu:
        qs = qs.filter(gpu_name=gpu)
    return qs


def filter_choices() -> dict:
    values = BenchmarkRun.objects.values_list("model_name", "engine", "gpu_name")
    return {"models": sorted({v[0] for v in values if v[0]}), "engines": sorted({v[1] for v in values if v[1]}),
            "gpus": sorted({v[2] for v in values if v[2]})}


def run_as_dict(run: BenchmarkRun, detailed: bool = False) -> dict:
    head = run.headline
    data = {
        "id": run.pk, "label": run.label, "title": run.title, "scenario": run.scenario, "source": run.source,
        "status": run.status, "colour": run.colour, "progress": run.progress, "error": run.error,
        "cancel_requested": run.cancel_requested, "deployment": run.deployment_id,
        "model": run.model_name, "engine": run.engine, "gpu": run.gpu_name,
        "created": run.created.isoformat() if run.created else None,
        "started": run.started.isoformat() if run.started else None,
        "finished": run.finished.isoformat() if run.finished else None,
        "created_by": run.created_by.username if run.created_by_id else None,
        "headline": {k: head.get(k) for k in ("output_throughput", "median_ttft_ms", "median_tpot_ms",
                                                "max_concurrency", "completed", "failed")} if head else {},
    }
    if detailed:
        data.update({"config": run.config, "snapshot": run.snapshot,
                     "result": [{k: v for k, v in s.items() if k not in compare_mod.VLLM_DETAIL_FIELDS}
                                for s in run.result or []]})
    return data


def decode_batch1(run: BenchmarkRun) -> float | None:
    """Decode tokens/s at batch 1: the concurrency-1 step's median per-stream rate."""
    for step in run.result or []:
        if step.get("max_concurrency") in (1, None) and step.get("median_decode_tokens_per_s_per_stream"):
            return step["median_decode_tokens_per_s_per_stream"]
    return None


def roofline(run: BenchmarkRun, bandwidth_gbps: float | None = None) -> dict:
    """Measured batch-1 decode vs weight bytes / memory bandwidth."""
    model = run.snapshot.get("model") or {}
    gpu = run.snapshot.get("gpu") or {}
    weight_bytes = model.get("weight_bytes") or 0
    bandwidth = bandwidth_gbps or gpu.get("bandwidth_gbps")
    measured = decode_batch1(run)
    out = {"measured": measured, "weight_bytes": weight_bytes, "bandwidth_gbps": bandwidth, "limit": None,
           "efficiency": None, "note": ""}
    if not weight_bytes:
        out["note"] = _("model weight size unknown")
    elif not bandwidth:
        out["note"] = (_("no memory bandwidth known for %(gpu)s; enter one to draw the line")
                       % {"gpu": gpu.get("name") or _("this run")})
    else:
        out["limit"] = compare_mod.roofline_decode_tokens_per_s(bandwidth, weight_bytes)
        if measured:
            out["efficiency"] = measured / out["limit"]
    return out


# The metrics the compare page shows first (the rest are folded away).
KEY_METRICS = ("output_throughput", "median_decode_tokens_per_s_per_stream", "median_ttft_ms", "median_tpot_ms",
               "median_e2el_ms", "request_goodput", "request_throughput", "failed")


def workload_of(run: BenchmarkRun) -> dict:
    """What load a run applied and on what: the fields that must match for two runs to be comparable."""
    config = run.config or {}
    load = config.get("load") or {}
    steps = [s for s in run.result or [] if isinstance(s, dict)]
    levels = sorted({s.get("max_concurrency") for s in steps if s.get("max_concurrency") is not None})
    rates = sorted({str(s.get("request_rate")) for s in steps if s.get("request_rate") is not None})
    done = sum(s.get("completed") or 0 for s in steps)
    prompt_mean = (sum(s.get("total_input_tokens") or 0 for s in steps) / done) if done else None
    output_mean = (sum(s.get("total_output_tokens") or 0 for s in steps) / done) if done else None
    model = run.snapshot.get("model") or {}
    hashes = model.get("sha256") or {}
    engine = run.snapshot.get("engine") or {}
    return {
        "scenario": run.scenario or "",
        "concurrency": ", ".join(str(v) for v in levels) or str(load.get("concurrency") or ""),
        "request_rate": ", ".join(rates) or str(load.get("request_rate") or ""),
        "prompts": str(config.get("num_prompts") or (steps[0].get("num_prompts") if steps else "") or ""),
        "prompt_tokens": f"{prompt_mean:.0f}" if prompt_mean else str(config.get("prompt_tokens") or ""),
        "output_tokens": f"{output_mean:.0f}" if output_mean else str(config.get("output_tokens") or ""),
        "engine": " ".join(x for x in (engine.get("name") or run.engine, engine.get("version")) if x),
        "gpu": run.gpu_name or (run.snapshot.get("gpu") or {}).get("name") or "",
        "model": run.model_name or model.get("name") or "",
        "model_hash": ", ".join(f"{v[:12]}…" for v in sorted(hashes.values())) if hashes else "",
        "goodput": goodput_text(config.get("goodput_slos") or (steps[0].get("goodput_slos_ms") if steps else None)),
    }


def workload_names() -> dict:
    return {"scenario": _("workload"), "concurrency": _("concurrency"), "request_rate": _("request rate"),
            "prompts": _("prompts"), "prompt_tokens": _("prompt tokens (mean)"),
            "output_tokens": _("output tokens (mean)"), "engine": _("engine and version"), "gpu": _("GPU"),
            "model": _("model"), "model_hash": _("model sha256"), "goodput": _("goodput SLO")}


def compare_runs(runs: list[BenchmarkRun], baseline_id: int | None = None,
                 bandwidth_gbps: float | None = None) -> dict:
    """Side by side, around the question "is B faster than A?": a verdict in
    words (runs with the same launch arguments and workload are pooled as
    repetitions of one configuration, which gives confidence intervals; single
    runs give ratios and say they cannot separate a difference from noise),
    what differs between the runs (launch arguments and workload), the
    metric table (ratios to the baseline), chart data and roofline per run."""
    if len(runs) < 2:
        raise BenchmarkInputError(_("Pick at least two runs to compare."))
    ids = [r.pk for r in runs]
    baseline = ids.index(baseline_id) if baseline_id in ids else 0
    heads = []
    for r in runs:
        head = dict(r.headline)
        head["label"] = f"#{r.pk} {r.title}"
        heads.append(head)
    argvs = [list(r.snapshot.get("argv") or []) for r in runs]
    table = compare_mod.compare(heads, baseline=baseline, launch_argvs=argvs if any(argvs) else None)
    table["run_ids"] = ids
    for row in table["rows"]:
        # One run each gives no interval: the direction is shown, never "better", "worse" or "same".
        row["verdicts"] = ["baseline" if i == baseline else ("unknown" if ratio is not None else "none")
                           for i, ratio in enumerate(row["ratios"])]
    workloads = [workload_of(r) for r in runs]
    names = workload_names()
    differences = [{"field": key, "name": names[key], "values": [w[key] for w in workloads]}
                   for key in names if len({w[key] for w in workloads}) > 1]
    return {"table": table, "charts": chart_data(runs), "rooflines": [roofline(r, bandwidth_gbps) for r in runs],
            "verdict": pooled_verdict(runs, baseline), "differences": differences,
            "argv_recorded": [bool(a) for a in argvs]}


def pooled_verdict(runs: list[BenchmarkRun], baseline: int = 0) -> dict:
    """Group runs by (launch arguments, workload): each group is a configuration,
    its runs repetitions; then the same statistics as an experiment."""
    from inference.benchmarks import verdict as verdict_mod

    keys, groups = [], []
    for r in runs:
        w = workload_of(r)
        # Launched on another port (or host, or with another key) is still the same configuration.
        argv = compare_mod.configuration_argv(r.snapshot.get("argv") or [])
        key = json.dumps([argv or [f"run {r.pk}"], {k: w[k] for k in
                          ("scenario", "concurrency", "prompt_tokens", "output_tokens", "engine", "gpu", "model",
                           "goodput")}],
                         sort_keys=True, default=str)
        if key not in keys:
            keys.append(key)
            groups.append([])
        groups[keys.index(key)].append(r)
    base_group = next(i for i, g in enumerate(groups) if runs[baseline] in g)
    order = [base_group] + [i for i in range(len(groups)) if i != base_group]
    labels = [", ".join(f"#{r.pk}" for r in groups[i]) for i in order]
    measurements = []
    for config, i in enumerate(order):
        for rep, r in enumerate(groups[i]):
            for step in r.result or []:
                if isinstance(step, dict):
                    measurements.append({"configuration": config, "repetition": rep, "concurrency":
                                         step.get("max_concurrency"), "prompt_tokens": None, "metrics": step,
                                         "run_id": r.pk})
    result = verdict_mod.analyse(measurements, labels)
    result["pooled"] = any(len(g) > 1 for g in groups)
    return result


def chart_data(runs: list[BenchmarkRun]) -> dict:
    """Plain series for the Plotly charts (the template only draws them)."""
    series = []
    for r in runs:
        steps = [s for s in r.result or [] if isinstance(s, dict)]
        prompt_len = []
        for s in steps:
            done = s.get("completed") or 0
            # No prompt length recorded: no point, rather than one at 0 tokens.
            prompt_len.append((s.get("total_input_tokens") or 0) / done if done and s.get("total_input_tokens")
                              else None)
        points = []  # per request: (prompt tokens, TTFT ms), when the run kept them
        for s in steps:
            for n, t in zip(s.get("input_lens") or [], s.get("ttfts") or []):
                if n and t:
                    points.append([n, t * 1000.0])
        series.append({
            "id": r.pk, "name": f"#{r.pk} {r.title}",
            "concurrency": [s.get("max_concurrency") for s in steps],
            "output_throughput": [s.get("output_throughput") for s in steps],
            "total_token_throughput": [s.get("total_token_throughput") for s in steps],
            "prompt_len": prompt_len,
            "mean_ttft_ms": [s.get("mean_ttft_ms") for s in steps],
            "request_points": points,
            "percentiles": {m: {p: r.headline.get(f"{p}_{m}_ms") for p in ("p50", "p90", "p95", "p99")}
                            for m in ("ttft", "tpot", "itl", "e2el")},
        })
    return {"series": series}


def scenario_choices() -> list[dict]:
    return [{"name": s.name, "title": _(s.title), "description": _(s.description), "prompt_tokens": s.prompt_tokens,
             "output_tokens": s.output_tokens, "num_prompts": s.num_prompts, "num_warmups": s.num_warmups,
             "concurrency": s.load.concurrency, "sweep": list(s.sweep)} for s in SCENARIOS.values()]


def ready_deployments():
    return Deployment.objects.filter(status=Deployment.Status.READY).select_related("profile", "model")
