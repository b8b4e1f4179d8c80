"""The live payoff (analysis/payoff.py): the fit recovers known costs, its interval covers them as often as it says,
"does not pay" is as rare as the alpha allows where restores pay, and assess() gates it as analysis.payoff says."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from kvoffload.analysis.assess import assess, look_alpha_of
from kvoffload.analysis.measurements import Measurements, VariantSample
from kvoffload.analysis.payoff import (
    PAYOFF,
    PayoffFit,
    SubWindow,
    fit_payoff,
    judge,
    payoff_row,
    t_quantile,
    t_upper,
)
from kvoffload.analysis.prometheus import PrometheusProvider
from kvoffload.api.rollout import AnalysisSpec, PayoffGate
from kvoffload.api.serving import SecondaryTier
from kvoffload.api.status import Verdict
from kvoffload.policy.ladder import Level
from tests.support.prometheus import SyntheticEngine, scraping, synthetic_target

PROMPT = (500, 4000)


@dataclass(frozen=True)
class Costs:
    """The truth a synthetic engine is priced with, seconds."""

    fixed: float = 0.040
    prefill: float = 50e-6
    restore: float = 15e-6
    hit: float = 2e-6
    noise: float = 0.010
    """Standard deviation of one request's TTFT about its price."""


def requests_of(
    rng: random.Random, costs: Costs, n: int, *, restores: bool, prompt: tuple[int, int] = PROMPT
) -> SubWindow:
    """One sub-window of ``n`` requests: varied prompts, some prefix in the GPU cache, and (on a canary) most of the
    rest restored from a tier for 60 % of the requests."""
    computed = hit = external = 0.0
    ttft = 0.0
    for _ in range(n):
        length = rng.randint(*prompt)
        on_gpu = rng.choice((0, 256, 512))
        restored = int((length - on_gpu) * rng.uniform(0.5, 0.9)) if restores and rng.random() < 0.6 else 0
        done = length - on_gpu - restored
        computed, hit, external = computed + done, hit + on_gpu, external + restored
        price = costs.fixed + costs.prefill * done + costs.hit * on_gpu + costs.restore * restored
        ttft += price + rng.gauss(0.0, costs.noise)
    return SubWindow(n, ttft, computed, hit, external)


def variants(
    seed: int, costs: Costs, windows: int = 12, *, canary_rate: tuple[int, int] = (15, 30), **kwargs: object
) -> tuple[list[SubWindow], list[SubWindow]]:
    """(canary, stable) sub-windows: the stable restores nothing (the first CPU tier's step), three times the canary's
    traffic."""
    rng = random.Random(seed)
    canary = [requests_of(rng, costs, rng.randint(*canary_rate), restores=True, **kwargs) for _ in range(windows)]  # type: ignore[arg-type]
    stable = [requests_of(rng, costs, 3 * rng.randint(*canary_rate), restores=False, **kwargs) for _ in range(windows)]  # type: ignore[arg-type]
    return canary, stable


def fitted(canary: Sequence[SubWindow], stable: Sequence[SubWindow]) -> PayoffFit:
    fit = fit_payoff(canary, stable)
    assert fit is not None
    return fit


# --- Student's t ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("upper", "dof", "table"),
    [(0.025, 1, 12.706), (0.025, 5, 2.571), (0.025, 30, 2.042), (0.005, 10, 3.169), (0.05, 2, 2.920)],
)
def test_t_quantiles_match_the_table(upper: float, dof: int, table: float) -> None:
    assert t_quantile(upper, dof) == pytest.approx(table, abs=1e-3)
    assert t_upper(table, dof) == pytest.approx(upper, rel=1e-3)
    assert t_upper(-table, dof) == pytest.approx(1 - upper, rel=1e-3)


def test_t_tends_to_the_normal() -> None:
    assert t_upper(1.959964, 1e6) == pytest.approx(0.025, rel=1e-4)


# --- the fit ----------------------------------------------------------------------------------------------------------


def test_the_fit_recovers_the_fixed_cost_the_prefill_and_the_restore_per_token() -> None:
    costs = Costs()
    fits = [fitted(*variants(seed, costs)) for seed in range(30)]
    # One fit is noisy in f and p apart (a sub-window averages its prompts); their mean is the truth.
    for figure, truth in (
        ("fixed_s", costs.fixed),
        ("prefill_s_per_token", costs.prefill),
        ("restore_s_per_token", costs.restore),
        ("saving_s_per_token", costs.prefill - costs.restore),
    ):
        values = [getattr(f, figure) for f in fits]
        assert sum(values) / len(values) == pytest.approx(truth, rel=0.1), figure
    fit = fits[0]
    assert fit.saving_s_per_token == pytest.approx(costs.prefill - costs.restore, rel=0.1)
    assert fit.rows == 24
    assert fit.dof == 24 - 4  # requests, prompt, GPU hits, the canary's restores
    # Per canary request: the saving per token times the tokens a canary request restored, on average.
    assert fit.saving_s == pytest.approx(fit.saving_s_per_token * fit.restored_tokens_per_request)
    assert 500 < fit.restored_tokens_per_request < 1500


