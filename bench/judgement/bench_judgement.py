"""The judgement bench: how often a judge rolls back identical variants, and how fast it catches real regressions.

Issue 37 ("Verdicts you can trust"). Synthetic engines fill vLLM's own TTFT and ITL histogram buckets; each analysis
cycle the bench evaluates, in-process, what the operator's Prometheus queries would answer
(``analysis/queries.py``: ``increase(..._count[w])``, ``increase(..._bucket[w])`` by ``le``,
``histogram_quantile(0.99, sum by (le) (rate(..._bucket[w])))``, ``increase(vllm:request_success_total[w])`` by
``finished_reason``), builds the same ``Measurements``/``VariantSample`` the provider builds, and hands them to the
operator's real ``assess()``, ``record_verdict()`` and ``breach_sustained()`` (which calls ``sustained()``), cycle
after cycle, as ``rollout/decide.py`` uses them. Two judges see the same simulated traffic (the same seeds):

- ``today``: the judge of commit ``TODAY_REVISION`` (p99 point estimates against the bounds), exactly: that
  revision's ``operator/kvoffload`` is extracted with ``git archive`` and the bench re-runs itself under it in a
  child process (``--as-judge today``, PYTHONPATH pointing there), which answers JSON on stdout;
- ``evidence``: this checkout's judge (``analysis/evidence.py``: a breach needs evidence at the step's look alpha),
  fed the window's bucket counts (``ttft_histogram``, ``itl_histogram``) and a policy whose ``stepDuration`` is the
  step, under issue 37's warm-up rule.

Around the judge the bench follows ``decide()``'s rules for one canary step:

- a canary step starts with a fresh canary (no requests before the step start) and a fresh streak;
- analysis runs every ``interval``; the warm-up ends at the first cycle with ``warmup`` time passed and
  ``warmupRequests`` canary requests in the window (``evidence``: or at the longest warm-up, half the step); today's
  judge gates the canary/stable ratios from the next cycle, the evidence judge all latency rows from one window
  later (``judgedFrom``), dropping a streak open then;
- a rollback happens at the first cycle where ``breach_sustained()`` holds (checked before anything else);
- at or after ``stepDuration`` the step advances on the first Pass verdict of a judged canary; until then it holds
  (a rollback can still come); the bench stops a held step at ``--extension`` steps' length past its end.

Modelling (README.md says more): requests arrive as a Poisson process per replica; a request fails (finished_reason
``error``, before its first token) with the variant's failed share; a finished request adds one TTFT observation and
``output_tokens - 1`` ITL observations, drawn independently from the variant's latency model. Bucket counts per
analysis interval are drawn as Poisson totals and multinomial splits over the model's exact bucket probabilities,
which is exact for the bucket counters. Prometheus' ``increase()`` is taken as the exact count of what arrived in the
window (no extrapolation to the window edges; with per-interval draws the window is a whole number of intervals).

    .venv/bin/python bench/judgement/bench_judgement.py --quick [--json FILE]   # headline figures, < 5 min
    .venv/bin/python bench/judgement/bench_judgement.py                         # full run: results.json
    .venv/bin/python bench/judgement/bench_judgement.py --sweep                 # the evidence judge's defaults
    .venv/bin/python bench/judgement/bench_judgement.py --fit                   # the lognormal fits to captures
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
FOREIGN_OPERATOR = "BENCH_JUDGEMENT_OPERATOR"
"""Set (to the folder on PYTHONPATH that holds another revision's ``kvoffload``) in the ``--as-judge`` child: the
checkout's operator is then not put first on the path, so the child judges with that revision's code."""
if not os.environ.get(FOREIGN_OPERATOR):
    sys.path.insert(0, str(ROOT / "operator"))

from kvoffload.analysis.assess import ITL_P99, ITL_RATIO, TTFT_P99, TTFT_RATIO, assess, record_verdict  # noqa: E402
from kvoffload.analysis.custom import breach_sustained  # noqa: E402
from kvoffload.analysis.errorgate import ERROR_SHARE, ERROR_SHARE_INCREASE  # noqa: E402

try:
    from kvoffload.engines.dialect import FINISHED_ERROR, FINISHED_STOP
except ImportError:  # an --as-judge child on a revision before issue 34 (TODAY_REVISION): they lived in analysis
    from kvoffload.analysis.dialects import FINISHED_ERROR, FINISHED_STOP  # type: ignore[no-redef]

try:
    from kvoffload.analysis.measurements import Measurements, VariantSample
except ImportError:  # an --as-judge child on a revision before issue 34 (TODAY_REVISION): they lived in assess
    from kvoffload.analysis.assess import Measurements, VariantSample

from kvoffload.api.quantity import GIB, parse_duration  # noqa: E402

try:
    from kvoffload.api.rollout import AnalysisSpec, RolloutSpec
    from kvoffload.api.status import AnalysisStatus, Verdict
except ImportError:  # an --as-judge child on a revision before issue 34 (TODAY_REVISION): they lived in api.types
    from kvoffload.api.types import AnalysisSpec, AnalysisStatus, RolloutSpec, Verdict

from kvoffload.api.types import KVOffloadPolicySpec  # noqa: E402
from kvoffload.policy.ladder import Level  # noqa: E402

# vLLM's bucket bounds, as the project records them (vLLM 0.32's /metrics: tests/data/vllm-0.32.0-cpu-metrics.txt,
# the same lists as the 0.26 GPU captures in tests/data/ and bench/gpu/).
from kvoffload_lab.engine.families import TOKEN_LATENCY_BUCKETS, TTFT_BUCKETS  # noqa: E402

GATES = (TTFT_P99, TTFT_RATIO, ITL_P99, ITL_RATIO, ERROR_SHARE, ERROR_SHARE_INCREASE)
"""The built-in gated rows a latency or error regression can breach; a rollback is attributed to each one failing."""

CANARY_LEVEL = Level(1, "cpu", 32 * GIB)
"""The canary's level: a CPU tier. Its offload rows are fed a passing external share (not what the bench measures)."""
CANARY_EXTERNAL_SHARE = 0.3

T0 = datetime(2026, 1, 1, tzinfo=UTC)

TODAY, EVIDENCE = "today", "evidence"
JUDGES = (TODAY, EVIDENCE)
"""``today``: the judge as it was at ``TODAY_REVISION`` (p99 point estimates, warm-up rule of then), run from that
revision's operator package in a child process. ``evidence``: this checkout's judge (analysis/evidence.py), fed the
bucket counts, under the warm-up rule of issue 37."""
TODAY_REVISION = "1fa7e6b"
"""The last commit before the statistical judge: today's judge, exactly."""
CHOSEN = {"window": "2m", "sustainedFor": "2m", "minRequests": 50}
"""The evidence judge's analysis defaults, chosen from ``--sweep`` (README.md: the trade-off table)."""
MINIMAL_POLICY: dict[str, Any] = {
    "model": {"name": "Qwen/Qwen3-8B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 32768},
    "gpu": {"class": "nvidia-h100-80gb"},
    "replicas": 4,
    "resources": {"baseMemory": "24Gi"},
    "offload": {"cpu": "32Gi"},
}
"""A valid policy around the analysis: ``assess()`` reads ``rollout.stepDuration`` from it (``look_alpha_of``)."""
BATCH = 1000
"""Rollouts drawn at once (memory: a few MB per thousand)."""


# --- Prometheus' histogram_quantile -----------------------------------------------------------------------------


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """Prometheus' ``histogram_quantile`` over classic buckets ``(le, cumulative count)``, in any order.

    As ``bucketQuantile`` in Prometheus' promql/quantile.go: NaN without a ``+Inf`` bucket, with fewer than two
    buckets or no observations; buckets sorted by ``le``, equal bounds merged, counts made monotonic; the rank
    ``q × count`` falls in the first bucket whose cumulative count reaches it, linearly interpolated from the
    bucket's lower bound (0 for the first bucket, unless its bound is <= 0); a rank in the ``+Inf`` bucket gives
    the highest finite bound.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    merged: dict[float, float] = {}
    for le, count in buckets:
        merged[le] = merged.get(le, 0.0) + count
    ordered = sorted(merged.items())
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]):
        return math.nan
    bounds = [le for le, _ in ordered]
    counts: list[float] = []
    for _, count in ordered:  # ensureMonotonic
        counts.append(max(count, counts[-1]) if counts else count)
    observations = counts[-1]
    if observations == 0 or math.isnan(observations):
        return math.nan
    rank = q * observations
    b = next((i for i in range(len(counts) - 1) if counts[i] >= rank), len(counts) - 1)
    if b == len(counts) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    return start + (end - start) * (rank / count)


def histogram_quantile_many(q: float, bounds: Sequence[float], cumulative: np.ndarray) -> np.ndarray:
    """``histogram_quantile`` over many histograms at once: ``cumulative[..., i]`` is the count with ``le=bounds[i]``
    (``bounds`` finite, positive and rising), the last column the ``+Inf`` bucket. NaN where a histogram is empty."""
    finite = np.asarray(bounds, dtype=float)
    n = finite.size
    cum = np.asarray(cumulative, dtype=float)
    total = cum[..., -1]
    rank = q * total
    reached = cum[..., :-1] >= rank[..., None]
    b = np.where(reached.any(axis=-1), reached.argmax(axis=-1), n)
    inner = np.minimum(b, n - 1)
    upper = finite[inner]
    lower = np.where(b > 0, finite[np.maximum(inner - 1, 0)], 0.0)
    at = np.take_along_axis(cum, inner[..., None], axis=-1)[..., 0]
    prev = np.where(b > 0, np.take_along_axis(cum, np.maximum(inner - 1, 0)[..., None], axis=-1)[..., 0], 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = lower + (upper - lower) * (rank - prev) / (at - prev)
    value = np.where(b == n, finite[-1], value)
    return np.where(total > 0, value, np.nan)


# --- latency models -----------------------------------------------------------------------------------------------

_erf = np.frompyfunc(math.erf, 1, 1)


def _lognormal_cdf(x: np.ndarray, median: float, sigma: float) -> np.ndarray:
    z = (np.log(x) - math.log(median)) / (sigma * math.sqrt(2.0))
    return np.asarray(0.5 * (1.0 + _erf(z).astype(float)), dtype=float)


@dataclass(frozen=True)
class Latency:
    """A lognormal, or a mixture: ``1 - tail_share`` of it, and ``tail_share`` from a slower, wider lognormal."""

    median: float
    sigma: float
    tail_share: float = 0.0
    tail_factor: float = 1.0
    """The tail component's median, as a multiple of ``median``."""
    tail_sigma: float = 0.0

    def cdf(self, x: np.ndarray, scale: float = 1.0) -> np.ndarray:
        """P(latency × scale <= x)."""
        body = _lognormal_cdf(x, self.median * scale, self.sigma)
        if self.tail_share <= 0:
            return body
        tail = _lognormal_cdf(x, self.median * self.tail_factor * scale, self.tail_sigma)
        return (1 - self.tail_share) * body + self.tail_share * tail

    def quantile(self, q: float, scale: float = 1.0) -> float:
        lo, hi = 1e-6, 1e4
        for _ in range(200):
            mid = math.sqrt(lo * hi)
            if float(self.cdf(np.array([mid]), scale)[0]) < q:
                lo = mid
            else:
                hi = mid
        return math.sqrt(lo * hi)

    def bucket_probabilities(self, bounds: Sequence[float] | np.ndarray, scale: float = 1.0) -> np.ndarray:
        """The probability of each bucket ``(le[i-1], le[i]]``, the ``+Inf`` bucket last; sums to 1."""
        cdf = self.cdf(np.asarray(bounds, dtype=float), scale)
        p = np.diff(np.concatenate(([0.0], cdf, [1.0])))
        p = np.clip(p, 0.0, None)
        out: np.ndarray = p / p.sum()
        return out


# TTFT: sigma fitted (bucket-censored maximum likelihood, ``--fit``) to the 144 TTFTs of the GPU capture
# tests/data/vllm-0.26.0-gpu-metrics.txt (Qwen3 on one GPU; median 30 ms there), the median set to 150 ms as a
# production-sized prompt would give. The heavier tail: 3 % of requests (queued behind a long prefill, or a cold
# cache) from a lognormal at 4× the median and twice as wide. ITL: the captures put every ITL under 10 ms (a small
# model), so ITL is an assumption: median 20 ms, sigma 0.3, within vLLM's finer ITL buckets and the 80 ms budget.
TTFT_SIGMA_FIT = 0.30
MODELS: dict[str, tuple[Latency, Latency]] = {
    "lognormal": (Latency(0.150, TTFT_SIGMA_FIT), Latency(0.020, 0.3)),
    "heavy-tail": (
        Latency(0.150, TTFT_SIGMA_FIT, tail_share=0.03, tail_factor=4.0, tail_sigma=2 * TTFT_SIGMA_FIT),
        Latency(0.020, 0.3, tail_share=0.01, tail_factor=3.0, tail_sigma=0.6),
    ),
}


def fit_lognormal(bounds: Sequence[float], cumulative: Sequence[float]) -> tuple[float, float]:
    """(median, sigma) of the lognormal most likely to give these cumulative bucket counts (``+Inf`` last), by a
    grid search of the bucket-censored likelihood."""
    counts = np.diff(np.concatenate(([0.0], np.asarray(cumulative, dtype=float))))
    edges = np.asarray(bounds, dtype=float)
    best = (-math.inf, 0.0, 0.0)
    for median in np.exp(np.linspace(math.log(0.002), math.log(2.0), 240)):
        for sigma in np.linspace(0.05, 1.5, 146):
            p = Latency(float(median), float(sigma)).bucket_probabilities(edges)
            with np.errstate(divide="ignore"):
                ll = float(np.sum(np.where(counts > 0, counts * np.log(np.maximum(p, 1e-300)), 0.0)))
            if ll > best[0]:
                best = (ll, float(median), float(sigma))
    return best[1], best[2]


def read_buckets(path: Path, name: str) -> list[float]:
    """The cumulative bucket counts of one histogram in a ``/metrics`` text, in its order (``+Inf`` last)."""
    out: list[float] = []
    for line in path.read_text().splitlines():
        if line.startswith(f"{name}_bucket{{"):
            out.append(float(line.rsplit(" ", 1)[1]))
    return out


# --- the setting and the scenarios --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Regression:
    """What the canary does differently from the stable engines."""

    name: str
    ttft_scale: float = 1.0
    """Every TTFT × this (the whole distribution: its p99 is × this, exactly)."""
    itl_scale: float = 1.0
    failed_share: float | None = None
    """The canary's failed share (stable's: the setting's ``failed_share``); None: the same as stable's."""


NULL = Regression("null")
REGRESSIONS = (
    Regression("ttftP99x1.25", ttft_scale=1.25),
    Regression("ttftP99x1.5", ttft_scale=1.5),
    Regression("ttftP99x2", ttft_scale=2.0),
    Regression("itlP99x1.5", itl_scale=1.5),
    Regression("errorShare2pct", failed_share=0.02),
    Regression("errorShare5pct", failed_share=0.05),
)


@dataclass(frozen=True)
class Setting:
    rate: float = 1.0
    """Requests per second per replica."""
    replicas: int = 4
    canary: int = 1
    model: str = "lognormal"
    ttft_median: float | None = None
    """The TTFT median in seconds; None: the model's (150 ms). The whole distribution is scaled to it."""
    failed_share: float = 0.005
    """Both variants' background failed share (client aborts), an assumption."""
    output_tokens: int = 128
    """Output tokens per request: ``output_tokens - 1`` ITL observations each."""
    step: str = "10m"
    extension: float = 1.0
    """A step held past its end (no Pass yet) is followed for this many more step lengths, then counted as held."""
    analysis: AnalysisSpec = field(default_factory=AnalysisSpec)
    rollout: RolloutSpec = field(default_factory=RolloutSpec)
    judge: str = EVIDENCE
    """``today`` (the judge of ``TODAY_REVISION``: no histograms, its warm-up rule; run only under that revision's
    code) or ``evidence`` (this checkout's: histograms, issue 37's warm-up rule, the step's looks)."""

    @property
    def stable(self) -> int:
        """Stable replicas during the canary step, as ``decide()`` shrinks them: ``max(0, canary - maxSurge)``."""
        return self.replicas - max(0, self.canary - self.rollout.max_surge)

    def policy(self) -> KVOffloadPolicySpec:
        """A valid policy with this analysis and ``rollout.stepDuration`` the step, for ``assess()``."""
        base = KVOffloadPolicySpec.model_validate({**MINIMAL_POLICY, "rollout": {"stepDuration": self.step}})
        return base.model_copy(update={"analysis": self.analysis})


def analysis_of(window: str, sustained_for: str, min_requests: int) -> AnalysisSpec:
    """The project's analysis defaults with these three replaced."""
    return AnalysisSpec.model_validate({"window": window, "sustainedFor": sustained_for, "minRequests": min_requests})


@dataclass
class Outcome:
    rollouts: int = 0
    rolled_back: int = 0
    rolled_back_in_step: int = 0
    promoted: int = 0
    held: int = 0
    paused: int = 0
    """Rollouts that met ``maxInconclusive`` Inconclusive verdicts in a row (decide() pauses the step until evidence
    returns; the bench follows on: a later Pass or rollback still ends it)."""
    by_gate: dict[str, int] = field(default_factory=lambda: dict.fromkeys(GATES, 0))
    cycles_to_rollback: list[int] = field(default_factory=list)
    rolled_back_ids: list[int] = field(default_factory=list)
    """The rollouts (by index) that rolled back: the same index is the same traffic for every judge."""


# --- simulation ---------------------------------------------------------------------------------------------------


@dataclass
class Side:
    """One variant's window figures for every rollout and cycle: arrays (rollouts, cycles[, buckets])."""

    requests: np.ndarray
    failed: np.ndarray
    ttft_p99: np.ndarray
    itl_p99: np.ndarray
    ttft_buckets: np.ndarray
    """The window's cumulative TTFT bucket counts (the ``_bucket`` series' ``increase``), ``+Inf`` last."""
    itl_buckets: np.ndarray


def _windows(per_interval: np.ndarray, width: int) -> np.ndarray:
    """Sums over the trailing ``width`` intervals, for the cycle after each interval (axis 1 is time)."""
    cum = np.cumsum(per_interval, axis=1)
    shifted = np.zeros_like(cum)
    shifted[:, width:] = cum[:, :-width]
    out: np.ndarray = cum - shifted
    return out


def simulate_side(
    rng: np.random.Generator,
    rollouts: int,
    cycles: int,
    setting: Setting,
    replicas: int,
    ttft_scale: float,
    itl_scale: float,
    failed_share: float,
) -> Side:
    """Draw one variant's counters interval by interval, and evaluate the queries at each cycle.

    The draws depend on the rate, the step and the latency model only, not on the analysis settings or the judge:
    the same seed gives every judge and every window the same traffic."""
    interval = parse_duration(setting.analysis.interval)
    window = parse_duration(setting.analysis.window)
    width = round(window / interval)
    if not math.isclose(width * interval, window):
        raise SystemExit(f"window {setting.analysis.window} must be a whole number of intervals here")
    ttft_model, itl_model = MODELS[setting.model]
    if setting.ttft_median is not None:
        ttft_scale *= setting.ttft_median / ttft_model.median
    p_ttft = ttft_model.bucket_probabilities(TTFT_BUCKETS, ttft_scale)
    p_itl = itl_model.bucket_probabilities(TOKEN_LATENCY_BUCKETS, itl_scale)
    arrived = rng.poisson(setting.rate * replicas * interval, size=(rollouts, cycles))
    failed = rng.binomial(arrived, failed_share)
    finished = arrived - failed
    ttft = rng.multinomial(finished, p_ttft)  # (rollouts, cycles, buckets)
    itl = rng.multinomial(finished * (setting.output_tokens - 1), p_itl)
    ttft_w = np.cumsum(_windows(ttft, width), axis=-1)  # cumulative over le: the _bucket series
    itl_w = np.cumsum(_windows(itl, width), axis=-1)
    return Side(
        requests=_windows(finished, width).astype(float),
        failed=_windows(failed, width).astype(float),
        ttft_p99=histogram_quantile_many(0.99, TTFT_BUCKETS, ttft_w),
        itl_p99=histogram_quantile_many(0.99, TOKEN_LATENCY_BUCKETS, itl_w),
        ttft_buckets=ttft_w,
        itl_buckets=itl_w,
    )


TTFT_LE = (*TTFT_BUCKETS, math.inf)
ITL_LE = (*TOKEN_LATENCY_BUCKETS, math.inf)


def _sample(side: Side, r: int, k: int, window_s: float, *, canary: bool, histograms: bool) -> VariantSample:
    """The VariantSample ``analysis/prometheus.py`` builds; with ``histograms``, the bucket counts too (the
    evidence judge's ``ttft_histogram``/``itl_histogram``: (le, cumulative count), ascending, ``inf`` last)."""
    requests = float(side.requests[r, k])
    ttft, itl = float(side.ttft_p99[r, k]), float(side.itl_p99[r, k])
    extra: dict[str, Any] = {}
    if histograms:
        extra["ttft_histogram"] = tuple(zip(TTFT_LE, side.ttft_buckets[r, k].astype(float).tolist(), strict=True))
        extra["itl_histogram"] = tuple(zip(ITL_LE, side.itl_buckets[r, k].astype(float).tolist(), strict=True))
    return VariantSample(
        requests=requests,
        request_rate=requests / window_s,
        ttft_p99=None if math.isnan(ttft) else ttft,
        itl_p99=None if math.isnan(itl) else itl,
        external_share=CANARY_EXTERNAL_SHARE if canary else None,
        finished={FINISHED_STOP: requests, FINISHED_ERROR: float(side.failed[r, k])},
        **extra,
    )


def run_rollouts(setting: Setting, regression: Regression, rollouts: int, seed: int) -> Outcome:
    """``rollouts`` canary steps of one setting, each judged by the operator's own code cycle by cycle."""
    interval = parse_duration(setting.analysis.interval)
    cycles = math.ceil(parse_duration(setting.step) * (1 + setting.extension) / interval)
    stable_failed = setting.failed_share
    canary_failed = regression.failed_share if regression.failed_share is not None else stable_failed
    out = Outcome(rollouts=rollouts)
    for batch, first in enumerate(range(0, rollouts, BATCH)):
        n = min(BATCH, rollouts - first)
        rng = np.random.default_rng([seed, batch])
        canary = simulate_side(
            rng, n, cycles, setting, setting.canary, regression.ttft_scale, regression.itl_scale, canary_failed
        )
        stable = simulate_side(rng, n, cycles, setting, setting.stable, 1.0, 1.0, stable_failed)
        _judge(out, setting, canary, stable, n, cycles, first)
    return out


@dataclass
class WarmupRule:
    """When the canary's latency is judged, as ``rollout/warmup.py`` decides it for the bench's judge.

    ``today``: the warm-up ends at the first cycle with at least ``warmup.duration`` passed and ``warmup.requests``
    canary requests in the window; the ratios are gated from the next cycle; the absolute budgets at once.
    ``evidence`` (issue 37): the same end, or the longest warm-up (``warmup.maxDuration``, default half the step),
    whichever is first (cache parity is not modelled); the latency rows, budgets and ratios, are judged from one
    window after it (``judgedFrom``); a streak open then is dropped."""

    judge: str
    least_s: float
    requests: int
    longest_s: float
    window_s: float
    warm_at: float | None = None

    @classmethod
    def of(cls, setting: Setting) -> WarmupRule:
        analysis = setting.analysis
        least = analysis.warmup_seconds()
        longest = math.inf
        if setting.judge == EVIDENCE:
            limit = getattr(analysis.warmup, "max_duration", None)
            longest = parse_duration(limit) if limit is not None else parse_duration(setting.step) / 2
            longest = max(longest, least)
        return cls(setting.judge, least, analysis.warmup_requests(), longest, parse_duration(analysis.window))

    @property
    def judged_from(self) -> float | None:
        if self.warm_at is None:
            return None
        return self.warm_at + (self.window_s if self.judge == EVIDENCE else 0.0)

    def comparing(self, elapsed: float) -> bool:
        """Whether this cycle judges the canary's latency (``today``: its ratios)."""
        start = self.judged_from
        if self.judge == EVIDENCE:
            return start is not None and elapsed >= start
        return start is not None and elapsed > start

    def after_cycle(self, elapsed: float, canary_requests: float) -> None:
        """The warm-up's record after the cycle at ``elapsed`` (``warmup_of`` runs after the verdict)."""
        if self.warm_at is not None:
            return
        warm = elapsed >= self.least_s and canary_requests >= self.requests
        if warm or elapsed >= self.longest_s:
            self.warm_at = elapsed


def _judge(
    out: Outcome, setting: Setting, canary: Side, stable: Side, rollouts: int, cycles: int, first: int = 0
) -> None:
    """Each rollout's cycles through the operator's assess(), record_verdict() and breach_sustained()."""
    analysis = setting.analysis
    interval = parse_duration(analysis.interval)
    window_s = parse_duration(analysis.window)
    step_s = parse_duration(setting.step)
    step_cycles = math.ceil(step_s / interval)
    evidence_judge = setting.judge == EVIDENCE
    spec: AnalysisSpec | KVOffloadPolicySpec = setting.policy() if evidence_judge else analysis
    max_inconclusive = analysis.max_inconclusive
    for r in range(rollouts):
        evidence: AnalysisStatus | None = None
        warmup = WarmupRule.of(setting)
        judged = not analysis.warmup.enabled
        paused = False
        for k in range(cycles):
            elapsed = (k + 1) * interval  # cycle k reads the window ending at (k + 1) intervals into the step
            now = T0 + timedelta(seconds=elapsed)
            comparing = not analysis.warmup.enabled or warmup.comparing(elapsed)
            if evidence_judge and comparing and not judged:
                evidence = None  # rollout/record.py: a streak never spans the warm-up's end (judgedFrom)
            judged = judged or comparing
            c = _sample(canary, r, k, window_s, canary=True, histograms=evidence_judge)
            s = _sample(stable, r, k, window_s, canary=False, histograms=evidence_judge)
            assessment = assess(
                spec,
                CANARY_LEVEL,
                Measurements(canary=c, stable=s),
                warmed_up=elapsed >= step_s / 2,
                comparing=comparing,
            )
            evidence = record_verdict(evidence, assessment, now)
            paused = paused or evidence.consecutive_inconclusive >= max_inconclusive
            if breach_sustained(evidence, analysis.sustained_for, now):
                out.rolled_back += 1
                out.rolled_back_in_step += elapsed <= step_s
                out.cycles_to_rollback.append(k + 1)
                out.rolled_back_ids.append(first + r)
                for m in evidence.metrics:
                    if m.passed is False and m.name in out.by_gate:
                        out.by_gate[m.name] += 1
                break
            if k + 1 >= step_cycles and comparing and assessment.verdict is Verdict.PASS:
                out.promoted += 1
                break
            warmup.after_cycle(elapsed, c.requests or 0.0)
        else:
            out.held += 1
        out.paused += paused


# --- statistics and reporting -------------------------------------------------------------------------------------


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95 % by default)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


def _percentile(values: Sequence[int], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)])


