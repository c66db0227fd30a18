"""What a worker's (or the standalone runner's) start does with what a SIGKILL left,
checked one case at a time without the whole stack (tests/faults/test_kill9.py runs
them for real): the rows are the record, whatever Redis still holds."""
import json
import os
import signal
import subprocess
import sys

import pytest
from django.conf import settings

from dashboard.standalone import StartError, pid_file_of, stop_leftovers
from inference.deployments.supervisor import LAUNCH_MARKER, process_start_time
from tests.helpers import pid_alive, wait_until


@pytest.fixture
def sent(monkeypatch):
    """The tasks the sweeps queue (task name, row id), instead of a broker."""
    from dashboard import jobs

    calls = []
    monkeypatch.setattr(jobs, "send", lambda task, row_id, **kw: calls.append((task.name, row_id)) or True)
    return calls


def sleeper(**env):
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                            env={**os.environ, **env})


def dead_process_record():
    """(pid, start time) of a process that has exited."""
    p = subprocess.Popen(["sleep", "0.1"])
    start = process_start_time(p.pid)
    p.wait()
    return p.pid, start


def test_launch_cut_before_its_pid_was_recorded_ends_the_orphan_and_launches_again(db, sent):
    from inference.deployments.services import deployments_resume_interrupted, launch_dir_for
    from inference.models import Deployment

    cut = Deployment.objects.create(name="cut", host=settings.HOST_NAME, status="starting", phase="starting")
    waiting = Deployment.objects.create(name="waiting", host=settings.HOST_NAME, status="pending")
    stopping = Deployment.objects.create(name="stopping", host=settings.HOST_NAME, status="stopping", pid=None)
    elsewhere = Deployment.objects.create(name="other host", host="elsewhere", status="pending")
    orphan = sleeper(**{LAUNCH_MARKER: str(launch_dir_for(cut.pk))})
    try:
        counts = deployments_resume_interrupted(host=settings.HOST_NAME)
        wait_until(lambda: orphan.poll() is not None, 10, "the orphaned engine ended")
    finally:
        if orphan.poll() is None:
            os.killpg(orphan.pid, signal.SIGKILL)
            orphan.wait()
    cut.refresh_from_db()
    assert cut.status == "pending" and cut.phase == "relaunched" and "started again" in cut.hint
    assert [p["phase"] for p in cut.phases][-1] == "relaunched"
    assert counts == {"launches": 2, "stops": 1, "relaunched": 1, "installs": 0}
    assert sorted(sent) == sorted([("inference.deployment_tasks.launch_deployment", cut.pk),
                                   ("inference.deployment_tasks.launch_deployment", waiting.pk),
                                   ("inference.deployment_tasks.stop_deployment", stopping.pk)])
    assert all(row_id != elsewhere.pk for _, row_id in sent)


def _run(deployment, status, runner=None):
    from inference.models import BenchmarkRun

    snapshot = {"model": {"name": "m"}}
    if runner is not None:
        snapshot["runner"] = runner
    return BenchmarkRun.objects.create(deployment=deployment, scenario="decode-single-stream", status=status,
                                       progress={"phase": "measuring", "completed": 3, "total": 8},
                                       snapshot=snapshot, config={})


