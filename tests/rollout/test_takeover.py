"""spec.workloadRef in ``decide``: the team's Deployment shrinks only as the operator's engines become Ready, never
grows back while held, and a new pod template starts a new ladder from GPU-only (issue 35).

``decide`` sees the Deployment through ``Observations.workload`` (the adapter reads it); the World below plays the
adapter too, applying ``status.workload.replicas`` to the Deployment after each cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvoffload.api.conventions import Decision, Reason
from kvoffload.api.status import Mode, Phase
from kvoffload.rollout.decide import decide
from kvoffload.rollout.observations import Observations, WorkloadObservation
from kvoffload.rollout.release import is_released, released, taking_over_again
from tests.rollout.test_rollout import World, make_spec


@dataclass
class Team:
    """The team's Deployment as the cluster holds it."""

    replicas: int = 3
    original: int = 3
    digest: str = "template-1"


class TakeoverWorld(World):
    team: Team

    def observe(self, *args: Any, **kwargs: Any) -> Observations:
        seen = super().observe(*args, **kwargs)
        workload = WorkloadObservation("chat", self.team.digest, self.team.original, self.team.replicas)
        return replace(seen, workload=workload)

    def tick(self, *args: Any, **kwargs: Any) -> Any:
        plan = super().tick(*args, **kwargs)
        assert plan.status.workload is not None
        self.team.replicas = plan.status.workload.replicas  # what the adapter writes
        return plan


def given(team: Team, **spec: Any) -> TakeoverWorld:
    world = TakeoverWorld(make_spec(**spec))
    world.team = team
    world.tick(advance="0s")
    return world


def with_ready(obs: Observations, ready: int) -> Observations:
    """The stable's Deployment with only ``ready`` of its pods Ready."""
    stable = obs.stable
    pods = tuple(replace(p, ready=i < ready) for i, p in enumerate(stable.pods))
    return replace(obs, stable=replace(stable, pods=pods, ready_replicas=ready))


def test_the_first_cycle_keeps_every_team_replica_while_no_engine_of_the_operator_is_ready() -> None:
    world = given(Team(replicas=3))
    assert world.st.workload is not None
    assert world.st.workload.replicas == 3
    assert world.st.workload.original_replicas == 3
    assert world.st.workload.template_digest == "template-1"


def test_the_team_deployment_shrinks_by_the_operators_ready_engines_and_to_zero_once_all_are_ready() -> None:
    world = given(Team(replicas=3))
    obs = world.observe(None, None)
    for ready, left in ((0, 3), (1, 2), (2, 1), (3, 0), (4, 0)):
        plan = decide(world.spec, world.status, with_ready(obs, ready), world.now)
        assert plan.status.workload is not None
        assert plan.status.workload.replicas == left, (ready, plan.status.workload)
    world.tick(advance="30s")  # every stable pod Ready in this world
    assert world.team.replicas == 0


def test_the_team_deployment_never_grows_back_while_the_policy_holds_it() -> None:
    world = given(Team(replicas=3))
    world.tick(advance="30s")
    assert world.team.replicas == 0
    obs = world.observe(None, None)
    plan = decide(world.spec, world.status, with_ready(obs, 0), world.now)  # every engine of ours went unready
    assert plan.status.workload is not None
    assert plan.status.workload.replicas == 0


def test_fewer_policy_replicas_than_the_team_ran_serve_what_the_policy_asks() -> None:
    world = given(Team(replicas=6, original=6), replicas=4)
    obs = world.observe(None, None)
    plan = decide(world.spec, world.status, with_ready(obs, 3), world.now)
    assert plan.status.workload is not None
    assert plan.status.workload.replicas == 1  # min(6, 4) serving: 3 of ours and 1 of theirs
    assert plan.status.workload.original_replicas == 6  # still what is given back


def test_a_new_pod_template_starts_a_new_ladder_from_gpu_only() -> None:
    world = given(Team(replicas=3))
    world.run_until(lambda w: w.st.stable is not None and w.st.stable.level >= 2, limit="24h")
    level_before = world.st.stable.level if world.st.stable is not None else None
    world.team.digest = "template-2"
    plan = world.tick(advance="30s")

    assert level_before is not None
    assert level_before >= 2
    assert world.st.history[-1].decision == Reason.WORKLOAD_CHANGED.value
    assert "Deployment chat's pod template changed (template-1 → template-2)" in world.st.history[-1].message
    assert world.st.stage is not None
    assert world.st.stage.index == 0
    assert world.st.mode is Mode.BASELINE
    assert plan.variants is not None
    assert plan.variants.stable.level == 0
    assert world.st.workload is not None
    assert world.st.workload.template_digest == "template-2"
    assert any(e.reason == Reason.WORKLOAD_CHANGED for e in plan.events)
    world.tick(advance="30s")
    assert [e.decision for e in world.st.history].count(Reason.WORKLOAD_CHANGED.value) == 1  # once


def test_a_policy_without_workload_ref_has_no_workload_status() -> None:
    world = World.given()
    assert world.st.workload is None
    assert world.observe(None, None).workload is None


def test_a_release_pauses_the_policy_once_and_gives_back_the_recorded_count() -> None:
    world = given(Team(replicas=3))
    world.tick(advance="30s")
    assert world.team.replicas == 0
    first = released(world.status, "releasing: Deployment chat: 1 of 3 Ready", 1, world.now)
    again = released(first.status, "released: done", 1, world.now)

    assert first.variants is None  # the ladder's Deployments are the adapter's to remove, once chat is Ready
    assert first.status.phase is Phase.PAUSED
    assert is_released(first.status)
    assert first.status.workload is not None
    assert first.status.workload.replicas == 3
    assert [e.decision for e in again.status.history].count(Decision.RELEASE.value) == 1
    assert [e.reason for e in (*first.events, *again.events)] == [Reason.RELEASED, Reason.RELEASED]
    assert released(again.status, "released: done", 1, world.now).events == ()  # nothing new, nothing told


def test_taking_over_again_after_a_release_starts_a_new_ladder_from_gpu_only() -> None:
    world = given(Team(replicas=3))
    world.run_until(lambda w: w.st.stable is not None and w.st.stable.level >= 2, limit="24h")
    world.status = taking_over_again(released(world.status, "released", 1, world.now).status)
    world.plan = None  # the release removed the operator's Deployments: none run
    assert not is_released(world.status)
    world.tick(advance="30s")
    assert world.st.history[-1].decision == Decision.NEW_LADDER.value
    assert world.st.stable is not None
    assert world.st.stable.level == 0
    assert world.st.phase is Phase.BASELINE
