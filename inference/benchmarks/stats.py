"""Statistics for experiments: a mean with its 95% confidence interval, and
the ratio of two means (B / A) with its interval.

Method (stated on the experiment page as well):
- Each configuration is measured R times; a run gives one number per metric
  (its output tok/s, its mean TTFT, ...). The R numbers give a mean and a
  95% confidence interval from Student's t distribution with R - 1 degrees
  of freedom: mean ± t(0.975, R-1) · s / √R.
- The ratio B/A is worked out on the log scale: log(mean B / mean A) has the
  standard error √(s_A²/(R_A·m_A²) + s_B²/(R_B·m_B²)) (the delta method),
  with Welch–Satterthwaite degrees of freedom, so unequal spreads and
  unequal repetition counts are allowed. The interval exp(log r ± t · se)
  is never negative and is symmetric in A and B (A/B's interval is the
  reciprocal of B/A's).
- An interval that contains 1.0 means "no measurable difference", whatever
  the point estimate says.

scipy is not a dependency: the t quantile comes from the regularized
incomplete beta function (continued fraction, as in every numerical
library), inverted by bisection; tests check it against published tables.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

CONFIDENCE = 0.95


# --------------------------------------------------------------------------
# Student's t distribution
# --------------------------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` (> 0, may be fractional) degrees of freedom."""
    if df <= 0:
        raise ValueError("degrees of freedom must be positive")
    if math.isinf(df):
        return 0.5 * math.erfc(-t / math.sqrt(2.0))
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t value with P(T <= t) = p (0 < p < 1); bisection on t_cdf."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be between 0 and 1")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
        if high > 1e12:
            return math.inf
    for _ in range(200):
        mid = (low + high) / 2.0
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2.0


# --------------------------------------------------------------------------
# Mean and ratio intervals
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class MeanCI:
    n: int
    mean: float
    sd: float  # sample standard deviation (n - 1); 0.0 with one value
    low: float | None  # None when n < 2: one run gives no interval
    high: float | None

    @property
    def half_width(self) -> float | None:
        return None if self.low is None else (self.high - self.low) / 2.0

    def as_dict(self) -> dict:
        return {"n": self.n, "mean": self.mean, "sd": self.sd, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class RatioCI:
    ratio: float
    low: float | None
    high: float | None
    df: float | None

    @property
    def has_interval(self) -> bool:
        return self.low is not None

    def includes_one(self) -> bool:
        return self.low is not None and self.low <= 1.0 <= self.high

    def as_dict(self) -> dict:
        return {"ratio": self.ratio, "low": self.low, "high": self.high, "df": self.df}


def _clean(values) -> list[float]:
    out = []
    for v in values:
        if v is None or isinstance(v, bool):
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out.append(f)
    return out


def mean_ci(values, confidence: float = CONFIDENCE) -> MeanCI | None:
    """Mean and Student-t interval of the finite numbers in `values`; None when there are none."""
    xs = _clean(values)
    n = len(xs)
    if n == 0:
        return None
    mean = sum(xs) / n
    if n < 2:
        return MeanCI(n, mean, 0.0, None, None)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * sd / math.sqrt(n)
    return MeanCI(n, mean, sd, mean - half, mean + half)


def ratio_ci(a_values, b_values, confidence: float = CONFIDENCE) -> RatioCI | None:
    """mean(B) / mean(A) with a log-scale delta-method interval (Welch–Satterthwaite df).

    None when either side has no values or a mean is not positive (a ratio of
    a throughput of 0 means nothing). No interval when either side has one value.
    """
    a, b = mean_ci(a_values), mean_ci(b_values)
    if a is None or b is None or a.mean <= 0 or b.mean <= 0:
        return None
    ratio = b.mean / a.mean
    if a.n < 2 or b.n < 2:
        return RatioCI(ratio, None, None, None)
    va = a.sd ** 2 / (a.n * a.mean ** 2)  # variance of log(mean A), delta method
    vb = b.sd ** 2 / (b.n * b.mean ** 2)
    se = math.sqrt(va + vb)
    if se == 0.0:
        return RatioCI(ratio, ratio, ratio, math.inf)
    df = (va + vb) ** 2 / ((va ** 2 / (a.n - 1) if va else 0.0) + (vb ** 2 / (b.n - 1) if vb else 0.0))
    t = t_quantile(0.5 + confidence / 2.0, df)
    log_r = math.log(ratio)
    return RatioCI(ratio, math.exp(log_r - t * se), math.exp(log_r + t * se), df)


def classify(ratio: RatioCI | None, better: str) -> str:
    """'better', 'worse', 'same' (interval includes 1.0), or 'unknown' (no interval).

    `better` is "higher" (throughputs) or "lower" (latencies)."""
    if ratio is None or not ratio.has_interval:
        return "unknown"
    if ratio.includes_one():
        return "same"
    higher = ratio.low > 1.0
    return "better" if higher == (better == "higher") else "worse"
