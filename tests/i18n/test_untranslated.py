"""No user-visible English outside the translation machinery (tests/i18n/scan.py
says what counts as visible and what is code)."""
from tests.i18n.scan import js_findings, template_findings

# Templates the scanner skips entirely, with the reason. Keep it empty when you can:
# a code sample belongs in <pre>/<code>, a brand or technical token in scan.ALLOWED_WORDS.
TEMPLATE_EXEMPT: dict[str, str] = {}

# Scripts the scanner skips entirely (static/vendor/ is always skipped: plotly.js, Swagger UI).
JS_EXEMPT: dict[str, str] = {}

# String literals that read like words but are code, per script ("*": every script).
JS_ALLOWED: dict[str, set[str]] = {
    "*": {
        '"use strict"',        # the directive
        '"Content-Type"',      # an HTTP header name
        '"Enter"',             # KeyboardEvent.key
        '"AbortError"',        # DOMException name of an aborted fetch
    },
    # The facts' English keys: data-field values scripts and tests select by; the
    # label shown is LABELS[key], a gettext of the same words.
    "monitoring/monitoring.js": {
        '"Utilization"', '"Memory"', '"Temperature"', '"Power"', '"Energy"', '"SM clock"', '"Mem clock"',
        '"Fan"', '"PCIe link"', '"PCIe TX/RX"', '"Clocks events"', '"Retired pages"', '"Remapped rows"',
        "`Gen${num(g.pcie_gen)} x${num(g.pcie_width)}`",
        "`Gen${num(g.pcie_gen)} x${num(g.pcie_width)} / Gen${num(g.pcie_gen_max)} x${num(g.pcie_width_max)}`",
    },
}


def _report(found):
    return "\n".join(f"{name}:\n    " + "\n    ".join(hits) for name, hits in found.items())


def test_every_template_text_is_translated():
    found = template_findings(TEMPLATE_EXEMPT)
    assert not found, ("User-visible text outside {% translate %} / {% blocktranslate %} "
                       "(wrap it, or see tests/i18n/scan.py for what counts as code):\n" + _report(found))


def test_every_script_string_goes_through_gettext():
    found = js_findings(JS_EXEMPT, JS_ALLOWED)
    assert not found, ("Words in page scripts outside gettext()/ngettext() (Django's JS catalogue, "
                       "loaded by base.html):\n" + _report(found))


def test_the_scanners_catch_what_they_are_for():
    """The heuristics themselves: a bare English word is found, the translated and the code forms are not."""
    from tests.i18n.scan import untranslated_js_literals, untranslated_template_text

    assert untranslated_template_text("<h1>Deployments</h1>") == ["Deployments"]
    assert untranslated_template_text('<input placeholder="e.g. notebook">') == ['placeholder="e.g. notebook"']
    assert untranslated_template_text('{% load i18n %}<h1>{% translate "Deployments" %}</h1>') == []
    assert untranslated_template_text("{% blocktranslate %}Hello {{ x }}{% endblocktranslate %}") == []
    assert untranslated_template_text("<pre>vllm serve --dtype half</pre><code>curl</code>") == []
    assert untranslated_template_text("<td>GPU</td><td>{{ value }} GiB</td>") == []
    assert untranslated_js_literals('b.textContent = "Cancelling…";', set()) == ['"Cancelling…"']
    assert untranslated_js_literals('x.title = `Started ${n} runs`;', set()) == ['`Started ${n} runs`']
    assert untranslated_js_literals('b.textContent = gettext("Cancelling…");', set()) == []
    assert untranslated_js_literals('el.className = "badge muted small";', set()) == []
    assert untranslated_js_literals('document.querySelector("#models tbody");', set()) == []


def test_no_function_hides_gettext_behind_a_throwaway_underscore():
    """`caller, _, refused = ...` in a function that also calls _("...") makes `_` a local
    there: the call fails with UnboundLocalError (a 500) before any message is shown."""
    import ast
    from pathlib import Path

    from tests.helpers import REPO

    found = []
    for area in ("dashboard", "inference", "monitoring"):
        for path in sorted((Path(REPO) / area).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for fn in ast.walk(ast.parse(path.read_text())):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                nodes = list(ast.walk(fn))
                stores = any(isinstance(n, ast.Name) and n.id == "_" and isinstance(n.ctx, ast.Store) for n in nodes)
                calls = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "_" for n in nodes)
                if stores and calls:
                    found.append(f"{path.relative_to(REPO)}:{fn.lineno} {fn.name}")
    assert not found, "rename the throwaway `_` (e.g. _info) in:\n" + "\n".join(found)
