"""Experiments: "is B really faster than A?" answered by repeated runs in a
fair order, unattended.

Web side: `experiment_create` checks the input, plans every step as a row
(launches, measurements, stops, in the order they will run) and queues the
runner on the host's worker; `experiment_cancel`; the preset builders.
Worker side: `experiment_execute` claims the experiment with a token, beats
a heartbeat, and walks the steps not yet done. A step already done is never
run again, so a worker that dies (or a panel restart that loses the queue)
continues at the first unfinished step once a worker of that host starts
(`resume_interrupted`, hooked to Celery's worker_ready).

Fair order:
- interleaved: every configuration is up at once and repetitions alternate
  (A B, then B A, ...), so drift over time (heat, other load) hits both
  alike. Only when the configurations' GPUs do not overlap (or none uses a
  GPU), or they are deployments already running.
- alternating: A, B, A, B blocks, one configuration up at a time; each
  repetition launches the configuration again (launch variance is measured
  too). The default when GPUs are shared.
- blocks: A A A, then B B B: one launch per configuration (quickest with
  engines that take minutes to start).

The engine processes are launched and stopped through the deployment
services in this process (the worker is busy with the experiment, so a
queued launch task could wait behind it); the monitor's watch loop marks a
launch Ready, as for any deployment. Each measurement is a BenchmarkRun
executed here by the benchmark service, so it stays in the history.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import uuid

from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone
from django.utils.translation import gettext as _, gettext_lazy

from dashboard import jobs
from dashboard.celery import host_queue
from inference.benchmarks import compare as compare_mod, services as benchmark_runs, verdict
from inference.benchmarks.scenarios import SCENARIOS
from inference.benchmarks.tasks import experiment_run
from inference.models import BenchmarkRun, Deployment, Experiment, ExperimentStep, LaunchProfile

logger = logging.getLogger(__name__)

MAX_CONFIGURATIONS = 6
MAX_REPETITIONS = 20
MAX_MEASUREMENTS = 400
MAX_POINTS = 12
LAUNCH_TIMEOUT_S = 30 * 60  # vLLM on a V100 may compile and load for many minutes
HEARTBEAT_S = 5.0
Status = Experiment.Status
StepStatus = ExperimentStep.Status


class ExperimentInputError(ValueError):
    """Bad input from the user; the message says what to change."""

    def __init__(self, message: str, code: str = "invalid"):
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------


def can_interleave(gpu_sets: list[list[int] | None]) -> bool:
    """All configurations may be up at once: their GPU sets do not overlap
    (configurations on no GPU never conflict over GPUs)."""
    seen: set[int] = set()
    for gpus in gpu_sets:
        gpus = set(gpus or [])
        if seen & gpus:
            return False
        seen |= gpus
    return True


def plan_steps(launched: list[bool], repetitions: int, points: list[tuple], order: str) -> list[dict]:
    """The steps in the order they run. `launched[i]`: configuration i is a
    launch profile (launched and stopped by the experiment) rather than a
    running deployment. `points`: (scenario, concurrency, prompt_tokens)."""
    n = len(launched)
    steps: list[dict] = []

    def measure(config, rep):
        for scenario, concurrency, prompt in points:
            steps.append({"kind": "measure", "configuration": config, "repetition": rep, "scenario": scenario,
                          "concurrency": concurrency, "prompt_tokens": prompt})

    def launch(config):
        if launched[config]:
            steps.append({"kind": "launch", "configuration": config})

    def stop(config):
        if launched[config]:
            steps.append({"kind": "stop", "configuration": config})

    if order == Experiment.Order.INTERLEAVED:
        for config in range(n):
            launch(config)
        for rep in range(repetitions):
            configs = list(range(n)) if rep % 2 == 0 else list(reversed(range(n)))  # A B, then B A
            for scenario, concurrency, prompt in points:
                for config in configs:
                    steps.append({"kind": "measure", "configuration": config, "repetition": rep,
                                  "scenario": scenario, "concurrency": concurrency, "prompt_tokens": prompt})
        for config in range(n):
            stop(config)
    elif order == Experiment.Order.ALTERNATING:
        for rep in range(repetitions):
            for config in range(n):
                launch(config)
                measure(config, rep)
                stop(config)
    else:
        for config in range(n):
            launch(config)
            for rep in range(repetitions):
                measure(config, rep)
            stop(config)
    for i, step in enumerate(steps):
        step["index"] = i
    return steps


def _levels(values, name: str, low: int, high: int) -> list[int]:
    if values in (None, "", []):
        return []
    if isinstance(values, str):
        values = [v for v in values.replace(" ", "").split(",") if v]
    try:
        levels = sorted({int(v) for v in values})
    except (TypeError, ValueError):
        raise ExperimentInputError(_("%(name)s: give whole numbers separated by commas, e.g. 1,4,16.")
                                   % {"name": name}) from None
    if any(not low <= v <= high for v in levels):
        raise ExperimentInputError(_("%(name)s: every value must be between %(low)s and %(high)s.")
                                   % {"name": name, "low": low, "high": high})
    if len(levels) > MAX_POINTS:
        raise ExperimentInputError(_("%(name)s: at most %(n)s values.") % {"name": name, "n": MAX_POINTS})
    return levels


def _configuration(item: dict, index: int) -> tuple[dict, LaunchProfile | None, Deployment | None]:
    profile = deployment = None
    if item.get("profile"):
        profile = item["profile"] if isinstance(item["profile"], LaunchProfile) else \
            LaunchProfile.objects.filter(pk=item["profile"]).select_related("runtime").first()
        if profile is None:
            raise ExperimentInputError(_("Configuration %(n)s: that launch profile does not exist.") % {"n": index + 1})
    elif item.get("deployment"):
        deployment = item["deployment"] if isinstance(item["deployment"], Deployment) else \
            Deployment.objects.filter(pk=item["deployment"]).select_related("profile").first()
        if deployment is None:
            raise ExperimentInputError(_("Configuration %(n)s: that deployment does not exist.") % {"n": index + 1})
        if deployment.status != Deployment.Status.READY:
            raise ExperimentInputError(
                _("Configuration %(n)s: deployment %(name)s is %(status)s; an experiment measures ready "
                  "deployments (or launches a profile itself).")
                % {"n": index + 1, "name": deployment.name, "status": deployment.get_status_display().lower()},
                code="not_ready")
    else:
        raise ExperimentInputError(_("Configuration %(n)s: choose a launch profile or a running deployment.")
                                   % {"n": index + 1})
    label = (item.get("label") or "").strip()[:40] or chr(ord("A") + index)
    name = profile.name if profile else deployment.name
    return ({"label": label, "name": name, "profile": profile.pk if profile else None,
             "deployment": deployment.pk if deployment else None}, profile, deployment)


def experiment_create(*, name: str = "", configurations: list[dict], scenario: str, user=None,
                      overrides: dict | None = None, scenarios: list[str] | None = None,
                      concurrency_levels=None, prompt_lengths=None, repetitions: int = 3,
                      order: str = "", slo_decode_tok_s: float | None = None, goodput=None,
                      preset: str = "") -> Experiment:
    """Check, plan and queue an experiment. `configurations`: [{"profile": id or
    LaunchProfile} or {"deployment": id or Deployment}, optional "label"]; the
    first is the baseline A. `scenarios` (optional) adds workloads measured
    at every point alongside `scenario`. `goodput`: SLOs as
    services.goodput_slos() takes them; without them a per-stream SLO
    (`slo_decode_tok_s`) defines goodput as TPOT <= 1000 / SLO ms, the same
    speed seen per request."""
    if not configurations:
        raise ExperimentInputError(_("Choose at least one configuration (two to compare)."))
    if len(configurations) > MAX_CONFIGURATIONS:
        raise ExperimentInputError(_("At most %(n)s configurations per experiment.") % {"n": MAX_CONFIGURATIONS})
    rows, gpu_sets, launched, hosts = [], [], [], set()
    for i, item in enumerate(configurations):
        row, profile, deployment = _configuration(item, i)
        rows.append(row)
        launched.append(profile is not None)
        hosts.add(profile.host if profile else deployment.host)
        source = profile or deployment.profile
        gpu_sets.append(list(source.gpus or []) if source else [])
    labels = [r["label"] for r in rows]
    if len(set(labels)) != len(labels):
        raise ExperimentInputError(_("Give each configuration its own label."))
    if len(hosts) != 1:
        raise ExperimentInputError(_("All configurations must be on one host: an experiment runs on one "
                                     "host's GPUs, so the comparison is fair."))
    host = hosts.pop()
    try:
        repetitions = int(repetitions)
    except (TypeError, ValueError):
        raise ExperimentInputError(_("Repetitions: give a whole number.")) from None
    if not 1 <= repetitions <= MAX_REPETITIONS:
        raise ExperimentInputError(_("Repetitions: between 1 and %(n)s (3 or more give a confidence interval "
                                     "worth reading).") % {"n": MAX_REPETITIONS})
    names = [scenario] + [s for s in (scenarios or []) if s and s != scenario]
    workload = {}
    for s in names:
        try:
            workload[s] = benchmark_runs.scenario_with_overrides(s, overrides).to_dict()
        except benchmark_runs.BenchmarkInputError as exc:
            raise ExperimentInputError(str(exc)) from None
    if concurrency_levels in (None, "", []) and SCENARIOS.get(scenario) and SCENARIOS[scenario].sweep:
        concurrency_levels = list(SCENARIOS[scenario].sweep)  # a sweep scenario sweeps by default
    concurrency = _levels(concurrency_levels, _("Concurrency levels"), *benchmark_runs.OVERRIDE_LIMITS["concurrency"])
    prompts = _levels(prompt_lengths, _("Prompt lengths"), *benchmark_runs.OVERRIDE_LIMITS["prompt_tokens"])
    for s in names:  # a length the scenario cannot take is refused now, not in the middle of the night
        for p in prompts:
            try:
                benchmark_runs.scenario_with_overrides(s, {**(overrides or {}), "prompt_tokens": p})
            except benchmark_runs.BenchmarkInputError as exc:
                raise ExperimentInputError(str(exc)) from None
    points = [(s, c, p) for s in names for c in (concurrency or [None]) for p in (prompts or [None])]
    if order not in Experiment.Order.values:
        order = Experiment.Order.INTERLEAVED if can_interleave(gpu_sets) else Experiment.Order.ALTERNATING
    elif order == Experiment.Order.INTERLEAVED and not can_interleave(gpu_sets):
        raise ExperimentInputError(_("Interleaved order needs every configuration up at once, but their GPUs "
                                     "overlap; choose alternating or blocks."), code="gpus_overlap")
    plan = plan_steps(launched, repetitions, points, order)
    measurements = sum(1 for s in plan if s["kind"] == "measure")
    if measurements > MAX_MEASUREMENTS:
        raise ExperimentInputError(_("That is %(n)s measurements; at most %(max)s per experiment. Use fewer "
                                     "repetitions or sweep points.") % {"n": measurements, "max": MAX_MEASUREMENTS})
    if slo_decode_tok_s not in (None, ""):
        try:
            slo_decode_tok_s = float(slo_decode_tok_s)
        except (TypeError, ValueError):
            raise ExperimentInputError(_("SLO: give tokens per second as a number.")) from None
        if not 0 < slo_decode_tok_s < 1e6:
            raise ExperimentInputError(_("SLO: give a positive number of tokens per second."))
    else:
        slo_decode_tok_s = None
    try:
        slos = benchmark_runs.goodput_slos(goodput)
    except benchmark_runs.BenchmarkInputError as exc:
        raise ExperimentInputError(str(exc)) from None
    if not slos and slo_decode_tok_s:
        slos = {"tpot": 1000.0 / slo_decode_tok_s}
    title = (name or "").strip()[:200] or " vs ".join(r["name"] for r in rows)[:200]
    with transaction.atomic():
        experiment = Experiment.objects.create(
            name=title, host=host, preset=preset, configurations=rows, scenario=scenario,
            workload={"overrides": {k: v for k, v in (overrides or {}).items() if v not in (None, "", [])},
                      "scenarios": workload, "goodput_slos": slos},
            concurrency_levels=concurrency, prompt_lengths=prompts, repetitions=repetitions, order=order,
            slo_decode_tok_s=slo_decode_tok_s, created_by=user,
            progress={"done": 0, "total": len(plan), "percent": 0, "current": _("queued")})
        ExperimentStep.objects.bulk_create([
            ExperimentStep(experiment=experiment, index=s["index"], kind=s["kind"], configuration=s["configuration"],
                           repetition=s.get("repetition"), scenario=s.get("scenario") or "",
                           concurrency=s.get("concurrency"), prompt_tokens=s.get("prompt_tokens"))
            for s in plan])
        jobs.enqueue(experiment_run, experiment.pk, queue=host_queue(host), on_refused=_not_queued)
    return experiment


def _not_queued(experiment_id: int, reason: str) -> None:
    Experiment.objects.filter(pk=experiment_id, status=Status.QUEUED).update(
        status=Status.FAILED, error=reason, finished=timezone.now())


def experiment_cancel(*, experiment: Experiment, user=None) -> Experiment:
    """Queued: cancelled at once. Running: the current measurement stops at its
    next progress check, then the runner stops what it launched."""
    if experiment.is_finished:
        raise ExperimentInputError(_("Experiment #%(id)s already %(status)s; nothing to cancel.")
                                   % {"id": experiment.pk, "status": experiment.get_status_display().lower()},
                                   code="finished")
    Experiment.objects.filter(pk=experiment.pk).update(cancel_requested=True)
    BenchmarkRun.objects.filter(experiment_steps__experiment=experiment,
                                status__in=(BenchmarkRun.Status.QUEUED, BenchmarkRun.Status.RUNNING)
                                ).update(cancel_requested=True)
    if Experiment.objects.filter(pk=experiment.pk, status=Status.QUEUED).update(
            status=Status.CANCELLED, finished=timezone.now()):
        ExperimentStep.objects.filter(experiment=experiment, status=StepStatus.PENDING).update(
            status=StepStatus.CANCELLED)
        _publish(experiment.pk)
    experiment.refresh_from_db()
    return experiment


def experiment_resume(*, experiment: Experiment, user=None) -> Experiment:
    """Run a cancelled or failed experiment's unfinished steps (done ones are kept)."""
    if experiment.status not in (Status.CANCELLED, Status.FAILED):
        raise ExperimentInputError(_("Only a cancelled or failed experiment can be resumed."), code="not_resumable")
    with transaction.atomic():
        experiment.steps.filter(status__in=(StepStatus.CANCELLED, StepStatus.FAILED, StepStatus.RUNNING)).update(
            status=StepStatus.PENDING, note="")
        Experiment.objects.filter(pk=experiment.pk).update(status=Status.QUEUED, cancel_requested=False, error="",
                                                           finished=None, claim="", pid=None)
        jobs.enqueue(experiment_run, experiment.pk, queue=host_queue(experiment.host), on_refused=_not_queued)
    experiment.refresh_from_db()
    return experiment


