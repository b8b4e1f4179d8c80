"""Custom metrics judged: gated ones decide, dry-run ones never do, each with its own sustainedFor."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kvoffload.analysis.assess import REQUESTS, Assessment, record_verdict
from kvoffload.analysis.custom import CustomReading, breach_sustained, judge_custom, with_custom
from kvoffload.api.analysistemplate import CustomMetric, MetricSource
from kvoffload.api.rollout import AnalysisSpec
from kvoffload.api.status import AnalysisStatus, KVOffloadPolicyStatus, MetricResult, StageStatus, Verdict
from kvoffload.rollout.record import evidence_of

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
ANALYSIS = AnalysisSpec(sustained_for="2m")
QUERY = "sum(x{ {{ selector }} })"


def source(name: str, *, dry_run: bool = False, template: str | None = None, **fields: object) -> MetricSource:
    doc = {"name": name, "query": QUERY, "max": 0.01, "dryRun": dry_run, **fields}
    return MetricSource(metric=CustomMetric.model_validate(doc), template=template)


def passing(enough: bool = True) -> Assessment:
    requests = MetricResult(name=REQUESTS, canary=100, threshold=50, passed=True if enough else None)
    return Assessment(Verdict.PASS if enough else Verdict.INCONCLUSIVE, (requests,), "every gated metric passed")


def cycle(
    readings: list[CustomReading], previous: AnalysisStatus | None, now: datetime, *, enough: bool = True
) -> AnalysisStatus:
    results = judge_custom(readings, previous, ANALYSIS, now, has_canary=True, enough=enough)
    return record_verdict(previous, with_custom(passing(enough), results), now)


def row(status: AnalysisStatus, name: str) -> MetricResult:
    return next(m for m in status.metrics if m.name == name)


def test_a_gated_breach_fails_the_verdict_while_a_dry_run_breach_only_shows() -> None:
    gated, dry = source("errors"), source("queueDepth", dry_run=True, template="platform@4")
    status = cycle([CustomReading(gated, canary=0.05), CustomReading(dry, canary=0.5)], None, T0)
    assert status.verdict is Verdict.FAIL
    assert "errors: canary 0.05, not at most 0.01" in status.message
    assert "queueDepth" not in status.message
    shown = row(status, "queueDepth")
    assert (shown.passed, shown.dry_run, shown.template) == (False, True, "platform@4")
    assert shown.message.startswith("dry run: ")


def test_a_dry_run_breach_alone_leaves_the_verdict_pass() -> None:
    status = cycle([CustomReading(source("errors", dry_run=True), canary=0.5)], None, T0)
    assert status.verdict is Verdict.PASS
    assert row(status, "errors").passed is False
    assert not breach_sustained(status, ANALYSIS.sustained_for, T0 + timedelta(hours=1))


def test_a_custom_breach_rolls_back_after_its_own_sustained_for_not_the_policys() -> None:
    quick = source("errors", sustainedFor="10s")
    first = cycle([CustomReading(quick, canary=0.05)], None, T0)
    assert row(first, "errors").failing_since == T0
    assert not breach_sustained(first, ANALYSIS.sustained_for, T0)  # one reading is never sustained
    second = cycle([CustomReading(quick, canary=0.06)], first, T0 + timedelta(seconds=5))
    assert row(second, "errors").failing_since == T0
    assert not breach_sustained(second, ANALYSIS.sustained_for, T0 + timedelta(seconds=5))
    third = cycle([CustomReading(quick, canary=0.06)], second, T0 + timedelta(seconds=11))
    assert row(third, "errors").sustained is True
    assert breach_sustained(third, ANALYSIS.sustained_for, T0 + timedelta(seconds=11))  # 11 s, not 2 min


def test_a_slower_custom_metric_waits_longer_than_the_policy() -> None:
    slow = source("errors", sustainedFor="10m")
    status = None
    for seconds in (0, 60, 180):
        status = cycle([CustomReading(slow, canary=0.05)], status, T0 + timedelta(seconds=seconds))
    assert status is not None
    assert not breach_sustained(status, ANALYSIS.sustained_for, T0 + timedelta(seconds=180))


def test_a_pass_clears_the_run_and_missing_evidence_keeps_it() -> None:
    metric = source("errors")
    failing = cycle([CustomReading(metric, canary=0.05)], None, T0)
    unread = cycle([CustomReading(metric, error="Prometheus unreachable")], failing, T0 + timedelta(seconds=5))
    assert unread.verdict is Verdict.INCONCLUSIVE
    assert row(unread, "errors").failing_since == T0
    healed = cycle([CustomReading(metric, canary=0.001)], unread, T0 + timedelta(seconds=10))
    assert healed.verdict is Verdict.PASS
    assert row(healed, "errors").failing_since is None


def test_too_few_requests_stay_inconclusive_whatever_the_custom_metrics_say() -> None:
    status = cycle([CustomReading(source("errors"), canary=0.9)], None, T0, enough=False)
    assert status.verdict is Verdict.INCONCLUSIVE
    assert row(status, "errors").passed is None


def test_a_ratio_is_reported_not_gated_while_the_canary_warms_up_or_without_a_stable_side() -> None:
    ratio = source("queue", comparison="ratio", max=1.5)
    reading = CustomReading(ratio, canary=3.0, stable=1.0)
    for kwargs in ({"comparing": False}, {"stable_side": False}):
        (result,) = judge_custom([reading], None, ANALYSIS, T0, has_canary=True, **kwargs)  # type: ignore[arg-type]
        assert (result.gated, result.result.passed, result.result.canary) == (False, None, 3.0)
    (judged,) = judge_custom([reading], None, ANALYSIS, T0, has_canary=True)
    assert (judged.gated, judged.result.passed) == (True, False)
    assert "canary/stable = 3" in judged.result.message


def test_a_built_in_breach_keeps_the_policy_wide_rule() -> None:
    builtin = MetricResult(name="ttftP99", canary=2.0, threshold=1.5, passed=False)
    custom = MetricResult(name="errors", passed=False, dry_run=False, sustained=True)
    status = AnalysisStatus(
        time=T0, verdict=Verdict.FAIL, metrics=[builtin, custom], consecutive_failures=2, failing_since=T0
    )
    assert breach_sustained(status, "2m", T0 + timedelta(seconds=10))  # the custom one is sustained
    status = status.model_copy(update={"metrics": [builtin, custom.model_copy(update={"sustained": False})]})
    assert not breach_sustained(status, "2m", T0 + timedelta(seconds=10))
    assert breach_sustained(status, "2m", T0 + timedelta(minutes=2))


def ratio_cycle(
    reading: CustomReading, previous: AnalysisStatus | None, now: datetime, *, has_canary: bool = True
) -> AnalysisStatus:
    results = judge_custom([reading], previous, ANALYSIS, now, has_canary=has_canary)
    return record_verdict(previous, with_custom(passing(), results), now)


def test_a_ratio_breach_that_rolled_back_does_not_carry_its_failing_since_into_the_retry() -> None:
    # A gated ratio breaches for its sustainedFor on the first canary: the step rolls back.
    ratio = source("queue", comparison="ratio", max=1.5)
    breaching = CustomReading(ratio, canary=3.0, stable=1.0)
    status = None
    for seconds in (0, 60, 120):
        status = ratio_cycle(breaching, status, T0 + timedelta(seconds=seconds))
    assert status is not None
    assert breach_sustained(status, ANALYSIS.sustained_for, T0 + timedelta(seconds=120))
    # No canary runs (rolled back): the ratio does not apply, so the breach run ends there.
    resting = ratio_cycle(CustomReading(ratio, stable=1.0), status, T0 + timedelta(minutes=5), has_canary=False)
    assert row(resting, "queue").passed is None
    assert row(resting, "queue").failing_since is None
    # A retry starts a new canary; its first breaching reading starts a new run, it is no sustained breach.
    retry = T0 + timedelta(minutes=30)
    first = ratio_cycle(breaching, resting, retry)
    assert row(first, "queue").failing_since == retry
    assert row(first, "queue").sustained is False
    assert not breach_sustained(first, ANALYSIS.sustained_for, retry)


def test_a_custom_failing_since_never_spans_a_step_start() -> None:
    # The adapter passes judge_custom the previous analysis cut at the step start, as decide() cuts the verdict's.
    metric = source("errors")
    status = None
    for seconds in (0, 60, 120):
        status = cycle([CustomReading(metric, canary=0.05)], status, T0 + timedelta(seconds=seconds))
    assert status is not None
    assert row(status, "errors").sustained is True
    step_start = T0 + timedelta(seconds=150)
    policy = KVOffloadPolicyStatus(
        stage=StageStatus(index=1, name="cpu", step=1, started_at=step_start), last_analysis=status
    )
    now = step_start + timedelta(seconds=30)
    first = cycle([CustomReading(metric, canary=0.05)], evidence_of(policy, None, now), now)
    assert row(first, "errors").failing_since == now
    assert not breach_sustained(first, ANALYSIS.sustained_for, now)
