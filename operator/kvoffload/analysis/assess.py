"""Analysis: judging what Prometheus shows for canary and stable, as one pure ``assess()``.

``assess()`` turns one cycle's measurements into a verdict with every metric's
value, threshold and reason; ``record_verdict()`` folds a verdict into the running
counters kept in status, and ``sustained()`` says whether a Fail has held long
enough to roll back. None of them does I/O or reads the clock.

The subject of an assessment is the canary when one runs; without one (the
Stable guard, or the baseline) it is the stable variant, judged against the
absolute budgets only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from kvoffload.analysis.errorgate import ERROR_SHARE, ERROR_SHARE_INCREASE, error_rows
from kvoffload.analysis.evidence import look_alpha
from kvoffload.analysis.latencygate import Gate, Side, budget_row, ratio_row
from kvoffload.analysis.measurements import Measurements, VariantSample, _num, _ratio
from kvoffload.analysis.offloadgate import (
    TIER_HIT_SHARE,
    _allocated_bytes,
    _allocated_check,
    _live_config_message,
    _tier_hit_shares,
)
from kvoffload.analysis.payoff import PAYOFF, payoff_row
from kvoffload.api.quantity import parse_duration
from kvoffload.api.rollout import AnalysisSpec, PayoffGate, RolloutSpec
from kvoffload.api.status import AnalysisStatus, BaselineStatus, MetricResult, Verdict
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.engines.dialect import CACHED_SOURCE_DISK, CACHED_SOURCE_HOST
from kvoffload.policy.ladder import Level

# Metric names, as they appear in status.lastAnalysis.metrics and the CLI table.
REQUESTS = "requests"
TTFT_P99 = "ttftP99"
TTFT_RATIO = "ttftP99Ratio"
ITL_P99 = "itlP99"
ITL_RATIO = "itlP99Ratio"
TTFT_VS_BASELINE = "ttftP99VsBaseline"
ITL_VS_BASELINE = "itlP99VsBaseline"
EXTERNAL_SHARE = "externalShare"
TIER_HITS = "tierHits"
"""Prefix ``tierHits.<source>``: prompt tokens served from that cache source (``host``, ``disk``)."""
KV_USAGE = "kvUsage"
LOAD_THROUGHPUT = "offloadLoadThroughput"
LIVE_CONFIG = "liveConfig"
"""What the engines run: ``vllm:cache_config_info`` (reported), and where ``vllm:kv_offload_config_info``
exists (vLLM 0.33 on) the CPU tier as allocated, compared with the rendered size: ``passed`` False on a
mismatch, which ``decide()`` treats as a canary's hard failure."""

OBSERVE_NOT_JUDGED = frozenset(
    {TTFT_RATIO, ITL_RATIO, EXTERNAL_SHARE, TIER_HITS, TIER_HIT_SHARE, LOAD_THROUGHPUT, LIVE_CONFIG, PAYOFF}
)
"""Rows an observe-only policy cannot judge: its fleet runs no offload tier, and its canary is its stable side."""


@dataclass(frozen=True)
class Assessment:
    """A verdict with each metric's value, threshold and reason."""

    verdict: Verdict
    metrics: tuple[MetricResult, ...] = ()
    message: str = ""

    def metric(self, name: str) -> MetricResult | None:
        """The result named ``name``, if it was reported."""
        return next((m for m in self.metrics if m.name == name), None)


@dataclass
class _Row:
    result: MetricResult
    gated: bool
    """A gated row decides the verdict: a breach fails it, an unjudged one makes it Inconclusive."""


GATES_WITH_EVIDENCE = 5
"""TTFT and ITL against budget and against stable, and the failed share against budget: the gates that share
``analysis.falseRollbackRate`` at each look (the failed share's increase over the stable's is judged on its bound).
Where the live payoff gates the level it is a sixth (``look_alpha_of(payoff=True)``)."""


def look_alpha_of(spec: AnalysisSpec | KVOffloadPolicySpec, *, payoff: bool = False) -> float:
    """The p-value a breach must come under at one analysis so a step of ``rollout.stepDuration`` rolls back a canary
    no worse than the stable in at most ``analysis.falseRollbackRate`` of steps (a union bound over its analyses and
    the gates; without a policy, the default step). ``payoff``: the live payoff gates this level too."""
    analysis = spec.analysis if isinstance(spec, KVOffloadPolicySpec) else spec
    step = spec.rollout.step_duration if isinstance(spec, KVOffloadPolicySpec) else RolloutSpec().step_duration
    looks = math.ceil(parse_duration(step) / parse_duration(analysis.interval))
    return look_alpha(analysis.false_rollback_rate, looks, GATES_WITH_EVIDENCE + (1 if payoff else 0))