def to_detect(cycles: float | None, interval: float, window: float) -> dict[str, float | None]:
    """A time to rollback in the three units: analysis cycles since the step start (the first at one interval),
    seconds (cycles x interval), and analysis windows (seconds / window length: issue 37's "windows")."""
    if cycles is None:
        return {"cycles": None, "seconds": None, "windows": None}
    seconds = cycles * interval
    return {"cycles": cycles, "seconds": seconds, "windows": round(seconds / window, 4)}


def summarise(outcome: Outcome, interval: float, window: float | None = None) -> dict[str, Any]:
    """One scenario's figures. ``window``: the analysis window in seconds (default four intervals, the 2m default)."""
    window = 4 * interval if window is None else window
    n = outcome.rollouts
    rate = outcome.rolled_back / n if n else 0.0
    lo, hi = wilson(outcome.rolled_back, n)
    median = statistics.median(outcome.cycles_to_rollback) if outcome.cycles_to_rollback else None
    p95 = _percentile(outcome.cycles_to_rollback, 0.95)
    gates = {}
    for gate, count in outcome.by_gate.items():
        g_lo, g_hi = wilson(count, n)
        gates[gate] = {"rolledBack": count, "rate": count / n if n else 0.0, "ci95": [g_lo, g_hi]}
    med, high = to_detect(median, interval, window), to_detect(p95, interval, window)
    return {
        "rollouts": n,
        "rolledBack": outcome.rolled_back,
        "rollbackRate": rate,
        "ci95": [lo, hi],
        "rolledBackWithinStep": outcome.rolled_back_in_step,
        "promoted": outcome.promoted,
        "heldAtEnd": outcome.held,
        "pausedInconclusive": outcome.paused,
        "byGate": gates,
        "medianCyclesToRollback": med["cycles"],
        "p95CyclesToRollback": high["cycles"],
        "medianSecondsToRollback": med["seconds"],
        "p95SecondsToRollback": high["seconds"],
        "medianWindowsToRollback": med["windows"],
        "p95WindowsToRollback": high["windows"],
    }


