"""The capacity rules of a paced move, as properties of decide() over random specs and pod start times.

A small cluster does what each plan says, the way a Deployment's ReplicaSet would: a scale-down takes
pods that are not Ready first, a scale-up adds pods that become Ready after a random number of cycles.
Whatever the spec and the start times:

- the pods (Ready or not) never hold more than ``(replicas + maxSurge) × gpu.count`` GPUs;
- Ready replicas never fall below ``replicas − canaryReplicas`` during a step;
- across a promotion to 100% with ``maxSurge ≥ 1`` they never fall below ``replicas``;
- a Ready pod goes only when the budget has no room for its replacement, or nothing waits for room;
- no running pod is ever restarted: a level's pods stay until that level's Deployment shrinks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from itertools import count

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvoffload.analysis.measurements import Measurements, VariantSample
from kvoffload.api.status import KVOffloadPolicyStatus, Mode, Phase, Verdict
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.policy.ladder import build_ladder
from kvoffload.rollout.decide import decide
from kvoffload.rollout.observations import Observations, PodObservation, VariantObservation
from kvoffload.rollout.plan import Plan
from kvoffload.rollout.replicas import canary_replicas
from tests.rollout.test_rollout import T0, crafted, make_spec, sized_plan
from tests.rollout.test_rollout_properties import specs


@dataclass
class Pod:
    name: str
    config_hash: str
    ready_in: int
    """Cycles until Ready; 0 is Ready."""

    @property
    def ready(self) -> bool:
        return self.ready_in <= 0


@dataclass
class Cluster:
    """One Deployment per level name, each with its pods; pods start with the delays drawn for them."""

    delays: list[int]
    deployments: dict[str, list[Pod]] = field(default_factory=dict)
    started: int = 0
    _names: count[int] = field(default_factory=count)

    def scale(self, level: str, config_hash: str, replicas: int) -> None:
        pods = self.deployments.setdefault(level, [])
        while len(pods) > replicas:  # a ReplicaSet takes pods that are not Ready first, the newest of them
            unready = [p for p in pods if not p.ready]
            pods.remove(unready[-1] if unready else pods[-1])
        while len(pods) < replicas:
            delay = self.delays[self.started % len(self.delays)]
            self.started += 1
            pods.append(Pod(f"{level}-{next(self._names)}", config_hash, delay))

    def apply(self, plan: Plan, ladder: list[str]) -> None:
        """Shrink first, then grow, as the controller does; a level no plan names goes."""
        assert plan.variants is not None
        wanted: dict[str, tuple[str, int]] = {}
        v = plan.variants
        for role in (v.stable, v.canary):
            if role is not None:
                wanted[ladder[role.level]] = (role.config_hash, role.replicas)
        for r in v.retiring:
            wanted[r.level_name] = (r.config_hash, r.replicas)
        for name in [n for n in self.deployments if n not in wanted]:
            self.scale(name, "", 0)
            del self.deployments[name]
        now = {n: len(p) for n, p in self.deployments.items()}
        for name, (config_hash, replicas) in sorted(wanted.items(), key=lambda kv: kv[1][1] - now.get(kv[0], 0)):
            self.scale(name, config_hash, replicas)

    def tick(self) -> None:
        for pods in self.deployments.values():
            for pod in pods:
                pod.ready_in -= 1

    def pods(self) -> list[Pod]:
        return [p for pods in self.deployments.values() for p in pods]

    def ready(self) -> int:
        return sum(p.ready for p in self.pods())

    def observe(self, level: str | None, config_hash: str) -> VariantObservation:
        pods = self.deployments.get(level or "", [])
        if level is None or not pods:
            return VariantObservation()
        observed = tuple(PodObservation(p.name, p.ready, config_hash=p.config_hash) for p in pods)
        ready = sum(1 for p in pods if p.ready and p.config_hash == config_hash)
        return VariantObservation(True, config_hash, None, len(pods), ready, observed)


def observations(spec: KVOffloadPolicySpec, status: KVOffloadPolicyStatus | None, cluster: Cluster) -> Observations:
    def of(variant: object) -> VariantObservation:
        if variant is None or status is None:
            return VariantObservation()
        level, config_hash = getattr(variant, "level"), getattr(variant, "config_hash")  # noqa: B009
        return cluster.observe(status.ladder[level], config_hash)

    return Observations(
        generation=1,
        sized=sized_plan(spec),
        stable=of(status.stable if status else None),
        canary=of(status.canary if status else None),
        retiring=tuple(cluster.observe(r.level_name, r.config_hash) for r in (status.retiring if status else [])),
        assessment=crafted(Verdict.PASS),
        measurements=Measurements(canary=VariantSample(requests=1000), stable=None),  # a busy canary warms up
    )


def climb(spec: KVOffloadPolicySpec, delays: list[int], cycles: int = 400) -> tuple[Cluster, list[tuple[str, int]]]:
    """Drive decide() and the cluster with healthy evidence until the top level holds every replica.

    Checks the capacity rules after every cycle; returns the cluster and Ready replicas over time."""
    cluster = Cluster(delays)
    status: KVOffloadPolicyStatus | None = None
    now = T0
    budget = (spec.replicas + spec.rollout.max_surge) * spec.gpu.count
    canaries = min(spec.rollout.canary_replicas, spec.replicas)
    timeline: list[tuple[str, int]] = []
    for _ in range(cycles):
        plan = decide(spec, status, observations(spec, status, cluster), now)
        before_pods = {p.name for p in cluster.pods()}
        ready_before = cluster.ready()
        cluster.apply(plan, plan.status.ladder)
        after = plan.status
        pods = cluster.pods()

        assert len(pods) * spec.gpu.count <= budget, (len(pods), budget, after.message)
        ready = cluster.ready()
        if after.mode is Mode.STEP and status is not None and status.mode is Mode.STEP:
            assert ready >= min(spec.replicas - canaries, ready_before), (ready, ready_before, after.message)
            to_full = after.canary is not None and _canary_target(spec, after) >= spec.replicas
            if spec.rollout.max_surge >= 1 and to_full:
                assert ready >= min(spec.replicas, ready_before), (ready, ready_before, after.message)
        # a Ready pod went while a level still waits for room: only if that room was taken at once
        lost_ready = ready_before - sum(1 for p in pods if p.name in before_pods and p.ready)
        if lost_ready > 0 and _short(spec, after):
            assert len(pods) * spec.gpu.count == budget, (lost_ready, len(pods), after.message)
        timeline.append((after.stage.name if after.stage else "", ready))

        if after.phase is Phase.STABLE and not after.retiring and len(pods) == spec.replicas and ready == len(pods):
            return cluster, timeline
        status = after
        cluster.tick()
        now += timedelta(seconds=30)
    raise AssertionError(f"no rest at the top within {cycles} cycles: {status.message if status else ''}")


def _canary_target(spec: KVOffloadPolicySpec, status: KVOffloadPolicyStatus) -> int:
    return canary_replicas(spec, status.stage.step) if status.stage is not None else 0


def _short(spec: KVOffloadPolicySpec, status: KVOffloadPolicyStatus) -> bool:
    """A role below the replicas its stage heads for (a level that waits for room)."""
    if status.stable is None:
        return False
    if status.canary is None:
        return status.stable.replicas < spec.replicas
    return status.canary.replicas < _canary_target(spec, status)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs(), delays=st.lists(st.integers(0, 6), min_size=1, max_size=12))
def test_paced_moves_keep_the_gpu_budget_and_the_ready_floor_on_any_spec(
    spec: KVOffloadPolicySpec, delays: list[int]
) -> None:
    spec = spec.model_copy(update={"rollout": spec.rollout.model_copy(update={"auto_promote": True})})
    cluster, _ = climb(spec, delays)
    # every other level's Deployment has gone; the top's holds every replica
    assert list(cluster.deployments) == [build_ladder(spec)[-1].name]
    assert len(cluster.deployments[build_ladder(spec)[-1].name]) == spec.replicas


def test_the_demo_promote_scenario_starts_seven_engines_and_keeps_one_ready():
    # examples/demo-two-tier.yaml: 2 replicas, 1 canary, maxSurge 0, steps 50/100, pilot, cpu, nvme
    spec = make_spec(
        replicas=2,
        **{
            "rollout.canaryReplicas": 1,
            "rollout.promotionSteps": [50, 100],
            "offload.secondaryTiers": [{"name": "nvme", "size": "100Gi", "path": "/mnt/nvme"}],
        },
    )
    cluster, timeline = climb(spec, delays=[2])
    # 2 gpu-only, 1 cpu-pilot, 1 cpu, 1 more cpu at 100%, 1 nvme, 1 more nvme at 100%
    assert cluster.started == 7
    full = next(i for i, (_, ready) in enumerate(timeline) if ready == 2)
    assert min(ready for _, ready in timeline[full:]) == 1  # replicas − canaryReplicas, during each swap
    assert list(cluster.deployments) == ["nvme"]


def test_with_max_surge_one_a_promotion_to_full_never_drops_below_every_replica():
    spec = make_spec(replicas=3, **{"rollout.maxSurge": 1, "rollout.promotionSteps": [100]})
    _, timeline = climb(spec, delays=[3])
    full = next(i for i, (_, ready) in enumerate(timeline) if ready == 3)
    assert min(ready for _, ready in timeline[full:]) == 3
