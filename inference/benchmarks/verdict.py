"""An experiment's answer: per headline metric and sweep point, each
configuration's mean with its 95% interval, the ratio to the baseline (the
first configuration, "A") with its interval, and a sentence saying what that
means. Plain functions over plain dicts, so tests feed them synthetic data.

A measurement is {"configuration": int, "repetition": int, "concurrency":
int|None, "prompt_tokens": int|None, "metrics": {vllm-bench keys},
"run_id": int|None}.
"""
from __future__ import annotations

from collections import defaultdict

from django.utils.translation import gettext as _, gettext_lazy

from inference.benchmarks import stats

# (key in a vllm-bench result, better direction, short name)
HEADLINE_METRICS = (
    ("output_throughput", "higher", gettext_lazy("output throughput (tok/s)")),
    ("median_decode_tokens_per_s_per_stream", "higher", gettext_lazy("per-stream decode (tok/s)")),
    ("mean_ttft_ms", "lower", gettext_lazy("time to first token (ms)")),
    ("mean_tpot_ms", "lower", gettext_lazy("time per output token (ms)")),
    ("mean_e2el_ms", "lower", gettext_lazy("end-to-end latency (ms)")),
    ("request_goodput", "higher", gettext_lazy("goodput (req/s within SLO)")),
)
METRIC_NAMES = {key: name for key, _better, name in HEADLINE_METRICS}
METRIC_BETTER = {key: better for key, better, _name in HEADLINE_METRICS}

# What changes when throughput "stops growing": the next level adds less than this.
SATURATION_GAIN = 0.10

METHOD = gettext_lazy(
    # xgettext:no-python-format  ("95% confidence" is prose, not a %-directive)
    "Each configuration ran the same workload R times. Per metric, each run gives one number; the page shows "
    "their mean and a 95% confidence interval from Student's t distribution (R − 1 degrees of freedom). "
    "The ratio B/A is computed on the log scale: its standard error combines both configurations' relative "
    "spreads (delta method) with Welch–Satterthwaite degrees of freedom. When the interval of a ratio contains "
    "1.0 the difference is reported as no measurable difference, never as better or worse. With one repetition "
    "there is no interval and no verdict."
)


def _phrases(metric: str):
    """(better phrase, worse phrase): %(b)s, %(a)s, %(r)s (a factor >= 1)."""
    if metric == "median_decode_tokens_per_s_per_stream":
        return (_("%(b)s decodes %(r)s× faster than %(a)s per stream"),
                _("%(b)s decodes %(r)s× slower than %(a)s per stream"))
    if metric == "output_throughput":
        return (_("%(b)s's output throughput is %(r)s× higher than %(a)s's"),
                _("%(b)s's output throughput is %(r)s× lower than %(a)s's"))
    if metric == "request_goodput":
        return (_("%(b)s's goodput is %(r)s× higher than %(a)s's"),
                _("%(b)s's goodput is %(r)s× lower than %(a)s's"))
    if metric == "mean_ttft_ms":
        return (_("%(b)s's time to first token is %(r)s× shorter than %(a)s's"),
                _("%(b)s's time to first token is %(r)s× longer than %(a)s's"))
    if metric == "mean_tpot_ms":
        return (_("%(b)s's time per output token is %(r)s× shorter than %(a)s's"),
                _("%(b)s's time per output token is %(r)s× longer than %(a)s's"))
    return (_("%(b)s's end-to-end latency is %(r)s× shorter than %(a)s's"),
            _("%(b)s's end-to-end latency is %(r)s× longer than %(a)s's"))


def _short_name(metric: str) -> str:
    return {
        "output_throughput": _("output throughput"),
        "median_decode_tokens_per_s_per_stream": _("per-stream decode speed"),
        "mean_ttft_ms": _("time to first token"),
        "mean_tpot_ms": _("time per output token"),
        "mean_e2el_ms": _("end-to-end latency"),
        "request_goodput": _("goodput"),
    }.get(metric, metric)


def goodput_definition(slos: dict | None) -> str:
    """What goodput counted, in words: "" when no SLO was set (goodput not measured)."""
    names = {"ttft": _("time to first token"), "tpot": _("time per output token"), "e2el": _("end-to-end latency")}
    parts = [_("%(metric)s ≤ %(ms)s ms") % {"metric": names[key], "ms": f"{float(slos[key]):g}"}
             for key in ("ttft", "tpot", "e2el") if key in (slos or {})]
    if not parts:
        return ""
    return _("Goodput: the requests per second that met every SLO (%(slos)s).") % {"slos": ", ".join(parts)}


