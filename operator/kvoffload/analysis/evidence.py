"""Evidence: how sure a breach is, from Prometheus histograms and counters. Pure; no I/O.

A verdict compares a canary that serves a fraction of the traffic with the stable engines, over windows that
may hold a hundred requests, through vLLM's coarse latency buckets. A point estimate of a p99 from that moves by
tens of percent between two identical variants (``bench/judgement``), so a breach counts only with evidence:

- **Canary against stable** (``compare``): a Mann-Whitney rank test on the bucket counts says whether the canary
  is slower at all (distribution-free: its false-alarm rate holds for any latency shape), and the effect, the
  canary/stable latency ratio, is fitted from the whole histogram of both: an ordinal probit model with a shape
  shared by both variants and a scale each (a lognormal read through the buckets). Under a shared shape that
  ratio is the p99 ratio, measured with every request rather than the one in a hundred above the p99.
- **Against a budget** (``exceedance``): the share of observations over the budget, counted through the
  buckets as ``histogram_quantile`` interpolates, tested against the share the quantile allows (1 % for a p99).
- **Failed requests** (``share_test``, ``difference_test``): a binomial test of a share over a budget, and a test
  that the canary fails more than the stable (the allowed increase is then the effect it must reach).

``look_alpha`` spreads ``analysis.falseRollbackRate`` over a step's analyses and gates: a rollback needs at least
one look with a p-value under it, so by the union bound identical variants roll back in at most that share of
steps, however correlated the overlapping windows are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import TypedDict

Histogram = tuple[tuple[float, float], ...]
"""Bucket counts over a window: (upper bound ``le``, cumulative count), ascending, ``inf`` last."""


class Sureness(TypedDict, total=False):
    """How sure a gated row is: the ``MetricResult`` fields the evidence fills."""

    p_value: float
    alpha: float
    interval: list[float]
    requests_needed: int | None


_NORMAL = NormalDist()
Z95 = _NORMAL.inv_cdf(0.975)
PRIOR_PRECISION = 0.5
"""A weak normal prior on the probit-scale difference of the two variants (sd 1.4 shape units): it keeps the fit
finite when one variant sits wholly in the open top bucket, and moves a fit of a hundred requests by under 1 %."""


def upper_tail(z: float) -> float:
    """P(Z > z) for a standard normal, accurate far into the tail."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def z_for(alpha: float) -> float:
    """The one-sided standard normal bound a z must pass for a p-value under ``alpha``."""
    return _NORMAL.inv_cdf(1.0 - min(max(alpha, 1e-300), 0.5))


def z_of(p_value: float) -> float:
    """The one-sided z a p-value stands for (how many standard errors the evidence is from the null)."""
    return -_NORMAL.inv_cdf(min(max(p_value, 1e-300), 1 - 1e-16))


def look_alpha(rate: float, looks: int, gates: int) -> float:
    """The p-value a breach must come under at one look so a step stays within ``rate`` false rollbacks."""
    return rate / max(1, looks) / max(1, gates)


def cells(histogram: Histogram) -> list[tuple[float, float, float]]:
    """(lower bound, upper bound, count) per bucket, as ``histogram_quantile`` reads them: bounds sorted, the counts
    of equal bounds added (Prometheus' ``coalesceBuckets``), counts made monotonic, the first bucket from 0. Empty
    when there is no ``inf`` bucket."""
    merged: dict[float, float] = {}
    for bound, count in histogram:
        if math.isnan(bound) or math.isnan(count):
            continue
        merged[bound] = merged.get(bound, 0.0) + count
    bounds = sorted(merged)
    if not bounds or not math.isinf(bounds[-1]):
        return []
    out: list[tuple[float, float, float]] = []
    lower, below = 0.0, 0.0
    for bound in bounds:
        cumulative = max(below, merged[bound])
        out.append((lower, bound, cumulative - below))
        lower, below = bound, cumulative
    return out


def total(histogram: Histogram) -> float:
    """Observations in the window: the ``inf`` bucket's count."""
    got = cells(histogram)
    return sum(c for _, _, c in got)


