import subprocess
import sys

import pytest

from dashboard import env
from tests.helpers import REPO


def test_envbool_accepts_the_usual_words(monkeypatch):
    monkeypatch.setenv("KILN_FLAG", "Yes")
    assert env.envbool("KILN_FLAG", False) is True
    monkeypatch.setenv("KILN_FLAG", "0")
    assert env.envbool("KILN_FLAG", True) is False


def test_envbool_names_the_variable_on_a_bad_value(monkeypatch):
    monkeypatch.setenv("KILN_FLAG", "maybe")
    with pytest.raises(env.ConfigError, match=r"KILN_FLAG='maybe' is not a yes/no value"):
        env.envbool("KILN_FLAG", False)


def test_envint_range(monkeypatch):
    monkeypatch.setenv("KILN_N", "70000")
    with pytest.raises(env.ConfigError, match="KILN_N=70000 is out of range"):
        env.envint("KILN_N", 1, minimum=1, maximum=65535)
    monkeypatch.setenv("KILN_N", "ten")
    with pytest.raises(env.ConfigError, match="KILN_N='ten' is not a whole number"):
        env.envint("KILN_N", 1)


def test_envurl_checks_scheme_and_port(monkeypatch):
    monkeypatch.setenv("KILN_URL", "http://127.0.0.1:6379")
    with pytest.raises(env.ConfigError, match="must start with redis://"):
        env.envurl("KILN_URL", None, schemes=("redis",))
    monkeypatch.setenv("KILN_URL", "redis://127.0.0.1:port/0")
    with pytest.raises(env.ConfigError, match="port that is not a number"):
        env.envurl("KILN_URL", None, schemes=("redis",))


def test_secret_key_is_generated_once_and_kept_private(tmp_path, monkeypatch):
    monkeypatch.delenv("SECRET_KEY", raising=False)
    first = env.secret_key(tmp_path)
    assert len(first) >= 50
    assert env.secret_key(tmp_path) == first
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600


def run_manage(*args, **environ):
    base = {k: v for k, v in __import__("os").environ.items() if k not in ("DJANGO_SETTINGS_MODULE",)}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env={**base, **environ}, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("DEBUG", "maybe", "DEBUG='maybe' is not a yes/no value"),
        ("DATABASE_URL", "mysql://db/kiln", "DATABASE_URL='mysql://db/kiln' must start with sqlite://"),
        ("REDIS_URL", "localhost:6379", "REDIS_URL='localhost:6379' must start with redis://"),
        ("SECRET_KEY", "short", "SECRET_KEY is shorter than 32 characters"),
        ("MONITOR_INTERVAL", "0.1", "MONITOR_INTERVAL=0.1 is out of range"),
    ],
)
def test_a_bad_environment_value_stops_the_start_with_a_message(name, value, expected, tmp_path):
    result = run_manage("check", **{name: value, "DATA_DIR": str(tmp_path)})
    assert result.returncode != 0
    assert f"kiln: configuration error: {expected}" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unwritable_data_dir_is_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    result = run_manage("check", DATA_DIR=str(blocker / "data"))
    assert result.returncode != 0
    assert "DATA_DIR=" in result.stderr and "cannot be created" in result.stderr
    assert "Traceback" not in result.stderr