def payoff_gates(analysis: AnalysisSpec, level: Level) -> tuple[bool, str]:
    """Whether ``analysis.payoff`` gates a canary of ``level`` on its live payoff, and why (for the row)."""
    if analysis.payoff is PayoffGate.REPORT:
        return False, "analysis.payoff is report"
    if analysis.payoff is PayoffGate.GATE:
        return True, "analysis.payoff is gate"
    if level.secondary_tiers:
        return True, "a secondary tier must pay (analysis.payoff auto)"
    return False, "analysis.payoff auto gates levels with a secondary tier"


def assess(
    spec: AnalysisSpec | KVOffloadPolicySpec,
    level: Level,
    measurements: Measurements,
    *,
    warmed_up: bool,
    baseline: BaselineStatus | None = None,
    stable_side: bool = True,
    comparing: bool = True,
    observing: bool = False,
    forecast_saving_us_per_token: float | None = None,
) -> Assessment:
    """Judge one cycle. Pure: the same inputs always give the same Assessment.

    - Prometheus error, no series, or fewer than ``minRequests`` on the subject: Inconclusive,
      never Fail (a breach seen on too few requests is reported but does not count). One exception: the
      error gate counts its own requests (a request failing before its first token has no TTFT), so an
      error row judged on ``minRequests`` of its own count that breached fails the verdict even when the
      TTFT count is short; the latency and offload rows still need their own samples.
    - Fail when any gated metric breached: p99 TTFT or ITL over budget; canary/stable p99 over
      ``maxRegression``; external share under ``minExternalShare`` (levels with offload, after
      warm-up); a secondary tier that served no tokens (after warm-up); a failed-request share over
      ``errors.maxShare``, or the canary's more than ``errors.maxIncrease`` over the stable's.
    - Pass when every gated metric passed; Inconclusive when one could not be judged.
    - Offload throughput, KV usage, the live config and the baseline ratios are reported only.
    - ``stable_side=False``: the canary runs every replica (the last promotion step with
      ``maxSurge: 0``), so no control group shares the window; the canary is held to the absolute
      budgets, and its ratio to the baseline is reported. Earlier steps already gated the ratio.
    - ``comparing=False``: the canary is not judged yet (``analysis.warmup``, until one window after it is warm):
      its latency rows, budgets and ratios, are reported, not gated, and so are the offload hit checks; the error
      gate still is (a failed request is no cold-cache artefact).
    - ``observing=True``: the subject is a fleet the operator observes and did not render (an observe-only
      policy, canary and stable both that fleet): what needs an offload tier or a canary apart from its stable
      side is reported as not judged (``OBSERVE_NOT_JUDGED``), and only the rest decides.
    - The live payoff (``payoff``, ``analysis/payoff.py``): a canary of an offload level beside its stable side, from
      their sub-windows (``VariantSample.payoff_rows``); gated as ``analysis.payoff`` says (``payoff_gates``), after
      the warm-up. ``forecast_saving_us_per_token``: the economics' forecast of the saving per restored token
      (``kvoffload plan``'s), shown beside it for the same restored tokens.
    """
    warmed_up = warmed_up and comparing
    analysis = spec.analysis if isinstance(spec, KVOffloadPolicySpec) else spec
    if measurements.error is not None:
        return Assessment(Verdict.INCONCLUSIVE, (), f"no measurements: {measurements.error}")

    canary = measurements.canary
    stable = measurements.stable or VariantSample()
    subject = canary if canary is not None else stable
    who = "observed fleet" if observing else "canary" if canary is not None else "stable"
    c = canary or VariantSample()
    min_requests = analysis.min_requests
    limit = analysis.max_regression

    subject_requests = _num(subject.requests)
    enough = subject_requests is not None and subject_requests >= min_requests
    stable_enough = (_num(stable.requests) or 0.0) >= min_requests

    rows: list[_Row] = []

    def add(
        name: str,
        canary_value: float | None,
        stable_value: float | None,
        threshold: float | None,
        passed: bool | None,
        message: str,
        *,
        gated: bool,
    ) -> None:
        result = MetricResult(
            name=name,
            canary=canary_value,
            stable=stable_value,
            threshold=threshold,
            passed=passed,
            message=message,
        )
        rows.append(_Row(result, gated))

    # Sample size: too few requests is never a failure, only a lack of evidence.
    if subject_requests is None:
        req_msg = f"no {who} requests seen in the window"
    elif enough:
        req_msg = f"{who} served {subject_requests:.0f} requests (at least {min_requests})"
    else:
        req_msg = f"{who} served {subject_requests:.0f} requests, fewer than minRequests {min_requests}"
    add(
        REQUESTS,
        _num(c.requests),
        _num(stable.requests),
        float(min_requests),
        True if enough else None,
        req_msg,
        gated=False,
    )

    payoff_measured = canary is not None and stable_side and level.offloads and not observing
    payoff_gated, payoff_why = payoff_gates(analysis, level)
    alpha = look_alpha_of(spec, payoff=payoff_measured and payoff_gated)
    shares_window = canary is not None and stable_side and stable_enough and not observing
    for gate, attr, hist_attr, vs_base_name, base_value in (
        (
            Gate(TTFT_P99, TTFT_RATIO, parse_duration(analysis.ttft_p99), analysis.ttft_p99, limit, alpha, True),
            "ttft_p99",
            "ttft_histogram",
            TTFT_VS_BASELINE,
            baseline.ttft_p99 if baseline else None,
        ),
        (
            Gate(ITL_P99, ITL_RATIO, parse_duration(analysis.itl_p99), analysis.itl_p99, limit, alpha, False),
            "itl_p99",
            "itl_histogram",
            ITL_VS_BASELINE,
            baseline.itl_p99 if baseline else None,
        ),
    ):
        if gate.name == ITL_P99 and measurements.no_itl is not None:
            unjudged = f"not judged: {measurements.no_itl}"
            add(ITL_P99, None, None, gate.budget, None, unjudged, gated=False)
            if canary is not None and stable_side:
                add(ITL_RATIO, None, None, limit, None, unjudged, gated=False)
            continue
        side = Side(_num(getattr(subject, attr)), getattr(subject, hist_attr), _num(subject.requests))
        other = Side(_num(getattr(stable, attr)), getattr(stable, hist_attr), _num(stable.requests))
        judged = budget_row(
            gate,
            side,
            shown=(_num(getattr(c, attr)), other.p99),
            stable_p99=other.p99 if shares_window else None,
            who=who,
            enough=enough,
            judging=comparing or canary is None,
        )
        rows.append(_Row(judged.result, judged.gated))
        if canary is not None and stable_side:
            judged = ratio_row(
                gate,
                side,
                other,
                enough=enough,
                stable_enough=stable_enough,
                min_requests=min_requests,
                judging=comparing,
            )
            rows.append(_Row(judged.result, judged.gated))
        elif base_value is not None:
            # The GPU-only baseline is for the record: traffic drifts since it was taken, so it is not gated.
            ratio = _ratio(side.p99, _num(base_value))
            add(
                vs_base_name,
                ratio,
                None,
                limit,
                None,
                "no data" if ratio is None else f"{who}/baseline p99 = {ratio:.2f} (reported, not gated)",
                gated=False,
            )

    # Failed requests: a canary that fails requests while its latency looks fine (analysis/errorgate.py).
    rows += (
        _Row(row.result, row.gated)
        for row in error_rows(
            analysis.errors,
            canary=(canary.finished, canary.http_responses) if canary is not None else None,
            stable=(stable.finished, stable.http_responses),
            min_requests=min_requests,
            stable_side=stable_side,
            alpha=alpha,
        )
    )

    # External share: only offload can load tokens from outside the GPU, and only once the tiers are warm.
    share = _num(subject.external_share)
    min_share = analysis.min_external_share
    share_gated = level.offloads and warmed_up
    if not level.offloads:
        share_msg, share_pass = f"level {level.name} has no offload (reported, not gated)", None
    elif not warmed_up:
        share_msg, share_pass = "warming up: gated after the first half of the step", None
    elif share is None:
        share_msg, share_pass = f"no {who} prompt tokens in the window", None
    else:
        share_pass = share >= min_share if enough else None
        share_msg = f"{who} loaded {share:.1%} of prompt tokens from offload, {'at least' if share >= min_share else 'under'} {min_share:.1%}"  # noqa: E501
    add(
        EXTERNAL_SHARE,
        _num(c.external_share),
        _num(stable.external_share),
        min_share,
        share_pass,
        share_msg,
        gated=share_gated,
    )

    # Per tier: a secondary tier that is never hit does not pay for itself. Under tiering, vLLM counts chunk
    # lookups and hits per tier: those gate each secondary tier, and the per-source counter is only reported.
    has_secondary = bool(level.secondary_tiers)
    per_tier = has_secondary and bool(subject.tier_chunk_queries)
    _tier_hit_shares(add, subject, c, stable, level, who, warmed_up=warmed_up, enough=enough)
    for source in (CACHED_SOURCE_HOST, CACHED_SOURCE_DISK):
        hits = subject.tier_hits.get(source)
        name = f"{TIER_HITS}.{source}"
        c_hits, s_hits = _num(c.tier_hits.get(source)), _num(stable.tier_hits.get(source))
        if source != CACHED_SOURCE_DISK or not has_secondary or per_tier:
            if hits is not None or c_hits is not None or s_hits is not None:
                note = "; the tiers are gated on their chunk hits" if per_tier else ""
                add(name, c_hits, s_hits, None, None, f"tokens served from {source} (reported{note})", gated=False)
            continue
        tiers = ", ".join(t.name for t in level.secondary_tiers)
        if not subject.tier_hits:
            add(
                name,
                c_hits,
                s_hits,
                0.0,
                None,
                "the engines export no per-source cache counters (not gated)",
                gated=False,
            )
        elif not warmed_up:
            add(name, c_hits, s_hits, 0.0, None, "warming up: gated after the first half of the step", gated=False)
        else:
            served = _num(hits) or 0.0
            ok = served > 0
            msg = (
                f"{who} served {served:.0f} tokens from {tiers}"
                if ok
                else f"secondary tier {tiers} was never hit on the {who}: it does not pay"
            )
            add(name, c_hits, s_hits, 0.0, ok if enough else None, msg, gated=True)

    # The payoff: what a restored request saves against recomputing it, fitted from both variants' sub-windows.
    if payoff_measured and (c.payoff_rows or stable.payoff_rows):
        judged_payoff = payoff_row(
            c.payoff_rows,
            stable.payoff_rows,
            gate=payoff_gated,
            gate_text=payoff_why,
            judging=warmed_up,
            min_requests=min_requests,
            alpha=alpha,
            forecast_saving_us_per_token=forecast_saving_us_per_token,
        )
        rows.append(_Row(judged_payoff.result, judged_payoff.gated))

    # Reported, not gated: transfer health, KV pressure, and what the engines really run.
    add(
        LOAD_THROUGHPUT,
        _num(c.load_bytes_per_second),
        _num(stable.load_bytes_per_second),
        None,
        None,
        "offload load bytes per transfer second (reported)",
        gated=False,
    )
    add(KV_USAGE, _num(c.kv_usage), _num(stable.kv_usage), None, None, "GPU KV cache usage (reported)", gated=False)
    live = _live_config_message(subject, level, who)
    allocated = _allocated_check(subject, level, who)
    if allocated is None:
        add(LIVE_CONFIG, None, None, None, None, live, gated=False)
    else:
        ok, figure, text = allocated
        rendered = None if level.cpu_bytes is None else float(level.cpu_bytes)
        c_value, s_value = (figure, _allocated_bytes(stable)) if canary is not None else (None, figure)
        # A mismatch is gated (the verdict says so) and, on a canary, a hard failure in decide().
        add(LIVE_CONFIG, c_value, s_value, rendered, ok, f"{live}; {text}", gated=not ok)

    if observing:
        for row in rows:
            if row.result.name.split(".")[0] in OBSERVE_NOT_JUDGED:
                why = f"not judged in observe mode ({row.result.message})"
                row.result, row.gated = row.result.model_copy(update={"passed": None, "message": why}), False
    return _verdict(rows, error_free_subject=subject_requests is not None, enough=enough, req_msg=req_msg)


