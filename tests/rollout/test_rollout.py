"""The ladder state machine, one scenario per rule (docs/design.md, "The ladder" and "Analysis").

``World`` plays the cluster and Prometheus: it feeds ``decide`` its own last plan
back as observations (the Deployments run what was planned, every pod Ready
unless a test says otherwise), judges synthetic metrics with the real
``assess()`` (or takes a crafted verdict), and moves the clock forward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import jsonschema
import pytest

from kvoffload.analysis.assess import Assessment, assess
from kvoffload.analysis.measurements import Measurements, VariantSample
from kvoffload.api.conventions import (
    ABORT,
    ANALYSIS_INCONCLUSIVE,
    DEGRADED,
    INVALID,
    PAUSE,
    PROGRESSING,
    PROMOTE,
    READY,
    RECONCILING,
    RESUME,
    RETRY,
    STALLED,
    Reason,
)
from kvoffload.api.quantity import GIB, parse_duration, to_quantity
from kvoffload.api.status import KVOffloadPolicyStatus, MetricResult, Mode, Phase, Verdict
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.sized import Sized, size_spec
from kvoffload.policy.startup import progress_deadline_seconds
from kvoffload.rollout import conditions as cond
from kvoffload.rollout.decide import decide, invalid
from kvoffload.rollout.observations import Observations, PodObservation, VariantObservation
from kvoffload.rollout.plan import Event, Plan
from kvoffload.rollout.preflight import RestorePrice
from kvoffload.rollout.replicas import canary_replicas, stable_replicas
from kvoffload.rollout.warmup import analysis_subject
from tests.support.crd_admission import drop_nulls, openapi_schema, strict

T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)

BASE_SPEC: dict[str, Any] = {
    "model": {"name": "Qwen/Qwen3-8B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 32768},
    "gpu": {"class": "nvidia-h100-80gb", "count": 1},
    "replicas": 4,
    "resources": {"baseMemory": "24Gi"},
    "offload": {"cpu": "32Gi", "secondaryTiers": [{"name": "nvme", "size": "500Gi", "path": "/mnt/kv-cache"}]},
    "rollout": {
        "canaryReplicas": 1,
        "maxSurge": 0,
        "pilotCpu": "4Gi",
        "baselineDuration": "10m",
        "stepDuration": "15m",
        "promotionSteps": [25, 50, 100],
        "progressDeadline": "20m",
    },
    "analysis": {"interval": "30s", "sustainedFor": "2m", "maxInconclusive": 10},
}


def make_spec(**changes: Any) -> KVOffloadPolicySpec:
    """The base spec with dotted-path changes: ``make_spec(**{"rollout.maxSurge": 1})``; None deletes."""
    raw: dict[str, Any] = _deep_copy(BASE_SPEC)
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = raw
        for part in parents:
            node = node[part]
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return KVOffloadPolicySpec.model_validate(raw)


def _deep_copy(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _deep_copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_deep_copy(v) for v in obj]
    return obj


def level_hashes(spec: KVOffloadPolicySpec) -> dict[int, str]:
    """What the renderer would hash: the level's tiers and the image (rollout settings do not render)."""
    return {lv.index: f"{lv.name}-{lv.cpu_bytes}-{spec.model.image.rsplit(':', 1)[-1]}" for lv in build_ladder(spec)}


def sized_plan(spec: KVOffloadPolicySpec, policy: str = "chat") -> Sized:
    """The spec's sized plan as the cycle hands it to decide, its config hashes from ``level_hashes``."""
    hashes = level_hashes(spec)
    return size_spec(spec, policy, lambda level, _: hashes[level.index])


# --- traffic, as Prometheus would show it --------------------------------------------

HEALTHY = VariantSample(
    requests=600,
    request_rate=5.0,
    ttft_p99=0.40,
    itl_p99=0.020,
    external_share=0.12,
    tier_hits={"host": 5000.0, "disk": 1500.0},
    kv_usage=0.70,
)
SLOW = replace(HEALTHY, ttft_p99=2.5)  # over the 1500ms TTFT budget
IDLE = VariantSample(requests=0, request_rate=0.0, tier_hits={"host": 0.0, "disk": 0.0})


@dataclass(frozen=True)
class Traffic:
    """What each variant shows this cycle; the world judges it with the real assess()."""

    canary: VariantSample = HEALTHY
    stable: VariantSample = HEALTHY


def crafted(verdict: Verdict) -> Assessment:
    """A verdict without metrics, for tests about the state machine rather than the analysis."""
    return Assessment(verdict, (MetricResult(name="ttftP99", canary=0.4, stable=0.4, threshold=1.5),), verdict.value)


# --- the world -----------------------------------------------------------------------