def fmt_factor(x: float | None) -> str:
    if x is None:
        return "–"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def point_label(concurrency, prompt_tokens) -> str:
    parts = []
    if concurrency:
        parts.append(_("concurrency %(c)s") % {"c": concurrency})
    if prompt_tokens:
        parts.append(_("%(n)s-token prompts") % {"n": prompt_tokens})
    return ", ".join(parts)


def sentence(metric: str, ratio: stats.RatioCI | None, a: str, b: str, point: str = "") -> tuple[str, str]:
    """(verdict class, sentence) for B vs A on one metric at one point."""
    better = METRIC_BETTER.get(metric, "higher")
    verdict = stats.classify(ratio, better)
    where = (" " + _("at %(point)s") % {"point": point}) if point else ""
    name = _short_name(metric)
    if ratio is None:
        return "unknown", _("%(metric)s: not measured%(where)s.") % {"metric": name, "where": where}
    if verdict == "unknown":
        return verdict, _("%(metric)s: %(b)s/%(a)s = %(r)s× from single runs%(where)s; repeat the runs to know "
                          "whether that is more than noise.") % {
            "metric": name, "a": a, "b": b, "r": fmt_factor(ratio.ratio), "where": where}
    if verdict == "same":
        return verdict, _("%(metric)s: no measurable difference between %(b)s and %(a)s%(where)s (%(r)s×, 95%% CI "
                          "%(lo)s–%(hi)s×).") % {
            "metric": name, "a": a, "b": b, "r": fmt_factor(ratio.ratio), "lo": fmt_factor(ratio.low),
            "hi": fmt_factor(ratio.high), "where": where}
    up, down = _phrases(metric)
    # Say "3× faster" rather than "0.33× the latency": a factor of at least 1 in the stated direction.
    larger = ratio.ratio >= 1.0
    factor, lo, hi = ((ratio.ratio, ratio.low, ratio.high) if larger
                      else (1.0 / ratio.ratio, 1.0 / ratio.high, 1.0 / ratio.low))
    phrase = up if verdict == "better" else down
    text = phrase % {"a": a, "b": b, "r": fmt_factor(factor)}
    return verdict, _("%(text)s%(where)s (95%% CI %(lo)s–%(hi)s×).") % {
        "text": text, "where": where, "lo": fmt_factor(lo), "hi": fmt_factor(hi)}


def analyse(measurements: list[dict], labels: list[str], baseline: int = 0,
            metrics=HEADLINE_METRICS) -> dict:
    """Statistics and sentences for every sweep point, metric and configuration.

    Returns {"points": [{"concurrency", "prompt_tokens", "label", "metrics": [{"metric", "name", "better",
    "configs": [MeanCI dict or None], "ratios": [RatioCI dict or None], "verdicts": [...], "sentences": [...]}]}],
    "headline": [sentence, ...], "repetitions": [n per configuration]}.
    """
    grouped: dict = defaultdict(lambda: defaultdict(list))
    for m in measurements:
        key = (m.get("concurrency"), m.get("prompt_tokens"))
        grouped[key][m["configuration"]].append(m.get("metrics") or {})
    points = []
    headline = []
    for (concurrency, prompt_tokens) in sorted(grouped, key=lambda k: (k[0] or 0, k[1] or 0)):
        per_config = grouped[(concurrency, prompt_tokens)]
        where = point_label(concurrency, prompt_tokens) if len(grouped) > 1 or concurrency else ""
        rows = []
        for metric, better, name in metrics:
            series = [[runs.get(metric) for runs in per_config.get(i, [])] for i in range(len(labels))]
            cis = [stats.mean_ci(values) for values in series]
            if all(ci is None for ci in cis):
                continue
            ratios, verdicts, sentences = [], [], []
            for i in range(len(labels)):
                if i == baseline:
                    ratios.append(None)
                    verdicts.append("baseline")
                    sentences.append("")
                    continue
                ratio = stats.ratio_ci(series[baseline], series[i])
                verdict, text = sentence(metric, ratio, labels[baseline], labels[i], where)
                if ratio is None:  # not measured on both sides at this point: nothing to say
                    verdict, text = "none", ""
                ratios.append(ratio.as_dict() if ratio else None)
                verdicts.append(verdict)
                sentences.append(text)
            rows.append({"metric": metric, "name": str(name), "better": better,
                         "configs": [ci.as_dict() if ci else None for ci in cis],
                         "ratios": ratios, "verdicts": verdicts, "sentences": sentences})
        points.append({"concurrency": concurrency, "prompt_tokens": prompt_tokens, "label": where, "metrics": rows})
        for row in rows:
            for text in row["sentences"]:
                if text:
                    headline.append(text)
    reps = [max((len(per_config.get(i, [])) for per_config in grouped.values()), default=0)
            for i in range(len(labels))]
    return {"points": points, "headline": headline, "repetitions": reps, "labels": list(labels),
            "baseline": baseline, "method": str(METHOD)}


