"""bench/judgement: its histogram_quantile is Prometheus', and a tiny run of the bench gives sane verdicts."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from kvoffload.lab.engine.families import TOKEN_LATENCY_BUCKETS, TTFT_BUCKETS
from tests.support.paths import ROOT
from tests.support.prometheus import expected_quantile


def _load() -> ModuleType:
    path = Path(ROOT) / "bench" / "judgement" / "bench_judgement.py"
    spec = importlib.util.spec_from_file_location("bench_judgement", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_judgement", module)
    spec.loader.exec_module(module)
    return module


bench = _load()
INF = math.inf


def test_histogram_quantile_known_values() -> None:
    buckets = [(0.1, 10.0), (0.25, 50.0), (0.5, 100.0), (INF, 100.0)]
    # rank 99 falls in (0.25, 0.5], 49 of its 50 observations in: 0.25 + 0.25 * 49/50
    assert bench.histogram_quantile(0.99, buckets) == pytest.approx(0.495)
    assert bench.histogram_quantile(0.5, buckets) == pytest.approx(0.25)  # rank 50: the top of (0.1, 0.25]
    assert bench.histogram_quantile(0.05, buckets) == pytest.approx(0.05)  # first bucket: from 0
    # le order does not matter; a rank in the +Inf bucket gives the highest finite bound
    assert bench.histogram_quantile(0.99, list(reversed(buckets))) == pytest.approx(0.495)
    assert bench.histogram_quantile(0.99, [(0.1, 10.0), (INF, 100.0)]) == 0.1
    # no +Inf bucket, one bucket, or no observations: NaN; q out of [0, 1]: -Inf / +Inf
    assert math.isnan(bench.histogram_quantile(0.99, [(0.1, 10.0), (0.25, 50.0)]))
    assert math.isnan(bench.histogram_quantile(0.99, [(INF, 10.0)]))
    assert math.isnan(bench.histogram_quantile(0.99, [(0.1, 0.0), (INF, 0.0)]))
    assert bench.histogram_quantile(-0.1, buckets) == -INF
    assert bench.histogram_quantile(1.1, buckets) == INF


@pytest.mark.parametrize("bounds", [TTFT_BUCKETS, TOKEN_LATENCY_BUCKETS], ids=["ttft", "itl"])
@pytest.mark.parametrize("value", [0.003, 0.03, 0.2, 0.3, 0.9, 3.0, 9000.0])
@pytest.mark.parametrize("q", [0.5, 0.95, 0.99])
def test_histogram_quantile_matches_the_prometheus_verified_expectation(
    bounds: tuple[float, ...], value: float, q: float
) -> None:
    """tests/support/prometheus.py's ``expected_quantile`` is what the real Prometheus answered (prometheus tests)."""
    cumulative = [100.0 if value <= le else 0.0 for le in bounds] + [100.0]
    got = bench.histogram_quantile(q, list(zip([*bounds, INF], cumulative, strict=True)))
    assert got == pytest.approx(expected_quantile(q, value, bounds))
    many = bench.histogram_quantile_many(q, bounds, np.array([cumulative]))
    assert float(many[0]) == pytest.approx(got)


def test_the_vectorised_quantile_agrees_with_the_reference() -> None:
    rng = np.random.default_rng(7)
    p = bench.MODELS["heavy-tail"][0].bucket_probabilities(TTFT_BUCKETS)
    counts = rng.multinomial(rng.integers(0, 300, size=400), p)
    cumulative = np.cumsum(counts, axis=-1)
    many = bench.histogram_quantile_many(0.99, TTFT_BUCKETS, cumulative)
    for row, got in zip(cumulative, many, strict=True):
        want = bench.histogram_quantile(0.99, list(zip([*TTFT_BUCKETS, INF], row.tolist(), strict=True)))
        assert (math.isnan(want) and math.isnan(got)) or got == pytest.approx(want)


def test_the_latency_model_scales_its_p99_exactly() -> None:
    ttft, _ = bench.MODELS["lognormal"]
    assert ttft.quantile(0.5) == pytest.approx(0.150, rel=1e-6)
    assert ttft.quantile(0.99, 1.5) == pytest.approx(1.5 * ttft.quantile(0.99), rel=1e-6)


def test_a_tenfold_ttft_regression_is_rolled_back_every_time() -> None:
    setting = bench.Setting(rate=2.0)
    outcome = bench.run_rollouts(setting, bench.Regression("x10", ttft_scale=10.0), 20, seed=1)
    assert outcome.rolled_back == 20
    assert outcome.by_gate[bench.TTFT_P99] == 20  # p99 over the 1500ms budget, whatever the ratio says
    assert max(outcome.cycles_to_rollback) <= 10


def test_identical_variants_at_a_high_rate_rarely_roll_back() -> None:
    setting = bench.Setting(rate=5.0, failed_share=0.0)
    outcome = bench.run_rollouts(setting, bench.NULL, 60, seed=2)
    assert outcome.rolled_back <= 3
    assert outcome.rolled_back + outcome.promoted + outcome.held == 60
    summary = bench.summarise(outcome, 30.0)
    assert summary["rollouts"] == 60
    low, high = summary["ci95"]
    assert 0.0 <= low <= summary["rollbackRate"] <= high <= 1.0


def test_wilson_interval() -> None:
    low, high = bench.wilson(10, 100)
    assert low == pytest.approx(0.0552, abs=1e-3)
    assert high == pytest.approx(0.1744, abs=1e-3)
    assert bench.wilson(0, 50)[0] == 0.0
