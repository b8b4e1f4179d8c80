"""``spec.notifications``: which of the admin's webhook sinks a policy's transitions are sent to.

A policy only names sinks; their URLs (and secrets) are the cluster admin's, configured once for the
operator (the chart's ``notifications.sinks``, ``kvoffload run --notifications-config``). So no policy
can make the operator POST to an address of its choosing. The kinds of notification are the
transitions a person wants to hear of: :class:`NotificationEvent`.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, field_validator

from kvoffload.api.fields import DnsLabel, Model


class NotificationEvent(StrEnum):
    """What a notification is about; the ``event`` of its payload."""

    PROMOTED = "Promoted"
    """A step, a level or the pilot passed: history decisions Promoted, ManualPromote, LevelPromoted, PilotPassed."""
    ROLLED_BACK = "RolledBack"
    """A level was taken away: Rollback or Abort."""
    PAUSED = "Paused"
    """Forward motion stopped: a person's pause, or too many Inconclusive verdicts."""
    AWAITING_PROMOTION = "AwaitingPromotion"
    """With ``rollout.autoPromote: false``, a step passed and waits for ``kvoffload.io/promote``."""
    INVALID = "Invalid"
    """The spec fails validation; nothing moves until it is fixed."""


class NotificationsSpec(Model):
    """Where the policy's transitions are told: sinks the cluster admin configured, by name."""

    sinks: list[DnsLabel] = Field(
        min_length=1,
        max_length=8,
        json_schema_extra={"x-kubernetes-list-type": "set"},
        description="Names of notification sinks the cluster admin configured (chart value notifications.sinks); "
        "a name the operator does not know is refused.",
    )
    events: list[NotificationEvent] = Field(
        default_factory=lambda: list(NotificationEvent),
        min_length=1,
        max_length=len(NotificationEvent),
        json_schema_extra={"x-kubernetes-list-type": "set"},
        description="Which transitions to send (default: all of them): Promoted, RolledBack, Paused, "
        "AwaitingPromotion, Invalid.",
    )

    @field_validator("sinks", "events")
    @classmethod
    def _unique(cls, values: list[str]) -> list[str]:
        if len(set(values)) != len(values):
            raise ValueError("must not name the same value twice")
        return values


__all__ = ["NotificationEvent", "NotificationsSpec"]