def test_a_run_whose_worker_died_is_interrupted_never_left_running_and_queued_ones_go_again(db, sent):
    from inference.benchmarks.services import runs_interrupted_sweep
    from inference.models import BenchmarkRun, Deployment

    here = Deployment.objects.create(name="here", host=settings.HOST_NAME, status="ready", port=9)
    there = Deployment.objects.create(name="there", host="elsewhere", status="ready", port=9)
    pid, start = dead_process_record()
    live = sleeper()
    try:
        orphaned = _run(here, "running", {"host": settings.HOST_NAME, "pid": pid, "start_time": start})
        legacy = _run(here, "running")  # claimed before runners were recorded: orphaned at a worker's start
        # The pid runs, but with another start time: the kernel gave the dead runner's pid to another process.
        reused = _run(here, "running", {"host": settings.HOST_NAME, "pid": live.pid, "start_time": 1})
        alive = _run(here, "running", {"host": settings.HOST_NAME, "pid": live.pid,
                                       "start_time": process_start_time(live.pid)})
        other_host = _run(there, "running", {"host": "elsewhere", "pid": pid, "start_time": start})
        queued = _run(here, "queued")
        queued_elsewhere = _run(there, "queued")

        assert runs_interrupted_sweep(host=settings.HOST_NAME) == (3, 1)
    finally:
        os.killpg(live.pid, signal.SIGKILL)
        live.wait()
    for run in (orphaned, legacy, reused):
        run.refresh_from_db()
        assert run.status == "failed" and run.error.startswith("Interrupted:") and run.result == []
        assert run.progress["phase"] == "interrupted" and run.finished is not None
    assert BenchmarkRun.objects.get(pk=alive.pk).status == "running"
    assert BenchmarkRun.objects.get(pk=other_host.pk).status == "running"  # only its own host can tell
    assert sent == [("inference.benchmark_run", queued.pk)]
    assert queued_elsewhere.pk not in [row_id for _, row_id in sent]


def test_the_claim_records_the_runner(db):
    from inference.benchmarks.services import benchmark_execute
    from inference.models import BenchmarkRun, Deployment

    dep = Deployment.objects.create(name="gone", host=settings.HOST_NAME, status="stopped")
    run = _run(dep, "queued")
    benchmark_execute(run.pk, worker="w@h")
    run = BenchmarkRun.objects.get(pk=run.pk)
    assert run.status == "failed"  # the deployment is not ready
    assert run.snapshot["runner"] == {"host": settings.HOST_NAME, "pid": os.getpid(),
                                      "start_time": process_start_time(os.getpid())}
    assert run.snapshot["model"] == {"name": "m"}  # what was there is kept


def _record(path, runner, children):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"runner": runner, "children": children}))


def test_a_restart_stops_what_a_killed_runner_left_and_nothing_else(tmp_path):
    pid, start = dead_process_record()
    web, monitor = sleeper(), sleeper()
    stranger = sleeper()  # recorded with another start time: its pid was "reused"
    try:
        _record(pid_file_of(tmp_path), {"pid": pid, "start_time": start},
                [{"name": "web", "pid": web.pid, "start_time": process_start_time(web.pid)},
                 {"name": "stranger", "pid": stranger.pid, "start_time": 1},
                 {"name": "monitor", "pid": monitor.pid, "start_time": process_start_time(monitor.pid)}])
        said = []
        stopped = stop_leftovers(tmp_path, said.append)
        assert stopped == [f"monitor (pid {monitor.pid})", f"web (pid {web.pid})"]  # newest first
        assert web.wait(5) == -signal.SIGTERM and monitor.wait(5) == -signal.SIGTERM
        assert stranger.poll() is None and pid_alive(stranger.pid)
        assert "left" in said[0] and not pid_file_of(tmp_path).exists()
        assert stop_leftovers(tmp_path, said.append) == []  # no record: nothing to do
    finally:
        for p in (web, monitor, stranger):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test_a_runner_that_still_runs_on_the_data_folder_is_refused(tmp_path):
    other = sleeper()
    try:
        _record(pid_file_of(tmp_path), {"pid": other.pid, "start_time": process_start_time(other.pid)}, [])
        with pytest.raises(StartError, match=f"another Kiln standalone \\(pid {other.pid}\\)"):
            stop_leftovers(tmp_path, print)
        assert pid_file_of(tmp_path).exists() and other.poll() is None
    finally:
        os.killpg(other.pid, signal.SIGKILL)
        other.wait()