def test_one_prompt_length_cannot_tell_fixed_from_prefill_and_still_measures_the_saving() -> None:
    """Every prompt 2,000 tokens, no GPU hits: requests and prompt tokens are collinear, so f and p are one figure;
    the canary computes fewer tokens by what it restores, so p - r is still measured."""
    costs = Costs(hit=0.0)
    rng = random.Random(3)

    def window(n: int, restores: bool) -> SubWindow:
        restored = sum(1500 for _ in range(n) if restores and rng.random() < 0.6)
        noise = sum(rng.gauss(0, costs.noise) for _ in range(n))
        ttft = n * (costs.fixed + costs.prefill * 2000) - (costs.prefill - costs.restore) * restored + noise
        return SubWindow(n, ttft, 2000 * n - restored, 0.0, restored)

    canary = [window(rng.randint(15, 30), True) for _ in range(12)]
    stable = [window(rng.randint(45, 90), False) for _ in range(12)]
    fit = fitted(canary, stable)
    assert fit.fixed_s is None
    assert fit.prefill_s_per_token is None
    assert fit.restore_s_per_token is None
    assert fit.saving_s_per_token == pytest.approx(costs.prefill - costs.restore, rel=0.1)


def test_a_stable_that_restores_too_has_its_own_restore_cost() -> None:
    """The nvme step: the stable (the CPU tier) restores cheaply, the canary slowly. Only the canary's counts."""
    costs = Costs(restore=15e-6)
    slow = Costs(restore=120e-6)
    rng = random.Random(9)
    stable = [requests_of(rng, costs, rng.randint(45, 90), restores=True) for _ in range(12)]
    canary = [requests_of(rng, slow, rng.randint(15, 30), restores=True) for _ in range(12)]
    fit = fitted(canary, stable)
    assert fit.restore_s_per_token == pytest.approx(slow.restore, rel=0.15)
    assert fit.saving_s_per_token == pytest.approx(slow.prefill - slow.restore, rel=0.15)
    assert judge(fit, 1e-4).passed is False


def test_nothing_is_fitted_without_restores_or_with_too_few_sub_windows() -> None:
    canary, stable = variants(2, Costs())
    no_restores = [SubWindow(w.requests, w.ttft_seconds, w.computed + w.external, w.local_hit, 0.0) for w in canary]
    assert fit_payoff(no_restores, stable) is None
    assert fit_payoff(canary[:2], stable[:2]) is None  # 4 rows, 4 figures
    assert fit_payoff([], []) is None
    # Empty sub-windows (a canary not yet Ready) are left out, not fitted as zeros.
    empty = [SubWindow(0.0, 0.0, 0.0, 0.0, 0.0)] * 5
    assert fitted(canary + empty, stable).rows == fitted(canary, stable).rows


# --- how sure it is ---------------------------------------------------------------------------------------------------


def test_the_95_percent_interval_covers_the_true_saving_about_95_percent_of_the_time() -> None:
    costs = Costs()
    covered = 0
    runs = 300
    for seed in range(runs):
        fit = fitted(*variants(seed, costs, windows=8))
        low, high = judge(fit, 0.05).interval
        truth = (costs.prefill - costs.restore) * fit.restored_tokens_per_request
        covered += low <= truth <= high
    assert 0.91 <= covered / runs <= 0.99, covered / runs


def test_does_not_pay_is_as_rare_as_alpha_allows_at_break_even_and_never_where_restores_pay() -> None:
    alpha = 0.05
    runs = 400
    at_par = Costs(restore=Costs().prefill)  # a restore costs what recomputing costs: saving 0
    false = sum(judge(fitted(*variants(seed, at_par, windows=8)), alpha).passed is False for seed in range(runs))
    # The binomial's 3 standard deviations over alpha: 0.083.
    assert false / runs <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / runs), false / runs
    paying = Costs(restore=Costs().prefill * 0.9)  # a restore saves 10 %: a small, real saving
    false = sum(judge(fitted(*variants(seed, paying, windows=8)), 1e-4).passed is False for seed in range(runs))
    assert false == 0


