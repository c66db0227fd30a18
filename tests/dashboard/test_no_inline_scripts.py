"""Pages carry no inline JavaScript, so a strict Content-Security-Policy
(script-src 'self') can land: no <script> block without src, no on*= event
handler attribute, no javascript: URL. Each page's JS is a file under
static/<area>/; data reaches it through json_script or data- attributes.

The templates' source is scanned (every branch, whatever the data), and the
main pages are also rendered, to catch markup that a view or a filter adds."""
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.staticfiles import finders

REPO = Path(__file__).resolve().parents[2]

# <script type="application/json"> (what json_script writes) is data, not code:
# a CSP does not apply to it.
DATA_TYPES = {"application/json", "application/ld+json"}
URL_ATTRIBUTES = {"href", "src", "action", "formaction", "data", "poster", "xlink:href"}


class InlineScriptFinder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.problems = []

    def handle_starttag(self, tag, attrs):
        line = self.getpos()[0]
        names = dict((name.lower(), value or "") for name, value in attrs)
        if tag == "script" and "src" not in names and names.get("type", "").strip().lower() not in DATA_TYPES:
            self.problems.append(f"line {line}: inline <script> (move it to a file under static/<area>/)")
        for name, value in attrs:
            name = name.lower()
            if re.fullmatch(r"on[a-z]+", name):
                self.problems.append(f"line {line}: <{tag} {name}=...> event handler attribute")
            # Browsers ignore leading blanks and control characters before the scheme.
            if name in URL_ATTRIBUTES and re.match(r"[\x00-\x20]*javascript:", value or "", re.I):
                self.problems.append(f"line {line}: <{tag} {name}=\"javascript:...\">")

    handle_startendtag = handle_starttag


def problems_in(html: str) -> list[str]:
    finder = InlineScriptFinder()
    finder.feed(html)
    finder.close()
    return finder.problems


def without_template_language(source: str) -> str:
    """The template's HTML, every branch kept: comments go, tags become blanks
    and variables a placeholder, so `<a {% if x %}class="on"{% endif %}>` reads
    as `<a  class="on" >` and no tag's words look like attributes. Line numbers
    are kept."""
    keep_lines = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    source = re.sub(r"{%\s*comment\s*%}.*?{%\s*endcomment\s*%}", keep_lines, source, flags=re.S)
    source = re.sub(r"{#.*?#}", keep_lines, source, flags=re.S)
    source = re.sub(r"{%.*?%}", lambda m: " " + keep_lines(m), source, flags=re.S)
    return re.sub(r"{{.*?}}", lambda m: "x" + keep_lines(m), source, flags=re.S)


def project_template_files() -> list[Path]:
    """The templates this project owns: the TEMPLATES dirs and the templates/
    folder of every app inside the repository (installed packages' are theirs)."""
    from django.apps import apps

    folders = [Path(d) for t in settings.TEMPLATES for d in t.get("DIRS", [])]
    folders += [Path(app.path) / "templates" for app in apps.get_app_configs()]
    files = set()
    for folder in folders:
        folder = folder.resolve()
        if folder.is_dir() and REPO in folder.parents and ".venv" not in folder.parts:
            files.update(folder.rglob("*.html"))
    return sorted(files)


TEMPLATES = project_template_files()


def test_the_check_finds_what_it_must():
    bad = """<script>alert(1)</script>
<script type="text/javascript">x()</script>
<form method="post" onsubmit="return confirm('sure?')"></form>
<button ONCLICK="go()">Go</button>
<a href=" javascript:go()">go</a>
<img src=x onerror=go()>"""
    found = problems_in(without_template_language(bad))
    assert len(found) == 6, found
    good = """<script src="/static/kiln.js"></script>
<script id="models-data" type="application/json">[1, 2]</script>
<form method="post" data-confirm="Revoke it?"><button class="online">Go</button></form>
<a href="/docs/javascript:notes">notes</a>
{% if online %}<span {% if onboarding %}hidden{% endif %}>{{ javascript }}</span>{% endif %}
{% comment %}<script>example()</script>{% endcomment %}"""
    assert problems_in(without_template_language(good)) == []


def test_templates_are_found():
    names = {p.relative_to(REPO).as_posix() for p in TEMPLATES}
    assert {"templates/base.html", "templates/library/models.html",
            "templates/deployments/deployment_detail.html", "templates/gateway/playground.html"} <= names


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_template_has_no_inline_javascript(path):
    problems = problems_in(without_template_language(path.read_text(encoding="utf-8")))
    assert not problems, f"{path.relative_to(REPO)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_static_file_a_template_names_exists(path):
    for name in re.findall(r"{%\s*static\s+['\"]([^'\"]+)['\"]\s*%}", path.read_text(encoding="utf-8")):
        assert finders.find(name), f"{path.relative_to(REPO)} names static '{name}', which no finder serves"


PAGES = ["/", "/models/", "/deployments/", "/deployments/plan", "/deployments/profiles/new", "/benchmarks/",
         "/playground/", "/keys/", "/monitoring/", "/monitoring/history", "/users/", "/password/",
         "/api/docs"]  # the API's docs page too (django-ninja's Swagger UI, served locally)


def test_rendered_pages_have_no_inline_javascript(client, operator, redis_server):
    anonymous = client.get("/login/")
    assert anonymous.status_code == 200
    assert problems_in(anonymous.content.decode()) == []
    client.force_login(operator)
    for page in PAGES:
        response = client.get(page)
        assert response.status_code == 200, page
        html = response.content.decode()
        assert "<script" in html, page  # kiln.js at least: the check looked at a real page
        assert problems_in(html) == [], (page, problems_in(html))
