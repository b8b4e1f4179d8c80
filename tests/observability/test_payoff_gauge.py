"""The live payoff on the operator's metrics port: kvoffload_payoff_saving_ms{level,source}, measured and forecast,
as the dashboard's payoff panel reads it, and its interval on the evidence gauges (metric payoff)."""

from __future__ import annotations

from datetime import UTC, datetime

import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.api.status import AnalysisStatus, KVOffloadPolicyStatus, MetricResult, Phase, VariantStatus, Verdict
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.controller.metrics import OperatorMetrics, PolicySeries
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.sized import size_policy
from tests.support import paths

DEMO = paths.ROOT / "examples" / "demo-two-tier.yaml"
"""gpu-only, cpu-pilot, cpu, nvme."""


def canary_status(level: int, *metrics: MetricResult) -> KVOffloadPolicyStatus:
    analysis = AnalysisStatus(time=datetime(2026, 1, 1, tzinfo=UTC), verdict=Verdict.FAIL, metrics=list(metrics))
    return KVOffloadPolicyStatus(
        phase=Phase.CANARY,
        stable=VariantStatus(config_hash="a", level=level - 1, replicas=1),
        canary=VariantStatus(config_hash="b", level=level, replicas=1),
        last_analysis=analysis,
    )


def scraped(metrics: OperatorMetrics, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    found: dict[tuple[tuple[str, str], ...], float] = {}
    for fam in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in fam.samples:
            if sample.name == family:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def test_the_payoff_of_the_canary_s_level_is_published_measured_and_forecast() -> None:
    policy = KVOffloadPolicy.model_validate(yaml.safe_load(DEMO.read_text()))
    ladder = build_ladder(policy.spec)
    nvme = next(level.index for level in ladder if level.name == "nvme")
    row = MetricResult(
        name="payoff",
        canary=-124.4,
        threshold=0.0,
        passed=False,
        p_value=4e-9,
        alpha=8.3e-5,
        interval=[-145.1, -103.7],
        forecast_saving_ms=31.5,
    )
    metrics = OperatorMetrics()
    metrics.publish_policy(
        "uid", PolicySeries.of("llm", "chat", canary_status(nvme, row), policy.spec, size_policy(policy))
    )
    who = (("policy", "chat"), ("policy_namespace", "llm"))
    assert scraped(metrics, "kvoffload_payoff_saving_ms") == {
        (("level", "nvme"), *who, ("source", "forecast")): 31.5,
        (("level", "nvme"), *who, ("source", "measured")): -124.4,
    }
    assert scraped(metrics, "kvoffload_analysis_interval_low") == {(("metric", "payoff"), *who): -145.1}
    assert scraped(metrics, "kvoffload_analysis_p_value") == {(("metric", "payoff"), *who): 4e-9}
    # Without a fitted saving or a forecast there is nothing to show, and the next analysis takes it away.
    unmeasured = row.model_copy(update={"canary": None, "forecast_saving_ms": None, "interval": None})
    metrics.publish_policy(
        "uid", PolicySeries.of("llm", "chat", canary_status(nvme, unmeasured), policy.spec, size_policy(policy))
    )
    assert scraped(metrics, "kvoffload_payoff_saving_ms") == {}
    assert "# TYPE kvoffload_payoff_saving_ms gauge" in generate_latest(metrics.registry).decode()
