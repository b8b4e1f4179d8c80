"""bench/judgement: its histogram_quantile is Prometheus', and a tiny run of the bench gives sane verdicts."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from kvoffload.analysis.assess import GATES_WITH_EVIDENCE, look_alpha_of
from kvoffload_lab.engine.families import TOKEN_LATENCY_BUCKETS, TTFT_BUCKETS
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
    setting = bench.Setting(rate=2.0, analysis=bench.analysis_of("2m", "2m", 50))
    outcome = bench.run_rollouts(setting, bench.Regression("x10", ttft_scale=10.0), 20, seed=1)
    assert outcome.rolled_back == 20
    assert outcome.by_gate[bench.TTFT_P99] == 20  # p99 over the 1500ms budget, whatever the ratio says
    # warm at cycle 4 (2m), judged from one window later (cycle 8), sustained 2m: cycle 12
    assert min(outcome.cycles_to_rollback) == 12
    assert max(outcome.cycles_to_rollback) <= 13


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


def test_time_to_detect_in_cycles_seconds_and_windows() -> None:
    assert bench.to_detect(10, 30.0, 120.0) == {"cycles": 10, "seconds": 300.0, "windows": 2.5}
    assert bench.to_detect(14, 30.0, 180.0)["windows"] == pytest.approx(420 / 180, abs=1e-4)
    assert bench.to_detect(None, 30.0, 120.0) == {"cycles": None, "seconds": None, "windows": None}
    outcome = bench.Outcome(rollouts=4, rolled_back=3, cycles_to_rollback=[9, 10, 12])
    summary = bench.summarise(outcome, 30.0, 180.0)
    assert summary["medianCyclesToRollback"] == 10
    assert summary["medianSecondsToRollback"] == 300.0
    assert summary["medianWindowsToRollback"] == pytest.approx(300 / 180, abs=1e-4)
    assert summary["p95CyclesToRollback"] == 12
    assert summary["p95WindowsToRollback"] == pytest.approx(2.0)


def test_the_warm_up_rules_of_both_judges() -> None:
    """today: ratios gated from the cycle after the warm-up ends; evidence (issue 37): all latency rows from one
    window after it, or after the longest warm-up (half the step) however few requests."""
    evidence = bench.WarmupRule.of(bench.Setting(judge=bench.EVIDENCE))
    today = bench.WarmupRule.of(bench.Setting(judge=bench.TODAY))
    for rule in (evidence, today):
        rule.after_cycle(90.0, 500.0)  # before warmup.duration (the 2m window)
        assert rule.warm_at is None
        rule.after_cycle(120.0, 49.0)  # fewer than warmup.requests (minRequests 50)
        assert rule.warm_at is None
        rule.after_cycle(150.0, 50.0)
        assert rule.warm_at == 150.0
        rule.after_cycle(180.0, 0.0)
        assert rule.warm_at == 150.0
    assert not today.comparing(150.0)
    assert today.comparing(180.0)
    assert evidence.judged_from == 270.0
    assert not evidence.comparing(240.0)
    assert evidence.comparing(270.0)
    cold = bench.WarmupRule.of(bench.Setting(judge=bench.EVIDENCE, step="10m"))
    cold.after_cycle(270.0, 10.0)
    assert cold.warm_at is None
    cold.after_cycle(300.0, 10.0)  # half the 10m step: judged while still cold
    assert cold.warm_at == 300.0
    assert cold.judged_from == 420.0


def test_the_evidence_judge_sees_the_step_and_the_histograms() -> None:
    setting = bench.Setting(step="10m", analysis=bench.analysis_of("3m", "1m", 25))
    spec = setting.policy()
    assert spec.rollout.step_duration == "10m"
    assert spec.analysis.window == "3m"
    described = bench.describe_analysis(setting)
    assert described["lookAlpha"] == pytest.approx(look_alpha_of(spec))
    assert described["lookAlpha"] == pytest.approx(0.01 / 20 / GATES_WITH_EVIDENCE)  # 20 looks in the 10m step
    rng = np.random.default_rng(3)
    side = bench.simulate_side(rng, 2, 8, setting, 1, 1.0, 1.0, 0.0)
    sample = bench._sample(side, 1, 7, 180.0, canary=True, histograms=True)
    assert sample.ttft_histogram[-1][0] == INF
    assert sample.ttft_histogram[-1][1] == sample.requests  # no failed requests here: every one has a TTFT
    assert sample.itl_histogram[-1][1] == pytest.approx(sample.requests * 127)
    counts = [c for _, c in sample.ttft_histogram]
    assert counts == sorted(counts)
    # the p99 the sample carries is histogram_quantile over the same counts
    assert sample.ttft_p99 == pytest.approx(bench.histogram_quantile(0.99, list(sample.ttft_histogram)))
    assert bench._sample(side, 1, 7, 180.0, canary=True, histograms=False).ttft_histogram == ()


def test_the_same_seed_gives_every_window_the_same_traffic() -> None:
    """The judges' comparison is paired: the draws do not depend on the analysis settings."""
    two = bench.Setting(analysis=bench.analysis_of("2m", "2m", 50))
    five = bench.Setting(analysis=bench.analysis_of("5m", "1m", 25))
    a = bench.simulate_side(np.random.default_rng(9), 3, 20, two, 1, 1.0, 1.0, 0.01)
    b = bench.simulate_side(np.random.default_rng(9), 3, 20, five, 1, 1.0, 1.0, 0.01)
    assert np.array_equal(a.requests[:, :4], b.requests[:, :4])  # both windows still hold every interval
    assert np.array_equal(b.requests[:, 4] - a.requests[:, 4], a.requests[:, 0])  # the 2m window dropped the first
    assert np.array_equal(a.ttft_buckets[:, :4], b.ttft_buckets[:, :4])