def _aligned(a: Histogram, b: Histogram) -> tuple[list[float], list[float], list[tuple[float, float]]]:
    """Both histograms' counts over the bounds they share (a bound only one has is merged away)."""
    ca, cb = cells(a), cells(b)
    common = sorted({hi for _, hi, _ in ca} & {hi for _, hi, _ in cb})

    def regroup(cs: list[tuple[float, float, float]]) -> list[float]:
        out, i = [], 0
        for hi in common:
            count = 0.0
            while i < len(cs) and cs[i][1] <= hi:
                count += cs[i][2]
                i += 1
            out.append(count)
        return out

    spans = list(zip([0.0, *common[:-1]], common, strict=True))
    return regroup(ca), regroup(cb), spans


def rank_z(canary: list[float], stable: list[float]) -> float | None:
    """Mann-Whitney's z for "the canary is slower", on counts per common bucket (ties within a bucket at midrank,
    with the tie correction). None without observations on both sides or with no spread at all."""
    n1, n2 = sum(canary), sum(stable)
    n = n1 + n2
    if n1 <= 0 or n2 <= 0:
        return None
    u, below = 0.0, 0.0
    ties = 0.0
    for c, s in zip(canary, stable, strict=True):
        u += c * (below + 0.5 * s)
        below += s
        t = c + s
        ties += t**3 - t
    var = n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return None
    return (u - n1 * n2 / 2.0) / math.sqrt(var)


@dataclass(frozen=True)
class Fit:
    """The canary/stable latency ratio from the ordinal probit fit: ``exp(log_ratio)``, with its standard error."""

    log_ratio: float
    se: float

    @property
    def ratio(self) -> float:
        return math.exp(self.log_ratio)

    def interval(self) -> tuple[float, float]:
        return math.exp(self.log_ratio - Z95 * self.se), math.exp(self.log_ratio + Z95 * self.se)


def _cell_terms(z_lo: float, z_hi: float) -> tuple[float, float, float, float, float]:
    """P(z_lo < Z <= z_hi) and the densities and their derivatives at both ends (0 at an infinite end)."""
    # In the upper tail, from the right, so far-out cells keep their precision.
    p = upper_tail(z_lo) - upper_tail(z_hi) if z_lo > 0 else upper_tail(-z_hi) - upper_tail(-z_lo)
    f_lo = 0.0 if math.isinf(z_lo) else _NORMAL.pdf(z_lo)
    f_hi = 0.0 if math.isinf(z_hi) else _NORMAL.pdf(z_hi)
    d_lo = 0.0 if math.isinf(z_lo) else -z_lo * f_lo
    d_hi = 0.0 if math.isinf(z_hi) else -z_hi * f_hi
    return p, f_lo, f_hi, d_lo, d_hi


def _loglik(
    theta: list[float], data: list[tuple[list[float], int]], spans: list[tuple[float, float]]
) -> tuple[float, list[float], list[list[float]]]:
    """Log-likelihood, gradient and Hessian of theta = (a, b_stable, b_canary), P(X <= x) = Phi(a ln x + b)."""
    a = theta[0]
    ll = -0.5 * PRIOR_PRECISION * (theta[1] - theta[2]) ** 2
    grad = [0.0, -PRIOR_PRECISION * (theta[1] - theta[2]), PRIOR_PRECISION * (theta[1] - theta[2])]
    hess = [[0.0] * 3 for _ in range(3)]
    hess[1][1] = hess[2][2] = -PRIOR_PRECISION
    hess[1][2] = hess[2][1] = PRIOR_PRECISION
    for counts, which in data:
        b = theta[which]
        for count, (lo, hi) in zip(counts, spans, strict=True):
            if count <= 0:
                continue
            x_lo = -math.inf if lo <= 0 else math.log(lo)
            x_hi = math.inf if math.isinf(hi) else math.log(hi)
            z_lo = -math.inf if math.isinf(x_lo) else a * x_lo + b
            z_hi = math.inf if math.isinf(x_hi) else a * x_hi + b
            p, f_lo, f_hi, d_lo, d_hi = _cell_terms(z_lo, z_hi)
            if p <= 1e-300:
                return -math.inf, grad, hess
            ll += count * math.log(p)
            # dz/d(a, b_which): (x, 1) at each finite end
            g_hi = (0.0 if math.isinf(x_hi) else x_hi, 1.0)
            g_lo = (0.0 if math.isinf(x_lo) else x_lo, 1.0)
            idx = (0, which)
            g = [(f_hi * g_hi[k] - f_lo * g_lo[k]) / p for k in range(2)]
            for k in range(2):
                grad[idx[k]] += count * g[k]
                for m in range(2):
                    h = (d_hi * g_hi[k] * g_hi[m] - d_lo * g_lo[k] * g_lo[m]) / p - g[k] * g[m]
                    hess[idx[k]][idx[m]] += count * h
    return ll, grad, hess