def test_restores_slower_than_recompute_are_caught_and_a_thin_sample_is_inconclusive() -> None:
    slow = Costs(restore=Costs().prefill * 2)
    caught = sum(judge(fitted(*variants(seed, slow)), 1e-4).passed is False for seed in range(50))
    assert caught >= 48
    # A small loss, a few sub-windows of noisy requests: at or under 0, mostly not beyond chance, and then the row
    # says how many canary requests would settle it.
    thin = Costs(restore=Costs().prefill * 1.1, noise=0.05)
    judged = [judge(fitted(*variants(seed, thin, windows=4, canary_rate=(5, 8))), 1e-4) for seed in range(40)]
    losing = [j for j in judged if j.fit.saving_s <= 0]
    unsure = [j for j in losing if j.passed is None]
    assert len(unsure) >= 10, [(j.fit.saving_s, j.passed) for j in judged]
    for j in unsure:
        assert j.requests_needed is not None
        assert j.requests_needed > j.fit.canary_requests
    assert all(j.passed is True for j in judged if j.fit.saving_s > 0)


# --- the row and assess() ---------------------------------------------------------------------------------------------

CPU = Level(1, "cpu", 1 << 30)
NVME = Level(2, "nvme", 1 << 30, (SecondaryTier(name="nvme", size="4Gi", path="/mnt/kv-cache"),))


def sample(rows: Sequence[SubWindow]) -> VariantSample:
    ttft = sum(w.ttft_seconds for w in rows) / max(1.0, sum(w.requests for w in rows))
    histogram = ((0.1, 0.0), (0.25, 0.0), (0.5, 0.0), (1.0, 0.0), (math.inf, 0.0))
    n = sum(w.requests for w in rows)
    prompt = sum(w.computed + w.local_hit + w.external for w in rows)
    return VariantSample(
        requests=n,
        ttft_p99=ttft,
        ttft_histogram=tuple((le, n if le >= ttft else 0.0) for le, _ in histogram),
        itl_p99=0.02,
        itl_histogram=tuple((le, n if le >= 0.02 else 0.0) for le, _ in histogram),
        external_share=sum(w.external for w in rows) / prompt,
        payoff_rows=tuple(rows),
    )


def assessed(level: Level, canary: Sequence[SubWindow], stable: Sequence[SubWindow], **analysis: object) -> object:
    # Latency gates too loose to act: only the payoff decides here.
    spec = AnalysisSpec.model_validate({"minRequests": 50, "maxRegression": 50, "ttftP99": "10s", **analysis})
    return assess(spec, level, Measurements(canary=sample(canary), stable=sample(stable)), warmed_up=True)


def test_a_secondary_tier_that_does_not_pay_fails_with_its_figures() -> None:
    canary, stable = variants(5, Costs(restore=Costs().prefill * 3))
    result = assessed(NVME, canary, stable)
    row = result.metric(PAYOFF)  # type: ignore[attr-defined]
    assert row is not None
    assert row.passed is False
    assert result.verdict is Verdict.FAIL  # type: ignore[attr-defined]
    assert "does not pay" in result.message  # type: ignore[attr-defined]
    assert row.canary is not None
    assert row.canary < 0
    assert row.interval is not None
    assert row.interval[1] < 0
    assert row.alpha == pytest.approx(look_alpha_of(AnalysisSpec(), payoff=True))
    assert row.payoff is not None
    assert row.payoff.restore_us_per_token == pytest.approx(150, rel=0.2)
    assert row.payoff.prefill_us_per_token == pytest.approx(50, rel=0.1)
    for words in ("fixed", "ms", "prefill", "restore", "µs/token"):
        assert words in row.message


def test_with_no_fault_the_payoff_gate_passes() -> None:
    """The positive control: restores that cost less than recomputing pass the gate on a secondary tier."""
    canary, stable = variants(6, Costs())
    row = assessed(NVME, canary, stable).metric(PAYOFF)  # type: ignore[attr-defined]
    assert row is not None
    assert row.passed is True
    assert row.canary is not None
    assert row.canary > 0
    assert row.message.startswith("pays")


def test_the_first_cpu_tier_reports_its_payoff_unless_analysis_payoff_is_gate() -> None:
    canary, stable = variants(7, Costs(restore=Costs().prefill * 3))
    auto = assessed(CPU, canary, stable)
    row = auto.metric(PAYOFF)  # type: ignore[attr-defined]
    assert row is not None
    assert row.passed is None
    assert "reported" in row.message
    assert "does not pay" in row.message
    assert row.alpha == pytest.approx(look_alpha_of(AnalysisSpec()))  # five gates: the payoff takes no share
    assert auto.verdict is Verdict.PASS  # type: ignore[attr-defined]
    on = assessed(CPU, canary, stable, payoff=PayoffGate.GATE.value)
    assert on.metric(PAYOFF).passed is False  # type: ignore[attr-defined]
    assert on.verdict is Verdict.FAIL  # type: ignore[attr-defined]
    off = assessed(NVME, canary, stable, payoff="report")
    assert off.metric(PAYOFF).passed is None  # type: ignore[attr-defined]
    assert off.verdict is Verdict.PASS  # type: ignore[attr-defined]


