"""The built-in latency gates: a p99 against its budget, and the canary against the stable engines, with evidence.

Per latency (TTFT, ITL) two rows:

- ``ttftP99`` / ``itlP99``: the subject's p99 (Prometheus' ``histogram_quantile``) against the absolute budget. A
  breach counts when the share of observations over the budget is beyond 1 % with a p-value under ``alpha``
  (``evidence.exceedance``); a p99 over the budget without that evidence is Inconclusive and says how many requests
  would settle it. When the stable engines breach the budget too, the canary's row is reported, not gated: a breach
  both share is no reason to take the canary away, and the ratio row judges the canary against them.
- ``ttftP99Ratio`` / ``itlP99Ratio``: the canary/stable latency ratio fitted to both histograms
  (``evidence.compare``), against ``maxRegression``; a breach needs the rank test's p-value under ``alpha``.

Without bucket counts (an answer cut short), a row falls back to the p99 point estimates and says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.analysis.evidence import (
    Histogram,
    Sureness,
    compare,
    exceedance,
    requests_needed,
    total,
    z_for,
    z_of,
)
from kvoffload.api.status import MetricResult

QUANTILE = 0.99


@dataclass(frozen=True)
class Side:
    """One variant's view of one latency: the p99 Prometheus reports, its histogram, and its requests."""

    p99: float | None
    histogram: Histogram
    requests: float | None


@dataclass(frozen=True)
class Gate:
    """What a latency gate is judged with."""

    name: str
    ratio_name: str
    budget: float
    budget_text: str
    max_regression: float
    alpha: float
    per_request: bool
    """False for ITL: many observations to a request; the evidence counts one per request."""


@dataclass(frozen=True)
class LatencyRow:
    result: MetricResult
    gated: bool


def _ms(seconds: float | None) -> str:
    return "no data" if seconds is None else f"{seconds * 1000:.1f}ms"


def _p(value: float) -> str:
    return f"{value:.2g}"


def _weight(gate: Gate, *sides: Side) -> float:
    """Requests per observation (1 for TTFT, about 1/127 for the ITL of 128-token answers)."""
    if gate.per_request:
        return 1.0
    requests = sum(s.requests or 0.0 for s in sides)
    observations = sum(total(s.histogram) for s in sides)
    return min(1.0, requests / observations) if observations > 0 and requests > 0 else 1.0


def budget_row(
    gate: Gate,
    subject: Side,
    *,
    shown: tuple[float | None, float | None],
    stable_p99: float | None,
    who: str,
    enough: bool,
    judging: bool,
) -> LatencyRow:
    """The subject's p99 against the budget. ``shown``: the (canary, stable) p99s for the row; ``stable_p99``: the
    stable engines' when they share the window with a canary (else None); ``judging`` False while the canary warms
    up: reported, not gated."""
    value = subject.p99

    def row(passed: bool | None, message: str, evidence: Sureness, *, gated: bool = True) -> LatencyRow:
        return LatencyRow(
            MetricResult(
                name=gate.name,
                canary=shown[0],
                stable=shown[1],
                threshold=gate.budget,
                passed=passed,
                message=message,
                **evidence,
            ),
            gated,
        )

    if value is None:
        return row(None, f"no {who} {gate.name} in the window", {})
    if not judging:
        return row(None, f"warming up: {who} p99 {_ms(value)} reported, judged once warm", {}, gated=False)
    weight = _weight(gate, subject)
    ex = exceedance(subject.histogram, gate.budget, QUANTILE, weight=weight)
    evidence: Sureness = {} if ex is None else {"p_value": ex.p_value, "alpha": gate.alpha}
    p99 = f"{who} p99 {_ms(value)}"
    if value <= gate.budget:
        return row(True if enough else None, f"{p99} within the {gate.budget_text} budget", evidence)
    if stable_p99 is not None and stable_p99 > gate.budget:
        why = f"and so is the stable's ({_ms(stable_p99)}): a breach both share is judged by the canary/stable ratio"
        return row(None, f"{p99} over the {gate.budget_text} budget, {why}", evidence, gated=False)
    if ex is None:
        return row(
            False if enough else None,
            f"{p99} over the {gate.budget_text} budget (no bucket counts: judged on the p99 alone)",
            evidence,
        )
    over = f"{ex.share:.2%} of {who} requests over {gate.budget_text} (at most {1 - QUANTILE:.0%})"
    if ex.p_value < gate.alpha:
        text = f"{p99} over the {gate.budget_text} budget: {over}, p={_p(ex.p_value)}"
        return row(False if enough else None, text, evidence)
    needed = requests_needed(ex.observations * weight, z_of(ex.p_value), z_for(gate.alpha))
    need = f"; about {needed} {who} requests would settle it" if needed is not None else ""
    evidence["requests_needed"] = needed
    text = (
        f"{p99} over the {gate.budget_text} budget, not yet beyond chance: {over}, "
        f"p={_p(ex.p_value)} (a breach needs under {_p(gate.alpha)}){need}"
    )
    return row(None, text, evidence)