@dataclass
class World:
    """A cluster that does what the last plan said, a Prometheus, and a clock."""

    spec: KVOffloadPolicySpec = field(repr=False)
    now: datetime = T0
    generation: int = 1
    annotations: dict[str, str] = field(default_factory=dict)
    status: KVOffloadPolicyStatus | None = field(default=None, repr=False)
    plan: Plan | None = field(default=None, repr=False)
    events: list[Event] = field(default_factory=list, repr=False)
    plans: list[Plan] = field(default_factory=list, repr=False)
    price: RestorePrice | None = None
    """The preflight's restore price the adapter would pass (economics.breakeven on the GPU class)."""
    crafted_stable: VariantSample | None = field(default=None, repr=False)
    """With a crafted verdict: the stable figures Prometheus would show beside it (the baseline's workload)."""

    # --- Given

    @classmethod
    def given(cls, spec: KVOffloadPolicySpec | None = None, **kwargs: Any) -> World:
        world = cls(spec or make_spec(), **kwargs)
        world.tick(advance="0s")
        return world

    # --- When

    def observe(
        self,
        assessment: Assessment | None,
        measurements: Measurements | None,
        *,
        canary_ready: int | None = None,
        canary_fault: Mapping[str, Any] | None = None,
        stable_ready: int | None = None,
    ) -> Observations:
        variants = self.plan.variants if self.plan is not None else None
        stable = canary = VariantObservation()
        retiring: tuple[VariantObservation, ...] = ()
        if variants is not None:
            s = variants.stable
            up = s.replicas if stable_ready is None else stable_ready
            stable = VariantObservation(
                exists=True,
                config_hash=s.config_hash,
                level=s.level,
                desired_replicas=s.replicas,
                ready_replicas=up,
                pods=tuple(PodObservation(f"stable-{i}", i < up, config_hash=s.config_hash) for i in range(s.replicas)),
            )
            if (c := variants.canary) is not None:
                ready = c.replicas if canary_ready is None else canary_ready
                pods = [PodObservation(f"canary-{i}", i < ready, config_hash=c.config_hash) for i in range(c.replicas)]
                if canary_fault:
                    pods[0] = replace(pods[0], **canary_fault)
                canary = VariantObservation(True, c.config_hash, c.level, c.replicas, ready, tuple(pods))
            retiring = tuple(
                VariantObservation(
                    True,
                    r.config_hash,
                    None,
                    r.replicas,
                    r.replicas,
                    tuple(
                        PodObservation(f"{r.level_name}-{i}", True, config_hash=r.config_hash)
                        for i in range(r.replicas)
                    ),
                )
                for r in variants.retiring
            )
        return Observations(
            generation=self.generation,
            sized=sized_plan(self.spec),
            annotations=dict(self.annotations),
            stable=stable,
            canary=canary,
            retiring=retiring,
            assessment=assessment,
            measurements=measurements,
            price=self.price,
        )

    def tick(
        self,
        traffic: Traffic | None = Traffic(),
        *,
        advance: str = "30s",
        verdict: Verdict | None = None,
        **observe: Any,
    ) -> Plan:
        """Move the clock, judge the traffic (or take ``verdict``), decide once."""
        self.now += timedelta(seconds=parse_duration(advance)) if advance != "0s" else timedelta(0)
        assessment, measurements = None, None
        if verdict is not None:
            assessment = crafted(verdict)
            # A crafted verdict comes with a busy canary (its warm-up can end) and any stable figures asked for.
            busy = VariantSample(requests=1000) if self.status is not None and self.status.canary else None
            if self.crafted_stable is not None or busy is not None:
                measurements = Measurements(canary=busy, stable=self.crafted_stable)
        elif traffic is not None:
            subject = analysis_subject(self.spec, build_ladder(self.spec), self.status, self.now)
            has_canary = self.status is not None and self.status.canary is not None
            # A variant with no replicas has no series: Prometheus shows nothing for it.
            variants = self.plan.variants if self.plan is not None else None
            has_stable = variants is None or variants.stable.replicas > 0
            measurements = Measurements(
                canary=traffic.canary if has_canary else None, stable=traffic.stable if has_stable else None
            )
            baseline = self.status.baseline if self.status is not None else None
            assessment = assess(
                self.spec,
                subject.level,
                measurements,
                warmed_up=subject.warmed_up,
                baseline=baseline,
                stable_side=subject.stable_side,
                comparing=subject.comparing,
            )
        before = self.status.model_dump() if self.status is not None else None
        obs = self.observe(assessment, measurements, **observe)
        plan = decide(self.spec, self.status, obs, self.now)
        assert (self.status.model_dump() if self.status is not None else None) == before, "decide mutated status"
        self.status, self.plan = plan.status, plan
        self.events += plan.events
        self.plans.append(plan)
        return plan

    def run_for(self, duration: str, traffic: Traffic | None = Traffic(), **kwargs: Any) -> Plan:
        """Tick every analysis interval for ``duration``."""
        cycles = math.ceil(parse_duration(duration) / parse_duration(self.spec.analysis.interval))
        for _ in range(cycles):
            plan = self.tick(traffic, advance=self.spec.analysis.interval, **kwargs)
        return plan

    def run_until(
        self, done: Callable[[World], bool], traffic: Traffic | None = Traffic(), *, limit: str = "12h", **kwargs: Any
    ) -> Plan:
        deadline = self.now + timedelta(seconds=parse_duration(limit))
        while not done(self):
            assert self.now < deadline, f"not done within {limit}: {self.status.message if self.status else ''}"
            self.tick(traffic, advance=self.spec.analysis.interval, **kwargs)
        assert self.plan is not None
        return self.plan

    def settle(self, limit: int = 50) -> Plan:
        """Tick without analysis until the paced moves of replicas are done (the plan stops changing)."""
        for _ in range(limit):
            before = self.plan.variants if self.plan is not None else None
            plan = self.tick(traffic=None, advance="10s")
            if plan.variants == before:
                return plan
        raise AssertionError(f"replicas still moving after {limit} cycles: {self.plan}")

    def annotate(self, key: str, value: str) -> None:
        self.annotations[key] = value

    def change_spec(self, spec: KVOffloadPolicySpec) -> None:
        self.spec = spec
        self.generation += 1

    # --- Then

    @property
    def st(self) -> KVOffloadPolicyStatus:
        assert self.status is not None
        return self.status

    @property
    def phase(self) -> Phase:
        return self.st.phase

    @property
    def stage(self) -> tuple[str, int]:
        assert self.st.stage is not None
        return self.st.stage.name, self.st.stage.step

    @property
    def fleet(self) -> tuple[tuple[str, int], tuple[str, int] | None]:
        """(stable level name, replicas), (canary level name, replicas) or None, as planned."""
        assert self.plan is not None
        assert self.plan.variants is not None
        names = self.st.ladder
        v = self.plan.variants
        canary = (names[v.canary.level], v.canary.replicas) if v.canary is not None else None
        return (names[v.stable.level], v.stable.replicas), canary

    def decisions(self) -> list[str]:
        return [h.decision for h in self.st.history]

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]


