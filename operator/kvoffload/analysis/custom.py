"""Custom metrics judged: each reading against its bounds, its own sustainedFor, and dry runs that never decide.

Pure, like ``assess()``: ``judge_custom()`` turns one cycle's readings of the policy's custom metrics
(``spec.analysis.metrics[]`` and those of its KVOffloadAnalysisTemplates) into results beside the built-in
ones, and ``with_custom()`` folds them into the cycle's Assessment:

- a gated metric that breached fails the verdict, as a built-in one does; one that could not be judged
  (no data, several series, Prometheus refused the query, a template not found) makes it Inconclusive;
- a dry-run metric is evaluated and shown, with the pass/fail it would have had, and never decides;
- too few requests, or no measurements at all, stay Inconclusive whatever the custom metrics say.

Each custom result carries ``failingSince`` (when its current run of breaches began, kept across
Inconclusive cycles as the verdict's is, ended by a pass or by a cycle where the metric does not apply: a
ratio with no canary beside a stable side, or in the warm-up; ``previous`` must not span a step start nor the
warm-up's end, see ``rollout.record.evidence_of``) and ``sustained`` (the breach has lasted the metric's own
``sustainedFor``, over two readings at least). ``breach_sustained()`` is the rollback rule with them:
a Fail whose only breaches are custom metrics rolls back once one of them is sustained; a Fail with a
built-in breach keeps the policy-wide rule (``sustained()`` with ``analysis.sustainedFor``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from kvoffload.analysis.assess import REQUESTS, Assessment, sustained
from kvoffload.api.analysistemplate import Comparison, MetricSource
from kvoffload.api.quantity import parse_duration
from kvoffload.api.rollout import AnalysisSpec
from kvoffload.api.status import AnalysisStatus, MetricResult, Verdict


@dataclass(frozen=True)
class CustomReading:
    """One custom metric's values this cycle, or why there are none."""

    source: MetricSource
    canary: float | None = None
    stable: float | None = None
    error: str | None = None
    """Why it could not be read (Prometheus's answer, several series...); the metric is then not judged."""


@dataclass(frozen=True)
class CustomResult:
    result: MetricResult
    gated: bool


def _within(value: float, low: float | None, high: float | None) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


def _bounds_text(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"between {low:g} and {high:g}"
    return f"at least {low:g}" if low is not None else f"at most {high:g}"


def judge_custom(
    readings: Sequence[CustomReading],
    previous: AnalysisStatus | None,
    analysis: AnalysisSpec,
    now: datetime,
    *,
    has_canary: bool,
    stable_side: bool = True,
    comparing: bool = True,
    enough: bool = True,
) -> list[CustomResult]:
    """The results of the custom metrics this cycle (see the module). ``has_canary``, ``stable_side`` and
    ``comparing`` mean what they mean to ``assess()``; ``enough``: the subject served ``minRequests``."""
    before = {m.name: m for m in (previous.metrics if previous is not None else []) if m.dry_run is not None}
    out: list[CustomResult] = []
    for reading in readings:
        metric = reading.source.metric
        who = "canary" if has_canary else "stable"
        gated = not metric.dry_run
        # False where the metric cannot be judged this cycle by its nature (a ratio without a canary beside a
        # stable side, or during the warm-up): no breach runs on then, so its failingSince ends.
        applies = True
        passed: bool | None = None
        value: float | None
        if metric.comparison is Comparison.RATIO:
            value = None
            if reading.canary is not None and reading.stable is not None and reading.stable != 0:
                value = reading.canary / reading.stable
                if math.isnan(value):  # both infinite: no ratio to judge
                    value = None
            if not has_canary or not stable_side:
                gated, applies = False, False
                message = "a ratio needs a canary beside stable engines (reported, not gated)"
            elif not comparing:
                gated, applies = False, False
                message = "warming up: canary/stable reported, gated once the canary is warm"
            elif reading.error is not None:
                message = f"not judged: {reading.error}"
            elif value is None:
                message = "canary/stable needs both values, the stable one not zero, not both infinite"
            else:
                passed = _within(value, metric.min, metric.max) if enough else None
                message = f"canary/stable = {value:.3g}, {'' if passed is not False else 'not '}{_bounds_text(metric.min, metric.max)}"  # noqa: E501
        else:
            value = reading.canary if has_canary else reading.stable
            if reading.error is not None:
                message = f"not judged: {reading.error}"
            elif value is None:
                message = f"no {who} value in the window"
            else:
                passed = _within(value, metric.min, metric.max) if enough else None
                message = (
                    f"{who} {value:.4g}, {'' if passed is not False else 'not '}{_bounds_text(metric.min, metric.max)}"
                )
        if metric.dry_run:
            message = f"dry run: {message}"
        old = before.get(metric.name)
        since = None
        if passed is False:
            since = old.failing_since if old is not None and old.failing_since is not None else now
        elif passed is None and old is not None and applies:
            since = old.failing_since  # missing evidence neither clears a breach nor extends it
        hold = parse_duration(metric.sustained_for or analysis.sustained_for)
        lasted = passed is False and since is not None and since < now and (now - since).total_seconds() >= hold
        result = MetricResult(
            name=metric.name,
            canary=reading.canary,
            stable=reading.stable,
            threshold=metric.max if metric.max is not None else metric.min,
            passed=passed,
            message=message,
            dry_run=metric.dry_run,
            template=reading.source.template,
            failing_since=since,
            sustained=lasted if passed is False else None,
        )
        out.append(CustomResult(result, gated))
    return out


def with_custom(assessment: Assessment, results: Sequence[CustomResult]) -> Assessment:
    """The cycle's Assessment with the custom results beside the built-in ones, and the verdict they give."""
    if not results:
        return assessment
    metrics = (*assessment.metrics, *(r.result for r in results))
    requests = assessment.metric(REQUESTS)
    if requests is None or requests.passed is not True:  # no measurements, or too few requests: no evidence
        return replace(assessment, metrics=metrics)
    failed = [r.result.message for r in results if r.gated and r.result.passed is False]
    unjudged = [r.result.message for r in results if r.gated and r.result.passed is None]
    named = [f"{r.result.name}: {r.result.message}" for r in results if r.gated and r.result.passed is False]
    if assessment.verdict is Verdict.FAIL:
        message = "; ".join([assessment.message, *named]) if failed else assessment.message
        return Assessment(Verdict.FAIL, metrics, message)
    if failed:
        return Assessment(Verdict.FAIL, metrics, "; ".join(named))
    if assessment.verdict is Verdict.INCONCLUSIVE:
        return replace(assessment, metrics=metrics)
    if unjudged:
        names = [f"{r.result.name}: {r.result.message}" for r in results if r.gated and r.result.passed is None]
        return Assessment(Verdict.INCONCLUSIVE, metrics, "; ".join(names))
    return replace(assessment, metrics=metrics)


def breach_sustained(status: AnalysisStatus | None, sustained_for: float | str, now: datetime) -> bool:
    """Whether the latest Fail calls for a rollback: when a gated custom metric's breach has lasted its own
    sustainedFor, or, when a built-in metric breached (or none is named), by ``sustained()``. A Fail whose only
    breaches are custom metrics waits for theirs, not for ``analysis.sustainedFor``."""
    if status is None or status.verdict is not Verdict.FAIL:
        return False
    breached = [m for m in status.metrics if m.passed is False and not m.dry_run]
    custom = [m for m in breached if m.dry_run is False]
    if any(m.sustained for m in custom):
        return True
    return (len(custom) < len(breached) or not breached) and sustained(status, sustained_for, now)
