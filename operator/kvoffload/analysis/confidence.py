"""How sure a metric row's verdict is, for people: the 95 % interval of its value, its p-value against the alpha a
breach must come under, and the canary requests an Inconclusive breach would need.

One place for ``kvoffload analyze`` and ``kvoffload status`` (cli/statusview.py builds their tables from it) and
for the operator's gauges the dashboard reads (controller/metrics.py), so both show the same rows the same way.
"""

from __future__ import annotations

from kvoffload.analysis.assess import ITL_RATIO, TTFT_RATIO, format_metric_value
from kvoffload.analysis.errorgate import ERROR_SHARE
from kvoffload.analysis.payoff import PAYOFF
from kvoffload.api.status import MetricResult

INTERVAL_SHOWN = frozenset({TTFT_RATIO, ITL_RATIO, ERROR_SHARE, PAYOFF})
"""Rows whose ``interval`` is in the unit of their value (a canary/stable ratio, a share, the payoff's ms). On ttftP99
and itlP99 it bounds the share of requests over the budget, not the p99 shown: beside ``412.0ms`` it would mislead."""


def shown_interval(m: MetricResult) -> tuple[float, float] | None:
    """The row's 95 % interval where it is in the value's unit; None elsewhere, or when it has none."""
    if m.name not in INTERVAL_SHOWN or m.interval is None or len(m.interval) != 2:
        return None
    return m.interval[0], m.interval[1]


def _sig(value: float) -> str:
    """Two significant figures: ``3e-05``, ``0.049``, ``0.5``."""
    return f"{value:.2g}"


def format_evidence(m: MetricResult) -> str:
    """``[1.18x, 1.45x] p=3e-05 (alpha 8e-05)``; empty when the row carries none of it."""
    parts = []
    if (bounds := shown_interval(m)) is not None:
        low, high = (format_metric_value(m.name, b) for b in bounds)
        parts.append(f"[{low}, {high}]")
    if m.p_value is not None:
        parts.append(f"p={_sig(m.p_value)}" + ("" if m.alpha is None else f" (alpha {_sig(m.alpha)})"))
    elif m.alpha is not None:
        parts.append(f"alpha {_sig(m.alpha)}")
    return " ".join(parts)


def format_needed(m: MetricResult) -> str:
    """``needs ~640 canary requests`` on an Inconclusive row that says so; empty otherwise."""
    return "" if m.requests_needed is None else f"needs ~{m.requests_needed:,} canary requests"


__all__ = ["INTERVAL_SHOWN", "format_evidence", "format_needed", "shown_interval"]