def at_stage(name: str, step: int = 0) -> Callable[[World], bool]:
    return lambda w: w.status is not None and w.stage == (name, step) and w.phase in (Phase.CANARY, Phase.PROMOTING)


def in_phase(phase: Phase) -> Callable[[World], bool]:
    return lambda w: w.status is not None and w.phase is phase


# --- a whole climb ------------------------------------------------------------------


def test_a_whole_climb_with_healthy_traffic_ends_stable_at_the_top_level():
    # Given a fresh policy climbing gpu-only → cpu-pilot → cpu → nvme on 4 replicas, maxSurge 0
    world = World.given(make_spec())
    assert world.phase is Phase.BASELINE
    assert world.fleet == (("gpu-only", 4), None)

    # When every cycle shows healthy traffic
    world.run_until(in_phase(Phase.STABLE))

    # Then every level was tried and promoted in order, one step per stepDuration
    assert world.fleet == (("nvme", 4), None)
    assert world.st.stable is not None
    assert world.st.stable.tiers == ["cpu", "nvme"]
    assert "WarmedUp" in world.reasons()  # each step's canary warmed up before its comparisons counted
    assert [r for r in world.reasons() if r != "WarmedUp"] == [
        "NewLadder",
        "BaselineTaken",  # → cpu-pilot canary
        "PilotPassed",  # → cpu canary, stable still gpu-only
        "Promoted",  # cpu 50% (25% would not add a replica)
        "Promoted",  # cpu 100%
        "LevelPromoted",  # cpu stable, nvme canary
        "Promoted",
        "Promoted",
        "LevelPromoted",  # nvme stable: the top
    ]
    # 10m baseline + 7 steps of 15m (pilot; cpu 1, 2, 4 replicas; nvme 1, 2, 4), no cycle wasted
    assert world.now - T0 == timedelta(minutes=10 + 7 * 15)
    # And the fleet never used more GPUs than replicas + maxSurge, nor ran empty
    for plan in world.plans:
        assert plan.variants is not None
        assert 0 < plan.variants.total_replicas <= 4
    assert world.st.baseline is not None
    assert world.st.baseline.ttft_p99 == pytest.approx(0.40)
    assert cond.is_true(world.st.conditions, READY)


def test_the_mode_is_kept_in_status_at_every_step_of_the_climb():
    world = World.given(make_spec())
    assert world.st.mode is Mode.BASELINE
    world.run_until(at_stage("cpu-pilot"))
    assert world.st.mode is Mode.STEP
    world.run_until(in_phase(Phase.STABLE))
    assert world.st.mode is Mode.STABLE
    # And every plan on the way wrote a mode: nothing is inferred from condition reasons
    assert all(plan.status.mode is not None for plan in world.plans)


def test_a_renamed_condition_reason_does_not_change_the_state_machine():
    # Given a policy in its baseline
    world = World.given(make_spec())
    assert world.st.mode is Mode.BASELINE
    # When the Progressing reason reads something the state machine has never heard of
    renamed = [
        c.model_copy(update={"reason": "SomeFutureReason"}) if c.type == PROGRESSING else c for c in world.st.conditions
    ]
    world.status = world.st.model_copy(update={"conditions": renamed})
    world.tick()
    # Then the baseline goes on: the mode came from status.mode
    assert world.st.mode is Mode.BASELINE
    assert world.phase is Phase.BASELINE


def test_a_status_written_before_the_mode_field_is_read_off_its_conditions_once():
    world = World.given(make_spec())
    world.run_until(at_stage("cpu-pilot"))
    world.status = world.st.model_copy(update={"mode": None})
    world.tick()
    assert world.st.mode is Mode.STEP
    assert world.stage == ("cpu-pilot", 0)


def test_the_climb_records_each_step_in_the_stage_and_the_variant_status():
    world = World.given(make_spec())
    world.run_until(at_stage("cpu", 2))

    assert world.fleet == (("gpu-only", 2), ("cpu", 2))
    world.tick()  # ready counts are what the cluster showed this cycle
    assert world.st.canary is not None
    assert world.st.canary.cpu_size == "32Gi"
    assert world.st.canary.ready == 2
    assert world.st.stable is not None
    assert world.st.stable.ready == 2
    assert world.st.stable.cpu_size is None
    assert world.st.ladder == ["gpu-only", "cpu-pilot", "cpu", "nvme"]
    # the printer columns of `kubectl get kvop`
    shown = (world.st.tiers_summary, world.st.canary_summary, world.st.ttft_p99, world.st.external_share)
    assert shown == ("cpu", "2/2", "400ms", "12.0%")


def test_the_printer_columns_show_the_stable_fleet_when_no_canary_runs():
    world = World.given(make_spec())
    world.run_for("1m", Traffic(stable=replace(HEALTHY, ttft_p99=0.212)))
    shown = (world.st.tiers_summary, world.st.canary_summary, world.st.ttft_p99, world.st.external_share)
    assert shown == ("none", "0/4", "212ms", "12.0%")


# --- baseline ----------------------------------------------------------------------


def test_the_baseline_lasts_baseline_duration_then_records_the_stable_figures():
    world = World.given(make_spec())
    world.run_for("9m30s")
    assert world.phase is Phase.BASELINE
    assert world.st.baseline is None

    world.run_for("30s")

    assert world.phase is Phase.CANARY
    b = world.st.baseline
    assert b is not None
    assert (b.ttft_p99, b.itl_p99, b.request_rate, b.gpu_kv_usage, b.taken_at) == (0.40, 0.020, 5.0, 0.70, world.now)
    assert world.fleet == (("gpu-only", 3), ("cpu-pilot", 1))


