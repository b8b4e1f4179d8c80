"""How sure the latest analysis is, on the operator's metrics port: kvoffload_analysis_p_value, _alpha and the
interval bounds, per built-in gate of each policy, as the dashboard's evidence panels read them."""

from __future__ import annotations

from datetime import UTC, datetime

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.api.status import AnalysisStatus, KVOffloadPolicyStatus, MetricResult, Phase, Verdict
from kvoffload.controller.metrics import OperatorMetrics, PolicySeries

FAMILIES = (
    "kvoffload_analysis_p_value",
    "kvoffload_analysis_alpha",
    "kvoffload_analysis_interval_low",
    "kvoffload_analysis_interval_high",
)


def status(*metrics: MetricResult) -> KVOffloadPolicyStatus:
    analysis = AnalysisStatus(time=datetime(2026, 1, 1, tzinfo=UTC), verdict=Verdict.FAIL, metrics=list(metrics))
    return KVOffloadPolicyStatus(phase=Phase.CANARY, last_analysis=analysis)


REQUESTS = MetricResult(name="requests", canary=412, threshold=50, passed=True)
SURE = status(
    REQUESTS,
    # The p99 row's interval bounds the share over the budget, not the p99: no interval series.
    MetricResult(name="ttftP99", canary=0.4, threshold=0.5, passed=True, p_value=0.93, alpha=8e-05, interval=[0, 0.03]),
    MetricResult(name="ttftP99Ratio", canary=1.31, passed=False, p_value=3e-05, alpha=8e-05, interval=[1.18, 1.45]),
    MetricResult(name="errorShare", canary=0.004, passed=True, p_value=0.99, alpha=8e-05, interval=[0.001, 0.012]),
    MetricResult(name="externalShare", canary=0.31, threshold=0.02, passed=True),
    # A custom metric: its name comes from the spec, and it carries no evidence of this kind.
    MetricResult(name="queueDepth", canary=3, passed=True, dry_run=False, interval=[1, 5]),
)


def scraped(metrics: OperatorMetrics) -> dict[str, dict[str, float]]:
    """{family: {metric label: value}} for the evidence families, as Prometheus would scrape them."""
    found: dict[str, dict[str, float]] = {name: {} for name in FAMILIES}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            if sample.name in found:
                assert set(sample.labels) == {"policy_namespace", "policy", "metric"}, sample
                assert (sample.labels["policy_namespace"], sample.labels["policy"]) == ("llm", "chat")
                found[sample.name][sample.labels["metric"]] = sample.value
    return found


def test_the_built_in_gates_publish_their_p_value_alpha_and_the_interval_in_their_unit() -> None:
    series = PolicySeries.of("llm", "chat", SURE)
    assert series.evidence == (
        ("ttftP99", 0.93, 8e-05, None),
        ("ttftP99Ratio", 3e-05, 8e-05, (1.18, 1.45)),
        ("errorShare", 0.99, 8e-05, (0.001, 0.012)),
    )
    metrics = OperatorMetrics()
    metrics.publish_policy("uid", series)
    assert scraped(metrics) == {
        "kvoffload_analysis_p_value": {"ttftP99": 0.93, "ttftP99Ratio": 3e-05, "errorShare": 0.99},
        "kvoffload_analysis_alpha": {"ttftP99": 8e-05, "ttftP99Ratio": 8e-05, "errorShare": 8e-05},
        "kvoffload_analysis_interval_low": {"ttftP99Ratio": 1.18, "errorShare": 0.001},
        "kvoffload_analysis_interval_high": {"ttftP99Ratio": 1.45, "errorShare": 0.012},
    }
    # The next analysis without evidence takes the series away: nothing stale stays.
    metrics.publish_policy("uid", PolicySeries.of("llm", "chat", status(REQUESTS)))
    assert scraped(metrics) == {name: {} for name in FAMILIES}


def test_a_status_without_evidence_publishes_none_and_the_families_are_described_anyway() -> None:
    plain = status(MetricResult(name="ttftP99", canary=0.4, threshold=0.5, passed=True))
    assert PolicySeries.of("llm", "chat", plain).evidence == ()
    assert PolicySeries.of("llm", "chat", KVOffloadPolicyStatus(phase=Phase.PENDING)).evidence == ()
    text = generate_latest(OperatorMetrics().registry).decode()
    for family in FAMILIES:
        assert f"# TYPE {family} gauge" in text