def ratio_row(
    gate: Gate,
    canary: Side,
    stable: Side,
    *,
    enough: bool,
    stable_enough: bool,
    min_requests: int,
    judging: bool,
) -> LatencyRow:
    """The canary against the stable engines in the same window."""
    limit = gate.max_regression
    point = None if canary.p99 is None or stable.p99 is None or stable.p99 <= 0 else canary.p99 / stable.p99
    both = total(canary.histogram) > 0 and total(stable.histogram) > 0
    cmp = compare(canary.histogram, stable.histogram, weight=_weight(gate, canary, stable)) if both else None
    fitted = cmp is not None and cmp.ratio is not None
    effect = cmp.ratio if cmp is not None and cmp.ratio is not None else point
    evidence: Sureness = {}
    if cmp is not None and cmp.p_value is not None:
        evidence = {"p_value": cmp.p_value, "alpha": gate.alpha}
    if cmp is not None and cmp.interval is not None:
        evidence["interval"] = list(cmp.interval)

    def row(passed: bool | None, message: str, *, gated: bool = True) -> LatencyRow:
        result = MetricResult(
            name=gate.ratio_name,
            canary=effect,
            stable=None,
            threshold=limit,
            passed=passed,
            message=message,
            **evidence,
        )
        return LatencyRow(result, gated)

    if effect is None:
        return row(None, "canary/stable ratio needs both histograms")
    bounds = f" [{cmp.interval[0]:.2f}, {cmp.interval[1]:.2f}]" if cmp is not None and cmp.interval else ""
    source = "fitted to both histograms" if fitted else "the p99s"
    what = f"canary/stable latency x{effect:.2f}{bounds} ({source}; p99 {_ms(canary.p99)} / {_ms(stable.p99)})"
    if not stable_enough:
        return row(None, f"stable served fewer than minRequests {min_requests}: {what} not judged")
    if not judging:
        return row(None, f"warming up: {what} reported, judged once warm", gated=False)
    if effect <= limit:
        return row(True if enough else None, f"{what}, at most maxRegression {limit:g}")
    if cmp is None or cmp.p_value is None or cmp.z is None:
        return row(False if enough else None, f"{what}, over maxRegression {limit:g} (no bucket counts)")
    if cmp.p_value < gate.alpha:
        return row(False if enough else None, f"{what}, over maxRegression {limit:g}: rank test p={_p(cmp.p_value)}")
    needed = requests_needed(cmp.canary_requests, cmp.z, z_for(gate.alpha))
    evidence["requests_needed"] = needed
    need = f"; about {needed} canary requests would settle it" if needed is not None else ""
    return row(
        None,
        f"{what}, over maxRegression {limit:g}, not yet beyond chance: rank test p={_p(cmp.p_value)} (a breach "
        f"needs under {_p(gate.alpha)}){need}",
    )