def test_an_inconclusive_baseline_is_extended_not_taken():
    world = World.given(make_spec())
    world.run_for("8m")
    world.run_for("4m", Traffic(stable=IDLE))  # 8 Inconclusive verdicts, 2m past baselineDuration

    assert world.phase is Phase.BASELINE
    assert world.st.baseline is None
    assert "baseline extended (12m)" in world.st.message

    world.tick()
    assert world.phase is Phase.CANARY


# --- replica arithmetic --------------------------------------------------------------


@pytest.mark.parametrize(
    ("replicas", "canary", "surge", "step", "want_canary", "want_stable"),
    [
        pytest.param(4, 1, 0, 0, 1, 3, id="surge-0-canary-replaces-a-stable-replica"),
        pytest.param(4, 1, 0, 1, 1, 3, id="25pct-of-4-is-1"),
        pytest.param(4, 1, 0, 2, 2, 2, id="50pct-of-4-is-2"),
        pytest.param(4, 1, 0, 3, 4, 0, id="100pct-leaves-no-stable"),
        pytest.param(10, 1, 0, 1, 3, 7, id="25pct-of-10-rounds-up-to-3"),
        pytest.param(10, 4, 0, 1, 4, 6, id="never-fewer-than-canaryReplicas"),
        pytest.param(4, 1, 1, 0, 1, 4, id="surge-1-keeps-every-stable-replica"),
        pytest.param(4, 1, 1, 2, 2, 3, id="surge-1-shrinks-stable-by-one-at-50pct"),
        pytest.param(4, 1, 1, 3, 4, 1, id="surge-1-keeps-one-stable-at-100pct"),
        pytest.param(2, 3, 2, 0, 2, 2, id="canary-capped-at-replicas"),
    ],
)
def test_replica_arithmetic(replicas, canary, surge, step, want_canary, want_stable):
    spec = make_spec(replicas=replicas, **{"rollout.canaryReplicas": canary, "rollout.maxSurge": surge})

    c = canary_replicas(spec, step)

    assert (c, stable_replicas(spec, c)) == (want_canary, want_stable)
    assert c + stable_replicas(spec, c) <= replicas + surge


def test_with_max_surge_zero_the_canary_uses_no_extra_gpus():
    spec = make_spec(**{"gpu.count": 2, "model.tensorParallelSize": 2})
    world = World.given(spec)
    world.run_until(in_phase(Phase.STABLE))

    gpus = [p.variants.total_replicas * 2 for p in world.plans if p.variants is not None]
    assert max(gpus) == 4 * 2


# --- promotion gates ------------------------------------------------------------------


def test_a_step_is_not_promoted_before_step_duration_even_with_pass():
    world = World.given(make_spec())
    world.run_until(at_stage("cpu-pilot"))

    world.run_for("14m30s")
    assert world.stage == ("cpu-pilot", 0)

    world.tick()
    assert world.stage == ("cpu", 0)


def test_promotion_never_happens_on_inconclusive():
    world = World.given(make_spec())
    world.run_until(at_stage("cpu-pilot"))

    # a canary with no traffic, far past the step's end
    world.run_for("20m", verdict=None, traffic=Traffic(canary=IDLE))

    assert world.stage == ("cpu-pilot", 0)
    assert world.phase is Phase.PAUSED  # maxInconclusive 10 reached
    assert "Promoted" not in world.reasons()
    assert "PilotPassed" not in world.reasons()


def test_promotion_waits_for_every_canary_to_be_ready():
    world = World.given(make_spec())
    world.run_until(at_stage("cpu", 2))
    world.run_for("15m", canary_ready=1)

    assert world.stage == ("cpu", 2)
    assert "waiting for canaries Ready (1/2)" in world.st.message


def test_the_cpu_pilot_is_never_promoted_its_canary_moves_on_to_the_full_cpu_level():
    world = World.given(make_spec())
    world.run_until(at_stage("cpu-pilot"))
    assert world.fleet == (("gpu-only", 3), ("cpu-pilot", 1))

    world.run_until(at_stage("cpu"))

    assert world.fleet == (("gpu-only", 3), ("cpu", 1))
    assert world.events[-1].reason == "PilotPassed"


def test_without_a_pilot_the_ladder_goes_straight_to_the_cpu_canary():
    world = World.given(make_spec(**{"rollout.pilotCpu": None}))
    world.run_for("10m")
    assert world.fleet == (("gpu-only", 3), ("cpu", 1))


def test_auto_promote_false_waits_at_the_end_of_each_step_for_the_promote_annotation():
    world = World.given(make_spec(**{"rollout.autoPromote": False}))
    world.run_until(at_stage("cpu-pilot"))
    world.run_for("1h")

    assert world.stage == ("cpu-pilot", 0)
    progressing = cond.find(world.st.conditions, PROGRESSING)
    assert progressing is not None
    assert progressing.reason == Reason.AWAITING_PROMOTION

    world.annotate(PROMOTE, "1")
    world.tick()
    assert world.stage == ("cpu", 0)


# --- rollback ---------------------------------------------------------------------------


def _at_cpu_canary() -> World:
    world = World.given(make_spec())
    world.run_until(at_stage("cpu"))
    world.run_for("5m")
    return world


def test_a_breach_shorter_than_sustained_for_does_not_roll_back():
    world = _at_cpu_canary()

    world.run_for("1m30s", Traffic(canary=SLOW))  # 3 Fail verdicts: 1m of failing
    world.run_for("1m")

    assert world.phase is Phase.CANARY
    assert world.st.last_analysis is not None
    assert world.st.last_analysis.consecutive_failures == 0