def _echo(line: str = "") -> None:
    """Progress: on stdout, or on stderr in an ``--as-judge`` child (whose stdout is its JSON answer)."""
    print(line, file=sys.stderr if os.environ.get(FOREIGN_OPERATOR) else sys.stdout, flush=True)


def describe_analysis(setting: Setting) -> dict[str, Any]:
    a = setting.analysis
    out: dict[str, Any] = {"window": a.window, "sustainedFor": a.sustained_for, "minRequests": a.min_requests}
    if setting.judge == EVIDENCE:
        from kvoffload.analysis.assess import look_alpha_of

        out["falseRollbackRate"] = a.false_rollback_rate
        out["lookAlpha"] = look_alpha_of(setting.policy())
    return out


def run_setting(
    setting: Setting, null_rollouts: int, regression_rollouts: int, seed: int
) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """One setting's scenarios under one judge: its result, and the rollouts each scenario rolled back (for the
    paired comparison; the same seed gives every judge the same traffic)."""
    interval = parse_duration(setting.analysis.interval)
    window = parse_duration(setting.analysis.window)
    result: dict[str, Any] = {
        "ratePerReplica": setting.rate,
        "replicas": setting.replicas,
        "canaryReplicas": setting.canary,
        "stableReplicas": setting.stable,
        "model": setting.model,
        "ttftMedian": setting.ttft_median if setting.ttft_median is not None else MODELS[setting.model][0].median,
        "failedShareBackground": setting.failed_share,
        "step": setting.step,
        "judge": setting.judge,
        "analysis": describe_analysis(setting),
        "scenarios": {},
    }
    ids: dict[str, list[int]] = {}
    for i, regression in enumerate((NULL, *REGRESSIONS)):
        n = null_rollouts if regression is NULL else regression_rollouts
        if n <= 0:
            continue
        started = time.perf_counter()
        outcome = run_rollouts(setting, regression, n, seed + 1000 * i)
        summary = summarise(outcome, interval, window)
        summary["seconds"] = round(time.perf_counter() - started, 2)
        result["scenarios"][regression.name] = summary
        ids[regression.name] = outcome.rolled_back_ids
        _echo(_line(setting, regression.name, summary))
    return result, ids


