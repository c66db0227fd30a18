"""An engine's /metrics page: the one Prometheus text parser and the one table
of engine metric names, shared by the monitor (monitoring/enginemetrics.py)
and the benchmark harness (inference/benchmarks/server.py).

Each engine module declares its own names (``metric_prefix`` and
``metric_names`` on its Engine class); this module gathers them:

    samples = parse_prometheus_text(text)       # {name: [(labels, value), ...]}
    engine = detect_engine(samples)             # "vllm", "llamacpp", "sglang" or None
    raw = extract(samples, engine)              # {"prompt_tokens_total": 1234.0, ...}

Plain Python: no Django here.
"""

from __future__ import annotations

import math
import re

from inference.engines.base import ENGINES, load_all

load_all()

# Engine -> the prefix its metric names carry.
ENGINE_PREFIXES: dict[str, str] = {name: engine.metric_prefix for name, engine in ENGINES.items()}
# Engine -> {field: (metric names, newest first; "sum" or "max")}.
ENGINE_NAMES: dict[str, dict[str, tuple[tuple[str, ...], str]]] = {
    name: engine.metric_names for name, engine in ENGINES.items()}


class MetricsParseError(ValueError):
    pass


# ------------------------------------------------------------------ parsing

_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = re.compile(r'\\(.)')


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse_prometheus_text(text: str, prefixes: tuple[str, ...] | None = None) -> dict[str, list[tuple[dict, float]]]:
    """Prometheus text exposition -> {sample name: [(labels, value), ...]}.

    A small parser of our own: on a 54 KB vLLM page it is several times
    faster than prometheus_client's (bench/monitoring.py measures both), and
    with ``prefixes`` it skips the lines of metrics nobody asked for before
    looking at their labels. Comment/TYPE/HELP lines are skipped; a malformed
    line raises MetricsParseError naming the line.
    """
    out: dict[str, list[tuple[dict, float]]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
            if prefixes is not None and not name.startswith(prefixes):
                continue
            labels, end = _parse_labels(line, brace, number)
            rest = line[end:].split()
        else:
            if space == -1:
                line = line.strip()
                if not line:
                    continue
                raise MetricsParseError(f"/metrics line {number} has a name but no value: {line[:120]!r}")
            name = line[:space]
            if prefixes is not None and not name.startswith(prefixes):
                continue
            labels = {}
            rest = line[space:].split()
        if not rest:
            raise MetricsParseError(f"/metrics line {number} has no value: {line[:120]!r}")
        try:
            value = float(rest[0])
        except ValueError:
            raise MetricsParseError(f"/metrics line {number} has a value that is not a number: {line[:120]!r}")
        out.setdefault(name, []).append((labels, value))
    return out


def _parse_labels(line: str, brace: int, number: int) -> tuple[dict, int]:
    labels = {}
    pos = brace + 1
    while True:
        while pos < len(line) and line[pos] in " ,":
            pos += 1
        if pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        match = _LABEL.match(line, pos)
        if not match:
            raise MetricsParseError(f"/metrics line {number} has malformed labels: {line[:120]!r}")
        labels[match.group(1)] = _unescape(match.group(2))
        pos = match.end()


def sum_by_name(samples: dict[str, list[tuple[dict, float]]]) -> dict[str, float]:
    """{name: the sum of its samples over all label sets}."""
    return {name: sum(value for _, value in found) for name, found in samples.items()}


# ------------------------------------------------------------------ names


def detect_engine(names) -> str | None:
    """'vllm', 'llamacpp', 'sglang' or None, by which prefix most names carry."""
    counts = {engine: 0 for engine in ENGINE_PREFIXES}
    for name in names:
        for engine, prefix in ENGINE_PREFIXES.items():
            if name.startswith(prefix):
                counts[engine] += 1
    best = max(counts, key=counts.get)
    return best if counts[best] else None


def _pick(samples: dict, names: tuple[str, ...], how: str) -> float | None:
    for name in names:
        found = samples.get(name)
        if found:
            values = [v for _, v in found if not math.isnan(v)]
            if not values:
                return None
            return sum(values) if how == "sum" else max(values)
    return None


def extract(samples: dict, engine: str) -> dict[str, float | None]:
    """Every field of one engine's table, read from its parsed samples
    (None where the page has none of the field's names)."""
    return {key: _pick(samples, names, how) for key, (names, how) in ENGINE_NAMES[engine].items()}


def first_present(values: dict[str, float], engine: str, field: str) -> float | None:
    """The value of the first of `field`'s metric names (newest first) that
    `values` ({metric name: number}) holds; None if it holds none of them."""
    names, _ = ENGINE_NAMES[engine].get(field, ((), ""))
    for name in names:
        if name in values:
            return values[name]
    return None
