"""Keep the translations in locale/ in step with the sources.

    manage.py translations update    # makemessages for templates + Python (django) and JS (djangojs)
    manage.py translations compile   # the .mo files (committed, so a fresh checkout needs no gettext tools)

`update` needs GNU gettext's xgettext/msgmerge and `compile` its msgfmt (Debian:
apt-get install gettext). The zh-Hans wording follows locale/GLOSSARY.md.
"""
from django.conf import settings
from django.core.management import BaseCommand, CommandError, call_command

# Never scanned: the virtualenv and data folders, the tests, vendored JS (plotly).
IGNORE = ["data/*", "test-artifacts/*", "tests/*", "bench/*", "static/vendor/*", "staticfiles/*", ".venv/*",
          "locale"]  # locale/ is LOCALE_PATHS[0] already; ignored so a scratch LOCALE_PATHS (tests) wins
LOCALES = [code.replace("-hans", "_Hans") for code, _name in settings.LANGUAGES if code != settings.LANGUAGE_CODE]


def update(**options):
    for domain in ("django", "djangojs"):
        call_command("makemessages", locale=LOCALES, domain=domain, ignore_patterns=IGNORE,
                     no_obsolete=True, verbosity=0, **options)


class Command(BaseCommand):
    help = "update: extract messages into locale/*.po; compile: write the .mo files"
    requires_system_checks = []  # reads source files only; a half-written view elsewhere must not stop it

    def add_arguments(self, parser):
        parser.add_argument("step", choices=["update", "compile"])

    def handle(self, *args, step, **options):
        if step == "update":
            update()
        elif step == "compile":
            call_command("compilemessages", locale=LOCALES, verbosity=0)
        else:  # pragma: no cover - argparse refuses it first
            raise CommandError(step)
        self.stdout.write(f"translations {step}: {', '.join(LOCALES)} done")
