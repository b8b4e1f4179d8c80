"""``kvoffload.io/release`` (``kvoffload abort NAME --release``) on a policy with spec.workloadRef: while it is set
the policy is Paused (reason Released), the team's Deployment runs at its recorded count and the operator none of
its own engines. Pure: the adapter (``controller/reconcile.py``) gives the Deployment back and removes its own."""

from __future__ import annotations

from datetime import datetime

from kvoffload.api.conventions import PAUSED, READY, RECONCILING, Decision, Reason
from kvoffload.api.status import HistoryEntry, KVOffloadPolicyStatus
from kvoffload.rollout import conditions as cond
from kvoffload.rollout.plan import Event, Plan
from kvoffload.rollout.record import HISTORY_LIMIT


def is_released(status: KVOffloadPolicyStatus | None) -> bool:
    """The policy handed its Deployment back (``kvoffload.io/release``) and runs nothing of its own."""
    paused = cond.find(status.conditions, PAUSED) if status is not None else None
    return paused is not None and paused.status == "True" and paused.reason == Reason.RELEASED


def released(status: KVOffloadPolicyStatus | None, message: str, generation: int | None, now: datetime) -> Plan:
    """The Plan while ``kvoffload.io/release`` is set: Paused (reason Released) with what the hand-back waits for,
    no Deployment of the ladder touched (the adapter gives the Deployment back and removes its own), the rest of
    the status kept."""
    current = status if status is not None else KVOffloadPolicyStatus()
    news = not is_released(current)
    conditions = cond.set_condition(current.conditions, PAUSED, True, Reason.RELEASED, message, now, generation)
    conditions = cond.set_condition(conditions, READY, False, Reason.RELEASED, message, now, generation)
    conditions = cond.set_condition(conditions, RECONCILING, False, Reason.RELEASED, "", now, generation)
    history = list(current.history)
    if news:
        stage = current.stage.name if current.stage is not None else ""
        history.append(
            HistoryEntry(time=now, stage=stage, decision=Decision.RELEASE, reason=Reason.RELEASED, message=message)
        )
    changed = news or current.message != message
    workload = current.workload
    if workload is not None:
        workload = workload.model_copy(update={"replicas": workload.original_replicas})
    new_status = current.model_copy(
        update={
            "conditions": conditions,
            "phase": cond.derive_phase(conditions, current.mode, current.stage),
            "observed_generation": generation,
            "history": history[-HISTORY_LIMIT:],
            "message": message,
            "workload": workload,
        }
    )
    events = (Event("Normal", Reason.RELEASED, message),) if changed else ()
    return Plan(status=new_status, variants=None, events=events)


def taking_over_again(status: KVOffloadPolicyStatus) -> KVOffloadPolicyStatus:
    """A released policy whose ``kvoffload.io/release`` is gone: a new ladder from GPU-only, as a new policy."""
    conditions = [c for c in status.conditions if c.type != PAUSED]
    return status.model_copy(update={"conditions": conditions, "stable": None, "canary": None, "stage": None})