def test_the_forecast_is_shown_beside_the_measured_saving_and_changes_no_verdict() -> None:
    canary, stable = variants(8, Costs())
    row = payoff_row(canary, stable, gate=True, gate_text="", judging=True, min_requests=50, alpha=1e-4)
    forecast = payoff_row(
        canary,
        stable,
        gate=True,
        gate_text="",
        judging=True,
        min_requests=50,
        alpha=1e-4,
        forecast_saving_us_per_token=20.0,
    )
    fit = fit_payoff(canary, stable)
    assert fit is not None
    want = 20.0 * fit.restored_tokens_per_request / 1e3  # the forecast for as many restored tokens a request
    assert row.result.forecast_saving_ms is None
    assert forecast.result.forecast_saving_ms == pytest.approx(want)
    assert f"the forecast for as many restored tokens: {want:+.1f} ms" in forecast.result.message
    assert forecast.result.passed == row.result.passed
    assert forecast.result.canary == row.result.canary


def test_while_warming_or_short_of_requests_the_row_is_reported_not_gated() -> None:
    canary, stable = variants(10, Costs(restore=Costs().prefill * 3))
    warming = payoff_row(canary, stable, gate=True, gate_text="", judging=False, min_requests=50, alpha=1e-4)
    assert (warming.result.passed, warming.gated) == (None, False)
    assert warming.result.message.startswith("warming up")
    short = payoff_row(canary, stable, gate=True, gate_text="", judging=True, min_requests=10**6, alpha=1e-4)
    assert (short.result.passed, short.gated) == (None, False)
    unmeasured = payoff_row(canary[:1], stable[:1], gate=True, gate_text="", judging=True, min_requests=5, alpha=1e-4)
    assert (unmeasured.result.passed, unmeasured.gated, unmeasured.result.canary) == (None, False, None)


def test_no_sub_windows_no_row() -> None:
    """A target that did not ask for the payoff (a GPU-only level, the guard) gets no row at all."""
    canary, stable = variants(11, Costs())
    spec = AnalysisSpec(minRequests=50)  # type: ignore[call-arg]
    plain = Measurements(
        canary=VariantSample(requests=sum(w.requests for w in canary)),
        stable=VariantSample(requests=sum(w.requests for w in stable)),
    )
    assert assess(spec, NVME, plain, warmed_up=True).metric(PAYOFF) is None


# --- the range query, on a real Prometheus ----------------------------------------------------------------------------


@pytest.mark.prometheus
def test_the_provider_reads_each_variant_s_sub_windows_in_one_more_query(tmp_path: Path) -> None:
    """Synthetic engines whose counters grow at known rates: each sub-window of each variant holds what they grew by,
    and a cycle that asks for the payoff sends exactly one query more than one that does not."""
    canary = SyntheticEngine(
        "chat", "canary", requests_per_s=10, ttft_s=0.3, prompt_tokens_per_s=4000, external_share=0.25
    )
    stable = SyntheticEngine("chat", "stable", requests_per_s=20, ttft_s=0.1, prompt_tokens_per_s=8000)
    with scraping([canary, stable], tmp_path, "10s") as server:
        provider = PrometheusProvider(server.url)
        plain = synthetic_target("llm", "chat", "10s")
        provider.measure([plain])
        without = provider.queries
        asking = replace(plain, payoff_since=time.time() - 12, payoff_step=2.0)
        got = provider.measure([asking])[asking.key]
        assert provider.queries - without == without + 1
        # No payoff asked: no sub-windows, and no row.
        again = provider.measure([plain])[plain.key].canary
        assert again is not None
        assert again.payoff_rows == ()
    assert got.error is None
    assert got.canary is not None
    assert got.stable is not None
    rows_c, rows_s = got.canary.payoff_rows, got.stable.payoff_rows
    assert 3 <= len(rows_c) <= 6, rows_c  # 2 s sub-windows wholly within the last 12 s
    assert len(rows_s) == len(rows_c)
    for w in rows_c:
        assert w.ttft_seconds / w.requests == pytest.approx(0.3, rel=0.01)
        assert w.requests == pytest.approx(20, rel=0.5)  # 10/s over 2 s, as increase() extrapolates scrapes
        assert w.external / (w.computed + w.local_hit + w.external) == pytest.approx(0.25, rel=0.01)
    for w in rows_s:
        assert w.ttft_seconds / w.requests == pytest.approx(0.1, rel=0.01)
        assert w.external == 0.0
