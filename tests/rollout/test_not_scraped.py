"""PodsNotScraped: a policy whose pods no Prometheus scrapes says so, instead of pausing on Inconclusive in silence.

Run through the real ``assess()`` and ``decide()`` (the World of ``test_rollout``): Prometheus answers, but holds
no series of any pod of the policy, canary or stable, ``maxInconclusive`` cycles in a row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from kvoffload.analysis.assess import assess
from kvoffload.analysis.measurements import Measurements, VariantSample, WorkloadSample, has_series, not_scraped
from kvoffload.api.conventions import ANALYSIS_INCONCLUSIVE, PODS_NOT_SCRAPED, Reason
from kvoffload.api.status import Phase, Verdict
from kvoffload.policy.ladder import build_ladder
from kvoffload.rollout import conditions as cond
from kvoffload.rollout.decide import decide
from kvoffload.rollout.observations import Observations, PodMonitorRef
from tests.rollout.test_rollout import HEALTHY, Traffic, World, at_stage, make_spec

NOTHING = Traffic(canary=VariantSample(), stable=VariantSample())
"""Prometheus answers, with no series of the policy's pods: nothing scrapes them."""


def _not_scraped(world: World) -> Any:
    return cond.find(world.st.conditions, PODS_NOT_SCRAPED)


def test_a_variant_with_any_series_counts_as_scraped_even_with_no_requests() -> None:
    assert has_series(VariantSample(requests=0.0))
    assert has_series(VariantSample(kv_usage=0.0))
    assert has_series(VariantSample(config={"kv_offloading_size": "4"}))
    assert not has_series(VariantSample())
    assert not has_series(VariantSample(workload=WorkloadSample()))  # asked for, and nothing came back
    assert not has_series(None)


def test_not_scraped_needs_an_answer_with_nothing_for_either_variant() -> None:
    assert not_scraped(Measurements(canary=None, stable=VariantSample()))
    assert not_scraped(Measurements(canary=VariantSample(), stable=VariantSample()))
    assert not not_scraped(Measurements(canary=VariantSample(), stable=HEALTHY))  # a fresh canary: scraped soon
    assert not not_scraped(Measurements(canary=None, stable=None, error="connection refused"))
    assert not not_scraped(None)


def test_no_series_for_max_inconclusive_cycles_pauses_with_pods_not_scraped_naming_the_fix() -> None:
    world = World.given(make_spec(prometheus={"monitorLabels": {"team": "llm"}}))

    world.run_for("4m30s", NOTHING)  # 9 cycles of 30 s: a first scrape can take that long, nothing said yet
    assert _not_scraped(world) is None
    assert world.phase is Phase.BASELINE

    world.tick(NOTHING)  # the 10th: maxInconclusive

    found = _not_scraped(world)
    assert found is not None
    assert found.status == "True"
    assert found.reason == Reason.NOT_SCRAPED
    for part in ("no Prometheus scrapes its PodMonitor", "team=llm", "podMonitorSelector", "release: <its release"):
        assert part in found.message, found.message
    assert "--monitor-label" in found.message
    assert "spec.prometheus.monitorLabels" in found.message
    assert world.phase is Phase.PAUSED
    assert cond.is_true(world.st.conditions, ANALYSIS_INCONCLUSIVE)
    assert "no Prometheus scrapes" in world.st.message
    assert world.reasons().count(Reason.NOT_SCRAPED) == 1

    world.run_for("2m", NOTHING)  # still nothing: the condition stays, with one Warning only
    assert world.reasons().count(Reason.NOT_SCRAPED) == 1
    assert "no Prometheus scrapes" in world.st.message


def test_engines_slower_to_start_than_max_inconclusive_intervals_do_not_pause_the_baseline() -> None:
    world = World.given(make_spec())

    world.run_for("15m", NOTHING, stable_ready=0)  # 30 cycles: a large model loading, its pool pinning

    assert world.phase is Phase.BASELINE
    assert world.st.last_analysis.verdict is Verdict.INCONCLUSIVE  # recorded, with no streak
    assert world.st.last_analysis.consecutive_inconclusive == 0
    assert _not_scraped(world) is None

    world.run_for("4m30s", NOTHING)  # Ready now: 9 cycles with no series, the first scrapes' time
    assert world.phase is Phase.BASELINE
    world.tick(NOTHING)  # the 10th since the pods were Ready
    assert world.phase is Phase.PAUSED
    assert _not_scraped(world).status == "True"


def test_a_canary_slower_to_start_than_max_inconclusive_intervals_does_not_pause_its_step() -> None:
    world = World.given(make_spec())
    world.run_until(at_stage("cpu-pilot"))

    world.run_for("10m", Traffic(canary=VariantSample(), stable=HEALTHY), canary_ready=0)

    assert world.phase is not Phase.PAUSED
    assert world.st.last_analysis.consecutive_inconclusive == 0


def test_series_coming_back_clear_it_and_the_ladder_goes_on() -> None:
    world = World.given(make_spec())
    world.run_for("5m", NOTHING)
    assert _not_scraped(world).status == "True"

    world.tick()  # the PodMonitor got its label: the engines are scraped, the verdict passes

    found = _not_scraped(world)
    assert found.status == "False"
    assert found.reason == Reason.SCRAPED
    assert world.phase is Phase.BASELINE


def test_a_canary_not_yet_scraped_beside_a_scraped_stable_is_not_reported() -> None:
    world = World.given(make_spec())
    world.run_until(at_stage("cpu-pilot"))

    world.run_for("10m", Traffic(canary=VariantSample(), stable=HEALTHY))

    assert _not_scraped(world) is None  # the PodMonitor is scraped: its stable engines show series
    assert world.phase is Phase.PAUSED  # the canary's evidence is missing all the same


def test_prometheus_down_is_not_reported_as_not_scraped() -> None:
    world = World.given(make_spec())
    down = Measurements(canary=None, stable=None, error="connection refused")
    for _ in range(12):
        world.now += timedelta(seconds=30)
        judged = assess(world.spec, build_ladder(world.spec)[0], down, warmed_up=False)
        plan = decide(world.spec, world.status, world.observe(judged, down), world.now)
        world.status, world.plan = plan.status, plan

    assert world.phase is Phase.PAUSED  # Inconclusive all the same
    assert _not_scraped(world) is None  # but not for want of a scrape


@dataclass
class MonitoredWorld(World):
    """The adapter passes the PodMonitor as it rendered it, the operator's --monitor-label included."""

    def observe(self, *args: Any, **kwargs: Any) -> Observations:
        pod_monitor = PodMonitorRef("chat", {"release": "prod-stack", "kvoffload.io/policy": "chat"})
        return replace(super().observe(*args, **kwargs), pod_monitor=pod_monitor)


def test_the_message_names_the_podmonitor_and_every_label_it_carries() -> None:
    world = MonitoredWorld.given(make_spec())
    world.run_for("5m", NOTHING)

    found = _not_scraped(world)
    assert "its PodMonitor chat (labels: kvoffload.io/policy=chat, release=prod-stack)" in found.message
