"""Conditions keep Kubernetes conventions, and the phase is read off them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from kvoffload.api.conventions import DEGRADED, PAUSED, PROGRESSING, READY, Reason
from kvoffload.api.status import Condition, Mode, Phase, StageStatus
from kvoffload.rollout import conditions as cond

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
LATER = T0 + timedelta(minutes=5)


def test_a_new_condition_gets_now_as_its_transition_time():
    conditions = cond.set_condition([], READY, True, Reason.LADDER_COMPLETE, "done", T0, generation=3)

    assert conditions == [
        Condition(
            type="Ready",
            status="True",
            reason="LadderComplete",
            message="done",
            last_transition_time=T0,
            observed_generation=3,
        )
    ]


def test_an_unchanged_status_keeps_last_transition_time_even_when_reason_and_message_change():
    before = cond.set_condition([], PROGRESSING, True, Reason.CANARY_RUNNING, "canary cpu", T0)

    after = cond.set_condition(before, PROGRESSING, True, Reason.PROMOTION_RUNNING, "cpu at 50%", LATER)

    (progressing,) = after
    assert progressing.last_transition_time == T0
    assert (progressing.reason, progressing.message) == ("PromotionRunning", "cpu at 50%")


def test_a_changed_status_moves_last_transition_time():
    before = cond.set_condition([], DEGRADED, False, Reason.AS_EXPECTED, "", T0)

    after = cond.set_condition(before, DEGRADED, True, Reason.CANARY_OOM_KILLED, "pod x OOMKilled", LATER)

    assert after[0].status == "True"
    assert after[0].last_transition_time == LATER


def test_setting_a_condition_leaves_the_input_list_and_the_other_conditions_alone():
    before = cond.set_condition([], READY, False, Reason.ROLLOUT_IN_PROGRESS, "", T0)
    before = cond.set_condition(before, PAUSED, False, Reason.NOT_PAUSED, "", T0)
    snapshot = [c.model_copy() for c in before]

    after = cond.set_condition(before, PAUSED, True, Reason.PAUSED, "by hand", LATER)

    assert before == snapshot
    assert [c.type for c in after] == ["Ready", "Paused"]
    assert after[0] is before[0]


def _conds(**statuses: bool | tuple[bool, Reason]) -> list[Condition]:
    out: list[Condition] = []
    for type_, value in statuses.items():
        status, reason = value if isinstance(value, tuple) else (value, Reason.AS_EXPECTED)
        out = cond.set_condition(out, type_, status, reason, "", T0)
    return out


def _stage(step: int) -> StageStatus:
    return StageStatus(index=2, name="cpu", step=step, started_at=T0)


@pytest.mark.parametrize(
    ("conditions", "mode", "stage", "phase"),
    [
        pytest.param([], None, None, Phase.PENDING, id="nothing-yet-is-pending"),
        pytest.param(_conds(Progressing=True), Mode.BASELINE, _stage(0), Phase.BASELINE, id="baseline-running"),
        pytest.param(_conds(Progressing=True), Mode.STEP, _stage(0), Phase.CANARY, id="step-0-canary"),
        pytest.param(_conds(Progressing=True), Mode.STEP, _stage(2), Phase.PROMOTING, id="step-2-promoting"),
        pytest.param(_conds(Ready=True, Progressing=False), Mode.STABLE, _stage(0), Phase.STABLE, id="stable"),
        pytest.param(_conds(Degraded=True), Mode.ROLLED_BACK, _stage(0), Phase.ROLLED_BACK, id="rolled-back"),
        pytest.param(_conds(Paused=True), Mode.STEP, _stage(0), Phase.PAUSED, id="paused-wins"),
        pytest.param(_conds(AnalysisInconclusive=True), Mode.STEP, _stage(0), Phase.PAUSED, id="inconclusive-pauses"),
        pytest.param(_conds(Paused=True), Mode.ROLLED_BACK, _stage(0), Phase.PAUSED, id="paused-over-rolled-back"),
        pytest.param(_conds(Invalid=True, Paused=True), Mode.STABLE, _stage(0), Phase.INVALID, id="invalid-wins-all"),
        pytest.param(
            _conds(Progressing=(True, Reason.BASELINE_RUNNING)),
            Mode.STEP,
            _stage(0),
            Phase.CANARY,
            id="a-reason-does-not-decide-the-phase",
        ),
    ],
)
def test_the_phase_is_derived_from_the_mode_and_the_stopping_conditions(conditions, mode, stage, phase):
    assert cond.derive_phase(conditions, mode, stage) is phase