def test_a_breach_longer_than_sustained_for_rolls_back_to_the_exact_stable_level():
    world = _at_cpu_canary()
    stable_before = world.st.stable
    assert stable_before is not None

    world.run_until(in_phase(Phase.ROLLED_BACK), Traffic(canary=SLOW), limit="3m")

    # first Fail at t, rollback at t + sustainedFor (2m)
    assert world.st.last_analysis is not None
    assert world.st.last_analysis.failing_since == world.now - timedelta(minutes=2)
    assert world.plan is not None
    assert world.plan.variants is not None
    assert world.plan.variants.canary is None
    assert world.plan.variants.stable.level == stable_before.level
    assert world.plan.variants.stable.config_hash == stable_before.config_hash
    assert world.plan.variants.stable.replicas == 4
    degraded = cond.find(world.st.conditions, DEGRADED)
    assert degraded is not None
    assert degraded.status == "True"
    assert degraded.reason == "AnalysisFailed"
    assert world.events[-1].type == "Warning"
    assert "2500.0ms" in world.events[-1].message
    assert world.decisions()[-1] == "Rollback"


def test_a_single_spike_followed_by_silence_does_not_roll_back():
    world = _at_cpu_canary()
    world.tick(Traffic(canary=SLOW))
    world.tick(traffic=None, advance="10m")  # no analysis for a long time

    assert world.phase is Phase.CANARY


def test_no_traffic_is_inconclusive_never_fail():
    world = _at_cpu_canary()

    world.run_for("4m", Traffic(canary=IDLE, stable=IDLE))

    assert world.st.last_analysis is not None
    assert world.st.last_analysis.verdict is Verdict.INCONCLUSIVE
    assert world.st.last_analysis.consecutive_failures == 0
    assert world.phase is Phase.CANARY


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        pytest.param({"oom_killed": True, "restarts": 1}, "CanaryOOMKilled", id="oom-killed"),
        pytest.param({"crash_looping": True, "restarts": 3}, "CanaryCrashLoopBackOff", id="crash-loop"),
        pytest.param({"restarts": 1}, "CanaryRestarted", id="one-restart"),
    ],
)
def test_a_failing_canary_pod_rolls_back_on_the_next_decision(fault, reason):
    world = _at_cpu_canary()

    world.tick(canary_fault=fault)

    assert world.phase is Phase.ROLLED_BACK
    assert world.fleet == (("gpu-only", 4), None)
    assert world.events[-1].reason == reason
    assert "canary-0" in world.events[-1].message
    assert world.events[-1].type == "Warning"


def _allocated(size: int, chunks: int) -> VariantSample:
    labels = {"pod": "canary-0", "tier": "", "cpu_kv_cache_size_bytes": str(size), "cpu_num_chunks": str(chunks)}
    return replace(HEALTHY, offload_allocated=(labels,))