def _pct(x: float) -> str:
    return f"{x * 100:.2f}%" if x < 0.01 else f"{x * 100:.1f}%"


def _line(setting: Setting, name: str, s: dict[str, Any]) -> str:
    lo, hi = s["ci95"]
    gates = ", ".join(f"{g} {v['rolledBack']}" for g, v in s["byGate"].items() if v["rolledBack"])
    ttd = (
        f"; to rollback median {s['medianWindowsToRollback']:g} / p95 {s['p95WindowsToRollback']:g} windows "
        f"({s['medianSecondsToRollback']:g}s / {s['p95SecondsToRollback']:g}s, cycles "
        f"{s['medianCyclesToRollback']:g} / {s['p95CyclesToRollback']:g})"
        if s["medianCyclesToRollback"] is not None
        else ""
    )
    paused = f", paused {s['pausedInconclusive']}" if s.get("pausedInconclusive") else ""
    return (
        f"  {setting.judge:8s} {setting.model:10s} {setting.rate:g} req/s/replica  {name:15s} "
        f"rolled back {s['rolledBack']}/{s['rollouts']} = {_pct(s['rollbackRate'])} [{_pct(lo)}, {_pct(hi)}] "
        f"(promoted {s['promoted']}, held {s['heldAtEnd']}{paused})"
        f"{ttd}{'; gates: ' + gates if gates else ''}  [{s['seconds']}s]"
    )


