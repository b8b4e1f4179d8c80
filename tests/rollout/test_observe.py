"""Observe-only policies (``spec.rollout.observeOnly``): the ladder climbs in status over a fleet the operator did
not render, on the fleet's real figures, and nothing it needs an offload tier for is judged (docs/design.md,
"Observe-only policies").

``Fleet`` plays the team's running engines and Prometheus: its pods (Ready or not) and what their series show.
Each cycle is judged with the real ``assess(observing=True)`` and decided with the real ``decide``, as the
controller does; the first cycle of a ladder has no analysis, as in the controller.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from kvoffload.analysis.assess import EXTERNAL_SHARE, ITL_RATIO, LIVE_CONFIG, TTFT_P99, TTFT_RATIO, assess
from kvoffload.analysis.measurements import Measurements, VariantSample, WorkloadSample
from kvoffload.api.conventions import OBSERVING, OFFLOAD_WILL_NOT_PAY, Decision, Reason
from kvoffload.api.status import KVOffloadPolicyStatus, Mode, Phase, Verdict
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.policy.ladder import build_ladder
from kvoffload.rollout import conditions as cond
from kvoffload.rollout.decide import decide
from kvoffload.rollout.observations import FleetObservation, Observations, PodObservation
from kvoffload.rollout.observe import NOT_JUDGED, would_apply
from kvoffload.rollout.plan import Event, Plan, RetiringPlan, VariantPlan, Variants
from kvoffload.rollout.preflight import RestorePrice
from kvoffload.rollout.warmup import analysis_subject
from tests.rollout.test_rollout import BASE_SPEC, T0, World, sized_plan

SELECTOR = {"matchLabels": {"app": "team-vllm"}}


def observe_spec(**rollout: Any) -> KVOffloadPolicySpec:
    raw = {**BASE_SPEC, "rollout": {**BASE_SPEC["rollout"], "observeOnly": True, "observe": {"selector": SELECTOR}}}
    raw["rollout"].update(rollout)
    return KVOffloadPolicySpec.model_validate(raw)


GPU_ONLY_FLEET = VariantSample(
    # What a GPU-only vLLM shows: latency within budget, and no token ever loaded from an offload tier.
    requests=600,
    request_rate=5.0,
    ttft_p99=0.40,
    itl_p99=0.020,
    external_share=0.0,
    kv_usage=0.70,
    config={"kv_offloading_size": "None", "kv_offloading_backend": "None"},
)
SLOW_FLEET = replace(GPU_ONLY_FLEET, ttft_p99=2.5)  # over the 1500ms budget


def pods(count: int = 4, ready: int | None = None, **extra: Any) -> tuple[PodObservation, ...]:
    ready = count if ready is None else ready
    return tuple(PodObservation(name=f"team-vllm-{i}", ready=i < ready, **extra) for i in range(count))


@dataclass
class Fleet:
    """The team's fleet, its Prometheus and a clock; ``decide`` never changes any of it."""

    spec: KVOffloadPolicySpec
    sample: VariantSample = GPU_ONLY_FLEET
    pods: tuple[PodObservation, ...] = field(default_factory=pods)
    price: RestorePrice | None = None
    now: datetime = T0
    generation: int = 1
    status: KVOffloadPolicyStatus | None = None
    plans: list[Plan] = field(default_factory=list)

    def cycle(self) -> Plan:
        status = self.status
        analysed = status is not None and status.stable is not None and status.observed_generation == self.generation
        assessment = measurements = None
        if analysed:
            subject = analysis_subject(self.spec, build_ladder(self.spec), status, self.now)
            assert status is not None
            measurements = Measurements(canary=self.sample if status.canary is not None else None, stable=self.sample)
            assessment = assess(
                self.spec,
                subject.level,
                measurements,
                warmed_up=subject.warmed_up,
                baseline=status.baseline,
                stable_side=subject.stable_side,
                comparing=subject.comparing,
                observing=self.spec.rollout.observe_only,
            )
        observations = Observations(
            generation=self.generation,
            sized=sized_plan(self.spec),
            assessment=assessment,
            measurements=measurements,
            price=self.price if analysed else None,
            fleet=FleetObservation("app=team-vllm", self.pods),
        )
        plan = decide(self.spec, status, observations, self.now)
        self.status = plan.status
        self.plans.append(plan)
        self.now += timedelta(seconds=30)
        return plan

    def run(self, minutes: float) -> None:
        for _ in range(int(minutes * 2)):
            self.cycle()

    @property
    def decisions(self) -> list[str]:
        assert self.status is not None
        return [h.decision for h in self.status.history]

    @property
    def events(self) -> list[Event]:
        return [e for p in self.plans for e in p.events]


