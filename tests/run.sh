#!/usr/bin/env bash
# Run Kiln's whole test suite on a fresh machine: installs Debian's Chromium for
# the browser tests, creates .venv with requirements.txt, requirements-demo.txt and
# tests/requirements.txt (the first time builds llama.cpp: about 10 minutes), then runs pytest.
#
# With no arguments (what CI runs) there are two passes: every test on SQLite, then,
# through tests/pg.sh on a throw-away PostgreSQL server, every test that is neither a
# browser nor an engine test, plus the engine tests marked `postgres`. The script fails
# when either pass fails; KILN_TEST_POSTGRES=0 skips the second pass.
# Extra arguments go to pytest and run one pass on the database DATABASE_URL names
# (SQLite when unset), e.g. `bash tests/run.sh tests/dashboard -x`.
# For a quick local run skip the tests that start a real llama-server:
# `bash tests/run.sh -m "not engine"` (CI runs them all).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null 2>&1; then
  echo "kiln: installing Debian's chromium and chromium-driver for the browser tests" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium chromium-driver >&2
fi

if ! command -v xgettext >/dev/null 2>&1; then
  # tests/i18n extracts the messages again to check locale/ is in step (the .mo files are committed).
  echo "kiln: installing Debian's gettext for the translation tests" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q gettext >&2
fi

if [ ! -e /usr/share/fonts/truetype/wqy/wqy-zenhei.ttc ]; then
  # Chinese glyphs for the zh-Hans screenshots (without a CJK font Chromium draws boxes).
  echo "kiln: installing Debian's fonts-wqy-zenhei for the zh-Hans screenshots" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q fonts-wqy-zenhei >&2
fi

PYTHON=$(python3 dashboard/bootstrap.py requirements.txt requirements-demo.txt tests/requirements.txt)
if [ "$#" -gt 0 ]; then
  # pytest exits 5 when no test ran; set -e makes that (like any failure) fail this script.
  exec "$PYTHON" -m pytest -c tests/pytest.ini --rootdir=. "$@"
fi

# The same tests run on PostgreSQL as on SQLite; the browser and most engine tests
# exercise no query that the first pass did not, and CI's 90 minutes hold only this much.
POSTGRES_PASS=(-m "not browser and (not engine or postgres)")

# Each pass runs in the background so that a SIGTERM to this script (a timeout, CI
# cancelling) reaches it at once, and its fixtures stop the servers they started.
run_pass() {
  "$@" &
  local child=$!
  trap 'kill -TERM "$child" 2>/dev/null || true' TERM INT
  set +e
  wait "$child"
  local rc=$?
  if kill -0 "$child" 2>/dev/null; then  # wait was cut short by the trap
    wait "$child"
    rc=$?
  fi
  set -e
  trap - TERM INT
  return "$rc"
}

if [ "${KILN_TEST_POSTGRES:-1}" = "0" ]; then
  exec "$PYTHON" -m pytest -c tests/pytest.ini --rootdir=.
fi
echo "kiln: pass 1 of 2: the whole suite on SQLite" >&2
sqlite_rc=0
run_pass env -u DATABASE_URL "$PYTHON" -m pytest -c tests/pytest.ini --rootdir=. || sqlite_rc=$?
echo "kiln: pass 2 of 2: ${POSTGRES_PASS[*]} on PostgreSQL (tests/pg.sh)" >&2
postgres_rc=0
run_pass bash tests/pg.sh "${POSTGRES_PASS[@]}" || postgres_rc=$?
echo "kiln: SQLite pass exit status $sqlite_rc, PostgreSQL pass exit status $postgres_rc" >&2
if [ "$sqlite_rc" -ne 0 ]; then
  exit "$sqlite_rc"
fi
exit "$postgres_rc"