HEADLINE_DETECTION = ("ttftP99x1.25", "ttftP99x1.5", "ttftP99x2")


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """The figures issue 37 asks ``--json`` for, from one setting's result under one judge."""
    scenarios = result["scenarios"]
    null = scenarios["null"]
    return {
        "nullRollouts": null["rollouts"],
        "falseRollbackRate": null["rollbackRate"],
        "detection": {name: scenarios[name]["rollbackRate"] for name in HEADLINE_DETECTION},
        "medianWindowsToDetect": {"ttftP99x1.5": scenarios["ttftP99x1.5"]["medianWindowsToRollback"]},
    }


def print_headline(result: dict[str, Any]) -> None:
    s = result["scenarios"]
    null = s["null"]
    lo, hi = null["ci95"]
    a = result.get("analysis", {})
    how = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in a.items())
    print(
        f"\nHeadline, {result.get('judge', TODAY)} judge ({result['model']}, canary {result['canaryReplicas']} of "
        f"{result['replicas']} replicas, {result['ratePerReplica']:g} req/s per replica, {result['step']} canary "
        f"step; {how}):"
    )
    print(
        f"  false rollbacks: {null['rolledBack']}/{null['rollouts']} = {_pct(null['rollbackRate'])} "
        f"[{_pct(lo)}, {_pct(hi)}]"
    )
    for name in (r.name for r in REGRESSIONS):
        if name not in s:
            continue
        d = s[name]
        d_lo, d_hi = d["ci95"]
        when = (
            ""
            if d["medianCyclesToRollback"] is None
            else f", median {d['medianWindowsToRollback']:g} windows ({d['medianSecondsToRollback']:g}s), "
            f"p95 {d['p95WindowsToRollback']:g} ({d['p95SecondsToRollback']:g}s)"
        )
        print(f"  detected {name:15s} {_pct(d['rollbackRate'])} [{_pct(d_lo)}, {_pct(d_hi)}]{when}")


