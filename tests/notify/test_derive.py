"""What a status write tells, derived from the real decide(): each transition once, as it happens, and nothing
while nothing changes. Each pair of consecutive plans is a status written over the one before, as the controller
writes it."""

from __future__ import annotations

from datetime import timedelta

from kvoffload.api.conventions import PAUSE, PROMOTE
from kvoffload.api.notifications import NotificationEvent
from kvoffload.api.status import Phase, Verdict
from kvoffload.notify.derive import EVENT_OF_DECISION, Notice, notices
from kvoffload.rollout.decide import invalid
from tests.rollout.test_rollout import SLOW, Traffic, World, at_stage, in_phase, make_spec


def told(world: World, since: int = 0) -> list[Notice]:
    """What the writes of the world's plans from plan ``since`` on would tell."""
    found: list[Notice] = []
    for i in range(max(since, 0), len(world.plans)):
        before = world.plans[i - 1].status if i > 0 else None
        after = world.plans[i].status
        found += notices("llm", "chat", before, after, after.last_analysis.time if after.last_analysis else world.now)
    return found


def kinds(found: list[Notice]) -> list[tuple[str, str, str, int | None]]:
    return [(n.event.value, n.decision, n.level, n.step) for n in found]


def test_a_whole_climb_tells_each_promotion_once_and_nothing_else() -> None:
    world = World.given(make_spec())
    world.run_until(in_phase(Phase.STABLE))
    world.run_for("1h")  # the guard at rest: nothing more to tell

    found = told(world)
    promoted = [h for h in world.st.history if EVENT_OF_DECISION.get(h.decision) is NotificationEvent.PROMOTED]
    assert kinds(found) == [
        ("Promoted", "PilotPassed", "cpu", 0),  # the pilot passed: the canary moves on to the full cpu tier
        ("Promoted", "Promoted", "cpu", 2),  # 25% of 4 replicas adds none over the canary: step 1 is skipped
        ("Promoted", "Promoted", "cpu", 3),
        ("Promoted", "LevelPromoted", "nvme", 0),
        ("Promoted", "Promoted", "nvme", 2),
        ("Promoted", "Promoted", "nvme", 3),
        ("Promoted", "LevelPromoted", "nvme", None),  # the top: at rest, no step
    ]
    assert len(found) == len(promoted) > 0
    assert [n.time for n in found] == [h.time for h in promoted]


def test_a_step_awaiting_a_person_is_told_once_then_its_promotion() -> None:
    world = World.given(make_spec(**{"rollout.autoPromote": False}))
    world.run_until(at_stage("cpu-pilot"))
    start = len(world.plans)
    world.run_for("2h")  # the pilot's step passes, then it waits, cycle after cycle
    waiting = told(world, start)
    assert [n.event for n in waiting] == [NotificationEvent.AWAITING_PROMOTION]
    assert (waiting[0].level, waiting[0].step, waiting[0].canary) == ("cpu-pilot", 0, "cpu-pilot")
    assert PROMOTE in waiting[0].message

    world.annotate(PROMOTE, "1")
    start = len(world.plans)
    world.tick()
    world.run_for("2h")  # the next step passes and waits in turn
    after = told(world, start)
    assert [n.event for n in after] == [NotificationEvent.PROMOTED, NotificationEvent.AWAITING_PROMOTION]
    assert after[0].decision == "ManualPromote"
    assert after[1].level == "cpu"


def test_a_rollback_is_told_once() -> None:
    world = World.given(make_spec(**{"rollout.pilotCpu": None}))
    world.run_until(at_stage("cpu"))
    start = len(world.plans)
    world.run_until(in_phase(Phase.ROLLED_BACK), Traffic(canary=SLOW))
    world.run_for("30m", Traffic(canary=SLOW))
    (rolled,) = told(world, start)
    assert (rolled.event, rolled.decision, rolled.reason) == (
        NotificationEvent.ROLLED_BACK,
        "Rollback",
        "AnalysisFailed",
    )
    assert (rolled.phase, rolled.level, rolled.stable, rolled.canary) == ("RolledBack", "gpu-only", "gpu-only", None)


def test_a_pause_by_a_person_and_one_on_missing_evidence_are_told() -> None:
    world = World.given(make_spec())
    world.run_until(at_stage("cpu-pilot"))
    start = len(world.plans)
    world.annotate(PAUSE, "1")
    world.run_for("10m")
    (paused,) = told(world, start)
    assert (paused.event, paused.reason) == (NotificationEvent.PAUSED, "Paused")

    quiet = World.given(make_spec())
    quiet.run_until(in_phase(Phase.PAUSED), verdict=Verdict.INCONCLUSIVE, limit="1h")
    quiet.run_for("10m", verdict=Verdict.INCONCLUSIVE)
    (inconclusive,) = told(quiet)
    assert (inconclusive.event, inconclusive.reason) == (NotificationEvent.PAUSED, "TooManyInconclusive")


def test_an_invalid_spec_is_told_once_however_often_it_is_judged() -> None:
    world = World.given(make_spec())
    first = invalid(world.st, ["spec.gpu.class: nvidia-x is not a GPU class"], 2, world.now)
    again = invalid(first.status, ["spec.gpu.class: nvidia-x is not a GPU class"], 2, world.now + timedelta(seconds=30))
    (told_once,) = notices("llm", "chat", world.st, first.status, world.now)
    assert (told_once.event, told_once.message) == (
        NotificationEvent.INVALID,
        "spec.gpu.class: nvidia-x is not a GPU class",
    )
    assert notices("llm", "chat", first.status, again.status, world.now) == []


def test_a_restarted_operator_tells_nothing_the_stored_status_already_holds() -> None:
    # A new leader's "before" is the status as stored: re-reading it is no transition.
    world = World.given(make_spec(**{"rollout.autoPromote": False}))
    world.run_until(at_stage("cpu-pilot"))
    world.run_for("2h")
    for plan in world.plans:
        assert notices("llm", "chat", plan.status, plan.status, world.now) == []


def test_the_same_transition_has_the_same_id_and_another_one_another() -> None:
    world = World.given(make_spec())
    world.run_until(in_phase(Phase.STABLE))
    found = told(world)
    again = told(world)
    assert [n.id for n in found] == [n.id for n in again]
    assert len({n.id for n in found}) == len(found)
