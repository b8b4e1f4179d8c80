"""What a status write decided that a person wants to hear of: pure, from the status before and after.

A notification is derived from the transition a cycle wrote, never from the state it found: a history
entry that is new in the written status (Promoted, Rollback, Pause, Invalid, ...), or the ``Progressing``
condition turning to AwaitingPromotion at a step. A cycle that writes nothing new derives nothing, so a
resting policy, a restarted operator and a new leader (whose "before" is the stored status) send nothing
again: at most once per transition (docs/notifications.md says why).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime

from kvoffload.api.conventions import PROGRESSING, Decision, Reason
from kvoffload.api.notifications import NotificationEvent
from kvoffload.api.status import HistoryEntry, KVOffloadPolicyStatus, Mode

EVENT_OF_DECISION: dict[str, NotificationEvent] = {
    Decision.PROMOTED: NotificationEvent.PROMOTED,
    Decision.MANUAL_PROMOTE: NotificationEvent.PROMOTED,
    Decision.LEVEL_PROMOTED: NotificationEvent.PROMOTED,
    Decision.PILOT_PASSED: NotificationEvent.PROMOTED,
    Decision.ROLLBACK: NotificationEvent.ROLLED_BACK,
    Decision.ABORT: NotificationEvent.ROLLED_BACK,
    Decision.PAUSE: NotificationEvent.PAUSED,
    Decision.INVALID: NotificationEvent.INVALID,
}
"""The history decisions that are told, and as what; the others (BaselineTaken, CanaryStarted, Resume, ...)
are routine and stay in status and Events."""


@dataclass(frozen=True)
class Notice:
    """One transition of one policy, as every sink format is made from it."""

    namespace: str
    name: str
    event: NotificationEvent
    time: datetime
    decision: str
    """The history decision, or the condition's reason for AwaitingPromotion."""
    reason: str
    message: str
    phase: str
    level: str
    """The ladder level the decision led to (the history entry's stage)."""
    step: int | None
    """The stage's step there (0 the canary, n promotion step n); None outside a step (at rest, in a baseline)."""
    stable: str | None
    canary: str | None
    observe_only: bool = False
    """Whether the policy only observes (``spec.rollout.observeOnly``, ``status.observe`` set): its ladder is
    climbed in status alone, nothing was applied to any pod."""

    @property
    def id(self) -> str:
        """The same for the same transition, whoever sends it: a receiver may drop a repeat by it."""
        text = f"{self.namespace}/{self.name}\0{self.event}\0{self.decision}\0{self.time.isoformat()}"
        return hashlib.sha256(text.encode()).hexdigest()[:20]


def notices(
    namespace: str, name: str, before: KVOffloadPolicyStatus | None, after: KVOffloadPolicyStatus, now: datetime
) -> list[Notice]:
    """The notifications the write of ``after`` over ``before`` makes, oldest first."""
    old = before.history if before is not None else []
    found = [
        _of_entry(namespace, name, after, entry)
        for entry in after.history
        if entry.decision in EVENT_OF_DECISION and entry not in old
    ]
    waiting = _awaiting(after)
    if waiting is not None and (before is None or _awaiting(before) is None or _step(before) != _step(after)):
        found.append(
            Notice(
                namespace=namespace,
                name=name,
                event=NotificationEvent.AWAITING_PROMOTION,
                time=now,
                decision=Reason.AWAITING_PROMOTION,
                reason=Reason.AWAITING_PROMOTION,
                message=waiting,
                phase=after.phase.value,
                level=after.stage.name if after.stage is not None else "",
                step=after.stage.step if after.stage is not None else None,
                observe_only=after.observe is not None,
                **_roles(after),
            )
        )
    return found


def _of_entry(namespace: str, name: str, after: KVOffloadPolicyStatus, entry: HistoryEntry) -> Notice:
    stage = after.stage
    return Notice(
        namespace=namespace,
        name=name,
        event=EVENT_OF_DECISION[entry.decision],
        time=entry.time,
        decision=entry.decision,
        reason=entry.reason,
        message=entry.message,
        phase=after.phase.value,
        level=entry.stage,
        step=stage.step if stage is not None and stage.name == entry.stage and after.mode is Mode.STEP else None,
        observe_only=after.observe is not None,
        **_roles(after),
    )


def _awaiting(status: KVOffloadPolicyStatus) -> str | None:
    """The Progressing message while a passed step waits for ``kvoffload.io/promote``; else None."""
    c = next((c for c in status.conditions if c.type == PROGRESSING), None)
    if c is not None and c.status == "True" and c.reason == Reason.AWAITING_PROMOTION:
        return c.message
    return None


def _step(status: KVOffloadPolicyStatus) -> tuple[str, int, datetime | None] | None:
    stage = status.stage
    return (stage.name, stage.step, stage.started_at) if stage is not None else None


def _roles(status: KVOffloadPolicyStatus) -> dict[str, str | None]:
    def level(index: int | None) -> str | None:
        return status.ladder[index] if index is not None and 0 <= index < len(status.ladder) else None

    return {
        "stable": level(status.stable.level if status.stable is not None else None),
        "canary": level(status.canary.level if status.canary is not None else None),
    }


__all__ = ["EVENT_OF_DECISION", "Notice", "notices"]