ERROR_ROWS = (ERROR_SHARE, ERROR_SHARE_INCREASE)
"""The error gate's rows: judged on their own request counts, so they can fail a subject short of TTFT samples."""


def _verdict(rows: list[_Row], *, error_free_subject: bool, enough: bool, req_msg: str) -> Assessment:
    metrics = tuple(r.result for r in rows)
    if not error_free_subject or not enough:
        # A request that fails before its first token has no TTFT, so a canary failing most of its requests is
        # short of minRequests by the TTFT count. The error gate counts its own requests (finished ones, HTTP
        # answers) and judges a row only with minRequests in that count: such a breach fails the verdict, while
        # every other row still waits for its own samples.
        failed_errors = [r.result for r in rows if r.gated and r.result.passed is False and r.result.name in ERROR_ROWS]
        if failed_errors:
            return Assessment(Verdict.FAIL, metrics, "; ".join(r.message for r in failed_errors))
        return Assessment(Verdict.INCONCLUSIVE, metrics, req_msg)
    failed = [r.result for r in rows if r.gated and r.result.passed is False]
    if failed:
        return Assessment(Verdict.FAIL, metrics, "; ".join(r.message for r in failed))
    unjudged = [r.result for r in rows if r.gated and r.result.passed is None]
    if unjudged:
        return Assessment(Verdict.INCONCLUSIVE, metrics, "; ".join(r.message for r in unjudged))
    return Assessment(Verdict.PASS, metrics, "every gated metric passed")


