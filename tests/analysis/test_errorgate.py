"""The built-in error gate through assess(): failed requests against an absolute budget and against the stable's.

Each scenario is a row of docs/design.md, "Analysis", "The error gate": a canary that fails requests while its
latency looks fine fails; a stable that fails nothing still bounds the canary; too few requests, or a canary that
served none, is Inconclusive, never Pass; the Stable guard holds the fleet to the absolute budget.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from pydantic import ValidationError

from kvoffload.analysis.assess import (
    Assessment,
    assess,
    format_metric_value,
    format_threshold,
    record_verdict,
    sustained,
)
from kvoffload.analysis.errorgate import ERROR_SHARE, ERROR_SHARE_INCREASE, failed_share
from kvoffload.analysis.measurements import Measurements, VariantSample
from kvoffload.api.errors import PolicyError
from kvoffload.api.quantity import GIB
from kvoffload.api.rollout import AnalysisSpec, ErrorsSpec
from kvoffload.api.status import MetricResult, Verdict
from kvoffload.policy.ladder import Level
from kvoffload.policy.loading import parse_policy
from tests.support import paths
from tests.support.crd_admission import admit

SPEC = AnalysisSpec()  # errors: maxShare 5%, maxIncrease 2 points; minRequests 50
CPU = Level(1, "cpu", 32 * GIB)


def finished(total: int, failed: int = 0, *, reason: str = "error") -> dict[str, float]:
    """Per-reason counts as vLLM's vllm:request_success_total shows them: the rest ended by length."""
    counts = {"stop": 0.0, "length": float(total - failed), "abort": 0.0, "error": 0.0, "repetition": 0.0}
    counts[reason] += failed
    return counts


# Latency well within every budget and ratio: only the failed requests can break anything.
CANARY = VariantSample(requests=400, ttft_p99=0.200, itl_p99=0.030, finished=finished(400))
STABLE = VariantSample(requests=1200, ttft_p99=0.205, itl_p99=0.031, finished=finished(1200))


def judge(
    canary: VariantSample | None,
    stable: VariantSample | None = STABLE,
    *,
    spec: AnalysisSpec = SPEC,
    stable_side: bool = True,
    comparing: bool = True,
) -> Assessment:
    return assess(
        spec,
        CPU,
        Measurements(canary=canary, stable=stable),
        warmed_up=False,  # no offload hit check gates: only latency and errors do
        stable_side=stable_side,
        comparing=comparing,
    )


def row(assessment: Assessment, name: str) -> MetricResult:
    result = assessment.metric(name)
    assert result is not None, f"{name} not reported: {[m.name for m in assessment.metrics]}"
    return result


def test_a_canary_failing_5_percent_of_requests_with_normal_latency_fails_on_the_increase_over_the_stable() -> None:
    result = judge(replace(CANARY, finished=finished(400, 20)))
    assert result.verdict is Verdict.FAIL, result.message
    increase = row(result, ERROR_SHARE_INCREASE)
    assert increase.passed is False
    assert increase.canary == pytest.approx(0.05)
    assert "+5.0 points" in increase.message
    assert "maxIncrease 2.0 points" in increase.message
    assert row(result, ERROR_SHARE).passed is True  # 5.0% is within the 5% budget: the comparison caught it
    assert row(result, "ttftP99").passed is True
    assert row(result, "ttftP99Ratio").passed is True
    assert "canary failed 5.0%, stable 0.0%" in result.message


def test_aborted_requests_count_as_failed_like_errored_ones() -> None:
    result = judge(replace(CANARY, finished=finished(400, 20, reason="abort")))
    assert result.verdict is Verdict.FAIL
    assert row(result, ERROR_SHARE_INCREASE).canary == pytest.approx(0.05)


def test_repetition_stop_and_length_are_finished_requests_not_failed_ones() -> None:
    share = failed_share({"stop": 10.0, "length": 20.0, "repetition": 10.0, "abort": 0.0, "error": 0.0})
    assert share is not None
    assert share.failed == 0
    assert share.total == 40


def answers(total: int, server_errors: int = 0) -> dict[str, float]:
    """The API server's http_requests_total by status class."""
    return {"2xx": float(total - server_errors), "4xx": 0.0, "5xx": float(server_errors)}