def paired(today: dict[str, list[int]], evidence: dict[str, list[int]], rollouts: dict[str, int]) -> dict[str, Any]:
    """Per scenario, how the two judges' rollbacks of the same rollouts (the same traffic) overlap."""
    out: dict[str, Any] = {}
    for name, n in rollouts.items():
        if name not in today or name not in evidence:
            continue
        t, e = set(today[name]), set(evidence[name])
        out[name] = {"rollouts": n, "both": len(t & e), "todayOnly": len(t - e), "evidenceOnly": len(e - t)}
    return out


def _judged(setting: dict[str, Any], judge: str) -> dict[str, Any] | None:
    """One judge's part of a results file's setting (a file of the first bench, one judge only: the setting)."""
    if "judges" not in setting:
        return setting if judge == TODAY else None
    got: dict[str, Any] | None = setting["judges"].get(judge)
    return got


def _ttd_cell(s: dict[str, Any]) -> str:
    """Median / p95 windows to rollback, and seconds."""
    if s["medianCyclesToRollback"] is None and s.get("medianWindowsToRollback") is None:
        return ""
    if "medianCyclesToRollback" not in s:  # the first bench's files: its "windows" were cycles
        return f"{s['medianWindowsToRollback']:g} / {s['p95WindowsToRollback']:g} cycles"
    return (
        f"{s['medianWindowsToRollback']:.3g} / {s['p95WindowsToRollback']:.3g} w "
        f"({s['medianSecondsToRollback']:g} / {s['p95SecondsToRollback']:g} s)"
    )


