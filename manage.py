#!/usr/bin/env python3
"""Django's command-line utility for Kiln."""
import os
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent

# Commands that serve or write through this release's models, refused on a
# database with unapplied migrations (dashboard.migrations_check). The monitor
# checks in its own command, the worker and the web app where they start;
# migrate, showmigrations, shell, check and standalone must run on any database.
REFUSED_UNMIGRATED = {"runserver": "the development server", "createoperator": "manage.py createoperator"}


def bootstrap_if_standalone():
    """`manage.py standalone` must work on a bare python3: build the venv first."""
    if len(sys.argv) < 2 or sys.argv[1] != "standalone":
        return
    import importlib.util

    spec = importlib.util.spec_from_file_location("kiln_bootstrap", BASE_DIR / "dashboard" / "bootstrap.py")
    bootstrap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bootstrap)
    bootstrap.reexec_in_venv([str(BASE_DIR / "manage.py"), *sys.argv[1:]])


def main():
    bootstrap_if_standalone()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    try:
        from django.core.management import execute_from_command_line
    except ImportError as exc:
        raise SystemExit(
            "kiln: Django is not installed in this Python. Run `python3 manage.py standalone` "
            "(it creates .venv and installs requirements.txt), or activate .venv first."
        ) from exc
    from dashboard.env import ConfigError

    try:
        from django.conf import settings

        settings.INSTALLED_APPS  # load settings now, so a bad value is reported here
    except ConfigError as exc:
        raise SystemExit(f"kiln: configuration error: {exc}") from None
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command in REFUSED_UNMIGRATED and not {"-h", "--help"} & set(sys.argv[2:]):
        import django

        django.setup()
        from dashboard.migrations_check import refuse_if_unmigrated

        refuse_if_unmigrated(REFUSED_UNMIGRATED[command])
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
