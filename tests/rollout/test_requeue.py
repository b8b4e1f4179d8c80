"""When the plan asks to come back (``Plan.requeue_after``): a step's end, a waiting annotation, and the instant an
open Fail run reaches ``sustainedFor``, so a sustained breach is decided then and not up to an interval later
(issue 24, item 8: bench/reaction)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from kvoffload.api.conventions import PAUSE, RESUME
from kvoffload.api.status import Phase, Verdict
from tests.rollout.test_rollout import World, at_stage, in_phase, make_spec

SUSTAINED = 4.0


def _fast_spec(**changes: object):
    """Judged every second, a breach sustained for 4 s, as in bench/reaction; straight to the cpu canary."""
    return make_spec(
        **{
            "analysis.interval": "1s",
            "analysis.sustainedFor": "4s",
            "rollout.pilotCpu": None,
            "rollout.baselineDuration": "20s",
            "rollout.stepDuration": "10m",
            **changes,
        }
    )


def _canary() -> World:
    world = World.given(_fast_spec())
    world.run_until(at_stage("cpu"), limit="10m")
    world.run_for("30s")  # warm and passing
    return world


def _fail(world: World, advance: str) -> float | None:
    return world.tick(verdict=Verdict.FAIL, advance=advance).requeue_after


def test_a_failing_canary_comes_back_when_the_breach_has_lasted_sustained_for_not_an_interval_later():
    world = _canary()
    _fail(world, "1s")
    t0 = world.now
    assert world.st.last_analysis is not None
    assert world.st.last_analysis.failing_since == t0
    _fail(world, "1s")
    _fail(world, "1s")

    requeue = _fail(world, "1.3s")  # t0 + 3.3 s: the breach is due at t0 + 4 s

    assert requeue == pytest.approx(0.7)
    assert world.phase is Phase.CANARY
    world.tick(verdict=Verdict.FAIL, advance="0.7s")
    assert world.now == t0 + timedelta(seconds=SUSTAINED)
    assert world.phase is Phase.ROLLED_BACK  # decided at exactly failingSince + sustainedFor
    assert world.decisions()[-1] == "Rollback"


def test_the_breach_requeue_is_failing_since_plus_sustained_for_minus_now_at_every_cycle_of_the_run():
    world = _canary()
    _fail(world, "1s")
    t0 = world.now
    for step in ("0.9s", "1.1s", "0.25s", "1.5s"):  # t0 + 0.9, 2.0, 2.25, 3.75
        requeue = _fail(world, step)
        left = SUSTAINED - (world.now - t0).total_seconds()
        assert requeue == pytest.approx(left)
        assert 0 < requeue <= SUSTAINED


def test_a_pass_ends_the_run_and_its_requeue():
    world = _canary()
    _fail(world, "1s")
    _fail(world, "1s")
    plan = world.tick(verdict=Verdict.PASS, advance="1s")
    assert plan.requeue_after is not None
    assert plan.requeue_after > 60  # the step's end, ten minutes away: nothing else falls due


def test_an_inconclusive_verdict_keeps_the_run_open_but_only_a_fail_is_due():
    world = _canary()
    _fail(world, "1s")
    _fail(world, "1s")
    plan = world.tick(verdict=Verdict.INCONCLUSIVE, advance="1s")
    assert plan.requeue_after is not None
    assert plan.requeue_after > 60  # sustained() needs the latest verdict to be Fail


def test_once_the_time_is_up_no_requeue_is_zero_or_negative():
    world = _canary()
    _fail(world, "1s")  # one Fail: sustained() needs a second
    plan = world.tick(traffic=None, advance="10s")  # no analysis for longer than sustainedFor
    assert world.phase is Phase.CANARY
    assert plan.requeue_after is not None
    assert plan.requeue_after > 60  # the step's end; the next verdict decides the breach


def test_a_paused_canary_still_comes_back_for_its_breach():
    world = _canary()
    world.annotate(PAUSE, "1")
    world.tick(verdict=Verdict.PASS, advance="1s")
    assert world.phase is Phase.PAUSED
    paused = world.tick(verdict=Verdict.PASS, advance="1s")
    assert paused.requeue_after is None  # a pause stops the step's clock

    _fail(world, "1s")
    requeue = _fail(world, "2.5s")
    assert requeue == pytest.approx(SUSTAINED - 2.5)  # a pause never stops a rollback
    world.tick(verdict=Verdict.FAIL, advance="1.5s")
    assert world.phase is Phase.ROLLED_BACK


def test_a_run_from_before_the_step_clock_restarted_is_not_due():
    world = _canary()
    world.annotate(PAUSE, "1")
    world.tick(verdict=Verdict.PASS, advance="1s")
    _fail(world, "1s")
    _fail(world, "1s")
    world.annotate(RESUME, "1")
    plan = world.tick(verdict=Verdict.FAIL, advance="1s")  # the resume restarts the step clock: a streak never
    assert world.phase is Phase.CANARY  # spans a step start
    assert plan.requeue_after is not None
    assert plan.requeue_after == pytest.approx(600)  # the new step's end only


def test_the_stable_guard_comes_back_for_its_breach():
    world = World.given(_fast_spec(**{"rollout.stepDuration": "30s"}))
    world.run_until(in_phase(Phase.STABLE), limit="1h")
    assert world.plan is not None
    assert world.plan.requeue_after is None  # at rest nothing falls due
    _fail(world, "1s")
    requeue = _fail(world, "1s")
    assert requeue == pytest.approx(SUSTAINED - 1)
    world.tick(verdict=Verdict.FAIL, advance="3s")
    assert world.phase is Phase.ROLLED_BACK


def test_a_breach_where_nothing_rolls_back_is_not_due():
    world = World.given(_fast_spec(**{"rollout.stepDuration": "30s"}))
    world.run_until(in_phase(Phase.STABLE), limit="1h")
    _fail(world, "1s")
    _fail(world, "1s")
    world.tick(verdict=Verdict.FAIL, advance="3s")
    assert world.phase is Phase.ROLLED_BACK
    assert _fail(world, "1s") is None  # rolled back: the ladder halts, no guard runs


def test_a_baseline_breach_is_not_due():
    world = World.given(_fast_spec(**{"rollout.baselineDuration": "10m"}))
    _fail(world, "1s")
    requeue = _fail(world, "1s")
    assert world.phase is Phase.BASELINE
    assert requeue is not None
    assert requeue > 60  # the baseline's end: a breach in the baseline rolls nothing back