def table(payload: dict[str, Any], judge: str = EVIDENCE) -> str:
    """A results file as a Markdown table for one judge: one row per setting, one column per scenario."""
    names = ["null", *(r.name for r in REGRESSIONS)]
    head = "| model | req/s per replica | " + " | ".join(names) + " |"
    rows = [head, "|" + "---|" * (len(names) + 2)]
    for setting in payload["settings"]:
        part = _judged(setting, judge)
        if part is None:
            continue
        cells = []
        for name in names:
            s = part["scenarios"].get(name)
            if s is None:
                cells.append("-")
                continue
            lo, hi = s["ci95"]
            cell = f"{_pct(s['rollbackRate'])} [{_pct(lo)}, {_pct(hi)}]"
            if name != "null" and (ttd := _ttd_cell(s)):
                cell += f"<br>{ttd}"
            cells.append(cell)
        rows.append(f"| {setting['model']} | {setting['ratePerReplica']:g} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def gate_table(payload: dict[str, Any], judge: str = EVIDENCE) -> str:
    """False rollbacks per gate: the null rollouts a gate was failing in at the rollback cycle."""
    rows = [
        "| model | req/s per replica | null rollouts | " + " | ".join(GATES) + " |",
        "|" + "---|" * (len(GATES) + 3),
    ]
    for setting in payload["settings"]:
        part = _judged(setting, judge)
        if part is None:
            continue
        s = part["scenarios"]["null"]
        cells = [f"{g['rolledBack']} ({_pct(g['rate'])})" for g in s["byGate"].values()]
        rows.append(
            f"| {setting['model']} | {setting['ratePerReplica']:g} | {s['rollouts']} | " + " | ".join(cells) + " |"
        )
    return "\n".join(rows)


def comparison_table(payload: dict[str, Any]) -> str:
    """Today's judge against the evidence judge on the same rollouts: rollback rate today → evidence, the median
    windows to rollback today → evidence, and the rollouts only one of them rolled back."""
    names = ["null", *(r.name for r in REGRESSIONS)]
    rows = ["| model | req/s per replica | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 2)]
    for setting in payload["settings"]:
        today, evidence = _judged(setting, TODAY), _judged(setting, EVIDENCE)
        if today is None or evidence is None:
            continue
        cells = []
        for name in names:
            t, e = today["scenarios"].get(name), evidence["scenarios"].get(name)
            if t is None or e is None:
                cells.append("-")
                continue
            cell = f"{_pct(t['rollbackRate'])} → **{_pct(e['rollbackRate'])}**"
            tw, ew = t["medianWindowsToRollback"], e["medianWindowsToRollback"]
            if name != "null" and (tw is not None or ew is not None):
                cell += f"<br>{'-' if tw is None else f'{tw:.3g}'} → {'-' if ew is None else f'{ew:.3g}'} w"
            pair = setting.get("paired", {}).get(name)
            if pair is not None:
                cell += f"<br>only {pair['todayOnly']} / {pair['evidenceOnly']}"
            cells.append(cell)
        rows.append(f"| {setting['model']} | {setting['ratePerReplica']:g} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


# --- the sweep: the evidence judge's defaults ----------------------------------------------------------------------

TARGETS = {"falseRollbackRate": 0.01, "ttftP99x1.5": 0.95, "ttftP99x1.25": 0.80, "medianWindowsToDetect": 3.0}
"""Issue 37's targets at the headline setting (lognormal, canary 1 of 4, 1 req/s per replica, 10-minute steps)."""


def meets_targets(entry: dict[str, Any]) -> list[str]:
    """The targets an entry of the sweep misses (empty: it meets them all)."""
    s = entry["scenarios"]
    missed = []
    if s["null"]["rollbackRate"] > TARGETS["falseRollbackRate"]:
        missed.append("false rollbacks")
    if s["ttftP99x1.5"]["rollbackRate"] < TARGETS["ttftP99x1.5"]:
        missed.append("x1.5")
    if s["ttftP99x1.25"]["rollbackRate"] < TARGETS["ttftP99x1.25"]:
        missed.append("x1.25")
    w = s["ttftP99x1.5"]["medianWindowsToRollback"]
    if w is None or w > TARGETS["medianWindowsToDetect"]:
        missed.append("time")
    return missed


def choose(entries: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Among the headline entries meeting every target, the one that detects x1.5 soonest (median seconds, then
    p95 seconds, then the fewest false rollbacks, then the larger minRequests: at 1 req/s per replica every window
    holds more than either, so a tie there is no reason to judge smaller samples elsewhere)."""
    ok = [
        e
        for e in entries
        if e["model"] == "lognormal" and e["ratePerReplica"] == 1.0 and e["step"] == "10m" and not meets_targets(e)
    ]

    def key(e: dict[str, Any]) -> tuple[float, float, float, int]:
        x = e["scenarios"]["ttftP99x1.5"]
        null = e["scenarios"]["null"]["rollbackRate"]
        return (x["medianSecondsToRollback"], x["p95SecondsToRollback"], null, -e["analysis"]["minRequests"])

    return min(ok, key=key) if ok else None


def tradeoff_table(entries: Sequence[dict[str, Any]]) -> str:
    cols = ["null", "ttftP99x1.25", "ttftP99x1.5", "ttftP99x2", "itlP99x1.5", "errorShare2pct", "errorShare5pct"]
    rows = [
        "| window | sustainedFor | minRequests | model | req/s | false rollbacks [95 % CI] | x1.25 | x1.5 | x2 | "
        "ITL x1.5 | errors 2 % | errors 5 % | x1.5 to detect: median / p95 windows (s) | targets |",
        "|" + "---|" * 14,
    ]
    for e in entries:
        s = e["scenarios"]
        a = e["analysis"]
        null = s["null"]
        lo, hi = null["ci95"]
        cells = [f"{_pct(null['rollbackRate'])} [{_pct(lo)}, {_pct(hi)}]"]
        cells += [_pct(s[name]["rollbackRate"]) if name in s else "-" for name in cols[1:]]
        x = s["ttftP99x1.5"]
        ttd = (
            "-"
            if x["medianCyclesToRollback"] is None
            else f"{x['medianWindowsToRollback']:.3g} / {x['p95WindowsToRollback']:.3g} "
            f"({x['medianSecondsToRollback']:g} / {x['p95SecondsToRollback']:g})"
        )
        missed = meets_targets(e)
        headline_setting = e["model"] == "lognormal" and e["ratePerReplica"] == 1.0
        verdict = ("all met" if not missed else "misses " + ", ".join(missed)) if headline_setting else ""
        rows.append(
            f"| {a['window']} | {a['sustainedFor']} | {a['minRequests']} | {e['model']} | {e['ratePerReplica']:g} | "
            + " | ".join([*cells, ttd, verdict])
            + " |"
        )
    return "\n".join(rows)


def print_tradeoff(entries: Sequence[dict[str, Any]]) -> None:
    print(tradeoff_table(entries))
    best = choose(entries)
    if best is None:
        print("\nno combination meets every target at the headline setting")
        return
    a, x = best["analysis"], best["scenarios"]["ttftP99x1.5"]
    print(
        f"\nchosen: window {a['window']}, sustainedFor {a['sustainedFor']}, minRequests {a['minRequests']} "
        f"(x1.5 detected in a median {x['medianWindowsToRollback']:g} windows, {x['medianSecondsToRollback']:g}s)"
    )


def sweep(args: argparse.Namespace, base: Setting, models: list[str], rates: list[float]) -> list[dict[str, Any]]:
    """The evidence judge over the grid of windows, sustainedFor and minRequests."""
    entries = []
    for window in args.sweep_windows.split(","):
        for sustained in args.sweep_sustained.split(","):
            for min_requests in (int(x) for x in args.sweep_min_requests.split(",")):
                analysis = analysis_of(window, sustained, min_requests)
                _echo(f"window {window}, sustainedFor {sustained}, minRequests {min_requests}:")
                for model in models:
                    for rate in rates:
                        setting = replace(base, model=model, rate=rate, analysis=analysis, judge=EVIDENCE)
                        result, _ = run_setting(setting, args.null_rollouts, args.regression_rollouts, args.seed)
                        entries.append(result)
    return entries


# --- the judges, the child, main -----------------------------------------------------------------------------------


def run_judge(
    judge: str, settings: Sequence[Setting], null_n: int, reg_n: int, seed: int
) -> list[tuple[dict[str, Any], dict[str, list[int]]]]:
    return [run_setting(replace(s, judge=judge), null_n, reg_n, seed) for s in settings]


def _child_args(args: argparse.Namespace, rates: list[float], models: list[str], null_n: int, reg_n: int) -> list[str]:
    """The arguments that make an ``--as-judge`` child simulate exactly what this run simulates."""
    out = [
        f"--rates={','.join(f'{r:g}' for r in rates)}",
        f"--models={','.join(models)}",
        f"--null-rollouts={null_n}",
        f"--regression-rollouts={reg_n}",
        f"--step={args.step}",
        f"--replicas={args.replicas}",
        f"--canary={args.canary}",
        f"--failed-share={args.failed_share}",
        f"--extension={args.extension}",
        f"--seed={args.seed}",
    ]
    if args.ttft_median is not None:
        out.append(f"--ttft-median={args.ttft_median}")
    return out


def run_today(child_args: Sequence[str], revision: str = TODAY_REVISION) -> dict[str, Any] | None:
    """Today's judge, exactly: ``revision``'s operator package extracted with ``git archive`` and the bench re-run
    under it in a child process (``--as-judge today``), whose stdout is the JSON of its results. None (and a note)
    when the revision is not in this clone."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-judgement-"))
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", revision, "operator/kvoffload"], capture_output=True, check=False
        )
        if archive.returncode != 0:
            _echo(f"today's judge skipped: git archive {revision} failed: {archive.stderr.decode().strip()}")
            return None
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
        operator = str(tmp / "operator")
        env = {**os.environ, "PYTHONPATH": operator, FOREIGN_OPERATOR: operator}
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--as-judge", TODAY, *child_args],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise SystemExit(f"today's judge (child process) failed with exit status {proc.returncode}")
        answer: dict[str, Any] = json.loads(proc.stdout)
        answer["revision"] = revision
        return answer
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def merge(
    today: dict[str, Any] | None, evidence: Sequence[tuple[dict[str, Any], dict[str, list[int]]]] | None
) -> list[dict[str, Any]]:
    """One entry per setting with each judge's result under ``judges`` and, with both, the paired overlap."""
    settings: list[dict[str, Any]] = []
    t_results = today["settings"] if today is not None else []
    t_ids = today["ids"] if today is not None else []
    e_results = [r for r, _ in evidence] if evidence is not None else []
    e_ids = [i for _, i in evidence] if evidence is not None else []
    for k in range(max(len(t_results), len(e_results))):
        first = e_results[k] if k < len(e_results) else t_results[k]
        entry = {key: value for key, value in first.items() if key not in ("judge", "analysis", "scenarios")}
        entry["judges"] = {}
        for judge, results in ((TODAY, t_results), (EVIDENCE, e_results)):
            if k < len(results):
                r = results[k]
                if (r["model"], r["ratePerReplica"]) != (entry["model"], entry["ratePerReplica"]):
                    raise SystemExit("the judges ran different settings")
                entry["judges"][judge] = {"analysis": r["analysis"], "scenarios": r["scenarios"]}
        if k < len(t_results) and k < len(e_results):
            counts = {name: s["rollouts"] for name, s in e_results[k]["scenarios"].items()}
            entry["paired"] = paired(t_ids[k], e_ids[k], counts)
        settings.append(entry)
    return settings


def fit_report() -> dict[str, Any]:
    """The lognormal fits of the TTFT captures the repository holds."""
    out: dict[str, Any] = {}
    for rel in (
        "tests/data/vllm-0.26.0-gpu-metrics.txt",
        "tests/data/vllm-0.26.0-gpu-offload-metrics.txt",
    ):
        counts = read_buckets(ROOT / rel, "vllm:time_to_first_token_seconds")
        median, sigma = fit_lognormal(TTFT_BUCKETS, counts)
        out[rel] = {"observations": counts[-1], "median": round(median, 4), "sigma": round(sigma, 3)}
        print(f"{rel}: {counts[-1]:.0f} TTFTs, lognormal median {median * 1000:.1f} ms, sigma {sigma:.3f}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the headline setting only, fewer rollouts")
    parser.add_argument("--json", type=Path, help="write the headline figures here (issue 37's shape)")
    parser.add_argument("--out", type=Path, default=None, help="the run's results (default results.json here)")
    parser.add_argument("--judges", default=",".join(JUDGES), help="judges to compare: today,evidence (default both)")
    parser.add_argument("--rates", default=None, help="requests/s per replica, comma-separated (full: 0.5,1,2,5)")
    parser.add_argument("--models", default=None, help=f"latency models (full: {','.join(MODELS)})")
    parser.add_argument("--null-rollouts", type=int, default=None)
    parser.add_argument("--regression-rollouts", type=int, default=None)
    parser.add_argument("--step", default="10m", help="the canary step's length (the issue's setting: 10m)")
    parser.add_argument("--ttft-median", type=float, default=None, help="TTFT median, seconds (default 0.150)")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--canary", type=int, default=1, help="canary replicas")
    parser.add_argument("--failed-share", type=float, default=0.005, help="both variants' background failed share")
    parser.add_argument(
        "--extension", type=float, default=1.0, help="steps' lengths a held step is followed past its end"
    )
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--window", default=CHOSEN["window"], help="the evidence judge's analysis.window")
    parser.add_argument("--sustained-for", default=CHOSEN["sustainedFor"], help="its analysis.sustainedFor")
    parser.add_argument("--min-requests", type=int, default=CHOSEN["minRequests"], help="its analysis.minRequests")
    parser.add_argument("--sweep", action="store_true", help="the evidence judge over a grid of the three above")
    parser.add_argument("--sweep-windows", default="2m,3m,5m")
    parser.add_argument("--sweep-sustained", default="1m,2m")
    parser.add_argument("--sweep-min-requests", default="25,50")
    parser.add_argument("--fit", action="store_true", help="print the lognormal fits to the TTFT captures and exit")
    parser.add_argument("--table", type=Path, help="print a results file as Markdown tables and exit")
    parser.add_argument("--tradeoff", type=Path, help="print a --sweep file as the trade-off table and exit")
    parser.add_argument("--as-judge", choices=[TODAY], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table:
        payload = json.loads(args.table.read_text())
        for judge in JUDGES:
            if any(_judged(s, judge) is not None for s in payload["settings"]):
                print(f"{judge}:\n\n{table(payload, judge)}\n\n{gate_table(payload, judge)}\n")
        if any("judges" in s and len(s["judges"]) == 2 for s in payload["settings"]):
            print(f"today → evidence:\n\n{comparison_table(payload)}")
        return 0
    if args.tradeoff:
        print_tradeoff(json.loads(args.tradeoff.read_text())["entries"])
        return 0
    if args.fit:
        fit_report()
        return 0
    started = time.perf_counter()
    rates = [float(x) for x in (args.rates or ("1" if args.quick or args.sweep else "0.5,1,2,5")).split(",")]
    models = (args.models or ("lognormal" if args.quick else ",".join(MODELS))).split(",")
    null_n = args.null_rollouts
    if null_n is None:
        null_n = 500 if args.sweep else 2000
    reg_n = args.regression_rollouts
    if reg_n is None:
        reg_n = 150 if args.sweep else 500
    args.null_rollouts, args.regression_rollouts = null_n, reg_n
    base = Setting(
        step=args.step,
        replicas=args.replicas,
        canary=args.canary,
        failed_share=args.failed_share,
        extension=args.extension,
        ttft_median=args.ttft_median,
    )
    settings = [replace(base, model=model, rate=rate) for model in models for rate in rates]
    if args.as_judge:
        return _as_judge(settings, null_n, reg_n, args.seed)
    if args.sweep:
        entries = sweep(args, base, models, rates)
        out = args.out or Path(__file__).with_name("sweep.json")
        payload = {
            "command": " ".join(["bench/judgement/bench_judgement.py", *(argv if argv is not None else sys.argv[1:])]),
            "seconds": round(time.perf_counter() - started, 1),
            "entries": entries,
        }
        out.write_text(json.dumps(payload, indent=1) + "\n")
        print(f"wrote {out}\n")
        print_tradeoff(entries)
        print(f"  ({time.perf_counter() - started:.0f}s)")
        return 0
    judges = [j.strip() for j in args.judges.split(",") if j.strip()]
    if not judges or any(j not in JUDGES for j in judges):
        raise SystemExit(f"--judges takes {' and/or '.join(JUDGES)}")
    today = run_today(_child_args(args, rates, models, null_n, reg_n)) if TODAY in judges else None
    evidence_analysis = analysis_of(args.window, args.sustained_for, args.min_requests)
    evidence = (
        run_judge(EVIDENCE, [replace(s, analysis=evidence_analysis) for s in settings], null_n, reg_n, args.seed)
        if EVIDENCE in judges
        else None
    )
    merged = merge(today, evidence)
    heads: dict[str, dict[str, Any]] = {}
    for judge in JUDGES:
        part = [(s, p) for s in merged if (p := _judged(s, judge)) is not None]
        if not part:
            continue
        head = next((p for s, p in part if s["model"] == "lognormal" and s["ratePerReplica"] == 1.0), part[0][1])
        first = next(s for s, p in part if p is head)
        heads[judge] = {**{k: v for k, v in first.items() if k not in ("judges", "paired")}, **head, "judge": judge}
    for judge, head in heads.items():
        if "null" not in head["scenarios"] or any(n not in head["scenarios"] for n in HEADLINE_DETECTION):
            raise SystemExit(f"the headline needs null and TTFT rollouts ({judge})")
    main_judge = EVIDENCE if EVIDENCE in heads else TODAY
    figures = headline(heads[main_judge])
    if main_judge == EVIDENCE and TODAY in heads:
        figures[TODAY] = headline(heads[TODAY])
    elapsed = time.perf_counter() - started
    if not args.quick:
        out = args.out or Path(__file__).with_name("results.json")
        payload = {
            "command": " ".join(["bench/judgement/bench_judgement.py", *(argv if argv is not None else sys.argv[1:])]),
            "seconds": round(elapsed, 1),
            "judges": {
                judge: {
                    "revision": TODAY_REVISION if judge == TODAY else "this checkout",
                    "analysis": heads[judge]["analysis"],
                }
                for judge in heads
            },
            "failedShareBackground": base.failed_share,
            "outputTokens": base.output_tokens,
            "models": {name: {"ttft": vars(ttft), "itl": vars(itl)} for name, (ttft, itl) in MODELS.items()},
            "headline": figures,
            "settings": merged,
        }
        out.write_text(json.dumps(payload, indent=1) + "\n")
        print(f"wrote {out}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    for judge in JUDGES:
        if judge in heads:
            print_headline(heads[judge])
    print(f"  ({elapsed:.0f}s)")
    print(json.dumps(figures))
    return 0


def _as_judge(settings: Sequence[Setting], null_n: int, reg_n: int, seed: int) -> int:
    """The child of ``run_today``: judge with the operator on PYTHONPATH (checked), answer JSON on stdout."""
    import kvoffload

    where = os.environ.get(FOREIGN_OPERATOR, "")
    if not where or not str(Path(kvoffload.__file__).resolve()).startswith(str(Path(where).resolve())):
        raise SystemExit(f"--as-judge needs {FOREIGN_OPERATOR} and the kvoffload on PYTHONPATH there")
    ran = run_judge(TODAY, settings, null_n, reg_n, seed)
    json.dump({"settings": [r for r, _ in ran], "ids": [i for _, i in ran]}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
