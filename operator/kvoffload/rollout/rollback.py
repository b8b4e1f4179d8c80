"""Rolling back: what makes the newest level go (a canary's hard failure, a sustained breach, the stable
guard) and the outcome that takes it away.
"""

from __future__ import annotations

from dataclasses import replace

from kvoffload.analysis.assess import LIVE_CONFIG
from kvoffload.analysis.custom import breach_sustained
from kvoffload.api.conventions import Decision, Reason
from kvoffload.api.quantity import format_duration
from kvoffload.api.status import Mode
from kvoffload.rollout.context import Ctx, Outcome, level_below, ready_of, stable_plan, stage_at
from kvoffload.rollout.observations import PodObservation
from kvoffload.rollout.plan import Event, VariantPlan
from kvoffload.rollout.replicas import canary_replicas
from kvoffload.rollout.texts import cpu_text, failing_for, figures_text, unschedulable_text


def failure_of(ctx: Ctx, mode: Mode) -> tuple[Reason, str] | None:
    """Why the newest level must go now, if it must: a canary's hard failure or a sustained breach."""
    if mode is Mode.STEP:
        if (hard := _hard_failure(ctx)) is not None:
            return hard
        if breach_sustained(ctx.evidence, ctx.spec.analysis.sustained_for, ctx.now):
            return Reason.ANALYSIS_FAILED, f"canary failed for {failing_for(ctx)}: {figures_text(ctx.evidence)}"
    guarded = mode is Mode.STABLE and level_below(ctx, ctx.level(ctx.stable.level)) is not None
    if guarded and breach_sustained(ctx.evidence, ctx.spec.analysis.sustained_for, ctx.now):
        return Reason.GUARD_BREACH, f"stable fleet over budget for {failing_for(ctx)}: {figures_text(ctx.evidence)}"
    return None


def _hard_failure(ctx: Ctx) -> tuple[Reason, str] | None:
    canary = ctx.status.canary
    assert canary is not None
    level = ctx.level(canary.level)
    pods = [p for p in ctx.obs.canary.pods if p.config_hash in (None, canary.config_hash)]
    where = f"at level {level.name}{cpu_text(level)}"
    for pod in pods:
        if pod.oom_killed:
            return Reason.CANARY_OOM_KILLED, f"canary pod {pod.name} was OOMKilled {where}"
    if (mismatch := _allocation_mismatch(ctx, pods)) is not None:
        return Reason.CANARY_ALLOCATION_MISMATCH, f"{mismatch} {where}"
    for pod in pods:
        if pod.crash_looping:
            return Reason.CANARY_CRASH_LOOPING, f"canary pod {pod.name} is in CrashLoopBackOff {where}"
    for pod in pods:
        if pod.restarts > 0:
            return Reason.CANARY_RESTARTED, f"canary pod {pod.name} restarted {pod.restarts} time(s) {where}"
    deadline = ctx.sized(level).progress_deadline_seconds
    ready = ready_of(ctx.obs.canary, canary.config_hash)
    wanted = canary_replicas(ctx.spec, ctx.stage.step)
    if ready < wanted and ctx.elapsed >= deadline:
        return (
            Reason.PROGRESS_DEADLINE_EXCEEDED,
            f"only {ready}/{wanted} canary replicas Ready {format_duration(ctx.elapsed)} after the step "
            f"started (progress deadline {format_duration(deadline)}) {where}{unschedulable_text(pods)}",
        )
    return None


def _allocation_mismatch(ctx: Ctx, pods: list[PodObservation]) -> str | None:
    """The figures, when this cycle's analysis of the canary found an engine that allocated another CPU tier.

    Judged only while every canary pod runs the current config: a pod of an older level that has not
    gone yet would otherwise speak for the new one.
    """
    assessment = ctx.obs.assessment
    measurements = ctx.obs.measurements
    if assessment is None or measurements is None or measurements.canary is None:
        return None
    if not pods or len(pods) != len(ctx.obs.canary.pods):
        return None
    live = assessment.metric(LIVE_CONFIG)
    if live is None or live.passed is not False:
        return None
    return live.message or "the canary engine allocated another CPU tier than rendered"


def roll_back(ctx: Ctx, mode: Mode, reason: Reason, why: str) -> Outcome:
    """The canary goes; the stable level stays exactly (the guard: the fleet drops a level)."""
    if mode is Mode.STABLE:
        current = ctx.level(ctx.stable.level)
        below = level_below(ctx, current)
        assert below is not None  # failure_of checks it
        landing = below
        target = VariantPlan(below.index, ctx.spec.replicas, ctx.hash_of(below))
        message = f"{why}; took away {current.name}: the fleet rolls back to {below.name}"
    else:
        target = replace(stable_plan(ctx), replicas=ctx.spec.replicas)
        landing = ctx.level(target.level)
        dropped = f"canary {ctx.level_name(ctx.status.canary.level)} removed" if ctx.status.canary else "ladder halted"
        message = f"{why}; {dropped}, all {ctx.spec.replicas} replicas on {landing.name} ({target.config_hash})"
    return Outcome(
        mode=Mode.ROLLED_BACK,
        stage=stage_at(landing, 0, ctx.now),
        stable=target,
        canary=None,
        reason=reason,
        message=message,
        event=Event("Warning", reason, message),
        decision=Decision.ROLLBACK,
        paused=False,
        inconclusive=False,
        # A broken canary goes at once; a healthy-but-slow one (a breach, an abort) drains as the stable level's
        # pods become Ready: at the last step with maxSurge 0 it holds every Ready replica (Flagger #1932).
        drop_canary=reason not in (Reason.ANALYSIS_FAILED, Reason.ABORTED),
    )
