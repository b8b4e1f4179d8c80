"""The judge's evidence (analysis/evidence.py) and the latency gates built on it, through assess().

Samples are drawn through vLLM's real TTFT and ITL buckets (the lab's families, recorded from vLLM 0.32's
/metrics), lognormal as the GPU captures are (bench/judgement/README.md): identical variants, and canaries slower
by a known factor. The statistical checks use enough draws that a correct implementation fails them about once in
a million runs; the seeds are fixed.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from kvoffload.analysis.assess import ITL_RATIO, TTFT_P99, TTFT_RATIO, assess, look_alpha_of
from kvoffload.analysis.evidence import (
    Histogram,
    binomial_upper,
    cells,
    compare,
    count_above,
    exceedance,
    look_alpha,
    rank_z,
)
from kvoffload.analysis.measurements import Measurements, VariantSample
from kvoffload.api.quantity import GIB
from kvoffload.api.rollout import AnalysisSpec
from kvoffload.api.status import Verdict
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.policy.ladder import Level
from kvoffload_lab.engine.families import TOKEN_LATENCY_BUCKETS, TTFT_BUCKETS

TTFT_BOUNDS = (*TTFT_BUCKETS, math.inf)
ITL_BOUNDS = (*TOKEN_LATENCY_BUCKETS, math.inf)
CPU = Level(1, "cpu", 32 * GIB)
SPEC = AnalysisSpec()
SIGMA = 0.30  # the TTFT width fitted to the 0.26 GPU capture (bench/judgement --fit)


def histogram(values: np.ndarray, bounds: tuple[float, ...] = TTFT_BOUNDS) -> Histogram:
    return tuple((b, float(np.count_nonzero(values <= b))) for b in bounds)


def lognormal(rng: np.random.Generator, n: int, median: float, sigma: float = SIGMA) -> np.ndarray:
    return np.exp(rng.normal(math.log(median), sigma, n))


def sample(rng: np.random.Generator, n: int, median: float, *, p99: float | None = None) -> VariantSample:
    ttft = lognormal(rng, n, median)
    itl = lognormal(rng, n * 16, 0.020)
    return VariantSample(
        requests=float(n),
        ttft_p99=p99 if p99 is not None else float(np.quantile(ttft, 0.99)),
        itl_p99=float(np.quantile(itl, 0.99)),
        ttft_histogram=histogram(ttft),
        itl_histogram=histogram(itl, ITL_BOUNDS),
    )


# --- the statistics ------------------------------------------------------------------------


def test_cells_read_buckets_as_histogram_quantile_does() -> None:
    # Unsorted, a repeated bound (added, as coalesceBuckets does), and a count that falls (a counter reset
    # mid-window) read monotonically.
    got = cells(((0.5, 7.0), (0.1, 2.0), (0.25, 4.0), (0.25, 5.0), (math.inf, 10.0)))
    assert got == [(0.0, 0.1, 2.0), (0.1, 0.25, 7.0), (0.25, 0.5, 0.0), (0.5, math.inf, 1.0)]
    assert cells(((0.1, 2.0), (0.25, 9.0))) == []  # no +Inf: no histogram, as Prometheus says NaN


def test_count_above_splits_the_bucket_that_holds_the_bound_linearly() -> None:
    h = ((1.0, 10.0), (2.5, 30.0), (math.inf, 32.0))
    assert count_above(h, 1.5) == pytest.approx(20 * (2.5 - 1.5) / 1.5 + 2)
    assert count_above(h, 2.5) == pytest.approx(2.0)


@pytest.mark.parametrize(("k", "n", "p"), [(0, 10, 0.1), (3, 10, 0.1), (10, 10, 0.5), (7, 120, 0.01), (12, 500, 0.01)])
def test_the_binomial_tail_is_exact_where_it_sums(k: int, n: int, p: float) -> None:
    exact = sum(math.comb(n, x) * p**x * (1 - p) ** (n - x) for x in range(k, n + 1))
    assert binomial_upper(k, n, p) == pytest.approx(exact, rel=1e-9, abs=1e-300)


def test_the_rank_test_holds_its_rate_between_identical_variants() -> None:
    # 4,000 identical pairs at 1 request/s for 2 minutes (120 canary, 360 stable), through the TTFT buckets.
    rng = np.random.default_rng(37)
    ps = []
    for _ in range(4000):
        c, s = histogram(lognormal(rng, 120, 0.15)), histogram(lognormal(rng, 360, 0.15))
        ps.append(compare(c, s).p_value)
    rate = np.mean(np.array(ps) < 0.05)
    assert 0.035 < rate < 0.065  # 5 % +- 4.3 standard errors


def test_the_fitted_ratio_is_unbiased_and_its_interval_covers() -> None:
    rng = np.random.default_rng(11)
    for k in (1.0, 1.25, 1.5, 2.0):
        ratios, covered = [], 0
        for _ in range(500):
            got = compare(histogram(lognormal(rng, 120, 0.15 * k)), histogram(lognormal(rng, 360, 0.15)))
            assert got.ratio is not None
            assert got.interval is not None
            ratios.append(got.ratio)
            covered += got.interval[0] <= k <= got.interval[1]
        assert np.median(ratios) == pytest.approx(k, rel=0.02)
        assert 0.91 < covered / 500 < 0.98


def test_a_lower_bucket_resolution_alone_does_not_make_a_p99_ratio() -> None:
    # Every observation in one bucket: no shape to fit, no spread to rank.
    one = ((0.25, 100.0), (math.inf, 100.0))
    got = compare(one, one)
    assert got.ratio is None
    assert got.p_value is None
    assert rank_z([100.0], [100.0]) is None


def test_look_alpha_spreads_the_step_rate_over_looks_and_gates() -> None:
    assert look_alpha(0.01, 30, 5) == pytest.approx(0.01 / 150)
    spec = KVOffloadPolicySpec.model_validate(
        {
            "model": {"name": "Qwen/Qwen3-8B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 32768},
            "gpu": {"class": "nvidia-h100-80gb"},
            "replicas": 4,
            "resources": {"baseMemory": "24Gi"},
            "offload": {"cpu": "32Gi"},
            "rollout": {"stepDuration": "10m"},
            "analysis": {"interval": "30s", "falseRollbackRate": 0.02},
        }
    )
    assert look_alpha_of(spec) == pytest.approx(0.02 / 20 / 5)
    assert look_alpha_of(AnalysisSpec()) == pytest.approx(0.01 / 30 / 5)  # the default 15m step


def test_exceedance_tests_the_share_the_quantile_allows() -> None:
    rng = np.random.default_rng(5)
    slow = histogram(lognormal(rng, 600, 1.2))  # about 27 % over 1.5 s
    got = exceedance(slow, 1.5, 0.99)
    assert got is not None
    assert got.share > 0.2
    assert got.p_value < 1e-12
    healthy = exceedance(histogram(lognormal(rng, 600, 0.15)), 1.5, 0.99)
    assert healthy is not None
    assert healthy.share == 0.0
    assert healthy.p_value == 1.0


# --- the gates, through assess() -------------------------------------------------------------


def judge(canary: VariantSample, stable: VariantSample, **kw: object) -> tuple[Verdict, dict[str, object]]:
    # Not warmed_up: the offload hit checks, which these samples do not carry, are not gated.
    got = assess(SPEC, CPU, Measurements(canary=canary, stable=stable), warmed_up=False, **kw)  # type: ignore[arg-type]
    return got.verdict, {m.name: m for m in got.metrics}


def test_a_canary_50_percent_slower_fails_with_its_evidence_shown() -> None:
    rng = np.random.default_rng(1)
    verdict, rows = judge(sample(rng, 120, 0.225), sample(rng, 360, 0.15))
    ratio = rows[TTFT_RATIO]
    assert verdict is Verdict.FAIL
    assert ratio.passed is False  # type: ignore[attr-defined]
    assert ratio.canary == pytest.approx(1.5, rel=0.15)  # type: ignore[attr-defined]
    low, high = ratio.interval  # type: ignore[attr-defined]
    assert 1.2 < low < 1.5 < high
    assert ratio.p_value < ratio.alpha  # type: ignore[attr-defined]
    assert "fitted to both histograms" in ratio.message  # type: ignore[attr-defined]


def test_identical_variants_pass_even_when_the_p99s_read_apart() -> None:
    # The canary's interpolated p99 reads 30 % over the stable's (as one bucket's interpolation can), but the
    # histograms are of the same engine: the fit says so.
    rng = np.random.default_rng(2)
    canary, stable = sample(rng, 120, 0.15), sample(rng, 360, 0.15)
    canary = replace(canary, ttft_p99=(stable.ttft_p99 or 0.0) * 1.3)
    verdict, rows = judge(canary, stable)
    assert verdict is Verdict.PASS, rows[TTFT_RATIO].message  # type: ignore[attr-defined]
    assert rows[TTFT_RATIO].canary < 1.2  # type: ignore[attr-defined]


def test_a_slower_canary_on_too_little_evidence_is_inconclusive_and_says_what_would_settle_it() -> None:
    # 30 % slower on 60 requests against 180: the effect is over 1.2, the rank test is not yet beyond chance.
    rng = np.random.default_rng(3)
    for _ in range(50):
        verdict, rows = judge(sample(rng, 60, 0.195), sample(rng, 180, 0.15))
        ratio = rows[TTFT_RATIO]
        if ratio.canary > 1.2 and ratio.p_value >= ratio.alpha:  # type: ignore[attr-defined]
            break
    else:
        pytest.fail("no draw with the effect over 1.2 and the test short of its alpha")
    assert ratio.passed is None  # type: ignore[attr-defined]
    assert verdict is Verdict.INCONCLUSIVE
    assert ratio.requests_needed > 60  # type: ignore[attr-defined]
    assert "not yet beyond chance" in ratio.message  # type: ignore[attr-defined]


def test_itl_is_judged_on_about_one_observation_per_request() -> None:
    # 16 ITL observations to a request: a 10 % slower ITL would be "certain" over 1,920 observations, but over 120
    # requests it is not, and it is under maxRegression anyway.
    rng = np.random.default_rng(4)
    canary, stable = sample(rng, 120, 0.15), sample(rng, 360, 0.15)
    itl = lognormal(rng, 120 * 16, 0.022)
    canary = replace(canary, itl_histogram=histogram(itl, ITL_BOUNDS), itl_p99=float(np.quantile(itl, 0.99)))
    verdict, rows = judge(canary, stable)
    assert verdict is Verdict.PASS
    assert rows[ITL_RATIO].p_value > 1e-4  # type: ignore[attr-defined]


def test_a_budget_breach_needs_evidence_and_one_the_stable_shares_is_not_the_canarys() -> None:
    rng = np.random.default_rng(6)
    slow_ttft = lognormal(rng, 120, 0.9)  # about 4 % over 1.5 s: a p99 over the budget, beyond chance
    slow = VariantSample(
        requests=120.0,
        ttft_p99=float(np.quantile(slow_ttft, 0.99)),
        itl_p99=0.03,
        ttft_histogram=histogram(slow_ttft),
    )
    healthy = sample(rng, 360, 0.9)
    healthy = replace(healthy, ttft_p99=1.2)  # the stable within its budget
    verdict, rows = judge(slow, healthy)
    budget = rows[TTFT_P99]
    assert budget.passed is False, budget.message  # type: ignore[attr-defined]
    assert verdict is Verdict.FAIL
    # The same canary beside a stable that breaches as much: reported, not gated; the ratio judges it.
    verdict, rows = judge(slow, replace(healthy, ttft_p99=2.0))
    budget = rows[TTFT_P99]
    assert budget.passed is None  # type: ignore[attr-defined]
    assert "and so is the stable's" in budget.message  # type: ignore[attr-defined]
    assert rows[TTFT_RATIO].passed is True  # type: ignore[attr-defined]
    assert verdict is Verdict.PASS
    # Over the budget by two requests in a hundred and twenty: not evidence yet.
    two_slow = np.concatenate([lognormal(rng, 118, 0.15), [3.0, 3.0]])
    edge = VariantSample(requests=120.0, ttft_p99=1.6, itl_p99=0.03, ttft_histogram=histogram(two_slow))
    verdict, rows = judge(edge, replace(healthy, ttft_p99=0.3))
    budget = rows[TTFT_P99]
    assert budget.passed is None  # type: ignore[attr-defined]
    assert budget.requests_needed > 1000  # type: ignore[attr-defined]
    assert "not yet beyond chance" in budget.message  # type: ignore[attr-defined]


def test_without_bucket_counts_the_p99s_decide_and_the_row_says_so() -> None:
    verdict, rows = judge(
        VariantSample(requests=120.0, ttft_p99=0.45, itl_p99=0.03),
        VariantSample(requests=360.0, ttft_p99=0.30, itl_p99=0.03),
    )
    assert verdict is Verdict.FAIL
    assert "(no bucket counts)" in rows[TTFT_RATIO].message  # type: ignore[attr-defined]
    assert rows[TTFT_RATIO].p_value is None  # type: ignore[attr-defined]
