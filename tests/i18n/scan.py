"""Finds user-visible English that bypasses the translation machinery.

Templates (`template_findings`): each file under templates/ is cut into tokens by
Django's own template Lexer. Text inside {% blocktranslate %}...{% endblocktranslate %}
and {% comment %} is translated or invisible; every other tag and variable becomes a
placeholder; the rest is parsed as HTML. Text nodes and the attributes a person
reads (title, placeholder, aria-label, alt, data-confirm) that still hold a Latin
word fail, except:
  - text inside <pre>, <code>, <kbd>, <samp>, <script>, <style> (commands, code samples);
  - words in ALLOWED_WORDS: names and technical tokens kept as they are in Chinese
    (Kiln, GPU, vLLM, TTFT, tok/s, units ...), see locale/GLOSSARY.md.

JS (`js_findings`), a heuristic: every string or template literal under static/
(vendored libraries in static/vendor/ aside) outside a gettext / ngettext /
pgettext / npgettext call is checked after removing `${...}` parts; it fails when it
reads as prose -- two Latin words with a space or punctuation between them, or a
capitalised word -- unless it is code: the argument of a DOM or fetch call that
takes selectors, class names, events, ids, tags or headers (CODE_CALLS), the value
of a className / type / method / headers / Plotly option key (CODE_KEYS), an object
key, an attribute value inside markup (`class="muted small"`: a literal right after
`=` with no space -- the project's JS always spaces its assignments), markup and
Plotly `%{...}` templates inside a literal, a URL or path, or a literal in
JS_ALLOWED (exact literals that are code, with the reason beside each).
"""
from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

from django.template.base import Lexer, TokenType

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates"
STATIC = REPO / "static"

# Kept as they are in the Chinese UI (locale/GLOSSARY.md says so for each).
ALLOWED_WORDS = {
    "Kiln", "GPU", "GPUs", "CPU", "vLLM", "SGLang", "llama.cpp", "llama-server", "TTFT", "TPOT", "ITL", "E2EL",
    "tok/s", "KV", "API", "CSV", "JSON", "URL", "ID", "PID", "NVML", "PCIe", "ECC", "Xid", "GGUF", "GiB", "MiB",
    "KiB", "TiB", "GB", "MB", "B", "s", "ms", "W", "MHz", "sha256", "HF", "Hugging", "Face", "ModelScope",
    "OpenAI", "Qwen", "Gemma", "NVFP4", "AWQ", "GPTQ", "fp16", "bf16", "fp8", "V100", "H200", "Playwright",
    "Celery", "Redis", "vs", "p50", "p90", "p95", "p99", "QPS", "RPS", "x", "curl", "Python", "openai", "torch",
    "CUDA", "main", "dtype", "NVIDIA", "auto", "Slack", "HTTP", "HTTPS", "SMTP", "TLS", "STARTTLS", "Webhook", "Lark", "JSONL",
}
READ_ATTRS = {"title", "placeholder", "aria-label", "alt", "data-confirm", "data-question"}
SKIP_ELEMENTS = {"pre", "code", "kbd", "samp", "script", "style"}
PLACEHOLDER = "\x00"
WORD = re.compile(r"[A-Za-z][A-Za-z0-9.+/_-]*")


CODE_CHUNK = re.compile(r"[/*_=<>$\\]|\w\.\w|\d|^--\w")


def english_words(text: str) -> list[str]:
    """The Latin words of `text` that are not in ALLOWED_WORDS. A whitespace-separated
    chunk holding a path, glob, dotted name, digit or = sign (Qwen/Qwen3-8B, *.bin,
    --max-model-len=4096, original/*) is code and skipped."""
    words = []
    prose = " ".join(c for c in text.replace(PLACEHOLDER, " ").split() if not CODE_CHUNK.search(c))
    for word in WORD.findall(prose):
        word = word.rstrip(".-/")
        if len(word) > 1 and word not in ALLOWED_WORDS and not re.fullmatch(r"[A-Za-z]?\d[\w.]*", word):
            words.append(word)
    return words