def test_an_observe_only_policy_climbs_the_whole_ladder_in_status_on_the_fleets_budgets() -> None:
    fleet = Fleet(observe_spec())
    fleet.run(240)
    status = fleet.status
    assert status is not None
    assert status.phase is Phase.STABLE
    assert status.mode is Mode.STABLE
    assert status.stage is not None
    assert status.stage.name == "nvme"
    assert [lv.name for lv in build_ladder(fleet.spec)] == ["gpu-only", "cpu-pilot", "cpu", "nvme"]
    # Every level in turn, every step of it, each after its full duration (the stage is where each decision led).
    assert [(h.stage, h.decision, h.time - T0) for h in status.history] == [
        ("gpu-only", Decision.NEW_LADDER, timedelta(0)),
        ("cpu-pilot", Decision.BASELINE_TAKEN, timedelta(minutes=10)),
        ("cpu", Decision.PILOT_PASSED, timedelta(minutes=25)),
        ("cpu", Decision.PROMOTED, timedelta(minutes=40)),  # 25% is one replica, the canary's: skipped to 50%
        ("cpu", Decision.PROMOTED, timedelta(minutes=55)),
        ("nvme", Decision.LEVEL_PROMOTED, timedelta(minutes=70)),
        ("nvme", Decision.PROMOTED, timedelta(minutes=85)),
        ("nvme", Decision.PROMOTED, timedelta(minutes=100)),
        ("nvme", Decision.LEVEL_PROMOTED, timedelta(minutes=115)),
    ]
    # Every decision was recorded as an Event too, and the baseline holds the fleet's real figures.
    assert {Reason.BASELINE_TAKEN, Reason.PILOT_PASSED, Reason.PROMOTED, Reason.LEVEL_PROMOTED} <= {
        e.reason for e in fleet.events
    }
    assert status.baseline is not None
    assert status.baseline.ttft_p99 == pytest.approx(0.40)
    observing = cond.find(status.conditions, OBSERVING)
    assert observing is not None
    assert observing.status == "True"
    assert observing.reason == Reason.OBSERVE_ONLY
    assert "app=team-vllm" in observing.message
    assert status.observe is not None
    assert (status.observe.selector, status.observe.pods, status.observe.ready) == ("app=team-vllm", 4, 4)
    assert status.observe.not_judged == list(NOT_JUDGED)
    assert status.message.startswith("observe-only: ")


def test_what_needs_an_offload_tier_is_reported_not_judged_never_passed() -> None:
    fleet = Fleet(observe_spec())
    fleet.run(50)  # past the baseline and the pilot, in the second half of the cpu level's 50% step
    status = fleet.status
    assert status is not None
    assert status.mode is Mode.STEP
    assert status.last_analysis is not None
    metrics = {m.name: m for m in status.last_analysis.metrics}
    for name in (EXTERNAL_SHARE, TTFT_RATIO, ITL_RATIO, LIVE_CONFIG):
        assert metrics[name].passed is None, name
        assert metrics[name].message.startswith("not judged in observe mode"), name
    assert metrics[TTFT_RATIO].canary == pytest.approx(1.0)  # the same engines on both sides
    assert metrics[TTFT_P99].passed is True  # the budget is real evidence
    assert status.last_analysis.verdict is Verdict.PASS


def test_the_same_fleet_applied_for_real_would_fail_the_external_share_gate() -> None:
    # The contrast: without observe mode a level with a CPU tier that loads no token fails, so observe mode's
    # climb is not the external share passing: it is the gate set aside.
    spec = observe_spec()
    level = build_ladder(spec)[2]  # cpu
    measurements = Measurements(canary=GPU_ONLY_FLEET, stable=GPU_ONLY_FLEET)
    real = assess(spec, level, measurements, warmed_up=True)
    observed = assess(spec, level, measurements, warmed_up=True, observing=True)
    assert real.verdict is Verdict.FAIL
    assert [m.name for m in real.metrics if m.passed is False] == [EXTERNAL_SHARE]
    assert observed.verdict is Verdict.PASS


def test_a_fleet_over_budget_rolls_the_observed_canary_back_in_status() -> None:
    fleet = Fleet(observe_spec())
    fleet.run(12)  # the baseline is taken (a fleet over budget still climbs) and the pilot's canary runs
    fleet.sample = SLOW_FLEET
    fleet.run(10)
    status = fleet.status
    assert status is not None
    assert status.mode is Mode.ROLLED_BACK
    assert status.history[-1].decision == Decision.ROLLBACK
    assert status.history[-1].reason == Reason.ANALYSIS_FAILED
    assert status.stable is not None
    assert status.stable.level == 0
    assert status.canary is None


def test_a_step_waits_for_the_fleets_ready_pods_and_its_pod_restarts_are_no_canarys() -> None:
    # No pod is a canary's: restarts and OOM kills of the fleet are not a canary's hard failure.
    fleet = Fleet(observe_spec(progressDeadline="720h"), pods=pods(4, ready=0, restarts=3, oom_killed=True))
    fleet.run(30)
    status = fleet.status
    assert status is not None
    assert status.mode is Mode.STEP
    assert status.canary is not None
    assert status.canary.ready == 0
    assert "waiting for canaries Ready (0/1)" in status.message
    assert Decision.ROLLBACK not in fleet.decisions
    fleet.pods = pods(4)
    fleet.run(1)
    assert fleet.status is not None
    assert fleet.status.canary is not None
    assert fleet.status.canary.ready == 1
    fleet.run(1)
    assert fleet.decisions[-1] == Decision.PILOT_PASSED


