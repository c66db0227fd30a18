"""Experiment planning, input checks, cancel and resume (no engine: the runner
itself is driven end to end in test_experiments_engine.py)."""
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from inference.benchmarks import experiments
from inference.benchmarks.experiments import ExperimentInputError, can_interleave, plan_steps
from inference.models import Deployment, EngineRuntime, Experiment, ExperimentStep, LaunchProfile

POINTS = [("decode-single-stream", 1, None), ("decode-single-stream", 4, None)]


def _kinds(steps):
    return [(s["kind"], s["configuration"], s.get("repetition"), s.get("concurrency")) for s in steps]


def test_interleaved_alternates_the_order_of_repetitions():
    steps = plan_steps([True, True], 2, POINTS, "interleaved")
    assert _kinds(steps) == [
        ("launch", 0, None, None), ("launch", 1, None, None),
        ("measure", 0, 0, 1), ("measure", 1, 0, 1), ("measure", 0, 0, 4), ("measure", 1, 0, 4),
        ("measure", 1, 1, 1), ("measure", 0, 1, 1), ("measure", 1, 1, 4), ("measure", 0, 1, 4),
        ("stop", 0, None, None), ("stop", 1, None, None)]
    assert [s["index"] for s in steps] == list(range(12))


def test_alternating_blocks_relaunch_each_repetition_and_blocks_launch_once():
    alternating = _kinds(plan_steps([True, True], 2, POINTS[:1], "alternating"))
    assert alternating == [("launch", 0, None, None), ("measure", 0, 0, 1), ("stop", 0, None, None),
                           ("launch", 1, None, None), ("measure", 1, 0, 1), ("stop", 1, None, None)] * 1 + [
        ("launch", 0, None, None), ("measure", 0, 1, 1), ("stop", 0, None, None),
        ("launch", 1, None, None), ("measure", 1, 1, 1), ("stop", 1, None, None)]
    blocks = _kinds(plan_steps([True, False], 2, POINTS[:1], "blocks"))
    # a running deployment (configuration 1) is never launched or stopped by the experiment
    assert blocks == [("launch", 0, None, None), ("measure", 0, 0, 1), ("measure", 0, 1, 1), ("stop", 0, None, None),
                      ("measure", 1, 0, 1), ("measure", 1, 1, 1)]


def test_gpus_that_overlap_cannot_be_up_at_once():
    assert can_interleave([[0], [1]]) and can_interleave([[], []]) and can_interleave([[0, 1], [2, 3], []])
    assert not can_interleave([[0, 1], [1]])


@pytest.fixture
def profiles(db):
    runtime = EngineRuntime.objects.create(host=settings.HOST_NAME, name="llama", engine="llamacpp",
                                           kind="executable", path="/bin/false")
    a = LaunchProfile.objects.create(name="one", host=settings.HOST_NAME, runtime=runtime, model_path="/m.gguf",
                                     gpus=[0])
    b = LaunchProfile.objects.create(name="two", host=settings.HOST_NAME, runtime=runtime, model_path="/m.gguf",
                                     gpus=[0])
    return a, b


def _create(profiles, **kw):
    a, b = profiles
    args = {"configurations": [{"profile": a.pk}, {"profile": b.pk}], "scenario": "decode-single-stream",
            "repetitions": 2}
    args.update(kw)
    return experiments.experiment_create(**args)