def test_a_canary_engine_that_allocated_another_cpu_tier_rolls_back_at_once_with_the_figures():
    world = _at_cpu_canary()
    chunk = 2 * 1024 * 1024
    world.tick(Traffic(canary=_allocated(16 * GIB, 16 * GIB // chunk)))

    assert world.phase is Phase.ROLLED_BACK  # one cycle, not sustainedFor: a hard failure like an OOM kill
    assert world.fleet == (("gpu-only", 4), None)
    event = world.events[-1]
    assert (event.type, event.reason) == ("Warning", "CanaryAllocationMismatch")
    assert f"canary pod canary-0 allocated {16 * GIB} B (8192 chunks of {chunk} B)" in event.message
    assert f"rendered {32 * GIB} B (32 GiB) at level cpu" in event.message


def test_a_canary_engine_that_allocated_the_rendered_cpu_tier_goes_on():
    world = _at_cpu_canary()
    chunk = 2 * 1024 * 1024
    world.run_for("2m", Traffic(canary=_allocated(32 * GIB, 32 * GIB // chunk)))
    assert world.phase is Phase.CANARY
    assert "CanaryAllocationMismatch" not in world.reasons()


def test_an_allocation_seen_while_an_older_canary_pod_lingers_is_not_judged():
    world = _at_cpu_canary()
    world.tick(Traffic(canary=_allocated(4 * GIB, 2048)), canary_fault={"config_hash": "cpu-pilot-old", "ready": False})
    assert world.phase is Phase.CANARY


def test_a_fault_on_a_pod_of_an_older_canary_config_is_not_held_against_the_new_one():
    world = _at_cpu_canary()
    world.tick(canary_fault={"oom_killed": True, "config_hash": "cpu-pilot-old"})
    assert world.phase is Phase.CANARY


def test_a_canary_not_ready_within_the_progress_deadline_rolls_back():
    spec = make_spec()
    deadline = progress_deadline_seconds(spec, build_ladder(spec)[1])
    world = World.given(spec)
    world.run_for("10m")
    assert world.stage == ("cpu-pilot", 0)

    world.run_for(f"{deadline - 30}s", canary_ready=0)
    assert world.phase is Phase.CANARY

    world.tick(canary_ready=0)
    assert world.phase is Phase.ROLLED_BACK
    assert world.events[-1].reason == "ProgressDeadlineExceeded"
    assert "0/1 canary replicas Ready" in world.events[-1].message


def test_a_canary_the_scheduler_cannot_place_says_why_while_it_waits_and_when_it_rolls_back():
    spec = make_spec()
    deadline = progress_deadline_seconds(spec, build_ladder(spec)[1])
    world = World.given(spec)
    world.run_for("10m")
    assert world.stage == ("cpu-pilot", 0)
    why = "0/1 nodes are available: 1 Insufficient memory."
    stuck = {"ready": False, "unschedulable": why}

    world.tick(canary_ready=0, canary_fault=stuck)
    assert world.phase is Phase.CANARY
    assert world.status is not None
    assert f"pod canary-0 cannot be scheduled: {why}" in world.status.message

    world.run_for(f"{deadline}s", canary_ready=0, canary_fault=stuck)
    assert world.phase is Phase.ROLLED_BACK
    assert world.events[-1].reason == "ProgressDeadlineExceeded"
    assert "0/1 canary replicas Ready" in world.events[-1].message
    assert f"pod canary-0 cannot be scheduled: {why}" in world.events[-1].message


def test_a_canary_ready_before_the_deadline_goes_on():
    world = World.given(make_spec())
    world.run_for("10m")
    world.run_for("10m", canary_ready=0)
    world.run_for("10m")
    assert world.stage == ("cpu", 0)


def test_the_ladder_stays_rolled_back_until_retry():
    world = _at_cpu_canary()
    world.tick(canary_fault={"oom_killed": True})
    world.run_for("2h")
    assert world.phase is Phase.ROLLED_BACK
    assert world.fleet == (("gpu-only", 4), None)

    world.annotate(RETRY, "2025-03-01T12:00:00Z")
    world.tick()

    assert world.phase is Phase.BASELINE
    assert world.fleet == (("gpu-only", 4), None)
    assert not cond.is_true(world.st.conditions, DEGRADED)
    world.run_until(at_stage("cpu-pilot"))


# --- the stable guard -------------------------------------------------------------------


def _stable_at_the_top(spec: KVOffloadPolicySpec) -> World:
    world = World.given(spec)
    world.run_until(in_phase(Phase.STABLE))
    return world


def test_the_stable_guard_takes_away_nvme_and_lands_on_cpu_not_gpu_only():
    world = _stable_at_the_top(make_spec())
    hashes = level_hashes(world.spec)

    world.run_until(in_phase(Phase.ROLLED_BACK), Traffic(stable=SLOW), limit="5m")
    world.settle()  # nvme's Deployment drains as cpu's pods become Ready

    assert world.fleet == (("cpu", 4), None)
    assert world.plan is not None
    assert world.plan.variants is not None
    assert world.plan.variants.stable.config_hash == hashes[2]
    assert world.events[-1].reason == "GuardBreach"


def test_the_stable_guard_from_cpu_skips_the_canary_only_pilot_and_lands_on_gpu_only():
    world = _stable_at_the_top(make_spec(**{"offload.secondaryTiers": []}))
    assert world.fleet == (("cpu", 4), None)

    world.run_until(in_phase(Phase.ROLLED_BACK), Traffic(stable=SLOW), limit="5m")
    world.settle()

    assert world.fleet == (("gpu-only", 4), None)


def test_the_stable_guard_ignores_a_short_breach():
    world = _stable_at_the_top(make_spec())
    world.run_for("1m30s", Traffic(stable=SLOW))
    world.run_for("30m")
    assert world.phase is Phase.STABLE


def test_the_stable_guard_does_not_pause_on_quiet_nights():
    world = _stable_at_the_top(make_spec())
    world.run_for("8h", Traffic(stable=IDLE))
    assert world.phase is Phase.STABLE


# --- inconclusive ----------------------------------------------------------------------


def test_max_inconclusive_verdicts_in_a_row_pause_and_a_pass_clears_it():
    world = _at_cpu_canary()
    world.run_for("4m30s", verdict=Verdict.INCONCLUSIVE)
    assert world.phase is Phase.CANARY  # 9 in a row

    world.tick(verdict=Verdict.INCONCLUSIVE)

    assert world.phase is Phase.PAUSED
    assert cond.is_true(world.st.conditions, ANALYSIS_INCONCLUSIVE)
    assert world.events[-1].reason == "TooManyInconclusive"

    world.tick(verdict=Verdict.PASS)

    assert world.phase is Phase.CANARY
    assert not cond.is_true(world.st.conditions, ANALYSIS_INCONCLUSIVE)


def test_the_resume_annotation_clears_an_inconclusive_pause_and_restarts_the_step_clock():
    world = _at_cpu_canary()
    world.run_for("5m", verdict=Verdict.INCONCLUSIVE)
    assert world.phase is Phase.PAUSED

    world.annotate(RESUME, "a")
    world.tick(verdict=Verdict.INCONCLUSIVE)

    assert world.phase is Phase.CANARY
    assert world.st.stage is not None
    assert world.st.stage.started_at == world.now
    world.run_for("14m30s")
    assert world.stage == ("cpu", 0)
    world.tick()
    assert world.stage == ("cpu", 2)


# --- manual control ----------------------------------------------------------------


def test_manual_promote_skips_the_rest_of_the_step_once_per_change():
    world = _at_cpu_canary()

    world.annotate(PROMOTE, "1")
    world.tick(verdict=Verdict.INCONCLUSIVE)
    assert world.stage == ("cpu", 2)
    assert world.decisions()[-1] == "ManualPromote"

    world.run_for("5m")  # the same value again: nothing more
    assert world.stage == ("cpu", 2)

    world.annotate(PROMOTE, "2")
    world.tick()
    assert world.stage == ("cpu", 3)


def test_manual_promote_cuts_the_baseline_short():
    world = World.given(make_spec())
    world.annotate(PROMOTE, "now")
    world.tick()
    assert world.fleet == (("gpu-only", 3), ("cpu-pilot", 1))
    assert world.st.baseline is not None


def test_abort_drops_the_canary_and_rolls_back_with_reason_aborted():
    world = _at_cpu_canary()

    world.annotate(ABORT, "1")
    world.tick()

    assert world.phase is Phase.ROLLED_BACK
    assert world.fleet == (("gpu-only", 4), None)
    degraded = cond.find(world.st.conditions, DEGRADED)
    assert degraded is not None
    assert degraded.reason == "Aborted"
    assert world.decisions()[-1] == "Abort"

    world.run_for("1h")  # not acted on twice, and nothing moves on its own
    assert world.reasons().count("Aborted") == 1
    assert world.phase is Phase.ROLLED_BACK


def test_pause_holds_everything_and_resume_goes_on():
    world = _at_cpu_canary()

    world.annotate(PAUSE, "1")
    world.tick()
    assert world.phase is Phase.PAUSED
    world.run_for("1h")
    assert world.stage == ("cpu", 0)
    assert world.phase is Phase.PAUSED

    world.annotate(RESUME, "1")
    world.tick()
    assert world.phase is Phase.CANARY
    world.run_for("15m")
    assert world.stage == ("cpu", 2)
    assert world.reasons().count("Paused") == 1
    assert world.reasons().count("Resumed") == 1


def test_pause_never_stops_a_rollback():
    world = _at_cpu_canary()
    world.annotate(PAUSE, "1")
    world.tick()

    world.tick(canary_fault={"oom_killed": True})

    assert world.phase is Phase.ROLLED_BACK
    assert world.fleet == (("gpu-only", 4), None)


def test_an_annotation_with_nothing_to_act_on_is_recorded_and_ignored():
    world = _stable_at_the_top(make_spec())

    world.annotate(PROMOTE, "x")
    world.tick()

    assert world.phase is Phase.STABLE
    assert world.events[-1].reason == "ManualActionIgnored"
    assert world.st.annotations_seen[PROMOTE] == "x"
    world.tick()
    assert world.events[-1].reason == "ManualActionIgnored"
    assert world.reasons().count("ManualActionIgnored") == 1


def test_annotations_already_on_a_new_policy_are_recorded_not_acted_on():
    world = World.given(make_spec(), annotations={ABORT: "old", PROMOTE: "old"})
    world.run_for("5m")
    assert world.phase is Phase.BASELINE
    assert world.st.annotations_seen == {ABORT: "old", PROMOTE: "old"}


def test_several_annotations_changed_at_once_are_acted_on_one_per_cycle_in_order():
    world = _at_cpu_canary()
    world.annotate(PROMOTE, "1")
    world.annotate(PAUSE, "1")

    plan = world.tick()
    assert world.phase is Phase.PAUSED
    assert world.stage == ("cpu", 0)
    assert plan.requeue_after == 1.0

    world.tick(advance="1s")
    assert world.stage == ("cpu", 2)
    assert world.phase is Phase.PAUSED


# --- spec changes ------------------------------------------------------------------------


def test_a_spec_change_mid_rollout_drops_the_canary_and_starts_a_new_ladder_from_the_stable_level():
    world = World.given(make_spec())
    world.run_until(at_stage("nvme"))
    assert world.fleet == (("cpu", 3), ("nvme", 1))

    world.change_spec(make_spec(**{"model.image": "vllm/vllm-openai:v0.32.1"}))
    world.tick()

    assert world.phase is Phase.BASELINE
    assert world.fleet == (("cpu", 4), None)
    assert world.plan is not None
    assert world.plan.variants is not None
    assert world.plan.variants.stable.config_hash == level_hashes(world.spec)[2]  # the new spec's cpu config
    assert world.st.observed_generation == 2
    assert world.events[-1].reason == "SpecChanged"
    assert "dropped canary nvme" in world.events[-1].message


def test_a_spec_change_that_removes_the_stable_level_lands_on_the_nearest_level_below():
    world = _stable_at_the_top(make_spec())
    assert world.fleet == (("nvme", 4), None)

    world.change_spec(make_spec(**{"offload.secondaryTiers": [], "rollout.pilotCpu": None}))
    world.tick()
    world.settle()

    assert world.st.ladder == ["gpu-only", "cpu"]
    assert world.fleet == (("cpu", 4), None)
    assert world.phase is Phase.STABLE  # cpu is now the top


def test_invalid_spec_touches_nothing_and_a_fixed_spec_resumes_from_the_stable_level():
    world = _at_cpu_canary()
    before = world.st

    plan = invalid(before, ["spec.offload.cpu: must be greater than zero"], 2, world.now)

    assert plan.variants is None
    assert plan.status.phase is Phase.INVALID
    invalid_cond = cond.find(plan.status.conditions, INVALID)
    assert invalid_cond is not None
    assert "spec.offload.cpu" in invalid_cond.message
    assert plan.events[0].type == "Warning"
    assert invalid(plan.status, ["spec.offload.cpu: must be greater than zero"], 2, world.now).events == ()

    world.status = plan.status
    world.generation = 3
    world.tick()
    assert world.phase is Phase.BASELINE
    assert world.fleet == (("gpu-only", 4), None)


# --- bookkeeping -----------------------------------------------------------------------


def test_history_keeps_the_last_20_decisions():
    world = World.given(make_spec())
    for i in range(25):
        world.annotate(PAUSE if i % 2 == 0 else RESUME, str(i))
        world.tick()
    assert len(world.st.history) == 20
    assert world.st.history[-1].decision == "Pause"


def test_a_running_stable_deployment_at_a_known_level_is_adopted_when_status_is_lost():
    spec = make_spec()
    world = _stable_at_the_top(spec)

    world.status = None
    world.tick()

    assert world.phase is Phase.STABLE
    assert world.fleet == (("nvme", 4), None)


def test_conditions_keep_last_transition_time_across_holds():
    world = _at_cpu_canary()
    progressing = cond.find(world.st.conditions, PROGRESSING)
    assert progressing is not None
    since = progressing.last_transition_time

    world.run_for("5m")

    again = cond.find(world.st.conditions, PROGRESSING)
    assert again is not None
    assert again.last_transition_time == since


def test_decide_writes_the_host_memory_and_selector_from_the_sized_plan():
    # Status has one author: decide writes hostMemory (the running level that needs the most) and the selector.
    spec = make_spec()
    sized = sized_plan(spec, "team-chat")
    plan = decide(spec, None, Observations(generation=1, sized=sized), T0)
    assert plan.status.selector == "kvoffload.io/policy=team-chat"
    assert plan.variants is not None
    assert plan.variants.canary is None
    memory = sized[plan.variants.stable.level].memory
    assert plan.status.host_memory is not None
    assert plan.status.host_memory.request == to_quantity(memory.request)
    assert plan.status.host_memory.pinned == to_quantity(memory.pinned)


def test_every_status_decide_writes_fits_the_crd_status_schema():
    validator = jsonschema.Draft4Validator(strict(openapi_schema())["properties"]["status"])
    world = World.given(make_spec())
    world.run_until(in_phase(Phase.STABLE))
    world.run_until(in_phase(Phase.ROLLED_BACK), Traffic(stable=SLOW), limit="5m")
    world.annotate(PAUSE, "1")
    world.tick()
    statuses = [p.status for p in world.plans]
    statuses.append(invalid(world.st, ["spec.replicas: must be at least 1"], 9, world.now).status)

    for status in statuses:
        doc = drop_nulls(status.model_dump(mode="json", by_alias=True))
        assert [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)] == []


# --- kstatus: what Flux, Helm v4 --wait=watcher and kpt read --------------------------------


def kstatus(status: KVOffloadPolicyStatus) -> tuple[bool, bool, bool]:
    """(Reconciling, Stalled, Ready), each True only when its condition is True."""
    return tuple(cond.is_true(status.conditions, t) for t in (RECONCILING, STALLED, READY))  # type: ignore[return-value]


def test_a_climb_is_reconciling_and_a_stable_policy_is_ready_with_neither():
    world = World.given(make_spec())
    assert kstatus(world.st) == (True, False, False)
    world.run_until(at_stage("cpu-pilot"))
    assert kstatus(world.st) == (True, False, False)
    world.run_until(in_phase(Phase.STABLE))
    assert kstatus(world.st) == (False, False, True)


def test_a_rolled_back_policy_is_stalled_and_says_why():
    world = _at_cpu_canary()
    world.run_until(in_phase(Phase.ROLLED_BACK), Traffic(canary=SLOW), limit="3m")
    assert kstatus(world.st) == (False, True, False)
    stalled = cond.find(world.st.conditions, STALLED)
    assert stalled is not None
    assert stalled.reason == Reason.ANALYSIS_FAILED
    assert "canary failed" in stalled.message


def test_an_invalid_spec_is_stalled_until_it_is_fixed():
    world = _at_cpu_canary()
    plan = invalid(world.st, ["spec.offload.cpu: must be greater than zero"], 2, world.now)
    assert kstatus(plan.status)[:2] == (False, True)
    world.status = plan.status
    world.change_spec(world.spec)
    world.tick()
    assert kstatus(world.st) == (True, False, False)


def test_every_condition_and_the_status_carry_the_observed_generation_as_an_integer():
    world = World.given(make_spec(), generation=7)
    world.run_until(at_stage("cpu-pilot"))
    assert world.st.observed_generation == 7
    assert {c.observed_generation for c in world.st.conditions} == {7}


# --- a scale subresource: replicas change mid-rollout (issue 9) --------------------------


def test_a_replicas_change_mid_step_resizes_both_shares_by_the_steps_percentage_without_restarting_it():
    # Given 4 replicas, maxSurge 1, steps 50/100, in the cpu canary's 50% step (2 of 4 on cpu)
    spec = make_spec(**{"rollout.maxSurge": 1, "rollout.promotionSteps": [50, 100]})
    world = World.given(spec)
    world.run_until(at_stage("cpu", 1))
    world.settle()
    stage_before = world.st.stage
    canary_before = world.st.canary
    assert world.fleet == (("gpu-only", 3), ("cpu", 2))  # 50% of 4 on cpu, one surge replica kept

    # When an autoscaler sets replicas to 10 through /scale (a new generation, only replicas changed)
    world.change_spec(spec.model_copy(update={"replicas": 10}))
    world.tick()
    world.settle()

    # Then the step goes on where it was, and the shares follow: 50% of 10 on cpu, the rest stable
    assert world.phase is Phase.PROMOTING
    assert world.st.stage == stage_before  # same step, same start: the step clock did not restart
    assert world.st.canary is not None
    assert canary_before is not None
    assert world.st.canary.config_hash == canary_before.config_hash
    assert world.fleet == (("gpu-only", 6), ("cpu", 5))  # 10 - max(0, 5 - maxSurge 1) = 6
    assert world.st.replicas == 11  # within (replicas + maxSurge) = 11
    assert "SpecChanged" not in world.reasons()
    # and the GPU budget held on every cycle of the resize
    for plan in world.plans:
        assert plan.variants is not None
        assert plan.variants.total_replicas == plan.status.replicas
        assert plan.variants.total_replicas <= 10 + 1


def test_any_other_spec_change_still_starts_a_new_ladder():
    spec = make_spec(**{"rollout.maxSurge": 1, "rollout.promotionSteps": [50, 100]})
    world = World.given(spec)
    world.run_until(at_stage("cpu", 1))
    world.change_spec(
        spec.model_copy(update={"replicas": 6, "rollout": spec.rollout.model_copy(update={"step_duration": "20m"})})
    )
    world.tick()
    assert world.phase is Phase.BASELINE
    assert world.events[-1].reason == "SpecChanged"