class _Visible(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.skip = 0
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in SKIP_ELEMENTS:
            self.skip += 1
        for name, value in attrs:
            if name in READ_ATTRS and value and english_words(value):
                self.found.append(f'{name}="{value.replace(PLACEHOLDER, "…")}"')

    def handle_startendtag(self, tag, attrs):
        skip = self.skip
        self.handle_starttag(tag, attrs)
        self.skip = skip

    def handle_endtag(self, tag):
        if tag in SKIP_ELEMENTS and self.skip:
            self.skip -= 1

    def handle_data(self, data):
        if not self.skip and english_words(data):
            self.found.append(" ".join(data.replace(PLACEHOLDER, "…").split()))


def untranslated_template_text(source: str) -> list[str]:
    """The pieces of user-visible text in a template that are not translated."""
    html, inside = [], None  # inside: the end tag we skip to (endblocktranslate, endcomment, endverbatim)
    for token in Lexer(source).tokenize():
        if inside:
            if token.token_type == TokenType.BLOCK and token.contents.split()[0] == inside:
                inside = None
                html.append(PLACEHOLDER)
            continue
        if token.token_type == TokenType.TEXT:
            html.append(token.contents)
        elif token.token_type == TokenType.BLOCK:
            name = token.contents.split()[0]
            if name in ("blocktranslate", "blocktrans"):
                inside = "endblocktranslate" if name == "blocktranslate" else "endblocktrans"
            elif name in ("comment", "verbatim"):
                inside = "end" + name
            html.append(PLACEHOLDER)
        elif token.token_type == TokenType.VAR:
            html.append(PLACEHOLDER)
    # A tag inside an HTML tag (<details{% if x %} open{% endif %}>) is markup, not text.
    markup = re.sub(r"<[a-zA-Z][^<>]*>", lambda m: m.group(0).replace(PLACEHOLDER, " "), "".join(html))
    parser = _Visible()
    parser.feed(markup)
    parser.close()
    return parser.found


def template_findings(exempt: dict[str, str]) -> dict[str, list[str]]:
    found = {}
    for path in sorted(TEMPLATES.rglob("*.html")):
        name = str(path.relative_to(TEMPLATES))
        if name in exempt:
            continue
        if hits := untranslated_template_text(path.read_text()):
            found[name] = hits
    return found


# ------------------------------------------------------------------ JS

GETTEXT_CALL = re.compile(r"\b(?:gettext|ngettext|pgettext|npgettext)\s*\(")
# Calls whose string arguments are code, not words a person reads.
CODE_CALLS = re.compile(
    r"(?:querySelector(?:All)?|getElementById|getElementsByClassName|createElement|closest|matches|"
    r"addEventListener|removeEventListener|setAttribute|getAttribute|removeAttribute|hasAttribute|"
    r"classList\.(?:add|remove|toggle|contains|replace)|toggleAttribute|\.get|\.set|\.has|\.append(?=\(\s*[\"'][a-z_]+[\"']\s*,)|"
    r"getJSON|postJSON|fetch|Kiln\.live\.on|live\.on|new\s+WebSocket|Plotly\.\w+|\.startsWith|\.endsWith|\.includes|"
    r"\.split|\.join|\.replace|\.match|\.test|\.indexOf|\.padStart|toLocaleString|Intl\.\w+|new\s+Date|"
    r"encodeURIComponent|RegExp|localStorage\.\w+|sessionStorage\.\w+)\s*\($"
)
CODE_KEYS = re.compile(r"(?:className|type|method|credentials|mode|id|name|href|src|key|kind|status|action|"
                       r"Accept|\"Content-Type\"|'Content-Type'|\"X-CSRFToken\"|headers|role|tag|rel|target|"
                       r"autocomplete|inputMode|dir|lang|cursor|display|width|height|color|colour|font|"
                       r"family|yaxis|xaxis|hovermode|barmode|mode|shape|dash|fill|anchor|side|overlaying|"
                       r"tickformat|hoverformat|ticksuffix|textposition|line|marker|size|symbol|orientation|"
                       r"layout|responsive|displaylogo|displayModeBar|x|y|z|field|scale|unit|format|"
                       r"categoryorder|hovertemplate|texttemplate)\s*[:=]\s*$")
LITERAL = re.compile(r"""("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`(?:[^`\\]|\\.)*`)""", re.S)
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
PROSE = re.compile(r"[A-Za-z]{2,}[ ,;:!?…’'.]+[A-Za-z]{2,}|^\s*[A-Z][a-z]{2,}")
CODE_LIKE = re.compile(r"^(?:[/#.]|https?:|wss?:|[\w-]+=|\[|\s*$)")


def _strip_comments(source: str) -> str:
    """Comments out, string literals kept intact (a // inside a string is not a comment)."""
    out, pos = [], 0
    pattern = re.compile(LITERAL.pattern + r"|//[^\n]*|/\*.*?\*/|/(?![/*])(?:[^/\\\n\[]|\\.|\[(?:[^\]\\\n]|\\.)*\])+/[gimsuy]*(?=\s*[.,;)\]}])", re.S)
    for m in pattern.finditer(source):
        out.append(source[pos:m.start()])
        text = m.group(0)
        if text.startswith("//") or text.startswith("/*"):
            out.append(" " * len(text) if "\n" not in text else "\n" * text.count("\n"))
        elif text.startswith("/"):
            out.append('""'.ljust(len(text)))  # a regular expression: code
        else:
            out.append(text)
        pos = m.end()
    out.append(source[pos:])
    return "".join(out)


def _inside_gettext(source: str, start: int) -> bool:
    """Is the literal at `start` an argument of gettext(...) and friends (directly)?"""
    depth = 0
    for i in range(start - 1, max(-1, start - 400), -1):
        ch = source[i]
        if ch == ")":
            depth += 1
        elif ch == "(":
            if depth == 0:
                return bool(GETTEXT_CALL.search(source[max(0, i - 12):i + 1]))
            depth -= 1
        elif ch in ";{}" and depth == 0:
            return False
    return False


def _call_before(source: str, start: int) -> str:
    """The text up to the '(' of the call whose argument list holds `start`, or ''."""
    depth = 0
    for i in range(start - 1, max(-1, start - 300), -1):
        ch = source[i]
        if ch in ")]}":
            depth += 1
        elif ch in "([{":
            if depth == 0:
                return source[max(0, i - 60):i + 1] if ch == "(" else ""
            depth -= 1
        elif ch == ";" and depth == 0:
            return ""
    return ""


def untranslated_js_literals(source: str, allowed: set[str]) -> list[str]:
    source = _strip_comments(source)
    found = []
    for m in LITERAL.finditer(source):
        literal = m.group(0)
        text = re.sub(r"\$\{[^}]*\}", " ", literal[1:-1]) if literal[0] == "`" else literal[1:-1]
        text = re.sub(r"<[^>]*>?|^[^<]*>", " ", text)  # markup in innerHTML templates is code
        text = re.sub(r"%\{[^}]*\}", " ", text)  # Plotly's hover templates: %{y:.1f}
        if not PROSE.search(text) or CODE_LIKE.match(text) or literal in allowed:
            continue
        before = source[max(0, m.start() - 40):m.start()]
        if before.endswith("="):
            continue  # an attribute value inside markup (class="muted small"); JS assignments have spaces
        if CODE_KEYS.search(before) or _inside_gettext(source, m.start()):
            continue
        if re.search(r"[{,]\s*$", before) and re.match(r"\s*:", source[m.end():]):
            continue  # an object's key: { "Memory": ... }
        call = _call_before(source, m.start())
        if CODE_CALLS.search(call or "\x01"):
            continue
        if re.search(r"\b(?:el|h)\($", call) and source[m.start() - 1] == "(":
            continue  # el("tag", ...): the tag name

        found.append(literal if len(literal) < 90 else literal[:87] + "…")
    return found


def js_findings(exempt: dict[str, str], allowed: dict[str, set[str]]) -> dict[str, list[str]]:
    found = {}
    for path in sorted(STATIC.rglob("*.js")):
        name = str(path.relative_to(STATIC))
        if name.startswith("vendor/") or name in exempt:
            continue
        if hits := untranslated_js_literals(path.read_text(), allowed.get(name, set()) | allowed.get("*", set())):
            found[name] = hits
    return found