def curves(measurements: list[dict], labels: list[str], slo_decode_tok_s: float | None = None) -> dict:
    """Per configuration, mean (and interval) of throughput and per-stream decode vs concurrency,
    TTFT vs prompt length, latency vs throughput points; the saturation point and the SLO limit."""
    by_config: dict = defaultdict(lambda: defaultdict(list))
    for m in measurements:
        by_config[m["configuration"]][(m.get("concurrency"), m.get("prompt_tokens"))].append(m)
    out = []
    for i, label in enumerate(labels):
        points = by_config.get(i, {})
        rows = []
        for (concurrency, prompt_tokens), runs in sorted(points.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1] or 0)):
            row = {"concurrency": concurrency, "prompt_tokens": prompt_tokens,
                   "run_ids": [r.get("run_id") for r in runs]}
            for metric, _better, _name in HEADLINE_METRICS:
                ci = stats.mean_ci([(r.get("metrics") or {}).get(metric) for r in runs])
                row[metric] = ci.as_dict() if ci else None
            rows.append(row)
        by_concurrency = _collapse(rows, "concurrency")
        out.append({
            "configuration": i, "label": label, "points": rows,
            "saturation_concurrency": saturation_point(by_concurrency),
            "slo_concurrency": slo_limit(by_concurrency, slo_decode_tok_s),
            "pareto": pareto_front(rows),
        })
    return {"series": out, "slo_decode_tok_s": slo_decode_tok_s}


def _collapse(rows: list[dict], axis: str) -> list[tuple[float, float | None, float | None]]:
    """(axis value, mean output throughput, mean per-stream decode), one per axis value
    (the first prompt length when both are swept)."""
    seen = {}
    for row in rows:
        x = row.get(axis)
        if x is None or x in seen:
            continue
        thr = (row.get("output_throughput") or {}).get("mean")
        dec = (row.get("median_decode_tokens_per_s_per_stream") or {}).get("mean")
        seen[x] = (x, thr, dec)
    return [seen[x] for x in sorted(seen)]


def saturation_point(points: list[tuple]) -> float | None:
    """The concurrency after which throughput stops growing: the first level whose
    next level adds less than SATURATION_GAIN; None when it grows all the way
    (or fewer than two levels were measured)."""
    usable = [(x, thr) for x, thr, _dec in points if thr]
    if len(usable) < 2:
        return None
    for (x, thr), (_x2, thr2) in zip(usable, usable[1:]):
        if thr2 < thr * (1.0 + SATURATION_GAIN):
            return x
    return None


def slo_limit(points: list[tuple], slo: float | None) -> float | None:
    """The highest concurrency whose per-stream decode speed still meets the SLO
    (tok/s); None without an SLO or when no level meets it."""
    if not slo:
        return None
    meeting = [x for x, _thr, dec in points if dec is not None and dec >= slo]
    return max(meeting) if meeting else None


def pareto_front(rows: list[dict]) -> list[dict]:
    """Points not beaten on both throughput (higher) and E2E latency (lower) by another point."""
    pts = []
    for row in rows:
        thr = (row.get("output_throughput") or {}).get("mean")
        lat = (row.get("mean_e2el_ms") or {}).get("mean")
        if thr is not None and lat is not None:
            pts.append({"throughput": thr, "latency_ms": lat, "concurrency": row.get("concurrency"),
                        "prompt_tokens": row.get("prompt_tokens")})
    front = [p for p in pts if not any(
        q is not p and q["throughput"] >= p["throughput"] and q["latency_ms"] <= p["latency_ms"]
        and (q["throughput"] > p["throughput"] or q["latency_ms"] < p["latency_ms"]) for q in pts)]
    return sorted(front, key=lambda p: p["throughput"])