def record_verdict(previous: AnalysisStatus | None, assessment: Assessment, now: datetime) -> AnalysisStatus:
    """The status after one more verdict.

    Pass clears both counters and ``failingSince``. Fail counts one more failure, clears the
    Inconclusive count and starts ``failingSince`` if no Fail run is open. Inconclusive counts one
    more Inconclusive and leaves the Fail run as it is: missing evidence neither clears a breach
    nor extends it (``sustained()`` still needs the latest verdict to be Fail).
    """
    failures = previous.consecutive_failures if previous else 0
    inconclusive = previous.consecutive_inconclusive if previous else 0
    since = previous.failing_since if previous else None
    if assessment.verdict is Verdict.PASS:
        failures, inconclusive, since = 0, 0, None
    elif assessment.verdict is Verdict.FAIL:
        failures, inconclusive, since = failures + 1, 0, since or now
    else:
        inconclusive += 1
    return AnalysisStatus(
        time=now,
        verdict=assessment.verdict,
        message=assessment.message,
        metrics=list(assessment.metrics),
        consecutive_failures=failures,
        consecutive_inconclusive=inconclusive,
        failing_since=since,
    )


def sustained(status: AnalysisStatus | None, sustained_for: float | str, now: datetime) -> bool:
    """Whether a Fail has held for ``sustained_for`` (seconds or a duration such as ``2m``) by ``now``.

    Needs the latest verdict to be Fail and at least two Fail verdicts in the run, so a single
    spike never rolls back, however long the gap before the next cycle.
    """
    if status is None or status.verdict is not Verdict.FAIL or status.failing_since is None:
        return False
    if status.consecutive_failures < 2:
        return False
    seconds = parse_duration(sustained_for)
    return (now - status.failing_since).total_seconds() >= seconds