def test_a_broken_record_is_dropped(tmp_path):
    path = pid_file_of(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert stop_leftovers(tmp_path, print) == [] and not path.exists()


def test_the_redis_restart_watch_fires_once_per_new_server_and_not_while_it_is_down():
    from dashboard.recovery import RedisRestartWatch

    class Client:
        run_id = "a"

        def info(self, section):
            if self.run_id is None:
                raise ConnectionError("down")
            return {"run_id": self.run_id}

    client, fired = Client(), []
    watch = RedisRestartWatch(client, lambda: fired.append(client.run_id))
    assert not watch.check() and fired == []
    client.run_id = None  # down: nothing to say yet
    assert not watch.check()
    client.run_id = "b"
    assert watch.check() and not watch.check() and fired == ["b"]


def test_while_the_worker_runs_only_a_launch_cut_long_ago_counts_as_cut(db, sent):
    from datetime import timedelta

    from django.utils import timezone

    from inference.deployments.services import deployments_resume_interrupted
    from inference.models import Deployment

    young = Deployment.objects.create(name="spawning now", host=settings.HOST_NAME, status="starting",
                                      started=timezone.now())
    old = Deployment.objects.create(name="cut", host=settings.HOST_NAME, status="starting",
                                    started=timezone.now() - timedelta(minutes=10))
    counts = deployments_resume_interrupted(host=settings.HOST_NAME, spawning_grace_s=300)
    assert counts["relaunched"] == 1
    assert Deployment.objects.get(pk=young.pk).status == "starting"
    assert Deployment.objects.get(pk=old.pk).status == "pending"


def test_a_cut_run_of_an_experiment_still_going_is_left_to_the_experiments_resume(db, sent):
    from inference.benchmarks.services import runs_interrupted_sweep
    from inference.models import BenchmarkRun, Deployment, Experiment, ExperimentStep

    here = Deployment.objects.create(name="here", host=settings.HOST_NAME, status="ready", port=9)
    pid, start = dead_process_record()
    runner = {"host": settings.HOST_NAME, "pid": pid, "start_time": start}
    runs = {}
    for status in ("running", "failed"):
        experiment = Experiment.objects.create(name=status, host=settings.HOST_NAME, scenario="decode-single-stream",
                                               status=status)
        runs[status] = _run(here, "running", runner)
        ExperimentStep.objects.create(experiment=experiment, index=0, kind="measure", configuration=0,
                                      status="running", run=runs[status])
    assert runs_interrupted_sweep(host=settings.HOST_NAME) == (1, 0)
    assert BenchmarkRun.objects.get(pk=runs["running"].pk).status == "running"  # the experiment records it
    assert BenchmarkRun.objects.get(pk=runs["failed"].pk).status == "failed"  # nobody else would


def test_an_install_cut_by_a_dead_worker_is_queued_again_and_one_running_now_is_left_alone(db, sent):
    from inference.deployments.services import runtimes_resume_interrupted
    from inference.models import EngineRuntime

    def runtime(name, status):
        return EngineRuntime.objects.create(name=name, host=settings.HOST_NAME, engine="llamacpp", kind="venv",
                                            path=f"/nonexistent/{name}", catalog_key="llamacpp-cpu-demo",
                                            install_status=status, install_progress=0.4)

    cut, queued, removing = runtime("cut", "installing"), runtime("queued", "queued"), runtime("rm", "uninstalling")
    done = runtime("done", "installed")
    # While the worker runs, an install in progress may be its own: only the queued one is sent again.
    assert runtimes_resume_interrupted(host=settings.HOST_NAME, at_start=False) == 1
    assert EngineRuntime.objects.get(pk=cut.pk).install_status == "installing"
    sent.clear()
    assert runtimes_resume_interrupted(host=settings.HOST_NAME) == 3
    cut.refresh_from_db()
    assert cut.install_status == "queued" and cut.install_progress == 0 and "installing again" in cut.install_step
    assert sorted(sent) == sorted([("inference.deployment_tasks.install_runtime", cut.pk),
                                   ("inference.deployment_tasks.install_runtime", queued.pk),
                                   ("inference.deployment_tasks.uninstall_runtime", removing.pk)])
    assert EngineRuntime.objects.get(pk=done.pk).install_status == "installed"