def test_merge_pairs_the_judges_rollouts() -> None:
    def result(judge: str, rate: float, rolled: int) -> dict[str, object]:
        return {
            "model": "lognormal",
            "ratePerReplica": rate,
            "judge": judge,
            "analysis": {"window": "2m"},
            "scenarios": {"null": {"rollouts": 10, "rolledBack": rolled}},
        }

    today = {
        "settings": [result("today", 1.0, 3), result("today", 2.0, 0)],
        "ids": [{"null": [1, 4, 7]}, {"null": []}],
    }
    evidence = [(result("evidence", 1.0, 2), {"null": [4, 8]}), (result("evidence", 2.0, 0), {"null": []})]
    merged = bench.merge(today, evidence)
    assert [m["ratePerReplica"] for m in merged] == [1.0, 2.0]
    assert set(merged[0]["judges"]) == {"today", "evidence"}
    assert merged[0]["paired"]["null"] == {"rollouts": 10, "both": 1, "todayOnly": 2, "evidenceOnly": 1}
    assert "judge" not in merged[0]
    only = bench.merge(None, evidence)
    assert set(only[0]["judges"]) == {"evidence"}
    assert "paired" not in only[0]


def _has_revision(revision: str) -> bool:
    got = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{revision}^{{commit}}"], capture_output=True, check=False
    )
    return got.returncode == 0


@pytest.mark.skipif(not _has_revision(bench.TODAY_REVISION), reason="today's revision is not in this clone")
def test_today_runs_in_a_child_on_its_own_revision() -> None:
    """The child judges with 1fa7e6b's operator (no histograms, the old warm-up) on the parent's traffic."""
    args = ["--rates=2", "--models=lognormal", "--null-rollouts=3", "--regression-rollouts=0", "--seed=5"]
    answer = bench.run_today(args)
    assert answer is not None
    assert answer["revision"] == bench.TODAY_REVISION
    [result] = answer["settings"]
    assert result["judge"] == "today"
    assert result["analysis"] == {"window": "2m", "sustainedFor": "2m", "minRequests": 50}
    assert result["scenarios"]["null"]["rollouts"] == 3
    assert set(result["scenarios"]) == {"null"}
    assert answer["ids"][0]["null"] == [] or all(0 <= i < 3 for i in answer["ids"][0]["null"])