def format_metric_value(name: str, value: float | None) -> str:
    """A metric's value for people: ``412.0ms``, ``3.17x``, ``15.0%``, ``12.6 GB/s``; ``-`` for none."""
    if value is None:
        return "-"
    if name in (TTFT_P99, ITL_P99):
        return f"{value * 1000:.1f}ms"
    if name in (TTFT_RATIO, ITL_RATIO, TTFT_VS_BASELINE, ITL_VS_BASELINE):
        return f"{value:.2f}x"
    if name in (EXTERNAL_SHARE, KV_USAGE, ERROR_SHARE) or name.startswith(TIER_HIT_SHARE):
        return f"{value:.1%}"
    if name == ERROR_SHARE_INCREASE:
        return f"{value * 100:+.1f} pts"
    if name == LOAD_THROUGHPUT:
        return f"{value / 1e9:.1f} GB/s"
    if name == PAYOFF:
        return f"{value:+.1f}ms"
    return f"{value:.0f}"


def format_threshold(name: str, threshold: float | None) -> str:
    """The bound a metric is held to, with its direction: ``<= 1500.0ms``, ``>= 2.0%``, ``> 0``."""
    if threshold is None:
        return "-"
    if name in (REQUESTS, EXTERNAL_SHARE):
        return f">= {format_metric_value(name, threshold)}"
    if name.startswith(TIER_HIT_SHARE):
        return "> 0 hits"
    if name == LIVE_CONFIG:
        return f"= {threshold:.0f} B (within a chunk)"
    if name.startswith(TIER_HITS):
        return f"> {threshold:.0f}"
    if name == PAYOFF:
        return "> 0ms saved"
    return f"<= {format_metric_value(name, threshold)}"
