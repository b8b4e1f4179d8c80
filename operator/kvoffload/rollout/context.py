"""One decision's inputs (``Ctx``), one transition before it is written (``Outcome``), and small reads of them."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from kvoffload.api.conventions import PAUSED, Decision
from kvoffload.api.status import (
    AnalysisStatus,
    BaselineStatus,
    KVOffloadPolicyStatus,
    Mode,
    PreflightStatus,
    StageStatus,
    VariantStatus,
)
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.policy.ladder import Level
from kvoffload.policy.sized import SizedLevel
from kvoffload.rollout import conditions as cond
from kvoffload.rollout.observations import Observations, VariantObservation
from kvoffload.rollout.plan import Event, VariantPlan


@dataclass(frozen=True)
class Ctx:
    """One decision's inputs, read-only."""

    spec: KVOffloadPolicySpec
    ladder: list[Level]
    status: KVOffloadPolicyStatus
    obs: Observations
    now: datetime
    evidence: AnalysisStatus | None
    """lastAnalysis after this cycle's verdict, counting only verdicts since the step started."""
    seen: Mapping[str, str]
    """annotationsSeen to write."""

    def level(self, index: int) -> Level:
        return self.ladder[index]

    def level_name(self, index: int) -> str:
        return self.ladder[index].name if 0 <= index < len(self.ladder) else f"level {index}"

    def sized(self, level: Level) -> SizedLevel:
        return self.obs.sized[level.index]

    def hash_of(self, level: Level) -> str:
        return self.sized(level).config_hash

    @property
    def stage(self) -> StageStatus:
        assert self.status.stage is not None  # decide() starts a fresh ladder otherwise
        return self.status.stage

    @property
    def stable(self) -> VariantStatus:
        assert self.status.stable is not None
        return self.status.stable

    @property
    def elapsed(self) -> float:
        started = self.stage.started_at
        return (self.now - started).total_seconds() if started is not None else math.inf

    @property
    def paused(self) -> bool:
        return cond.is_true(self.status.conditions, PAUSED)

    @property
    def top(self) -> Level:
        return self.ladder[-1]


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """One transition (or hold), before it is written into the status."""

    mode: Mode
    stage: StageStatus
    stable: VariantPlan
    canary: VariantPlan | None
    reason: str
    """The Progressing reason, or the Degraded reason when rolled back."""
    message: str
    event: Event | None = None
    decision: Decision | None = None
    """The history entry's decision; None for a hold."""
    paused: bool | None = None
    """None keeps the Paused condition as it was."""
    inconclusive: bool = False
    baseline: BaselineStatus | None = None
    """A new baseline; None keeps the old one."""
    seen: Mapping[str, str] | None = None
    """annotationsSeen to write; None takes the context's."""
    preflight: PreflightStatus | None = None
    """A new preflight verdict; None keeps the old one (unless ``new_ladder``)."""
    new_ladder: bool = False
    """A new ladder starts: the old ladder's preflight verdict is dropped."""
    drop_canary: bool = False
    """The running canary goes at once, not paced (a hard failure: its pods are broken)."""


def spec_digest(spec: KVOffloadPolicySpec) -> str:
    """A digest of everything in the spec but ``replicas`` (what /scale changes) and ``notifications`` (who is
    told, which changes no engine: a new sink must not start a new ladder). Fields at their defaults are left
    out, so a field a later release adds does not change the digest of a spec that does not set it."""
    text = json.dumps(
        spec.model_dump(mode="json", by_alias=True, exclude={"replicas", "notifications"}, exclude_defaults=True),
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def preflight_due(ctx: Ctx, level: Level) -> bool:
    """A preflight is asked for and this baseline runs on GPU-only: its figures are what offload would change."""
    return ctx.spec.rollout.preflight is not None and not level.offloads


def plan_of(variant: VariantStatus) -> VariantPlan:
    """The VariantPlan a variant status describes."""
    return VariantPlan(variant.level, variant.replicas, variant.config_hash)


def stable_plan(ctx: Ctx) -> VariantPlan:
    return plan_of(ctx.stable)


def stage_at(level: Level, step: int, now: datetime) -> StageStatus:
    return StageStatus(index=level.index, name=level.name, tiers=level.tiers, step=step, started_at=now)


def level_below(ctx: Ctx, level: Level) -> Level | None:
    """The level the guard falls back to: the next lower one that may hold the whole fleet."""
    return next((lv for lv in reversed(ctx.ladder[: level.index]) if not lv.canary_only), None)


def ready_of(seen: VariantObservation, config_hash: str) -> int:
    """Ready replicas running ``config_hash``; a Deployment still on another config counts none."""
    return seen.ready_replicas if seen.exists and seen.config_hash == config_hash else 0


def too_inconclusive(ctx: Ctx) -> bool:
    return inconclusive_count(ctx) >= ctx.spec.analysis.max_inconclusive


def inconclusive_count(ctx: Ctx) -> int:
    return ctx.evidence.consecutive_inconclusive if ctx.evidence is not None else 0


def annotation_changed(annotations: Mapping[str, str], seen: Mapping[str, str], key: str) -> bool:
    value = annotations.get(key, "")
    return bool(value) and seen.get(key) != value
