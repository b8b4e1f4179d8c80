"""assess(), record_verdict() and sustained(): one named scenario per rule of docs/design.md, "Analysis"."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvoffload.analysis.assess import (
    EXTERNAL_SHARE,
    ITL_P99,
    ITL_RATIO,
    LIVE_CONFIG,
    REQUESTS,
    TTFT_P99,
    TTFT_RATIO,
    TTFT_VS_BASELINE,
    Assessment,
    assess,
    record_verdict,
    sustained,
)
from kvoffload.analysis.measurements import Measurements, VariantSample
from kvoffload.api.quantity import GIB
from kvoffload.api.rollout import AnalysisSpec
from kvoffload.api.serving import SecondaryTier
from kvoffload.api.status import BaselineStatus, Verdict
from kvoffload.policy.ladder import Level

SPEC = AnalysisSpec()  # ttftP99 1500ms, itlP99 80ms, maxRegression 1.2, minExternalShare 0.02, minRequests 50
GPU_ONLY = Level(0, "gpu-only", None)
CPU = Level(1, "cpu", 32 * GIB)
NVME = Level(2, "nvme", 32 * GIB, (SecondaryTier(name="nvme", size="500Gi", path="/mnt/kv"),))

HEALTHY = VariantSample(
    requests=600,
    request_rate=5.0,
    ttft_p99=0.200,
    itl_p99=0.030,
    external_share=0.15,
    tier_hits={"host": 9000.0, "disk": 1200.0},
    kv_usage=0.8,
    load_bytes_per_second=12.6e9,
    config={"kv_offloading_size": "32.0", "kv_offloading_backend": "native"},
)
STABLE = VariantSample(requests=1800, ttft_p99=0.210, itl_p99=0.031, external_share=0.0, tier_hits={"host": 0.0})


def judge(
    canary: VariantSample | None,
    stable: VariantSample | None = STABLE,
    *,
    level: Level = CPU,
    warmed_up: bool = True,
    spec: AnalysisSpec = SPEC,
    baseline: BaselineStatus | None = None,
    stable_side: bool = True,
) -> Assessment:
    measurements = Measurements(canary=canary, stable=stable)
    return assess(spec, level, measurements, warmed_up=warmed_up, baseline=baseline, stable_side=stable_side)


def passed(assessment: Assessment, name: str) -> bool | None:
    result = assessment.metric(name)
    assert result is not None, f"{name} not reported"
    return result.passed


def test_a_healthy_canary_passes_every_gated_metric() -> None:
    result = judge(HEALTHY, level=NVME)
    assert result.verdict is Verdict.PASS, result.message
    assert passed(result, TTFT_P99) is True
    assert passed(result, TTFT_RATIO) is True
    assert passed(result, EXTERNAL_SHARE) is True
    assert passed(result, "tierHits.disk") is True


@pytest.mark.parametrize(
    ("case", "canary", "stable", "breached"),
    [
        ("ttft over its budget", replace(HEALTHY, ttft_p99=1.9), replace(STABLE, ttft_p99=1.4), TTFT_P99),
        ("itl over its budget", replace(HEALTHY, itl_p99=0.095), replace(STABLE, itl_p99=0.075), ITL_P99),
        ("ttft three times stable", replace(HEALTHY, ttft_p99=0.63), STABLE, TTFT_RATIO),
        ("itl 1.5x stable", replace(HEALTHY, itl_p99=0.0465), STABLE, ITL_RATIO),
    ],
)
def test_a_breach_fails_the_canary(case: str, canary: VariantSample, stable: VariantSample, breached: str) -> None:
    result = judge(canary, stable)
    assert result.verdict is Verdict.FAIL, case
    assert passed(result, breached) is False
    assert result.metric(breached).message in result.message  # type: ignore[union-attr]


def test_the_regression_threshold_is_inclusive() -> None:
    result = judge(replace(HEALTHY, ttft_p99=0.240), replace(STABLE, ttft_p99=0.200))
    assert result.metric(TTFT_RATIO).canary == pytest.approx(1.2)  # type: ignore[union-attr]
    assert passed(result, TTFT_RATIO) is True


def test_no_traffic_is_inconclusive_never_a_failure() -> None:
    idle = VariantSample(requests=0.0)  # histogram_quantile over no requests gives no p99
    result = judge(idle, VariantSample(requests=0.0))
    assert result.verdict is Verdict.INCONCLUSIVE
    assert "fewer than minRequests" in result.message


def test_a_canary_without_any_series_is_inconclusive() -> None:
    result = judge(VariantSample())
    assert result.verdict is Verdict.INCONCLUSIVE
    assert "no canary requests" in result.message


def test_a_breach_on_too_few_requests_is_inconclusive_not_a_failure() -> None:
    result = judge(replace(HEALTHY, requests=49, ttft_p99=9.0))
    assert result.verdict is Verdict.INCONCLUSIVE
    assert passed(result, TTFT_P99) is None
    assert result.metric(TTFT_P99).canary == 9.0  # type: ignore[union-attr]  # still reported
    assert passed(result, REQUESTS) is None


@given(
    requests=st.floats(min_value=0, max_value=49.99),
    ttft=st.floats(min_value=0, max_value=100),
    itl=st.floats(min_value=0, max_value=10),
    share=st.floats(min_value=0, max_value=1),
)
def test_below_min_requests_no_values_ever_fail(requests: float, ttft: float, itl: float, share: float) -> None:
    canary = VariantSample(requests=requests, ttft_p99=ttft, itl_p99=itl, external_share=share, tier_hits={"disk": 0})
    assert judge(canary, level=NVME).verdict is Verdict.INCONCLUSIVE


def test_stable_with_too_few_requests_leaves_the_ratio_unjudged() -> None:
    result = judge(HEALTHY, replace(STABLE, requests=10))
    assert passed(result, TTFT_RATIO) is None
    assert result.verdict is Verdict.INCONCLUSIVE


def test_a_low_external_share_fails_an_offload_level_after_warm_up() -> None:
    cold_canary = replace(HEALTHY, external_share=0.001)
    result = judge(cold_canary, level=CPU, warmed_up=True)
    assert result.verdict is Verdict.FAIL
    assert passed(result, EXTERNAL_SHARE) is False


def test_the_external_share_is_not_gated_during_warm_up() -> None:
    result = judge(replace(HEALTHY, external_share=0.0), level=CPU, warmed_up=False)
    assert result.verdict is Verdict.PASS
    assert passed(result, EXTERNAL_SHARE) is None
    assert "warming up" in result.metric(EXTERNAL_SHARE).message  # type: ignore[union-attr]


def test_the_external_share_is_not_gated_without_offload() -> None:
    result = judge(replace(HEALTHY, external_share=0.0, tier_hits={}), level=GPU_ONLY)
    assert result.verdict is Verdict.PASS
    assert passed(result, EXTERNAL_SHARE) is None


def test_a_secondary_tier_never_hit_fails_it_does_not_pay() -> None:
    result = judge(replace(HEALTHY, tier_hits={"host": 9000.0, "disk": 0.0}), level=NVME)
    assert result.verdict is Verdict.FAIL
    assert passed(result, "tierHits.disk") is False
    assert "never hit" in result.message


def test_a_missing_disk_series_counts_as_never_hit() -> None:
    result = judge(replace(HEALTHY, tier_hits={"host": 9000.0}), level=NVME)
    assert passed(result, "tierHits.disk") is False


def test_the_secondary_tier_check_waits_for_warm_up() -> None:
    result = judge(replace(HEALTHY, tier_hits={"host": 10.0, "disk": 0.0}), level=NVME, warmed_up=False)
    assert result.verdict is Verdict.PASS


def test_a_vllm_without_per_source_counters_does_not_block_a_secondary_tier() -> None:
    result = judge(replace(HEALTHY, tier_hits={}), level=NVME)
    assert result.verdict is Verdict.PASS
    assert "no per-source" in result.metric("tierHits.disk").message  # type: ignore[union-attr]


def test_a_prometheus_error_is_inconclusive() -> None:
    result = assess(SPEC, CPU, Measurements(None, None, error="Prometheus unreachable"), warmed_up=True)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert "unreachable" in result.message


def test_nan_values_are_no_data() -> None:
    result = judge(replace(HEALTHY, ttft_p99=float("nan")))
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.metric(TTFT_P99).canary is None  # type: ignore[union-attr]


def test_the_guard_judges_stable_against_the_absolute_budgets_only() -> None:
    fleet = replace(HEALTHY, ttft_p99=0.9)
    result = judge(None, fleet, level=CPU)
    assert result.verdict is Verdict.PASS
    assert result.metric(TTFT_RATIO) is None
    assert result.metric(TTFT_P99).stable == 0.9  # type: ignore[union-attr]


def test_the_guard_fails_a_stable_fleet_over_budget() -> None:
    result = judge(None, replace(HEALTHY, ttft_p99=1.6), level=CPU)
    assert result.verdict is Verdict.FAIL
    assert "stable p99" in result.message


def test_the_guard_reports_regression_against_the_baseline_without_gating_it() -> None:
    baseline = BaselineStatus(ttftP99=0.2, itlP99=0.03)
    result = judge(None, replace(HEALTHY, ttft_p99=0.6), level=CPU, baseline=baseline)
    assert result.verdict is Verdict.PASS
    vs_base = result.metric(TTFT_VS_BASELINE)
    assert vs_base is not None
    assert vs_base.canary == pytest.approx(3.0)
    assert vs_base.passed is None


def test_a_canary_on_every_replica_is_held_to_the_budgets_without_a_stable_to_compare() -> None:
    baseline = BaselineStatus(ttftP99=0.25, itlP99=0.03)
    result = judge(HEALTHY, None, level=NVME, baseline=baseline, stable_side=False)
    assert result.verdict is Verdict.PASS
    assert result.metric(TTFT_RATIO) is None
    vs_base = result.metric(TTFT_VS_BASELINE)
    assert vs_base is not None
    assert vs_base.canary == pytest.approx(0.8)
    assert "canary/baseline" in vs_base.message


def test_a_canary_on_every_replica_over_budget_fails() -> None:
    result = judge(replace(HEALTHY, ttft_p99=1.6), None, level=NVME, stable_side=False)
    assert result.verdict is Verdict.FAIL


def test_the_guard_on_too_little_stable_traffic_is_inconclusive() -> None:
    result = judge(None, replace(HEALTHY, requests=3), level=GPU_ONLY)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert "stable served 3 requests" in result.message


def test_the_live_config_is_reported_against_the_level() -> None:
    result = judge(HEALTHY, level=CPU)
    assert "matches level cpu" in result.metric(LIVE_CONFIG).message  # type: ignore[union-attr]
    wrong = judge(replace(HEALTHY, config={"kv_offloading_size": "4.0", "kv_offloading_backend": "native"}))
    assert "DOES NOT MATCH" in wrong.metric(LIVE_CONFIG).message  # type: ignore[union-attr]
    assert wrong.verdict is Verdict.PASS  # reported, not gated


def test_the_whole_spec_can_be_passed() -> None:
    from kvoffload.api.types import KVOffloadPolicySpec

    spec = KVOffloadPolicySpec.model_validate(
        {
            "model": {"name": "Qwen/Qwen3-8B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 32768},
            "gpu": {"class": "nvidia-h100-80gb"},
            "replicas": 4,
            "resources": {"baseMemory": "24Gi"},
            "offload": {"cpu": "32Gi"},
            "analysis": {"ttftP99": "100ms"},
        }
    )
    stable = replace(STABLE, ttft_p99=0.090)  # within the 100ms budget: the canary's breach is its own
    assert assess(spec, CPU, Measurements(HEALTHY, stable), warmed_up=True).verdict is Verdict.FAIL


# --- record_verdict() and sustained() --------------------------------------------------

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PASS = Assessment(Verdict.PASS)
FAIL = Assessment(Verdict.FAIL, message="ttft over budget")
INCONCLUSIVE = Assessment(Verdict.INCONCLUSIVE)


def run(*verdicts: Assessment, every: timedelta = timedelta(seconds=30)):  # type: ignore[no-untyped-def]
    status = None
    for i, verdict in enumerate(verdicts):
        status = record_verdict(status, verdict, T0 + i * every)
    assert status is not None
    return status


def test_failures_count_up_and_remember_when_they_began() -> None:
    status = run(PASS, FAIL, FAIL, FAIL)
    assert status.consecutive_failures == 3
    assert status.failing_since == T0 + timedelta(seconds=30)
    assert status.consecutive_inconclusive == 0
    assert status.message == "ttft over budget"


def test_a_pass_clears_the_failing_run() -> None:
    status = run(FAIL, FAIL, PASS)
    assert status.consecutive_failures == 0
    assert status.failing_since is None


def test_an_inconclusive_neither_clears_nor_extends_a_failing_run() -> None:
    status = run(FAIL, INCONCLUSIVE)
    assert status.consecutive_failures == 1
    assert status.consecutive_inconclusive == 1
    assert status.failing_since == T0
    status = record_verdict(status, FAIL, T0 + timedelta(seconds=60))
    assert status.failing_since == T0
    assert status.consecutive_failures == 2
    assert status.consecutive_inconclusive == 0


def test_inconclusive_verdicts_count_up_until_evidence_returns() -> None:
    assert run(INCONCLUSIVE, INCONCLUSIVE, INCONCLUSIVE).consecutive_inconclusive == 3
    assert run(INCONCLUSIVE, INCONCLUSIVE, PASS).consecutive_inconclusive == 0


def test_a_breach_is_sustained_once_it_held_for_sustained_for() -> None:
    status = run(FAIL, FAIL, FAIL, FAIL)  # failing since T0, last at T0+90s
    assert not sustained(status, "2m", T0 + timedelta(seconds=90))
    assert sustained(status, "2m", T0 + timedelta(seconds=120))
    assert sustained(status, 90.0, T0 + timedelta(seconds=90))


def test_a_single_spike_never_rolls_back() -> None:
    status = run(FAIL)
    assert not sustained(status, "1s", T0 + timedelta(hours=1))


def test_a_breach_is_not_sustained_while_the_latest_verdict_is_not_fail() -> None:
    assert not sustained(run(FAIL, FAIL, INCONCLUSIVE), "30s", T0 + timedelta(minutes=5))
    assert not sustained(run(FAIL, FAIL, PASS), "30s", T0 + timedelta(minutes=5))
    assert not sustained(None, "30s", T0)


# --- vLLM 0.33: the CPU tier as allocated (vllm:kv_offload_config_info) -----------------------------

CHUNK = 3 * 786_432  # an aligned chunk of a few GPU blocks, bytes; 32 GiB is not a multiple of it


def allocated(size: int, chunks: int, *, pod: str = "chat-canary-0", tier: str = "") -> dict[str, str]:
    return {"pod": pod, "tier": tier, "cpu_kv_cache_size_bytes": str(size), "cpu_num_chunks": str(chunks)}


def test_an_engine_that_allocated_the_rendered_size_to_within_a_chunk_matches() -> None:
    chunks = 32 * GIB // CHUNK
    canary = replace(HEALTHY, offload_allocated=(allocated(chunks * CHUNK, chunks),))
    result = judge(canary)
    live = result.metric(LIVE_CONFIG)
    assert live is not None
    assert live.passed is True
    assert live.canary == chunks * CHUNK
    assert live.threshold == 32 * GIB
    assert result.verdict is Verdict.PASS, result.message


@pytest.mark.parametrize(
    ("size", "chunks"),
    [
        pytest.param(16 * GIB // CHUNK * CHUNK, 16 * GIB // CHUNK, id="half"),
        pytest.param((32 * GIB // CHUNK - 1) * CHUNK, 32 * GIB // CHUNK - 1, id="one-chunk-short"),
        pytest.param(64 * GIB, 64 * GIB // (8 * 1024 * 1024), id="more-than-rendered"),
        pytest.param(0, 0, id="nothing"),
    ],
)
def test_an_engine_that_allocated_another_size_fails_the_live_config_with_its_figures(size: int, chunks: int) -> None:
    canary = replace(HEALTHY, offload_allocated=(allocated(size, chunks),))
    result = judge(canary)
    live = result.metric(LIVE_CONFIG)
    assert live is not None
    assert live.passed is False
    assert result.verdict is Verdict.FAIL
    assert "ALLOCATED SIZE MISMATCH" in result.message
    assert f"allocated {size} B ({chunks} chunks" in live.message
    assert f"rendered {32 * GIB} B (32 GiB) at level cpu" in live.message
    assert "chat-canary-0" in live.message


def test_under_tiering_only_the_primary_tier_series_is_the_cpu_tier() -> None:
    chunks = 32 * GIB // CHUNK
    canary = replace(
        HEALTHY,
        offload_allocated=(
            allocated(chunks * CHUNK, chunks, tier="0:primary"),
            {"pod": "chat-canary-0", "tier": "1:fs", "cpu_kv_cache_size_bytes": "", "cpu_num_chunks": ""},
        ),
    )
    assert passed(judge(canary, level=NVME), LIVE_CONFIG) is True


def test_without_kv_offload_config_info_the_live_config_is_only_reported() -> None:
    result = judge(HEALTHY)
    assert passed(result, LIVE_CONFIG) is None
    assert result.verdict is Verdict.PASS


# --- tiering: per-tier chunk hit shares gate the fs tier ---------------------------------------------


def tiered(fs_hits: float, fs_queries: float = 800.0, *, disk: float = 1200.0) -> VariantSample:
    return replace(
        HEALTHY,
        tier_hits={"host": 9000.0, "disk": disk},
        tier_chunk_queries={"0:primary": 1000.0, "1:fs": fs_queries},
        tier_chunk_hits={"0:primary": 200.0, "1:fs": fs_hits},
    )


def test_under_tiering_the_fs_tier_is_gated_on_its_chunk_hits_not_the_lumped_disk_source() -> None:
    result = judge(tiered(fs_hits=200.0, disk=0.0), level=NVME)
    assert result.verdict is Verdict.PASS, result.message
    fs = result.metric("tierHitShare.1:fs")
    assert fs is not None
    assert (fs.passed, fs.canary) == (True, 0.25)
    assert "hit 200 of 800 chunk lookups (25.0%)" in fs.message
    primary = result.metric("tierHitShare.0:primary")
    assert primary is not None
    assert (primary.passed, primary.canary) == (None, 0.2)
    assert passed(result, "tierHits.disk") is None  # reported only


def test_under_tiering_an_fs_tier_never_hit_fails_even_when_the_disk_source_counted_tokens() -> None:
    result = judge(tiered(fs_hits=0.0, disk=1200.0), level=NVME)
    assert result.verdict is Verdict.FAIL
    assert "secondary tier 1:fs (nvme) was never hit on the canary (800 chunk lookups)" in result.message


def test_the_fs_tier_hit_share_waits_for_warm_up() -> None:
    result = judge(tiered(fs_hits=0.0), level=NVME, warmed_up=False)
    assert passed(result, "tierHitShare.1:fs") is None
    assert result.verdict is not Verdict.FAIL
