#!/usr/bin/env bash
# Run Kiln's tests on a real PostgreSQL server instead of SQLite.
#
# Installs Debian's postgresql package if it is missing, creates a fresh server
# (its own data directory under a temporary folder, a free 127.0.0.1 port, its
# socket in that folder), a role and a database for Kiln, exports DATABASE_URL
# and runs tests/run.sh with the given arguments (so pytest arguments work as
# there), e.g. `bash tests/pg.sh -m "not engine and not browser" -q`; with none,
# the whole suite. CI's second pass (tests/run.sh) is this script with a subset.
# pytest-django creates and drops test_kiln on that server; the child processes
# the tests start (web, worker, monitor) get the same test database through
# tests/helpers.py child_env. The server is stopped and its folder removed when
# this script ends, however it ends.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  echo "kiln: installing Debian's postgresql for the PostgreSQL test run" >&2
  $SUDO apt-get update -q >&2
  # The package's own cluster is not started in a container (policy-rc.d) and not used here.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q postgresql >&2
fi
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)

# PostgreSQL refuses to run as root: as root the server runs as the package's
# `postgres` system user, in a folder that user owns.
RUNAS=()
if [ "$(id -u)" -eq 0 ]; then
  RUNAS=(runuser -u postgres --)
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kiln-pg.XXXXXX")
chmod 755 "$WORK"
DATA="$WORK/data"
LOG="$WORK/server.log"
[ "${#RUNAS[@]}" -eq 0 ] || chown postgres: "$WORK"

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
PASSWORD=$(python3 -c 'import secrets; print(secrets.token_hex(16))')

stop_server() {
  if [ -e "$DATA/postmaster.pid" ]; then
    "${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null 2>&1 \
      || "${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$DATA" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
}
trap stop_server EXIT

# Local (socket) connections for the setup below are trusted; TCP, which Kiln
# uses, needs the role's password.
"${RUNAS[@]}" "$PGBIN/initdb" -D "$DATA" -U postgres -E UTF8 --locale=C.UTF-8 \
  --auth-local=trust --auth-host=scram-sha-256 >"$WORK/initdb.log" 2>&1 \
  || { cat "$WORK/initdb.log" >&2; exit 1; }
# fsync off: the data is thrown away at the end, and the test run's many small
# transactions wait on no disk flush.
"${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -p $PORT -k $WORK -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
  start >/dev/null || { cat "$LOG" >&2; exit 1; }

"${RUNAS[@]}" "$PGBIN/psql" -h "$WORK" -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -q <<SQL
CREATE ROLE kiln LOGIN CREATEDB PASSWORD '$PASSWORD';
CREATE DATABASE kiln OWNER kiln;
SQL

export DATABASE_URL="postgresql://kiln:$PASSWORD@127.0.0.1:$PORT/kiln"
echo "kiln: PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT (data in $DATA)" >&2

# In the background, so a SIGTERM to this script (timeout, CI cancelling) reaches
# pytest, whose fixtures then stop their servers before the trap stops PostgreSQL.
# With no arguments: the whole suite, one pass (tests/run.sh's own second pass is this script).
KILN_TEST_POSTGRES=0 bash tests/run.sh "$@" &
TESTS=$!
trap 'kill -TERM "$TESTS" 2>/dev/null || true' TERM INT
set +e
wait "$TESTS"
rc=$?
if kill -0 "$TESTS" 2>/dev/null; then
  wait "$TESTS"
  rc=$?
fi
exit "$rc"