def resume_interrupted(*, host: str) -> int:
    """At worker start: queue again this host's experiments whose runner died."""
    count = 0
    for experiment in Experiment.objects.filter(host=host, status__in=(Status.QUEUED, Status.RUNNING)):
        if experiment.claim and not runner_gone(experiment):
            continue
        logger.info("resuming experiment %s (runner %s gone)", experiment.pk, experiment.worker or "none")
        jobs.send(experiment_run, experiment.pk, queue=host_queue(host), on_refused=_not_queued)
        count += 1
    return count


def _publish(experiment_id: int) -> None:
    experiment = Experiment.objects.filter(pk=experiment_id).first()
    if experiment is not None:
        jobs.publish({"type": "experiment", "id": experiment.pk, "status": experiment.status,
                      "status_label": experiment.get_status_display(), "colour": experiment.colour,
                      "progress": experiment.progress, "error": experiment.error})


# --------------------------------------------------------------------------
# Worker side
# --------------------------------------------------------------------------


class _Stop(Exception):
    """The experiment was cancelled (or lost its claim): stop walking the steps."""


def runner_gone(experiment: Experiment) -> bool:
    """Its runner is dead: no heartbeat for a while, or (on its own host) its process is gone,
    which a worker started right after a crash sees at once."""
    if experiment.worker_gone():
        return True
    if experiment.pid and experiment.host == settings.HOST_NAME and experiment.pid != os.getpid():
        try:
            os.kill(experiment.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
    return False


def claim_experiment(experiment_id: int, worker: str) -> str | None:
    """Take the experiment for this process; None when it is finished or a live runner has it."""
    experiment = Experiment.objects.filter(pk=experiment_id).first()
    if experiment is None or experiment.is_finished:
        return None
    if experiment.claim and not runner_gone(experiment):
        return None
    token = uuid.uuid4().hex
    now = timezone.now()
    taken = jobs.claim(Experiment.objects.filter(pk=experiment.pk, claim=experiment.claim,
                                                 status__in=(Status.QUEUED, Status.RUNNING)),
                       claim=token, worker=worker, pid=os.getpid(), heartbeat=now, status=Status.RUNNING,
                       started=experiment.started or now)
    return token if taken else None


class _Heartbeat:
    """Beats the claim every few seconds from a thread of its own (a measurement
    or a launch blocks the runner's thread for minutes)."""

    def __init__(self, experiment_id: int, token: str):
        self.experiment_id, self.token = experiment_id, token
        self.stopped = threading.Event()
        self.lost = False
        self.thread = threading.Thread(target=self._run, name=f"experiment-{experiment_id}-heartbeat", daemon=True)

    def _run(self):
        try:
            while not self.stopped.wait(HEARTBEAT_S):
                if not Experiment.objects.filter(pk=self.experiment_id, claim=self.token).update(
                        heartbeat=timezone.now()):
                    self.lost = True
                    return
        finally:
            # The thread ends: close its connection now. close_old_connections() would keep it
            # for CONN_MAX_AGE, and on PostgreSQL each ended heartbeat left one open.
            connections.close_all()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join(HEARTBEAT_S + 5)


def experiment_execute(experiment_id: int, worker: str = "") -> None:
    token = claim_experiment(experiment_id, worker)
    if token is None:
        logger.info("experiment %s: finished or run elsewhere; nothing to do", experiment_id)
        return
    with _Heartbeat(experiment_id, token) as beat:
        runner = _Runner(experiment_id, token, worker, beat)
        runner.run()


class _Runner:
    def __init__(self, experiment_id: int, token: str, worker: str, beat: _Heartbeat):
        self.id, self.token, self.worker, self.beat = experiment_id, token, worker, beat
        self.experiment = Experiment.objects.get(pk=experiment_id)
        self.labels = self.experiment.labels

    # -- helpers ----------------------------------------------------------

    def cancelled(self) -> bool:
        return Experiment.objects.filter(pk=self.id, cancel_requested=True).exists()

    def check(self) -> None:
        if self.beat.lost or not Experiment.objects.filter(pk=self.id, claim=self.token).exists():
            raise _Stop("lost")
        if self.cancelled():
            raise _Stop("cancelled")

    def progress(self, current: str) -> None:
        steps = list(self.experiment.steps.values_list("status", flat=True))
        done = sum(1 for s in steps if s in (StepStatus.DONE, StepStatus.FAILED, StepStatus.SKIPPED))
        value = {"done": done, "total": len(steps), "percent": round(100.0 * done / max(1, len(steps)), 1),
                 "current": current}
        Experiment.objects.filter(pk=self.id, claim=self.token).update(progress=value)
        _publish(self.id)

    def deployments(self) -> dict:
        return dict((Experiment.objects.get(pk=self.id).state or {}).get("deployments") or {})

    def remember(self, config: int, deployment_id: int | None) -> None:
        state = dict(Experiment.objects.get(pk=self.id).state or {})
        deps = dict(state.get("deployments") or {})
        deps[str(config)] = deployment_id
        state["deployments"] = deps
        Experiment.objects.filter(pk=self.id).update(state=state)

    def describe(self, step: ExperimentStep) -> str:
        label = self.labels[step.configuration] if step.configuration < len(self.labels) else "?"
        if step.kind == ExperimentStep.Kind.LAUNCH:
            return _("Launching %(label)s and waiting for Ready") % {"label": label}
        if step.kind == ExperimentStep.Kind.STOP:
            return _("Stopping %(label)s") % {"label": label}
        where = verdict.point_label(step.concurrency, step.prompt_tokens)
        text = _("Measuring %(label)s, repetition %(rep)s") % {"label": label, "rep": (step.repetition or 0) + 1}
        return f"{text} ({where})" if where else text

    # -- the walk ---------------------------------------------------------

    def run(self) -> None:
        outcome, error = Status.SUCCEEDED, ""
        try:
            for step in list(self.experiment.steps.order_by("index")):
                if step.status in (StepStatus.DONE, StepStatus.SKIPPED):
                    continue
                self.check()
                self.progress(self.describe(step))
                ExperimentStep.objects.filter(pk=step.pk).update(status=StepStatus.RUNNING, started=timezone.now(),
                                                                 note="")
                try:
                    status, note = self.do(step)
                except _Stop:
                    ExperimentStep.objects.filter(pk=step.pk).update(status=StepStatus.CANCELLED,
                                                                     finished=timezone.now())
                    raise
                except _Failed as failed:  # e.g. a configuration that went down: this step says why
                    ExperimentStep.objects.filter(pk=step.pk).update(status=StepStatus.FAILED, note=str(failed)[:2000],
                                                                     finished=timezone.now())
                    raise
                ExperimentStep.objects.filter(pk=step.pk).update(status=status, note=note[:2000],
                                                                 finished=timezone.now())
                if status == StepStatus.FAILED and step.kind == ExperimentStep.Kind.LAUNCH:
                    raise _Failed(note)
        except _Stop as stop:
            if str(stop) == "lost":
                logger.warning("experiment %s: claim lost; another runner has it", self.id)
                return
            outcome = Status.CANCELLED
        except _Failed as failed:
            outcome, error = Status.FAILED, str(failed)
        except Exception as exc:  # noqa: BLE001 - recorded on the row; the launched engines are stopped below
            logger.exception("experiment %s failed", self.id)
            outcome, error = Status.FAILED, _("The runner stopped: %(error)s") % {"error": f"{type(exc).__name__}: {exc}"}
        self.cleanup()
        if outcome == Status.SUCCEEDED:
            measured = self.experiment.steps.filter(kind=ExperimentStep.Kind.MEASURE, status=StepStatus.DONE)
            configs = set(measured.values_list("configuration", flat=True))
            missing = [self.labels[i] for i in range(len(self.labels)) if i not in configs]
            if missing:
                outcome, error = Status.FAILED, _("No successful measurement of %(labels)s; see the steps.") % {
                    "labels": ", ".join(missing)}
        left = StepStatus.CANCELLED if outcome == Status.CANCELLED else StepStatus.SKIPPED
        self.experiment.steps.filter(status__in=(StepStatus.PENDING, StepStatus.RUNNING)).update(status=left)
        Experiment.objects.filter(pk=self.id, claim=self.token).update(status=outcome, error=error,
                                                                       finished=timezone.now())
        self.progress(str(Experiment.Status(outcome).label))
        if outcome != Status.CANCELLED:  # the user cancelled it: nobody needs telling
            try:
                from django.urls import reverse

                from monitoring.alerts import hooks as alert_hooks

                alert_hooks.experiment_finished(self.experiment, failed=outcome == Status.FAILED, error=error,
                                                link=reverse("experiment_detail", args=[self.id]))
            except Exception:  # noqa: BLE001 - an alert that cannot be raised must not fail the experiment
                logger.exception("experiment %s: alert not raised", self.id)

    def do(self, step: ExperimentStep) -> tuple[str, str]:
        if step.kind == ExperimentStep.Kind.LAUNCH:
            deployment = self.bring_up(step.configuration)
            ExperimentStep.objects.filter(pk=step.pk).update(deployment=deployment)
            return StepStatus.DONE, _("Ready at %(url)s") % {"url": deployment.base_url}
        if step.kind == ExperimentStep.Kind.STOP:
            stopped = self.take_down(step.configuration)
            return StepStatus.DONE, (_("Stopped") if stopped else _("Nothing to stop"))
        return self.measure(step)

    def bring_up(self, config: int) -> Deployment:
        """Launch the configuration's profile (or reuse its deployment still Ready
        from before a restart) and wait for the watch loop to mark it Ready."""
        from inference.deployments import services as deployments

        spec = self.experiment.configurations[config]
        known = self.deployments().get(str(config))
        if known:
            deployment = Deployment.objects.filter(pk=known).first()
            if deployment is not None and deployment.status == Deployment.Status.READY:
                return deployment
            if deployment is not None and deployment.is_active:
                return self.wait_ready(deployment)
        if not spec.get("profile"):
            deployment = Deployment.objects.filter(pk=spec.get("deployment")).first()
            if deployment is None or deployment.status != Deployment.Status.READY:
                raise _Failed(_("Deployment %(name)s is no longer ready; start it again and resume the "
                                "experiment.") % {"name": spec.get("name")})
            return deployment
        profile = LaunchProfile.objects.filter(pk=spec["profile"]).select_related("runtime").first()
        if profile is None:
            raise _Failed(_("The launch profile of %(label)s was deleted.") % {"label": self.labels[config]})
        try:
            deployment = deployments.deployment_launch(profile=profile, user=self.experiment.created_by)
        except deployments.DeploymentError as exc:
            raise _Failed(_("%(label)s could not be launched: %(error)s") % {"label": self.labels[config],
                                                                             "error": exc}) from None
        except Exception as exc:  # InvalidLaunch and its problems dict
            raise _Failed(_("%(label)s could not be launched: %(error)s") % {"label": self.labels[config],
                                                                             "error": exc}) from None
        self.remember(config, deployment.pk)
        # The launch task was queued too; whichever claims the pending row first spawns it.
        deployments.deployment_start_process(deployment_id=deployment.pk)
        return self.wait_ready(deployment)

    def wait_ready(self, deployment: Deployment) -> Deployment:
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        while True:
            deployment.refresh_from_db()
            if deployment.status == Deployment.Status.READY and deployment.port:
                return deployment
            if not deployment.is_active or deployment.status == Deployment.Status.STOPPING:
                raise _Failed(_("%(name)s did not become ready: %(status)s. %(failure)s") % {
                    "name": deployment.name, "status": deployment.get_status_display().lower(),
                    "failure": deployment.failure or ""})
            if time.monotonic() > deadline:
                raise _Failed(_("%(name)s was not ready after %(m)s minutes (is the monitor running on host "
                                "%(host)s?).") % {"name": deployment.name, "m": LAUNCH_TIMEOUT_S // 60,
                                                   "host": deployment.host})
            self.check()
            time.sleep(1.0)

    def take_down(self, config: int) -> bool:
        """Stop what this experiment launched for the configuration (never a user's own deployment)."""
        from inference.deployments import services as deployments

        if not self.experiment.configurations[config].get("profile"):
            return False
        known = self.deployments().get(str(config))
        deployment = Deployment.objects.filter(pk=known).first() if known else None
        if deployment is None:
            return False
        live = [s for s in Deployment.ACTIVE if s != Deployment.Status.STOPPING]
        if jobs.claim(Deployment.objects.filter(pk=deployment.pk, status__in=live),
                      status=Deployment.Status.STOPPING, stop_requested=True):
            deployments.deployment_record_phase(deployment.pk, "stopping")
        deployment.refresh_from_db()
        if deployment.status == Deployment.Status.STOPPING or deployment.pid:
            deployments.deployment_stop_process(deployment_id=deployment.pk)
        self.remember(config, None)
        return True

    def measure(self, step: ExperimentStep) -> tuple[str, str]:
        deployment = self.bring_up(step.configuration)
        workload = self.experiment.workload or {}
        overrides = dict(workload.get("overrides") or {})
        if step.concurrency:
            overrides["concurrency"] = step.concurrency
        if step.prompt_tokens:
            overrides["prompt_tokens"] = step.prompt_tokens
        name = step.scenario or self.experiment.scenario
        scenario = benchmark_runs.scenario_with_overrides(name, overrides)
        scenario = dataclasses.replace(scenario, sweep=())
        if step.run_id:  # a run cut short by a dead worker: record why, measure again
            benchmark_runs.benchmark_fail_unexpected(step.run_id, RuntimeError(_("the worker restarted")))
        label = _("Experiment #%(id)s · %(label)s · repetition %(rep)s") % {
            "id": self.id, "label": self.labels[step.configuration], "rep": (step.repetition or 0) + 1}
        where = verdict.point_label(step.concurrency, step.prompt_tokens)
        run = benchmark_runs.benchmark_row(deployment=deployment, scenario=scenario,
                                           label=f"{label} · {where}" if where else label,
                                           user=self.experiment.created_by,
                                           goodput_slos=workload.get("goodput_slos") or None)
        ExperimentStep.objects.filter(pk=step.pk).update(run=run, deployment=deployment)
        if self.cancelled():
            BenchmarkRun.objects.filter(pk=run.pk).update(cancel_requested=True)
        benchmark_runs.benchmark_execute(run.pk, worker=self.worker)
        run.refresh_from_db()
        if run.status == BenchmarkRun.Status.CANCELLED:
            raise _Stop("cancelled")
        if run.status != BenchmarkRun.Status.SUCCEEDED:
            return StepStatus.FAILED, run.error or _("The run did not succeed.")
        head = (run.result or [{}])[0]
        return StepStatus.DONE, _("%(done)s requests, %(thr).1f output tok/s") % {
            "done": head.get("completed") or 0, "thr": head.get("output_throughput") or 0.0}

    def cleanup(self) -> None:
        """Whatever the outcome, nothing this experiment launched is left running."""
        for config, deployment_id in self.deployments().items():
            if deployment_id:
                try:
                    self.take_down(int(config))
                except Exception:  # noqa: BLE001 - keep stopping the others
                    logger.exception("experiment %s: stopping configuration %s failed", self.id, config)
        self.experiment.steps.filter(kind=ExperimentStep.Kind.STOP, status=StepStatus.PENDING).update(
            status=StepStatus.DONE, note=_("Stopped at the end"), finished=timezone.now())


class _Failed(Exception):
    """A step that the experiment cannot go on without failed (a launch)."""


def experiment_fail_unexpected(experiment_id: int, exc: BaseException) -> None:
    Experiment.objects.filter(pk=experiment_id, status__in=(Status.QUEUED, Status.RUNNING)).update(
        status=Status.FAILED, error=_("The worker failed: %(error)s") % {"error": f"{type(exc).__name__}: {exc}"},
        finished=timezone.now())
    _publish(experiment_id)


# --------------------------------------------------------------------------
# Reads
# --------------------------------------------------------------------------


def measurements(experiment: Experiment) -> list[dict]:
    """The successful measurements, as verdict.analyse takes them."""
    out = []
    steps = experiment.steps.filter(kind=ExperimentStep.Kind.MEASURE, status=StepStatus.DONE).select_related("run")
    for step in steps:
        run = step.run
        if run is None or run.status != BenchmarkRun.Status.SUCCEEDED or not run.result:
            continue
        head = run.result[0]
        out.append({"configuration": step.configuration, "repetition": step.repetition,
                    "scenario": step.scenario or experiment.scenario,
                    "concurrency": step.concurrency or head.get("max_concurrency"),
                    "prompt_tokens": step.prompt_tokens, "metrics": head, "run_id": run.pk})
    return out


def analysis(experiment: Experiment) -> dict:
    """Verdict per workload (scenario) and curves, for the page and the report."""
    rows = measurements(experiment)
    labels = experiment.labels
    workloads = []
    names = [experiment.scenario] + [s for s in (experiment.workload or {}).get("scenarios", {})
                                     if s != experiment.scenario]
    for name in names:
        mine = [m for m in rows if m["scenario"] == name]
        scenario = SCENARIOS.get(name)
        result = verdict.analyse(mine, labels)
        result["scenario"] = name
        result["title"] = _(scenario.title) if scenario else name
        result["curves"] = verdict.curves(mine, labels, experiment.slo_decode_tok_s)
        workloads.append(result)
    argvs: dict[int, list] = {}
    for step in experiment.steps.filter(kind=ExperimentStep.Kind.MEASURE).exclude(run=None).select_related("run"):
        argvs.setdefault(step.configuration, list((step.run.snapshot or {}).get("argv") or []))
    differences = []
    if len(argvs) == len(labels) and len(labels) > 1:
        diff = compare_mod.diff_launch_args([argvs[i] for i in range(len(labels))])
        differences = [{"flag": flag or _("(program and model)"), "values": values} for flag, values in diff.items()]
    slos = (experiment.workload or {}).get("goodput_slos") or {}
    return {"workloads": workloads, "labels": labels, "method": str(verdict.METHOD),
            "measurements": len(rows), "differences": differences, "goodput_slos": slos,
            "goodput": verdict.goodput_definition(slos)}


# --------------------------------------------------------------------------
# Presets: the questions users bring
# --------------------------------------------------------------------------

SWEET_SPOT_LEVELS = (1, 2, 4, 8, 16, 32, 64)
PRESETS = {
    "speculative": {
        "title": gettext_lazy("With vs without speculative decoding"),
        "description": gettext_lazy(
            "For a launch profile with a draft model (e.g. the DFlash2 preset): the same profile without its "
            "draft as A, with it as B; same model files and context length, prefix cache off in both, "
            "concurrency 1; a decode-heavy and a long-prefill workload, 3 repetitions. Checks the speed-up "
            "claims on your own card."),
    },
    "sweet-spot": {
        "title": gettext_lazy("Find the concurrency sweet spot"),
        "description": gettext_lazy(
            "Sweeps concurrency 1, 2, 4 … 64 (3 repetitions each) and marks where throughput stops growing "
            "and where per-stream speed falls below the SLO you set."),
    },
}


def has_draft(profile: LaunchProfile) -> bool:
    return bool(profile.speculative_config)


def _copy_profile(profile: LaunchProfile, name: str, **changes) -> LaunchProfile:
    """A copy of the user's profile for the experiment; theirs stays as it is."""
    copy = LaunchProfile.objects.get(pk=profile.pk)
    copy.pk = None
    copy.name = name[:200]
    copy.preset = ""
    for field, value in changes.items():
        setattr(copy, field, value)
    copy.save()
    return copy


def preset_speculative(*, profile: LaunchProfile, user=None, repetitions: int = 3) -> Experiment:
    if not has_draft(profile):
        raise ExperimentInputError(_("%(name)s has no draft model (speculative config); choose a profile with one, "
                                     "e.g. the DFlash2 preset.") % {"name": profile.name}, code="no_draft")
    baseline = _copy_profile(profile, _("%(name)s — without speculative decoding") % {"name": profile.name},
                             speculative_config={}, enable_prefix_caching=False)
    speculative = _copy_profile(profile, _("%(name)s — with speculative decoding") % {"name": profile.name},
                                enable_prefix_caching=False)
    return experiment_create(
        name=_("Speculative decoding: %(name)s") % {"name": profile.name}, preset="speculative", user=user,
        configurations=[{"profile": baseline, "label": _("without draft")},
                        {"profile": speculative, "label": _("with draft")}],
        scenario="decode-single-stream", scenarios=["prefill-long-prompt"], concurrency_levels=[1],
        repetitions=repetitions)


def preset_sweet_spot(*, configuration: dict, slo_decode_tok_s=None, goodput=None, user=None,
                      repetitions: int = 3) -> Experiment:
    """One configuration: one launch for the whole sweep is as fair as any order. The per-stream
    SLO also defines goodput (TPOT <= 1000 / SLO ms) unless `goodput` gives SLOs of its own."""
    return experiment_create(
        name=_("Concurrency sweet spot"), preset="sweet-spot", user=user, configurations=[configuration],
        scenario="concurrency-sweep", concurrency_levels=list(SWEET_SPOT_LEVELS), repetitions=repetitions,
        slo_decode_tok_s=slo_decode_tok_s, goodput=goodput, order=Experiment.Order.BLOCKS)
