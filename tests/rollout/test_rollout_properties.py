"""Properties of decide() over random histories: verdicts, pod faults, annotations, spec changes, time.

Whatever happens, decide never raises, never promotes without a Pass at the end
of a full step (or a manual promote), never leaves the fleet empty, never asks
for more than (replicas + maxSurge) × gpu.count GPUs, never lets an
OOM-killed canary survive a decision, and never starts a canary while
OffloadWillNotPay holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvoffload.analysis.measurements import VariantSample
from kvoffload.api.conventions import (
    MANUAL_ANNOTATIONS,
    OFFLOAD_WILL_NOT_PAY,
    PAUSED,
    PROGRESSING,
    PROMOTE,
    STALLED,
    Reason,
)
from kvoffload.api.quantity import parse_duration
from kvoffload.api.rollout import PreflightSpec
from kvoffload.api.status import KVOffloadPolicyStatus, Phase, Verdict
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.policy.ladder import build_ladder
from kvoffload.rollout import conditions as cond
from kvoffload.rollout.preflight import RestorePrice
from tests.rollout.test_preflight import CHEAP_RESTORE, NO_REUSE, PRESSED, ROOMY, SLOW_RESTORE
from tests.rollout.test_rollout import World, level_hashes, make_spec

FAULTS: dict[str, dict[str, Any]] = {
    "none": {},
    "oom": {"canary_fault": {"oom_killed": True, "restarts": 1}},
    "crash": {"canary_fault": {"crash_looping": True, "restarts": 2}},
    "restart": {"canary_fault": {"restarts": 1}},
    "not-ready": {"canary_ready": 0},
}


@dataclass(frozen=True)
class Cycle:
    seconds: int
    verdict: Verdict | None
    fault: str
    annotation: str | None
    new_generation: bool


cycles = st.builds(
    Cycle,
    seconds=st.sampled_from([0, 1, 15, 30, 30, 30, 60, 120, 180, 600]),
    verdict=st.sampled_from([Verdict.PASS, Verdict.PASS, Verdict.PASS, Verdict.FAIL, Verdict.INCONCLUSIVE, None]),
    fault=st.sampled_from(["none"] * 12 + list(FAULTS)),
    annotation=st.one_of(st.none(), st.none(), st.none(), st.sampled_from(MANUAL_ANNOTATIONS)),
    new_generation=st.sampled_from([False] * 20 + [True]),
)


@st.composite
def specs(draw: st.DrawFn) -> KVOffloadPolicySpec:
    replicas = draw(st.integers(1, 6))
    surge = draw(st.integers(0, 2))
    if replicas == 1 and surge == 0:
        surge = 1
    canary = draw(st.integers(1, 3))
    if surge == 0:
        canary = min(canary, replicas - 1)
    tiers = [{"name": f"t{i}", "size": "100Gi", "path": f"/mnt/t{i}"} for i in range(draw(st.integers(0, 2)))]
    gpus = draw(st.sampled_from([1, 2]))
    return make_spec(
        replicas=replicas,
        **{
            "gpu.count": gpus,
            "model.tensorParallelSize": gpus,
            "model.name": "example/unknown-model",
            "model.architecture": {"numLayers": 4, "numKVHeads": 2, "headDim": 64},
            "offload.secondaryTiers": tiers,
            "rollout.canaryReplicas": canary,
            "rollout.maxSurge": surge,
            "rollout.pilotCpu": draw(st.sampled_from(["4Gi", None])),
            "rollout.promotionSteps": draw(st.sampled_from([[100], [50, 100], [25, 50, 100], [10, 20, 40, 80, 100]])),
            "rollout.autoPromote": draw(st.booleans()),
            "rollout.baselineDuration": "2m",
            "rollout.stepDuration": "3m",
            "analysis.sustainedFor": "1m",
            "analysis.maxInconclusive": 3,
        },
    )


def _advanced(before: KVOffloadPolicyStatus, after: KVOffloadPolicyStatus) -> bool:
    """The ladder moved up: a later step or level than before, not by a rollback or a new ladder."""
    assert before.stage is not None
    assert after.stage is not None
    return (after.stage.index, after.stage.step) > (before.stage.index, before.stage.step) and (
        after.phase is not Phase.ROLLED_BACK
    )


def _in_baseline(status: KVOffloadPolicyStatus) -> bool:
    progressing = cond.find(status.conditions, PROGRESSING)
    return status.canary is None and progressing is not None and progressing.reason == Reason.BASELINE_RUNNING


def _check(world: World, before: KVOffloadPolicyStatus, cycle: Cycle, generation_before: int) -> None:
    spec = world.spec
    after = world.st
    plan = world.plan
    assert plan is not None
    assert plan.variants is not None
    variants = plan.variants
    ladder = build_ladder(spec)
    hashes = level_hashes(spec)

    # the fleet is never empty and never bigger than replicas + maxSurge (so GPUs stay within budget)
    assert variants.total_replicas >= 1
    assert variants.total_replicas * spec.gpu.count <= (spec.replicas + spec.rollout.max_surge) * spec.gpu.count
    # the stable side only ever runs a level that may hold the fleet, with that level's rendered config
    assert not ladder[variants.stable.level].canary_only
    assert variants.stable.config_hash == hashes[variants.stable.level]
    if variants.canary is not None:
        assert variants.canary.level > variants.stable.level
        assert variants.canary.config_hash == hashes[variants.canary.level]
    # the status agrees with itself
    assert after.phase is cond.derive_phase(after.conditions, after.mode, after.stage)
    assert len(after.history) <= 20

    if world.generation != generation_before:
        return
    manual_promote = before.annotations_seen.get(PROMOTE) != after.annotations_seen.get(PROMOTE)
    assessment = world.plans[-1].status.last_analysis
    verdict_now = cycle.verdict
    assert before.stage is not None
    assert before.stage.started_at is not None
    elapsed = (world.now - before.stage.started_at).total_seconds()

    event(f"phase {after.phase.value}")
    # an OOM-killed, crash-looping or restarted canary never survives a decision
    if before.canary is not None and cycle.fault in ("oom", "crash", "restart"):
        assert variants.canary is None
        assert after.phase is Phase.ROLLED_BACK

    # a canary or promotion step advances only on a Pass after a whole step, or by hand
    if before.canary is not None and _advanced(before, after):
        event("a step advanced" + (" by hand" if manual_promote else ""))
        assert manual_promote or (
            verdict_now is Verdict.PASS
            and spec.rollout.auto_promote
            and elapsed >= parse_duration(spec.rollout.step_duration)
            and not cond.is_true(before.conditions, PAUSED)
        ), (before.stage, after.stage, verdict_now, elapsed, assessment)
    # the baseline ends only after baselineDuration with enough samples, or by hand
    if _in_baseline(before) and after.canary is not None:
        assert manual_promote or (
            verdict_now in (Verdict.PASS, Verdict.FAIL)
            and elapsed >= parse_duration(spec.rollout.baseline_duration)
            and not cond.is_true(before.conditions, PAUSED)
        )


CALM = Cycle(seconds=30, verdict=Verdict.PASS, fault="none", annotation=None, new_generation=False)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs(), calm=st.integers(0, 100), history=st.lists(cycles, min_size=1, max_size=40))
def test_decide_keeps_its_promises_over_any_history(spec: KVOffloadPolicySpec, calm: int, history: list[Cycle]) -> None:
    # a run of healthy cycles first, so the random part starts anywhere on the ladder
    world = World.given(spec)
    for n, cycle in enumerate([CALM] * calm + history):
        before = world.st
        generation_before = world.generation
        if cycle.annotation is not None:
            world.annotate(cycle.annotation, str(n))
        if cycle.new_generation:
            world.generation += 1
        world.tick(traffic=None, advance=f"{cycle.seconds}s", verdict=cycle.verdict, **FAULTS[cycle.fault])
        _check(world, before, cycle, generation_before)


@settings(max_examples=40, deadline=None)
@given(spec=specs())
def test_with_healthy_evidence_every_spec_climbs_to_the_top(spec: KVOffloadPolicySpec) -> None:
    world = World.given(spec)
    n = 0
    while world.phase is not Phase.STABLE:
        assert world.now - world.plans[0].status.history[0].time < timedelta(hours=6), world.st.message
        if not spec.rollout.auto_promote and world.st.phase in (Phase.CANARY, Phase.PROMOTING):
            n += 1
            world.annotate(PROMOTE, str(n))
        world.tick(traffic=None, advance="30s", verdict=Verdict.PASS)
    world.settle()
    assert world.fleet == ((build_ladder(spec)[-1].name, spec.replicas), None)
    assert world.plan is not None
    assert world.plan.variants is not None
    assert not world.plan.variants.retiring


PRICES = [CHEAP_RESTORE, SLOW_RESTORE, RestorePrice(1480, error="no profile"), None]
WORKLOADS = [PRESSED, ROOMY, NO_REUSE, None]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=specs(),
    calm=st.integers(0, 10),
    history=st.lists(
        st.tuples(cycles, st.sampled_from(range(len(PRICES))), st.sampled_from(range(len(WORKLOADS)))),
        min_size=1,
        max_size=40,
    ),
)
def test_no_canary_is_ever_started_while_OffloadWillNotPay_holds(
    spec: KVOffloadPolicySpec, calm: int, history: list[tuple[Cycle, int, int]]
) -> None:
    spec = spec.model_copy(update={"rollout": spec.rollout.model_copy(update={"preflight": PreflightSpec()})})
    world = World.given(spec)
    for n, (cycle, price, workload) in enumerate([(CALM, 1, 1)] * calm + history):
        before = world.st
        world.price = PRICES[price]
        world.crafted_stable = VariantSample(workload=WORKLOADS[workload]) if WORKLOADS[workload] else None
        if cycle.annotation is not None:
            world.annotate(cycle.annotation, str(n))
        if cycle.new_generation:
            world.change_spec(spec)
        world.tick(traffic=None, advance=f"{cycle.seconds}s", verdict=cycle.verdict, **FAULTS[cycle.fault])
        after = world.st
        plan = world.plan
        assert plan is not None
        assert plan.variants is not None
        holds_before = cond.is_true(before.conditions, OFFLOAD_WILL_NOT_PAY)
        holds_after = cond.is_true(after.conditions, OFFLOAD_WILL_NOT_PAY)
        event(f"phase {after.phase.value}")
        # no canary while it holds, before the decision or after it
        if holds_before or holds_after:
            assert plan.variants.canary is None
            assert plan.variants.stable.level == 0
            assert plan.variants.stable.replicas == spec.replicas
        # a canary starts only from a policy it did not hold
        if before.canary is None and after.canary is not None:
            assert not holds_before
        # the phase shows it, and so does kstatus
        assert holds_after == (after.phase is Phase.HELD)
        if holds_after:
            assert cond.is_true(after.conditions, STALLED)
            assert after.preflight is not None
            assert not after.preflight.pays
