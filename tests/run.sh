#!/usr/bin/env bash
# Run Kiln's whole test suite on a fresh machine: installs Debian's Chromium for
# the browser tests, creates .venv with requirements.txt, requirements-demo.txt and
# tests/requirements.txt (the first time builds llama.cpp: about 10 minutes), then runs pytest.
# Extra arguments go to pytest, e.g. `bash tests/run.sh tests/dashboard -x`.
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
# pytest exits 5 when no test ran; set -e makes that (like any failure) fail this script.
exec "$PYTHON" -m pytest -c tests/pytest.ini --rootdir=. "$@"