def _solve3(m: list[list[float]], v: list[float]) -> list[float] | None:
    """m x = v for a 3x3 system (Gaussian elimination with pivoting); None when singular."""
    a = [[*row, v[i]] for i, row in enumerate(m)]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(3):
            if r != col:
                f = a[r][col] / a[col][col]
                for c in range(col, 4):
                    a[r][c] -= f * a[col][c]
    return [a[i][3] / a[i][i] for i in range(3)]


def scale_fit(canary: list[float], stable: list[float], spans: list[tuple[float, float]]) -> Fit | None:
    """The canary/stable latency ratio under a shared shape (lognormal through the buckets), by Newton's method.

    None when the pooled counts occupy fewer than three buckets (the shape cannot be told from the scale) or the
    fit does not converge."""
    pooled = [c + s for c, s in zip(canary, stable, strict=True)]
    if sum(1 for p in pooled if p > 0) < 3 or sum(canary) <= 0 or sum(stable) <= 0:
        return None
    # Start from the pooled probits: P(X <= bound) = Phi(a ln bound + b), by least squares.
    n, below, xs, ys = sum(pooled), 0.0, [], []
    for count, (_, hi) in zip(pooled, spans, strict=True):
        below += count
        if not math.isinf(hi) and 0 < below < n:
            xs.append(math.log(hi))
            ys.append(_NORMAL.inv_cdf(below / n))
    if len(xs) >= 2 and max(xs) > min(xs):
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        a0 = max(0.1, sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx)
        b0 = my - a0 * mx
    else:
        a0, b0 = 3.0, -3.0 * (xs[0] if xs else 0.0)
    theta = [a0, b0, b0]
    data = [(stable, 1), (canary, 2)]
    ll, grad, hess = _loglik(theta, data, spans)
    for _ in range(60):
        step = _solve3([[-h for h in row] for row in hess], grad)
        if step is None:
            return None
        scale = 1.0
        while True:
            trial = [t + scale * s for t, s in zip(theta, step, strict=True)]
            if trial[0] > 0:
                t_ll, t_grad, t_hess = _loglik(trial, data, spans)
                if t_ll >= ll - 1e-12:
                    break
            scale /= 2
            if scale < 1e-8:
                return None
        theta, ll, grad, hess = trial, t_ll, t_grad, t_hess
        if max(abs(s) * scale for s in step) < 1e-9:
            break
    a, b_s, b_c = theta
    if not 1e-3 < a < 1e4:
        return None
    cov_grad = [-(b_s - b_c) / a**2, 1.0 / a, -1.0 / a]
    solved = _solve3([[-h for h in row] for row in hess], cov_grad)
    if solved is None:
        return None
    var = sum(g * s for g, s in zip(cov_grad, solved, strict=True))
    if not var > 0:
        return None
    return Fit(log_ratio=(b_s - b_c) / a, se=math.sqrt(var))


@dataclass(frozen=True)
class Comparison:
    """Canary against stable for one latency histogram."""

    ratio: float | None
    """Canary/stable latency ratio (the shared-shape fit); None when the histograms cannot give one."""
    interval: tuple[float, float] | None
    """Its 95 % confidence interval."""
    p_value: float | None
    """One-sided: the chance of a rank statistic this far toward "canary slower" between identical variants."""
    z: float | None
    """The rank test's z (after the weight), for the requests a decision would need."""
    canary_requests: float
    stable_requests: float


def compare(canary: Histogram, stable: Histogram, *, weight: float = 1.0) -> Comparison:
    """Judge the canary's latency histogram against the stable's.

    ``weight`` scales the information each observation carries: inter-token latencies come many to a request and
    move together, so the ITL gate passes requests / observations and is judged on about one observation per
    request."""
    c, s, spans = _aligned(canary, stable)
    n_c, n_s = sum(c) * weight, sum(s) * weight
    z = rank_z(c, s)
    fit = scale_fit(c, s, spans)
    if z is not None:
        z *= math.sqrt(weight)
    if fit is not None and weight != 1.0:
        fit = Fit(fit.log_ratio, fit.se / math.sqrt(weight))
    return Comparison(
        ratio=None if fit is None else fit.ratio,
        interval=None if fit is None else fit.interval(),
        p_value=None if z is None else upper_tail(z),
        z=z,
        canary_requests=n_c,
        stable_requests=n_s,
    )