def test_errors_answered_with_a_500_are_counted_once_not_by_the_engine_and_again_by_the_api_server() -> None:
    # vLLM answers each request that finished with reason error with a 500: the same 20 requests in both counts.
    canary = replace(CANARY, finished=finished(400, 20), http_responses=answers(400, 20))
    stable = replace(STABLE, http_responses=answers(1200))
    result = judge(canary, stable)
    assert row(result, ERROR_SHARE).canary == pytest.approx(0.05)
    assert row(result, ERROR_SHARE_INCREASE).canary == pytest.approx(0.05)
    assert "20 of 400 finished requests failed; 20 of 400 HTTP answers were 5xx" in row(result, ERROR_SHARE).message


def test_500s_the_engine_never_saw_fail_the_canary_through_the_api_server_s_count() -> None:
    # The engine finished every request it got; the API server answered 24 of 424 with a 500 before reaching it.
    canary = replace(CANARY, http_responses=answers(424, 24))
    result = judge(canary, replace(STABLE, http_responses=answers(1200)))
    assert result.verdict is Verdict.FAIL
    assert row(result, ERROR_SHARE_INCREASE).canary == pytest.approx(24 / 424)


def test_streamed_requests_that_fail_after_their_200_fail_the_canary_through_the_engine_s_count() -> None:
    canary = replace(CANARY, finished=finished(400, 20), http_responses=answers(400))
    result = judge(canary, replace(STABLE, http_responses=answers(1200)))
    assert result.verdict is Verdict.FAIL
    assert row(result, ERROR_SHARE_INCREASE).canary == pytest.approx(0.05)


def test_a_count_with_too_few_requests_does_not_speak_for_the_side_but_the_other_count_does() -> None:
    # 40 HTTP answers (too few to judge) all 5xx; 400 finished requests, none failed: judged on the engine's count.
    canary = replace(CANARY, http_responses=answers(40, 40))
    result = judge(canary, replace(STABLE, http_responses=answers(1200)))
    assert row(result, ERROR_SHARE).passed is True
    assert row(result, ERROR_SHARE_INCREASE).canary == pytest.approx(0.0)


def test_a_canary_within_the_allowed_increase_over_a_failing_stable_passes() -> None:
    stable = replace(STABLE, finished=finished(1200, 36))  # 3.0%
    result = judge(replace(CANARY, finished=finished(400, 16)), stable)  # 4.0%: +1.0 point
    assert result.verdict is Verdict.PASS, result.message
    assert row(result, ERROR_SHARE_INCREASE).canary == pytest.approx(0.01)
    assert row(result, ERROR_SHARE_INCREASE).passed is True


def test_a_canary_over_the_absolute_budget_fails_even_when_the_stable_fails_as_much() -> None:
    stable = replace(STABLE, finished=finished(1200, 180))  # 15%
    result = judge(replace(CANARY, finished=finished(400, 60)), stable)  # 15%: no increase at all
    assert result.verdict is Verdict.FAIL
    assert row(result, ERROR_SHARE).passed is False
    assert row(result, ERROR_SHARE_INCREASE).passed is True
    assert "over maxShare 5.0%" in result.message


def test_a_share_over_the_budget_without_evidence_is_inconclusive_and_says_how_many_requests_would_settle_it() -> None:
    # 8 % of 400 over a 5 % budget: P(32 or more of 400 at 5 %) is about 0.5 %, far from the look's 6.7e-05.
    result = judge(replace(CANARY, finished=finished(400, 32)), replace(STABLE, finished=finished(1200, 96)))
    share = row(result, ERROR_SHARE)
    assert result.verdict is Verdict.INCONCLUSIVE, result.message
    assert share.passed is None
    assert share.p_value is not None
    assert 1e-3 < share.p_value < 1e-2
    assert share.alpha == pytest.approx(0.01 / 30 / 5)
    assert share.requests_needed is not None
    assert 400 < share.requests_needed < 2000
    assert "not yet beyond chance" in share.message
    # The same share over a few more than that is a breach (the figure is an estimate, "about").
    n = round(1.2 * share.requests_needed)
    more = judge(
        replace(CANARY, requests=n, finished=finished(n, round(0.08 * n))),
        replace(STABLE, finished=finished(3 * n, round(0.24 * n))),
    )
    assert row(more, ERROR_SHARE).passed is False, row(more, ERROR_SHARE).message


