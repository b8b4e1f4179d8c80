"""Warm-up: a fresh canary's cache fills before comparisons count, and what the analysis compares meanwhile."""

from __future__ import annotations

from datetime import datetime

from kvoffload.api.conventions import Reason
from kvoffload.api.quantity import format_duration, parse_duration
from kvoffload.api.types import KVOffloadPolicySpec, KVOffloadPolicyStatus, Mode, WarmupStatus
from kvoffload.policy.ladder import build_ladder
from kvoffload.rollout.context import Ctx, Outcome
from kvoffload.rollout.plan import AnalysisSubject, Event


def analysis_subject(spec: KVOffloadPolicySpec, status: KVOffloadPolicyStatus | None, now: datetime) -> AnalysisSubject:
    """The level to judge and whether its tiers count as warm.

    Warm after the first half of a canary or promotion step. The stable guard
    and the baseline are never warm: they are held to the absolute budgets only.
    """
    ladder = build_ladder(spec)
    if status is None or status.stable is None or not 0 <= status.stable.level < len(ladder):
        return AnalysisSubject(ladder[0], warmed_up=False)
    if status.canary is None or not 0 <= status.canary.level < len(ladder):
        return AnalysisSubject(ladder[status.stable.level], warmed_up=False)
    started = status.stage.started_at if status.stage is not None else None
    half = parse_duration(spec.rollout.step_duration) / 2
    warm = started is not None and (now - started).total_seconds() >= half
    return AnalysisSubject(
        ladder[status.canary.level],
        warmed_up=warm,
        stable_side=status.stable.replicas > 0,
        comparing=warmed_up_canary(spec, status),
    )


def warmed_up_canary(spec: KVOffloadPolicySpec, status: KVOffloadPolicyStatus) -> bool:
    """The step's canary is warm (``analysis.warmup`` done, or off): its comparisons with stable count.

    A step without a warm-up record (a status written before warm-ups existed) compares at once."""
    if not spec.analysis.warmup.enabled or status.warmup is None:
        return True
    return status.warmup.warm_at is not None


def warmup_of(ctx: Ctx, o: Outcome) -> tuple[WarmupStatus | None, Event | None]:
    """The step's warm-up after this cycle, and the Event when it ended now.

    A new step starts a new warm-up; it ends at the first cycle at which both the least time has
    passed and the canary's requests in the window reach the least count (the later of the two)."""
    analysis = ctx.spec.analysis
    if o.mode is not Mode.STEP or not analysis.warmup.enabled or o.stage.started_at is None:
        return None, None
    before = ctx.status.warmup
    since = o.stage.started_at
    if before is None or before.since != since:
        if before is None and ctx.status.mode is Mode.STEP and ctx.status.stage == o.stage:
            return None, None  # a step that began before warm-ups existed: it compares at once
        return (
            WarmupStatus(
                since=since,
                duration=format_duration(analysis.warmup_seconds()),
                requests=analysis.warmup_requests(),
            ),
            None,
        )
    if before.warm_at is not None:
        return before, None
    sample = ctx.obs.measurements.canary if ctx.obs.measurements is not None else None
    served = sample.requests if sample is not None and sample.requests is not None else before.served
    elapsed = (ctx.now - since).total_seconds()
    if elapsed < analysis.warmup_seconds() or served is None or served < before.requests:
        return before.model_copy(update={"served": served}), None
    level = ctx.level(o.canary.level).name if o.canary is not None else o.stage.name
    message = (
        f"canary {level} warm after {format_duration(elapsed)}: {served:.0f} requests in the analysis window "
        f"(at least {before.requests}) and at least {before.duration} passed; canary/stable comparisons count from now"
    )
    return before.model_copy(update={"served": served, "warm_at": ctx.now}), Event("Normal", Reason.WARMED_UP, message)


def warmup_reason(warmup: WarmupStatus) -> str:
    return (
        f"warm-up: canary/stable ratios and offload hit checks count only after {warmup.duration} and "
        f"{warmup.requests} canary requests in the analysis window, whichever is later (a fresh canary's cache "
        "is empty, the stable engines' is full); the absolute budgets and hard failures apply at once"
    )


def warming_text(ctx: Ctx) -> str:
    w = ctx.status.warmup
    if w is None:
        return "warming up"
    served = "no" if w.served is None else f"{w.served:.0f}"
    return f"warming up ({served} of {w.requests} canary requests in the window, at least {w.duration})"
