"""Line-by-line checks of a batch input file, fed in chunks as it streams in.

Nothing here holds more than one line (bounded by LINE_MAX_BYTES) plus a
hash of each custom_id, so a 1 GB file is checked in constant memory apart
from those 8-byte hashes.
"""

from __future__ import annotations

import hashlib
import json

from django.conf import settings
from django.utils.translation import gettext as _

from inference.gateway.proxy import _DECODER, BadBody

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
MAX_ERRORS = 20
SEEN_PER_KEY = 5  # line numbers kept per model / url, to name them in an error
CUSTOM_ID_MAX = 500


def file_max_bytes() -> int:
    return int(getattr(settings, "BATCH_FILE_MAX_BYTES", 2 * 1024**3))


def line_max_bytes() -> int:
    return int(getattr(settings, "BATCH_LINE_MAX_BYTES", 8 * 1024**2))


def _id_hash(custom_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(custom_id.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


class Checker:
    """Feed bytes; collects up to MAX_ERRORS (line number, message) pairs and
    the models and urls the lines name."""

    def __init__(self, max_errors: int = MAX_ERRORS):
        self.max_errors = max_errors
        self.errors: list[tuple[int, str]] = []
        self.error_count = 0
        self.lines = 0  # lines with a request (blank lines are skipped)
        self.line_no = 0
        self.size = 0
        self.models: dict[str, list[int]] = {}
        self.urls: dict[str, list[int]] = {}
        self._ids: dict[int, int] = {}  # hash of custom_id -> its line
        self._partial = bytearray()
        self._overlong = False
        self._line_max = line_max_bytes()

    # ------------------------------------------------------------ feeding
    def feed(self, chunk: bytes) -> None:
        self.size += len(chunk)
        start = 0
        while True:
            cut = chunk.find(b"\n", start)
            if cut < 0:
                rest = chunk[start:]
                if not self._overlong:
                    if len(self._partial) + len(rest) > self._line_max:
                        self._overlong = True
                        self._partial.clear()
                    else:
                        self._partial += rest
                return
            piece = chunk[start:cut]
            if self._overlong:
                self._end_overlong()
            elif self._partial:
                self._partial += piece
                if len(self._partial) > self._line_max:
                    self._end_overlong()
                else:
                    self._line(bytes(self._partial))
                self._partial.clear()
            elif len(piece) > self._line_max:
                self._end_overlong()
            else:
                self._line(piece)
            start = cut + 1

    def finish(self) -> None:
        if self._overlong:
            self._end_overlong()
        elif self._partial:
            self._line(bytes(self._partial))
            self._partial.clear()
        if not self.lines and not self.error_count:
            self.error(0, _("The file has no requests: write one JSON object per line."))

    @property
    def ok(self) -> bool:
        return not self.error_count

    def error(self, line: int, message: str) -> None:
        self.error_count += 1
        if len(self.errors) < self.max_errors:
            self.errors.append((line, message))

    def message(self) -> str:
        """All collected errors in one text, for an API error or a page."""
        parts = [(_("line %(n)d: %(msg)s") % {"n": n, "msg": m}) if n else m for n, m in self.errors]
        more = self.error_count - len(self.errors)
        if more > 0:
            parts.append(_("and %(n)d more") % {"n": more})
        return "; ".join(parts)

    # ------------------------------------------------------------ one line
    def _end_overlong(self) -> None:
        self.line_no += 1
        self._overlong = False
        self._partial.clear()
        self.error(self.line_no, _("longer than %(n)d bytes (BATCH_LINE_MAX_BYTES); shorten the request.")
                   % {"n": self._line_max})

    def _line(self, raw: bytes) -> None:
        self.line_no += 1
        n = self.line_no
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw.strip():
            return
        self.lines += 1
        problem = check_line(raw)
        if isinstance(problem, str):
            self.error(n, problem)
            return
        custom_id, url, model = problem
        h = _id_hash(custom_id)
        first = self._ids.get(h)
        if first is not None:
            self.error(n, _("custom_id %(id)r is already used on line %(first)d; give every line its own "
                            "custom_id.") % {"id": custom_id, "first": first})
            return
        self._ids[h] = n
        _seen(self.urls, url, n)
        _seen(self.models, model, n)


def _seen(table: dict, key: str, n: int) -> None:
    lines = table.setdefault(key, [])
    if len(lines) < SEEN_PER_KEY:
        lines.append(n)


def storable(text: str) -> bool:
    """Whether a database keeps this text as it is: the custom_id becomes a row, the model a key
    of the file's models_seen. PostgreSQL refuses NUL (in text and in JSON) and a lone surrogate
    cannot be encoded as UTF-8 for either database; JSON's \\u escapes let a line hold both."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_line(raw: bytes):
    """(custom_id, url, model) of a good line ("" for a missing model), or the problem as text."""
    try:
        obj = _DECODER.decode(raw.decode("utf-8"))
    except BadBody as exc:
        return _("not valid JSON (%(why)s).") % {"why": exc.message}
    except UnicodeDecodeError:
        return _("not UTF-8 text; save the file as UTF-8.")
    except (ValueError, RecursionError) as exc:
        return _("not valid JSON (%(why)s); write one JSON object per line.") % {"why": str(exc)[:120]}
    if not isinstance(obj, dict):
        return _("not a JSON object; each line is {\"custom_id\": ..., \"method\": \"POST\", \"url\": ..., "
                 "\"body\": {...}}.")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _("'custom_id' is missing or not a string; give every line a unique custom_id.")
    if len(custom_id) > CUSTOM_ID_MAX:
        return _("'custom_id' is longer than %(n)d characters.") % {"n": CUSTOM_ID_MAX}
    if not storable(custom_id):
        return _("'custom_id' holds a NUL character (\\u0000) or a lone surrogate (\\ud800-\\udfff); "
                 "use plain text.")
    method = obj.get("method", "POST")
    if method != "POST":
        return _("'method' must be \"POST\".")
    url = obj.get("url")
    if url not in ENDPOINTS:
        return _("'url' is %(url)s; it must be one of %(ok)s.") % {"url": json.dumps(url), "ok": ", ".join(ENDPOINTS)}
    body = obj.get("body")
    if not isinstance(body, dict):
        return _("'body' must be a JSON object (the request you would send to %(url)s).") % {"url": url}
    model = body.get("model", "")
    if not isinstance(model, str):
        return _("'body.model' must be a string naming a model.")
    if not storable(model):
        return _("'body.model' holds a NUL character (\\u0000) or a lone surrogate (\\ud800-\\udfff); "
                 "name a model the panel serves.")
    if body.get("stream"):
        return _("'body.stream' must be false or absent: batch requests are answered whole.")
    if url == "/v1/chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return _("'body.messages' must be a list of message objects such as "
                     "{\"role\": \"user\", \"content\": \"Hi\"}.")
    return custom_id, url, model
