"""What ``decide`` returns: the Deployments per variant, the status to write and the Events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvoffload.api.status import KVOffloadPolicyStatus
from kvoffload.policy.ladder import Level


@dataclass(frozen=True)
class VariantPlan:
    """One variant's desired Deployment: which level, how many replicas, which config."""

    level: int
    replicas: int
    config_hash: str


@dataclass(frozen=True)
class RetiringPlan:
    """A level's Deployment that holds no role any more and drains, paced."""

    level_name: str
    replicas: int
    config_hash: str


@dataclass(frozen=True)
class Variants:
    """The desired Deployments, one per level: the stable and canary roles and what drains.

    ``canary is None``: no canary level. A level's Deployment that none of them names goes.
    """

    stable: VariantPlan
    canary: VariantPlan | None
    retiring: tuple[RetiringPlan, ...] = ()

    @property
    def total_replicas(self) -> int:
        roles = self.stable.replicas + (self.canary.replicas if self.canary is not None else 0)
        return roles + sum(r.replicas for r in self.retiring)


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to record on the policy."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    """What to apply: the Deployments, the status, the Events.

    ``variants is None`` means touch no Deployment (an invalid spec).
    """

    status: KVOffloadPolicyStatus
    variants: Variants | None
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None
    """Seconds after the decision's ``now`` until the next decision is due (a step ends, another annotation waits, an
    open Fail run reaches ``sustainedFor``), if useful; always more than zero."""


@dataclass(frozen=True)
class AnalysisSubject:
    """What the adapter passes to ``assess()`` this cycle."""

    level: Level
    """The level whose engines are judged: the canary's, else the stable's."""
    warmed_up: bool
    """True after the first half of a canary or promotion step (external share and tier hits gated)."""
    stable_side: bool = True
    """False when the canary runs every replica: no stable p99 shares the window to compare with."""
    comparing: bool = True
    """False until the step's canary is judged (``status.warmup.judgedFrom``): its latency rows are not gated."""