def count_above(histogram: Histogram, bound: float) -> float:
    """Observations over ``bound``, the bucket that holds it split linearly, as ``histogram_quantile`` reads it."""
    above = 0.0
    for lo, hi, count in cells(histogram):
        if lo >= bound:
            above += count
        elif hi > bound:
            above += count if math.isinf(hi) else count * (hi - bound) / (hi - lo)
    return above


def binomial_upper(k: float, n: float, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), n and k rounded; the normal form (continuity-corrected) for large n."""
    n_i, k_i = round(n), math.ceil(k - 1e-9)
    if k_i <= 0:
        return 1.0
    if k_i > n_i:
        return 0.0
    if p <= 0:
        return 0.0
    if p >= 1:
        return 1.0
    if n_i * p * (1 - p) > 400:
        return upper_tail((k_i - 0.5 - n_i * p) / math.sqrt(n_i * p * (1 - p)))
    log_p, log_q = math.log(p), math.log1p(-p)
    base = math.lgamma(n_i + 1)
    total_p = 0.0
    for x in range(k_i, n_i + 1):
        term = math.exp(base - math.lgamma(x + 1) - math.lgamma(n_i - x + 1) + x * log_p + (n_i - x) * log_q)
        total_p += term
        if x > n_i * p and term < total_p * 1e-15:
            break
    return min(1.0, total_p)


def share_test(k: float, n: float, p0: float) -> float | None:
    """One-sided p-value of "the share k/n is over p0" (binomial); None without observations."""
    if n <= 0:
        return None
    return binomial_upper(k, n, p0)


def share_interval(k: float, n: float) -> tuple[float, float] | None:
    """Wilson's 95 % interval of the share k/n; None without observations."""
    if n <= 0:
        return None
    phat = min(max(k / n, 0.0), 1.0)
    denom = 1 + Z95**2 / n
    centre = (phat + Z95**2 / (2 * n)) / denom
    half = Z95 * math.sqrt(phat * (1 - phat) / n + Z95**2 / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Exceedance:
    """How much of a histogram lies over a budget, against the share its quantile allows."""

    share: float
    interval: tuple[float, float]
    p_value: float
    observations: float


def exceedance(histogram: Histogram, budget: float, quantile: float, *, weight: float = 1.0) -> Exceedance | None:
    """Test "the ``quantile`` is over ``budget``", i.e. more than 1 - quantile of the observations exceed it.

    ``weight`` as in ``compare``: the test counts ``weight`` times the observations. None without any."""
    n = total(histogram)
    if n <= 0:
        return None
    above = count_above(histogram, budget)
    n_eff, k_eff = n * weight, above * weight
    interval = share_interval(k_eff, n_eff) or (0.0, 1.0)
    return Exceedance(
        share=above / n, interval=interval, p_value=binomial_upper(k_eff, n_eff, 1.0 - quantile), observations=n
    )


def difference_test(k1: float, n1: float, k2: float, n2: float, delta: float) -> float | None:
    """One-sided p-value of "share 1 exceeds share 2 by more than ``delta``" (a Wald z with the allowed
    difference as the null, each share shrunk toward a half-count so an empty stable side still has a variance).
    None without observations on both sides."""
    if n1 <= 0 or n2 <= 0:
        return None
    p1, p2 = (k1 + 0.5) / (n1 + 1), (k2 + 0.5) / (n2 + 1)
    se = math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    return upper_tail((k1 / n1 - k2 / n2 - delta) / se)


def requests_needed(n: float, z: float | None, z_alpha: float) -> int | None:
    """Requests at which evidence as strong per request as ``z`` from ``n`` would pass ``z_alpha`` (z grows as
    the square root of the sample). None where no sample would do (no effect in the breach's direction)."""
    if z is None or z <= 0 or n <= 0:
        return None
    return math.ceil(n * (z_alpha / z) ** 2)
