"""The payoff measured live: what a request restored from the offload tiers saves against recomputing it. Pure.

A canary's window says how slow it is, not why: a tier can stay within every latency budget and still cost more
than the prefill it replaces. So the TTFT each variant served is split into its parts, from Prometheus' increments
over sub-windows of the step (``SubWindow``, one per variant and sub-window), pooled over both variants:

    TTFT summed = f x requests + p x computed tokens + h x GPU-hit tokens + r_s x stable's restored tokens
                  + r_c x canary's restored tokens

``f`` is the per-request fixed cost, ``p`` the prefill per computed token, ``r_c`` the canary's restore per restored
token (``r_s`` the stable's, where its level restores too), by least squares weighted by 1 / requests (a sub-window's
TTFT sum varies as its request count). What a restored token saves is ``d = p - r_c``, and a restored request
``d x e``, with ``e`` the canary's restored tokens per request (no engine counts the requests that loaded, so it is
per request of the canary, and the row says so).

The fit solves for ``d`` directly (the model written with ``p x (computed + restored)`` and ``-d x restored``): a
workload of one prompt length makes requests and prompt tokens collinear, and then ``f`` and ``p`` cannot be told
apart while ``d`` still can (the canary computes fewer tokens by what it restores). Columns that add nothing are
dropped in order (the GPU-hit term first of all); ``d`` is judged only while its own column is not explained by the
others. Its interval and test use Student's t on the sub-windows' degrees of freedom: a step has tens of them.

The verdict asks what every gate with evidence asks (``analysis/evidence.py``): "does not pay" (Fail) when the
one-sided upper bound of the saving is under 0 at the look's ``alpha``; a saving at or under 0 without that
evidence is Inconclusive with the canary requests that would settle it; a positive one passes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvoffload.analysis.evidence import Sureness, requests_needed
from kvoffload.api.quantity import parse_duration
from kvoffload.api.rollout import AnalysisSpec
from kvoffload.api.status import KVOffloadPolicyStatus, MetricResult, PayoffFigures
from kvoffload.policy.ladder import Level

MIN_DEGREES_OF_FREEDOM = 2
"""Sub-windows beyond the figures fitted before a saving is judged: with fewer, the residual variance is a guess."""

COLLINEAR = 1e-6
"""A column whose part not explained by the columns before it is under this share of its own (weighted) sum of
squares adds nothing the fit can use: dropped (or, for the canary's restored tokens, nothing is judged)."""


@dataclass(frozen=True)
class SubWindow:
    """One variant's increments over one sub-window (``increase(...[sub])`` at one step of a range query)."""

    requests: float
    """Requests that got their first token (the TTFT histogram's count)."""
    ttft_seconds: float
    """Their TTFT summed (the histogram's sum)."""
    computed: float
    """Prompt tokens prefilled (``source="local_compute"``)."""
    local_hit: float
    """Prompt tokens found in the GPU prefix cache."""
    external: float
    """Prompt tokens restored from the offload tiers (``external_kv_transfer``)."""


@dataclass(frozen=True)
class PayoffFit:
    """The fitted figures (seconds), and the saving per restored request with its standard error."""

    fixed_s: float | None
    """None where the sub-windows cannot tell it from the prefill (prompts of one length make requests and prompt
    tokens collinear, and then ``f`` holds ``p`` x the prompt): the prefill is not positive beyond its interval."""
    prefill_s_per_token: float | None
    restore_s_per_token: float | None
    saving_s_per_token: float
    saving_s_per_token_se: float
    restored_tokens_per_request: float
    rows: int
    dof: int
    canary_requests: float
    stable_requests: float

    @property
    def saving_s(self) -> float:
        """What a request of the canary saves by its restores, seconds (negative: it loses)."""
        return self.saving_s_per_token * self.restored_tokens_per_request

    @property
    def saving_se_s(self) -> float:
        return self.saving_s_per_token_se * self.restored_tokens_per_request


# Column order: the greedy drop keeps the earlier of two collinear columns; the canary's restored tokens come last,
# so their coefficient is judged only on what nothing before it explains.
_REQUESTS, _PROMPT, _STABLE_RESTORED, _LOCAL, _CANARY_RESTORED = range(5)


def _design(canary: Sequence[SubWindow], stable: Sequence[SubWindow]) -> tuple[list[list[float]], list[float]]:
    """Rows of the reparametrised model, weighted (each divided by the square root of its requests)."""
    xs, ys = [], []
    for rows, is_canary in ((stable, False), (canary, True)):
        for w in rows:
            if not (w.requests >= 1 and all(math.isfinite(v) for v in (w.ttft_seconds, w.computed, w.external))):
                continue
            scale = 1.0 / math.sqrt(w.requests)
            restored = max(w.external, 0.0)
            x = [0.0] * 5
            x[_REQUESTS] = w.requests
            x[_PROMPT] = max(w.computed, 0.0) + (restored if is_canary else 0.0)
            x[_STABLE_RESTORED] = 0.0 if is_canary else restored
            x[_LOCAL] = max(w.local_hit, 0.0) if math.isfinite(w.local_hit) else 0.0
            x[_CANARY_RESTORED] = -restored if is_canary else 0.0  # its coefficient is d = p - r_c
            xs.append([v * scale for v in x])
            ys.append(w.ttft_seconds * scale)
    return xs, ys


def _invert(m: list[list[float]]) -> list[list[float]] | None:
    """The inverse of a small symmetric positive definite matrix (Gauss-Jordan with pivoting); None if singular."""
    n = len(m)
    a = [[*row, *(1.0 if i == j else 0.0 for j in range(n))] for i, row in enumerate(m)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        lead = a[col][col]
        a[col] = [v / lead for v in a[col]]
        for r in range(n):
            if r != col and a[r][col] != 0.0:
                f = a[r][col]
                a[r] = [v - f * p for v, p in zip(a[r], a[col], strict=True)]
    return [row[n:] for row in a]


def _kept_columns(xs: list[list[float]]) -> list[int] | None:
    """The columns that add rank, in order (Gram-Schmidt on the weighted columns); None when the canary's restored
    tokens are explained by the rest (or absent): the saving cannot be told from the data."""
    basis: list[list[float]] = []
    kept: list[int] = []
    for j in range(5):
        col = [row[j] for row in xs]
        norm2 = sum(v * v for v in col)
        if norm2 <= 0:
            if j == _CANARY_RESTORED:
                return None
            continue
        residual = col[:]
        for q in basis:  # twice, for the precision of nearly collinear columns
            dot = sum(a * b for a, b in zip(residual, q, strict=True))
            residual = [a - dot * b for a, b in zip(residual, q, strict=True)]
        for q in basis:
            dot = sum(a * b for a, b in zip(residual, q, strict=True))
            residual = [a - dot * b for a, b in zip(residual, q, strict=True)]
        left = sum(v * v for v in residual)
        if left <= COLLINEAR * norm2:
            if j == _CANARY_RESTORED:
                return None
            continue
        basis.append([v / math.sqrt(left) for v in residual])
        kept.append(j)
    return kept


def fit_payoff(canary: Sequence[SubWindow], stable: Sequence[SubWindow]) -> PayoffFit | None:
    """The payoff fitted to both variants' sub-windows; None when the canary restored nothing, the saving cannot be
    told apart from the rest, or fewer than ``MIN_DEGREES_OF_FREEDOM`` sub-windows are left over."""
    xs, ys = _design(canary, stable)
    kept = _kept_columns(xs) if xs else None
    if kept is None:
        return None
    k, n = len(kept), len(xs)
    dof = n - k
    if dof < MIN_DEGREES_OF_FREEDOM:
        return None
    # Requests and tokens differ by orders of magnitude: solved on unit columns, then scaled back.
    norms = [math.sqrt(sum(row[j] ** 2 for row in xs)) for j in kept]
    x = [[row[j] / s for j, s in zip(kept, norms, strict=True)] for row in xs]
    xtx = [[sum(r[a] * r[b] for r in x) for b in range(k)] for a in range(k)]
    xty = [sum(r[a] * y for r, y in zip(x, ys, strict=True)) for a in range(k)]
    unit_inv = _invert(xtx)
    if unit_inv is None:
        return None
    unit_beta = [sum(unit_inv[a][b] * xty[b] for b in range(k)) for a in range(k)]
    rss = sum((y - sum(b * v for b, v in zip(unit_beta, r, strict=True))) ** 2 for r, y in zip(x, ys, strict=True))
    sigma2 = rss / dof
    beta = [b / s for b, s in zip(unit_beta, norms, strict=True)]
    inv = [[unit_inv[a][b] / (norms[a] * norms[b]) for b in range(k)] for a in range(k)]
    at = {j: i for i, j in enumerate(kept)}
    d_at = at[_CANARY_RESTORED]
    d, d_var = beta[d_at], sigma2 * inv[d_at][d_at]
    separable = _REQUESTS in at and _PROMPT in at
    if separable:
        # Told apart only where the prefill is positive beyond its own 95 % interval: prompts of nearly one length
        # leave requests and tokens nearly collinear, and a negative prefill per token is no figure to show.
        p_at = at[_PROMPT]
        separable = beta[p_at] - t_quantile(0.025, dof) * math.sqrt(max(sigma2 * inv[p_at][p_at], 0.0)) > 0
    p = beta[at[_PROMPT]] if separable else None
    canary_requests = sum(w.requests for w in canary if w.requests >= 1)
    restored = sum(max(w.external, 0.0) for w in canary if w.requests >= 1)
    return PayoffFit(
        fixed_s=beta[at[_REQUESTS]] if separable else None,
        prefill_s_per_token=p,
        restore_s_per_token=None if p is None else p - d,
        saving_s_per_token=d,
        saving_s_per_token_se=math.sqrt(max(d_var, 0.0)),
        restored_tokens_per_request=restored / canary_requests if canary_requests > 0 else 0.0,
        rows=n,
        dof=dof,
        canary_requests=canary_requests,
        stable_requests=sum(w.requests for w in stable if w.requests >= 1),
    )


# --- Student's t, for the few degrees of freedom of a step's sub-windows --------------------------------------------


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), regularised."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_upper(t: float, dof: float) -> float:
    """P(T > t) for Student's t with ``dof`` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(dof / 2.0, 0.5, dof / (dof + t * t))
    return tail if t >= 0 else 1.0 - tail


def t_quantile(upper: float, dof: float) -> float:
    """The t whose upper tail is ``upper`` (0 < upper <= 0.5), by bisection."""
    lo, hi = 0.0, 1.0
    while t_upper(hi, dof) > upper:
        hi *= 2.0
        if hi > 1e12:
            return hi
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_upper(mid, dof) > upper:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


# --- The verdict ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PayoffJudgement:
    """The saving and how sure it is: ``passed`` False "does not pay", None not judged, True pays."""

    fit: PayoffFit
    passed: bool | None
    p_value: float
    interval: tuple[float, float]
    """95 % interval of the saving per restored request, seconds."""
    requests_needed: int | None


def judge(fit: PayoffFit, alpha: float) -> PayoffJudgement:
    """ "Does not pay" when the saving is under 0 beyond chance (its one-sided p-value under ``alpha``)."""
    se = fit.saving_se_s
    saving = fit.saving_s
    if se > 0:
        t = saving / se
        p_value = 1.0 - t_upper(t, fit.dof)  # P(T <= t): evidence this strong that it loses, were it break-even
        half = t_quantile(0.025, fit.dof) * se
    else:  # a perfect fit: the sign is the evidence
        p_value = 0.0 if saving < 0 else 1.0
        half = 0.0
    interval = (saving - half, saving + half)
    if saving > 0:
        return PayoffJudgement(fit, True, p_value, interval, None)
    if p_value < alpha:
        return PayoffJudgement(fit, False, p_value, interval, None)
    # The bound is Student's at these degrees of freedom; with more requests in as many sub-windows, t grows as
    # their square root (a conservative count: more sub-windows also lower the bound).
    z = -saving / se if se > 0 else None
    needed = requests_needed(fit.canary_requests, z, t_quantile(alpha, fit.dof))
    return PayoffJudgement(fit, None, p_value, interval, needed)


def sureness(j: PayoffJudgement, alpha: float) -> Sureness:
    """The row's evidence fields, the interval in ms as the row's value."""
    out: Sureness = {"p_value": j.p_value, "alpha": alpha, "interval": [j.interval[0] * 1e3, j.interval[1] * 1e3]}
    if j.requests_needed is not None:
        out["requests_needed"] = j.requests_needed
    return out


def describe(fit: PayoffFit) -> str:
    """``fixed 52.1 ms, prefill 48.3 µs/token, restore 112.0 µs/token (canary), 1,984 restored tokens a request``."""
    if fit.fixed_s is None or fit.prefill_s_per_token is None or fit.restore_s_per_token is None:
        parts = ["fixed and prefill not told apart (prompts of about one length)"]
    else:
        parts = [
            f"fixed {fit.fixed_s * 1e3:.1f} ms",
            f"prefill {fit.prefill_s_per_token * 1e6:.1f} µs/token",
            f"restore {fit.restore_s_per_token * 1e6:.1f} µs/token",
        ]
    parts.append(f"prefill - restore {fit.saving_s_per_token * 1e6:+.1f} µs/token")
    parts.append(f"{fit.restored_tokens_per_request:,.0f} restored tokens per canary request")
    return ", ".join(parts) + f" ({fit.rows} sub-windows)"


# --- What to read ----------------------------------------------------------------------------------------------------


def payoff_sub_window(analysis: AnalysisSpec) -> float:
    """The sub-window, seconds: two scrapes (the rendered PodMonitor scrapes every ``analysis.interval``), so each
    sub-window's ``increase`` has two samples of every series to stand on."""
    return 2.0 * parse_duration(analysis.interval)


def payoff_since(status: KVOffloadPolicyStatus | None, level: Level) -> float | None:
    """From when (Unix seconds) a cycle reads the payoff's sub-windows: the running step's start, while a canary of
    an offload level runs beside a stable side; None otherwise (nothing is read). The whole step, not one window:
    a step gives tens of sub-windows where a window gives a few, and cold sub-windows are no bias here (the fit
    prices tokens by where they came from, whatever the mix)."""
    if status is None or status.canary is None or status.stable is None or not level.offloads:
        return None
    if status.stable.replicas <= 0 or status.stage is None or status.stage.started_at is None:
        return None
    return status.stage.started_at.timestamp()


# --- The row ----------------------------------------------------------------------------------------------------------

PAYOFF = "payoff"
"""The row's name in ``status.lastAnalysis.metrics``: its value is the saving per restored request, ms."""


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:+.1f} ms"