def test_create_plans_rows_and_picks_a_fair_order_for_shared_gpus(profiles, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        experiment = _create(profiles, concurrency_levels="4, 1", prompt_lengths=[64])
    assert experiment.order == Experiment.Order.ALTERNATING  # both on GPU 0: one at a time, A B A B
    assert experiment.concurrency_levels == [1, 4] and experiment.prompt_lengths == [64]
    assert experiment.labels == ["A", "B"]
    measures = experiment.steps.filter(kind=ExperimentStep.Kind.MEASURE)
    assert measures.count() == 2 * 2 * 2
    assert experiment.progress["total"] == experiment.steps.count() == 8 + 8  # a launch and a stop per block


@pytest.mark.parametrize("kw,words", [
    ({"repetitions": 0}, "Repetitions"),
    ({"repetitions": "x"}, "Repetitions"),
    ({"concurrency_levels": "1,a"}, "Concurrency levels"),
    ({"concurrency_levels": [0]}, "between 1"),
    ({"scenario": "nope"}, "Unknown benchmark scenario"),
    ({"order": "interleaved"}, "overlap"),
    ({"configurations": []}, "at least one"),
    ({"configurations": [{"profile": 99999}]}, "does not exist"),
    ({"configurations": [{}]}, "choose a launch profile"),
    ({"slo_decode_tok_s": "-3"}, "SLO"),
    ({"repetitions": 20, "concurrency_levels": list(range(1, 13))}, "at most"),
])
def test_bad_input_is_refused_with_a_message_that_says_what_to_change(profiles, kw, words):
    with pytest.raises(ExperimentInputError) as err:
        _create(profiles, **kw)
    assert words in str(err.value)
    assert Experiment.objects.count() == 0


def test_a_deployment_that_is_not_ready_is_refused(profiles):
    dep = Deployment.objects.create(name="down", host=settings.HOST_NAME, profile=profiles[0],
                                    status=Deployment.Status.STOPPED)
    with pytest.raises(ExperimentInputError, match="stopped"):
        _create(profiles, configurations=[{"profile": profiles[0].pk}, {"deployment": dep.pk}])


def test_cancel_a_queued_experiment_and_resume_it(profiles, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        experiment = _create(profiles)
        experiments.experiment_cancel(experiment=experiment)
    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.CANCELLED
    assert set(experiment.steps.values_list("status", flat=True)) == {"cancelled"}
    with pytest.raises(ExperimentInputError):
        experiments.experiment_cancel(experiment=experiment)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        experiments.experiment_resume(experiment=experiment)
    assert len(callbacks) == 1  # queued again
    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.QUEUED
    assert set(experiment.steps.values_list("status", flat=True)) == {"pending"}


def test_a_runner_with_a_fresh_heartbeat_keeps_its_claim_a_dead_one_loses_it(profiles,
                                                                            django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        experiment = _create(profiles)
    token = experiments.claim_experiment(experiment.pk, "w1")
    assert token and experiments.claim_experiment(experiment.pk, "w2") is None
    Experiment.objects.filter(pk=experiment.pk).update(heartbeat=timezone.now() - timedelta(minutes=5))
    second = experiments.claim_experiment(experiment.pk, "w2")
    assert second and second != token
    experiment.refresh_from_db()
    assert experiment.worker == "w2" and experiment.status == Experiment.Status.RUNNING


def test_the_speculative_preset_measures_the_same_profile_with_and_without_its_draft(
        profiles, django_capture_on_commit_callbacks):
    draft = profiles[0]
    draft.speculative_config = {"method": "dflash", "model": "z-lab/Qwen3.8-27B-DFlash2", "num_speculative_tokens": 15}
    draft.max_model_len, draft.enable_prefix_caching = 8192, True
    draft.save()
    with pytest.raises(ExperimentInputError, match="no draft model"):
        experiments.preset_speculative(profile=profiles[1])
    with django_capture_on_commit_callbacks(execute=False):
        experiment = experiments.preset_speculative(profile=draft)
    without, with_draft = (LaunchProfile.objects.get(pk=c["profile"]) for c in experiment.configurations)
    assert without.speculative_config == {} and with_draft.speculative_config == draft.speculative_config
    for copy in (without, with_draft):
        assert copy.pk != draft.pk and copy.enable_prefix_caching is False
        assert (copy.model_path, copy.max_model_len, copy.gpus) == (draft.model_path, 8192, draft.gpus)
    draft.refresh_from_db()
    assert draft.enable_prefix_caching is True  # the user's own profile is left alone
    assert experiment.concurrency_levels == [1]
    assert set(experiment.steps.values_list("scenario", flat=True)) >= {"decode-single-stream", "prefill-long-prompt"}
    # Fair order, as for any experiment: both copies need the profile's GPU 0, so one is up at a time and
    # they take turns, relaunched each repetition (A, B, A, B), never A A A then B B B.
    assert experiment.order == Experiment.Order.ALTERNATING
    steps = list(experiment.steps.order_by("index").values_list("kind", "configuration", "repetition", "scenario"))
    assert [(k, c, r) for k, c, r, _s in steps] == [
        step for rep in range(3) for config in (0, 1)
        for step in (("launch", config, None), ("measure", config, rep), ("measure", config, rep), ("stop", config, None))]
    assert [s for k, _c, _r, s in steps if k == "measure"][:2] == ["decode-single-stream", "prefill-long-prompt"]


def test_the_speculative_preset_interleaves_when_the_gpus_allow_both_at_once(
        profiles, django_capture_on_commit_callbacks):
    draft = profiles[0]
    draft.speculative_config, draft.gpus = {"method": "ngram", "num_speculative_tokens": 4}, []
    draft.save()
    with django_capture_on_commit_callbacks(execute=False):
        experiment = experiments.preset_speculative(profile=draft, repetitions=2)
    assert experiment.order == Experiment.Order.INTERLEAVED
    measures = list(experiment.steps.filter(kind="measure").order_by("index").values_list("configuration", flat=True))
    assert measures == [0, 1, 0, 1, 1, 0, 1, 0]  # both up at once; per workload A B, then B A


def test_the_sweet_spot_preset_sweeps_1_to_64_with_the_slo(profiles, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        experiment = experiments.preset_sweet_spot(configuration={"profile": profiles[0].pk}, slo_decode_tok_s=20)
    assert experiment.concurrency_levels == [1, 2, 4, 8, 16, 32, 64] and experiment.slo_decode_tok_s == 20
    assert experiment.steps.filter(kind="measure").count() == 7 * 3
    # Goodput: the requests that stream at least 20 tok/s, i.e. TPOT within 1000 / 20 = 50 ms.
    assert experiment.workload["goodput_slos"] == {"tpot": 50.0}
    with django_capture_on_commit_callbacks(execute=False):
        own = experiments.preset_sweet_spot(configuration={"profile": profiles[0].pk}, slo_decode_tok_s=20,
                                            goodput="ttft:2000 tpot:40")
        none = experiments.preset_sweet_spot(configuration={"profile": profiles[0].pk})
    assert own.workload["goodput_slos"] == {"ttft": 2000.0, "tpot": 40.0}
    assert none.workload["goodput_slos"] == {}
    with pytest.raises(ExperimentInputError, match="use ttft, tpot or e2el"):
        experiments.preset_sweet_spot(configuration={"profile": profiles[0].pk}, goodput="itl:5")


def test_a_configuration_that_went_down_fails_the_experiment_with_the_reason_and_an_alert(
        profiles, django_capture_on_commit_callbacks):
    from monitoring.models import AlertEvent

    dep = Deployment.objects.create(name="mine", host=settings.HOST_NAME, profile=profiles[0], status="ready",
                                    port=9)
    with django_capture_on_commit_callbacks(execute=False):
        experiment = _create(profiles, configurations=[{"deployment": dep.pk}, {"deployment": dep.pk, "label": "B"}],
                             repetitions=1)
    Deployment.objects.filter(pk=dep.pk).update(status="stopped")
    experiments.experiment_execute(experiment.pk, worker="here")  # the task's work, in this process
    experiment.refresh_from_db()
    assert experiment.status == "failed" and "mine is no longer ready" in experiment.error
    assert list(experiment.steps.values_list("status", flat=True)) == ["failed", "skipped"]
    assert "no longer ready" in experiment.steps.first().note
    event = AlertEvent.objects.get(kind="experiment_failed")
    assert event.link == f"/benchmarks/experiments/{experiment.pk}/"
    dep.refresh_from_db()
    assert dep.status == "stopped"  # a user's own deployment is never started or stopped by an experiment