def test_a_stable_that_fails_nothing_still_bounds_the_canary_where_a_ratio_would_have_none() -> None:
    canary = replace(CANARY, requests=2000, finished=finished(2000, 20))  # 1.0% against 0: +1 point
    result = judge(canary)
    assert result.verdict is Verdict.PASS, result.message
    assert row(result, ERROR_SHARE_INCREASE).canary == pytest.approx(0.01)
    tight = SPEC.model_copy(update={"errors": ErrorsSpec(max_increase=0.005)})
    assert judge(canary, spec=tight).verdict is Verdict.FAIL


def test_a_canary_that_served_no_requests_is_inconclusive_not_pass() -> None:
    result = judge(VariantSample(requests=0.0, finished=finished(0)))
    assert result.verdict is Verdict.INCONCLUSIVE
    assert row(result, ERROR_SHARE).passed is None
    assert row(result, ERROR_SHARE_INCREASE).passed is None


def test_too_few_finished_requests_on_the_canary_is_inconclusive_even_when_all_of_them_failed() -> None:
    # Enough requests by the TTFT count (they got a first token), but only 40 finished, all failed.
    result = judge(replace(CANARY, requests=60, finished=finished(40, 40)))
    assert result.verdict is Verdict.INCONCLUSIVE, result.message
    assert row(result, ERROR_SHARE).passed is None
    assert "fewer than minRequests 50" in row(result, ERROR_SHARE).message


@pytest.mark.parametrize("ttft_count", [0.0, None], ids=["ttft-count-0", "no-ttft-series"])
def test_a_canary_failing_every_request_before_its_first_token_fails_not_inconclusive(ttft_count: float | None) -> None:
    # 400 finished, all failed: none got a first token, so the TTFT histogram counts none (or has no series).
    canary = VariantSample(requests=ttft_count, finished=finished(400, 400))
    result = judge(canary)
    assert result.verdict is Verdict.FAIL, result.message
    share = row(result, ERROR_SHARE)
    assert share.passed is False
    assert share.canary == pytest.approx(1.0)
    assert "canary failed 100.0%" in result.message
    assert "over maxShare 5.0%" in result.message
    assert row(result, "requests").passed is None  # the TTFT count is still short, and says so
    assert row(result, "ttftP99").passed is None  # latency waits for samples of its own


def test_a_canary_failing_30_percent_fails_though_its_ttft_count_is_under_min_requests() -> None:
    # 70 finished, 21 failed before a first token: 49 TTFT samples, one under minRequests 50.
    canary = replace(CANARY, requests=49, finished=finished(70, 21))
    result = judge(canary)
    assert result.verdict is Verdict.FAIL, result.message
    assert row(result, ERROR_SHARE).passed is False
    assert row(result, ERROR_SHARE).canary == pytest.approx(0.3)
    assert row(result, ERROR_SHARE_INCREASE).passed is False
    assert row(result, "ttftP99").passed is None  # within budget, but on too few samples: not judged


def test_a_short_ttft_count_with_the_error_gate_within_budget_stays_inconclusive() -> None:
    result = judge(replace(CANARY, requests=49, finished=finished(70)))
    assert result.verdict is Verdict.INCONCLUSIVE, result.message
    assert row(result, ERROR_SHARE).passed is True
    assert "fewer than minRequests 50" in result.message


def test_a_short_ttft_count_with_too_few_finished_requests_too_stays_inconclusive() -> None:
    result = judge(VariantSample(requests=0.0, finished=finished(40, 40)))
    assert result.verdict is Verdict.INCONCLUSIVE, result.message
    assert row(result, ERROR_SHARE).passed is None


def test_a_canary_failing_every_request_rolls_back_once_the_breach_is_sustained() -> None:
    failing = VariantSample(requests=0.0, finished=finished(400, 400))
    start = datetime(2026, 12, 5, 19, 0, tzinfo=UTC)
    status = record_verdict(None, judge(failing), start)
    status = record_verdict(status, judge(failing), start + timedelta(minutes=2))
    assert status.verdict is Verdict.FAIL
    assert sustained(status, "2m", start + timedelta(minutes=2))


