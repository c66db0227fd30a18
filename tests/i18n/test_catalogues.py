"""The zh-Hans catalogues: complete, not fuzzy, in step with the sources, compiled.

The .mo files are committed (a fresh checkout, CI included, needs no gettext tools
to serve Chinese); these tests fail when one is older than its .po. Extracting the
sources again needs GNU gettext's xgettext (tests/run.sh installs Debian's gettext).
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import polib
import pytest

from tests.helpers import REPO, child_env

LOCALE = Path(REPO) / "locale"
CATALOGUES = sorted(LOCALE.glob("*/LC_MESSAGES/*.po"))
PLACEHOLDER = re.compile(r"%\(\w+\)[-#0 +]*\d*(?:\.\d+)?[sdrfi]|\{\w+\}|<[^<>]+>")


def _key(entry):
    return (entry.msgctxt, entry.msgid, entry.msgid_plural)


def test_there_is_a_chinese_catalogue_for_templates_python_and_scripts():
    names = {str(p.relative_to(LOCALE)) for p in CATALOGUES}
    assert {"zh_Hans/LC_MESSAGES/django.po", "zh_Hans/LC_MESSAGES/djangojs.po"} <= names


@pytest.mark.parametrize("po_path", CATALOGUES, ids=lambda p: str(p.relative_to(LOCALE)))
def test_every_entry_is_translated_and_not_fuzzy(po_path):
    po = polib.pofile(str(po_path))
    assert po.metadata.get("Plural-Forms", "").startswith("nplurals=1"), "Chinese has one plural form"
    fuzzy = [e.msgid for e in po if "fuzzy" in e.flags and not e.obsolete]
    empty = [e.msgid for e in po if not e.obsolete and not (e.msgstr or all(e.msgstr_plural.values()) and e.msgstr_plural)]
    assert not fuzzy, f"fuzzy entries in {po_path.name}: {fuzzy}"
    assert not empty, f"untranslated entries in {po_path.name}: {empty}"
    assert not po.obsolete_entries(), f"obsolete entries in {po_path.name}: run `manage.py translations update`"


@pytest.mark.parametrize("po_path", CATALOGUES, ids=lambda p: str(p.relative_to(LOCALE)))
def test_translations_keep_every_placeholder_and_tag(po_path):
    wrong = []
    for e in polib.pofile(str(po_path)):
        for source, translated in ([(e.msgid, e.msgstr)] if not e.msgid_plural
                                   else [(e.msgid_plural, s) for s in e.msgstr_plural.values()]):
            if sorted(PLACEHOLDER.findall(source)) != sorted(PLACEHOLDER.findall(translated)):
                wrong.append(f"{e.msgid!r} -> {translated!r}")
    assert not wrong, "placeholders or HTML tags differ:\n" + "\n".join(wrong)


@pytest.mark.parametrize("po_path", CATALOGUES, ids=lambda p: str(p.relative_to(LOCALE)))
def test_the_committed_mo_is_compiled_from_the_po(po_path):
    mo_path = po_path.with_suffix(".mo")
    assert mo_path.exists(), f"{mo_path} is missing: run `manage.py translations compile` and commit it"
    po = {(_key(e)): (e.msgstr, dict(e.msgstr_plural)) for e in polib.pofile(str(po_path)) if not e.obsolete}
    mo = {(_key(e)): (e.msgstr, dict(e.msgstr_plural)) for e in polib.mofile(str(mo_path)) if e.msgid}
    stale = sorted(k[1] for k in po.keys() ^ mo.keys()) + sorted(k[1] for k in po.keys() & mo.keys() if po[k] != mo[k])
    assert not stale, f"{mo_path.name} differs from {po_path.name}: run `manage.py translations compile`: {stale[:10]}"


def test_the_catalogues_hold_every_message_of_the_sources(tmp_path):
    """makemessages over the sources now, into a scratch folder: the same msgids as the committed .po."""
    assert shutil.which("xgettext"), "GNU gettext is needed to extract messages (apt-get install gettext)"
    # makemessages walks the current folder and writes next to any locale/ it sees there,
    # so it runs in a copy of the sources without one, into a scratch LOCALE_PATHS.
    sources, out = tmp_path / "src", tmp_path / "out"
    for folder in ("dashboard", "inference", "monitoring", "templates", "static"):
        shutil.copytree(Path(REPO) / folder, sources / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "vendor", "migrations"))
    out.mkdir()
    env = child_env(DJANGO_SETTINGS_MODULE="tests.i18n.extract_settings", KILN_EXTRACT_TO=str(out),
                    PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, str(Path(REPO) / "manage.py"), "translations", "update"], cwd=sources,
                   env=env, check=True, capture_output=True, timeout=300)
    found = sorted(out.glob("*/LC_MESSAGES/*.po"))
    assert len(found) == len(CATALOGUES), f"extracted {found}"
    for fresh in found:
        committed = LOCALE / fresh.relative_to(out)
        assert committed.exists(), f"{committed} is missing"
        now = {_key(e) for e in polib.pofile(str(fresh))}
        kept = {_key(e) for e in polib.pofile(str(committed)) if not e.obsolete}
        new, gone = sorted(k[1] for k in now - kept), sorted(k[1] for k in kept - now)
        assert not new and not gone, (f"{committed.name} is out of step with the sources; run "
                                      f"`manage.py translations update`, translate, compile.\n"
                                      f"new in the sources: {new}\nno longer in the sources: {gone}")


def test_preflight_rule_wording_is_listed_for_translation():
    from inference.preflight.rules_messages import MESSAGES, from_rules

    assert MESSAGES == from_rules(), ("rules.toml changed: regenerate inference/preflight/rules_messages.py "
                                      "(its docstring says how)")