def figures(fit: PayoffFit) -> PayoffFigures:
    """The fitted figures as the status carries them."""

    def scaled(value: float | None, unit: float) -> float | None:
        return None if value is None else value * unit

    return PayoffFigures(
        fixed_ms=scaled(fit.fixed_s, 1e3),
        prefill_us_per_token=scaled(fit.prefill_s_per_token, 1e6),
        restore_us_per_token=scaled(fit.restore_s_per_token, 1e6),
        saving_us_per_token=fit.saving_s_per_token * 1e6,
        restored_tokens_per_request=fit.restored_tokens_per_request,
        sub_windows=fit.rows,
        degrees_of_freedom=fit.dof,
    )


@dataclass(frozen=True)
class PayoffRow:
    result: MetricResult
    gated: bool


def payoff_row(
    canary: Sequence[SubWindow],
    stable: Sequence[SubWindow],
    *,
    gate: bool,
    gate_text: str,
    judging: bool,
    min_requests: int,
    alpha: float,
    forecast_saving_us_per_token: float | None = None,
) -> PayoffRow:
    """The ``payoff`` row of a canary on an offload level. ``gate``: the policy gates it here (``analysis.payoff``;
    ``gate_text`` says why or why not); ``judging`` False while the canary warms up: reported, not gated.
    ``forecast_saving_us_per_token``: the economics' forecast of the saving per restored token, shown beside the
    measured saving for the same restored tokens a request."""
    fit = fit_payoff(canary, stable)
    forecast_saving_ms = (
        None
        if forecast_saving_us_per_token is None or fit is None
        else forecast_saving_us_per_token * fit.restored_tokens_per_request / 1e3
    )
    forecast = (
        ""
        if forecast_saving_ms is None
        else f"; the forecast for as many restored tokens: {forecast_saving_ms:+.1f} ms"
    )

    def row(
        passed: bool | None, message: str, *, gated: bool, value: float | None = None, evidence: Sureness | None = None
    ) -> PayoffRow:
        result = MetricResult(
            name=PAYOFF,
            canary=value,
            threshold=0.0,
            passed=passed,
            message=message + forecast,
            payoff=None if fit is None else figures(fit),
            forecast_saving_ms=forecast_saving_ms,
            **(evidence or {}),
        )
        return PayoffRow(result, gated)

    if fit is None:
        restored = sum(max(w.external, 0.0) for w in canary)
        seen = sum(1 for w in (*canary, *stable) if w.requests >= 1)
        why = (
            "the canary restored no prompt tokens in the sub-windows"
            if restored <= 0
            else f"{seen} sub-windows cannot tell the restores' cost from the rest yet"
        )
        return row(None, f"payoff not measured: {why} (not judged)", gated=False)
    judged = judge(fit, alpha)
    low, high = judged.interval
    what = f"a canary request saves {_ms(fit.saving_s)} [{_ms(low)}, {_ms(high)}] by its restores ({describe(fit)})"
    evidence = sureness(judged, alpha)
    value = fit.saving_s * 1e3
    if fit.canary_requests < min_requests or fit.stable_requests < min_requests:
        short = f"fewer than minRequests {min_requests} requests in the sub-windows"
        return row(None, f"{what}: {short} (not judged)", gated=False, value=value, evidence=evidence)
    if not judging:
        text = f"warming up: {what} (reported, judged once warm)"
        return row(None, text, gated=False, value=value, evidence=evidence)
    if not gate:
        verdict = "pays" if judged.passed else "does not pay" if judged.passed is False else "not yet judged"
        return row(None, f"{verdict}: {what} (reported: {gate_text})", gated=False, value=value, evidence=evidence)
    p = f"p={judged.p_value:.2g}"
    if judged.passed:
        return row(True, f"pays: {what}", gated=True, value=value, evidence=evidence)
    if judged.passed is False:
        return row(
            False,
            f"does not pay: {what}, below 0 beyond chance ({p}, alpha {alpha:.2g})",
            gated=True,
            value=value,
            evidence=evidence,
        )
    need = "" if judged.requests_needed is None else f"; about {judged.requests_needed} canary requests would settle it"
    text = f"{what}, not yet beyond chance: {p} (does not pay needs under {alpha:.2g}){need}"
    return row(None, text, gated=True, value=value, evidence=evidence)


__all__ = [
    "MIN_DEGREES_OF_FREEDOM",
    "PAYOFF",
    "PayoffFit",
    "PayoffJudgement",
    "PayoffRow",
    "SubWindow",
    "describe",
    "figures",
    "fit_payoff",
    "judge",
    "payoff_row",
    "payoff_since",
    "payoff_sub_window",
    "sureness",
    "t_quantile",
    "t_upper",
]