def test_the_preflight_judges_the_fleets_real_workload() -> None:
    # A GPU that never comes near full and never preempts: offload cannot pay, and the observed ladder holds.
    calm = replace(GPU_ONLY_FLEET, workload=WorkloadSample(kv_usage_max=0.35, preemptions_per_second=0.0))
    price = RestorePrice(1480, recompute_ms=80.0, restore_ms=6.0, profile="nvidia-h100-80gb", profile_kind="measured")
    fleet = Fleet(observe_spec(preflight={}), sample=calm, price=price)
    fleet.run(15)
    status = fleet.status
    assert status is not None
    assert status.mode is Mode.HELD
    assert status.preflight is not None
    assert not status.preflight.pays
    held = cond.find(status.conditions, OFFLOAD_WILL_NOT_PAY)
    assert held is not None
    assert held.status == "True"
    assert held.reason == Reason.GPU_MEMORY_NOT_CONSTRAINED


def test_turning_observe_only_off_starts_a_fresh_ladder_from_gpu_only_that_applies() -> None:
    fleet = Fleet(observe_spec())
    fleet.run(240)
    assert fleet.status is not None
    assert fleet.status.mode is Mode.STABLE
    fleet.spec = observe_spec(observeOnly=False)
    fleet.generation += 1
    plan = fleet.cycle()
    status = plan.status
    assert status.history[-1].decision == Decision.OBSERVE_SWITCHED
    assert "rollout.observeOnly turned off" in status.history[-1].message
    assert status.mode is Mode.BASELINE
    assert status.stable is not None
    assert status.stable.level == 0
    assert status.stable.replicas == 4
    assert status.canary is None
    assert status.retiring == []
    assert plan.variants is not None
    assert plan.variants.stable.level == 0
    assert plan.variants.retiring == ()
    assert status.observe is None
    assert not status.message.startswith("observe-only")
    observing = cond.find(status.conditions, OBSERVING)
    assert observing is not None
    assert observing.status == "False"
    assert observing.reason == Reason.APPLYING


def test_turning_observe_only_on_starts_an_observed_ladder_from_gpu_only() -> None:
    world = World.given(observe_spec(observeOnly=False))
    world.run_for("40m")  # a real climb, mid-step on the cpu level
    before = world.status
    assert before is not None
    assert before.mode is Mode.STEP
    assert cond.find(before.conditions, OBSERVING) is None
    spec = observe_spec()
    observations = Observations(generation=2, sized=sized_plan(spec), fleet=FleetObservation("app=team-vllm", pods()))
    plan = decide(spec, before, observations, world.now)
    assert plan.status.history[-1].decision == Decision.OBSERVE_SWITCHED
    assert "left as they are, never deleted" in plan.status.history[-1].message
    assert plan.status.mode is Mode.BASELINE
    assert plan.status.stable is not None
    assert plan.status.stable.level == 0
    assert plan.status.canary is None
    assert plan.status.retiring == []
    assert cond.is_true(plan.status.conditions, OBSERVING)


def test_would_apply_names_each_deployment_a_real_climb_would_write() -> None:
    fleet = Fleet(observe_spec())
    fleet.run(11)  # a canary of cpu-pilot has started
    status = fleet.status
    assert status is not None
    assert status.canary is not None
    ladder = status.ladder
    same = Variants(stable=VariantPlan(0, 3, status.stable.config_hash if status.stable else ""), canary=None)
    assert status.stable is not None
    stable_hash, canary_hash = status.stable.config_hash, status.canary.config_hash
    # Nothing changes: nothing would be written.
    unchanged = Variants(VariantPlan(0, status.stable.replicas, stable_hash), VariantPlan(1, 1, canary_hash))
    assert would_apply("demo", status, ladder, unchanged) == ()
    # The canary grows and the stable side shrinks; a draining level would go.
    moved = Variants(VariantPlan(0, 2, stable_hash), VariantPlan(1, 2, canary_hash))
    messages = sorted(e.message for e in would_apply("demo", status, ladder, moved))
    assert messages == [
        f"not applied (observe-only): Deployment demo-cpu-pilot would run 2 replica(s) of level cpu-pilot, "
        f"config {canary_hash}",
        f"not applied (observe-only): Deployment demo-gpu-only would run 2 replica(s) of level gpu-only, "
        f"config {stable_hash}",
    ]
    gone = would_apply("demo", status, ladder, replace(same, retiring=(RetiringPlan("cpu", 0, "x"),)))
    assert any("Deployment demo-cpu-pilot would be deleted" in e.message for e in gone)
    assert all(e.reason == Reason.WOULD_APPLY for e in gone)