def test_too_few_finished_requests_on_the_stable_leaves_the_increase_unjudged_and_the_verdict_inconclusive() -> None:
    result = judge(CANARY, replace(STABLE, finished=finished(10)))
    assert row(result, ERROR_SHARE).passed is True
    assert row(result, ERROR_SHARE_INCREASE).passed is None
    assert result.verdict is Verdict.INCONCLUSIVE


def test_an_engine_without_the_counter_reports_the_gate_without_gating_it() -> None:
    result = judge(replace(CANARY, finished={}), replace(STABLE, finished={}))
    assert result.verdict is Verdict.PASS, result.message
    assert row(result, ERROR_SHARE).passed is None
    assert "no finished-request counts" in row(result, ERROR_SHARE).message


def test_the_comparison_is_gated_during_the_warm_up_failed_requests_are_no_cold_cache_artefact() -> None:
    result = judge(replace(CANARY, finished=finished(400, 20)), comparing=False)
    assert result.verdict is Verdict.FAIL
    assert row(result, ERROR_SHARE_INCREASE).passed is False
    assert row(result, "ttftP99Ratio").passed is None  # the latency ratio waits for the warm-up


def test_without_a_stable_side_only_the_absolute_budget_applies() -> None:
    result = judge(replace(CANARY, finished=finished(400, 20)), stable_side=False)
    assert result.metric(ERROR_SHARE_INCREASE) is None
    assert result.verdict is Verdict.PASS  # 5.0% is within maxShare 5%
    result = judge(replace(CANARY, finished=finished(400, 60)), stable_side=False)
    assert result.verdict is Verdict.FAIL


def test_the_stable_guard_holds_the_fleet_to_the_absolute_budget() -> None:
    fleet = replace(STABLE, finished=finished(1200, 120))  # 10%
    result = judge(None, fleet)
    assert result.verdict is Verdict.FAIL
    guard = row(result, ERROR_SHARE)
    assert guard.passed is False
    assert guard.stable == pytest.approx(0.10)
    assert guard.canary is None
    assert "stable failed 10.0%" in guard.message
    assert result.metric(ERROR_SHARE_INCREASE) is None


def test_a_failing_canary_rolls_back_only_once_the_breach_is_sustained() -> None:
    failing = replace(CANARY, finished=finished(400, 20))
    start = datetime(2026, 12, 5, 19, 0, tzinfo=UTC)
    status = record_verdict(None, judge(failing), start)
    assert not sustained(status, "2m", start)
    status = record_verdict(status, judge(failing), start + timedelta(minutes=2))
    assert sustained(status, "2m", start + timedelta(minutes=2))


def test_the_values_read_as_a_share_and_as_points() -> None:
    assert format_metric_value(ERROR_SHARE, 0.0512) == "5.1%"
    assert format_threshold(ERROR_SHARE, 0.05) == "<= 5.0%"
    assert format_metric_value(ERROR_SHARE_INCREASE, 0.05) == "+5.0 pts"
    assert format_threshold(ERROR_SHARE_INCREASE, 0.02) == "<= +2.0 pts"


@pytest.mark.parametrize(
    ("field", "value"),
    [("maxShare", 1.5), ("maxShare", -0.1), ("maxIncrease", 2), ("maxIncrease", "much")],
)
def test_a_bad_error_budget_is_refused_naming_its_field_path(field: str, value: object) -> None:
    with pytest.raises(ValidationError):
        ErrorsSpec.model_validate({field: value})
    doc = yaml.safe_load((paths.EXAMPLES / "qwen3-0.6b-cpu.yaml").read_text())
    doc["spec"].setdefault("analysis", {})["errors"] = {field: value}
    with pytest.raises(PolicyError) as refused:
        parse_policy(doc)
    assert f"spec.analysis.errors.{field}" in str(refused.value)
    # The API server refuses it through the generated CRD's schema, naming the same path.
    _, problems = admit(doc)
    assert [p.path for p in problems] == [f"spec.analysis.errors.{field}"]
