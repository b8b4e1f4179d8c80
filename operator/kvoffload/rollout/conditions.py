"""Kubernetes-style conditions of a KVOffloadPolicy, and the phase derived from them.

Conditions follow the Kubernetes conventions: one entry per type, ``status``
True/False/Unknown, a CamelCase ``reason`` from the constants below, and a
``lastTransitionTime`` that moves only when ``status`` changes (a new reason or
message alone keeps it). The phase is never decided on its own: ``derive_phase`` reads it
off the mode and the conditions, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from kvoffload.api.conventions import ANALYSIS_INCONCLUSIVE, INVALID, PAUSED
from kvoffload.api.status import Condition, Mode, Phase, StageStatus

ConditionStatus = Literal["True", "False", "Unknown"]


def find(conditions: Sequence[Condition], type_: str) -> Condition | None:
    """The condition of that type, or None."""
    return next((c for c in conditions if c.type == type_), None)


def is_true(conditions: Sequence[Condition], type_: str) -> bool:
    """Whether the condition of that type exists and is True."""
    found = find(conditions, type_)
    return found is not None and found.status == "True"


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: bool | ConditionStatus,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None = None,
) -> list[Condition]:
    """A new list with that condition set; the input is left alone.

    ``lastTransitionTime`` is kept when ``status`` is unchanged (a new reason or
    message is not a transition) and set to ``now`` when it changes or the
    condition is new. The order of existing conditions is kept; a new one goes last.
    """
    text: ConditionStatus = status if isinstance(status, str) else ("True" if status else "False")
    old = find(conditions, type_)
    since = old.last_transition_time if old is not None and old.status == text else now
    new = Condition(
        type=type_,
        status=text,
        reason=str(reason),
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )
    if old is None:
        return [*conditions, new]
    return [new if c.type == type_ else c for c in conditions]


def derive_phase(conditions: Sequence[Condition], mode: Mode | None, stage: StageStatus | None) -> Phase:
    """The phase a person reads, from the state machine's mode and the conditions that stop it.

    Invalid; then Paused (by a person, or by ``AnalysisInconclusive``); then the mode:
    RolledBack, Held (the preflight found offload cannot pay), Baseline, Canary (step 0) or
    Promoting (step 1 and on), Stable; else Pending.
    """
    if is_true(conditions, INVALID):
        return Phase.INVALID
    if is_true(conditions, PAUSED) or is_true(conditions, ANALYSIS_INCONCLUSIVE):
        return Phase.PAUSED
    if mode is Mode.ROLLED_BACK:
        return Phase.ROLLED_BACK
    if mode is Mode.HELD:
        return Phase.HELD
    if mode is Mode.BASELINE:
        return Phase.BASELINE
    if mode is Mode.STEP:
        return Phase.PROMOTING if stage is not None and stage.step > 0 else Phase.CANARY
    if mode is Mode.STABLE:
        return Phase.STABLE
    return Phase.PENDING
