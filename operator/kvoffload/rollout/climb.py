"""Climbing the ladder: a new ladder's baseline, the preflight's hold, each level's canary and its
promotion steps up to the top (the rules: ``rollout.decide``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from kvoffload.api.conventions import PROMOTE, RETRY, Decision, Reason
from kvoffload.api.quantity import format_duration, parse_duration
from kvoffload.api.status import BaselineStatus, Mode, Verdict
from kvoffload.policy.ladder import Level
from kvoffload.rollout.context import (
    Ctx,
    Outcome,
    plan_of,
    preflight_due,
    ready_of,
    stable_plan,
    stage_at,
    too_inconclusive,
)
from kvoffload.rollout.hold import hold, newly_inconclusive, pause_inconclusive
from kvoffload.rollout.plan import Event, VariantPlan
from kvoffload.rollout.preflight import PreflightJudgment, judge
from kvoffload.rollout.record import baseline_from
from kvoffload.rollout.replicas import canary_replicas, next_step, stable_replicas
from kvoffload.rollout.texts import (
    baseline_text,
    cpu_text,
    figures_text,
    progress_text,
    step_name,
    unschedulable_text,
    verdict_text,
)
from kvoffload.rollout.warmup import warmed_up_canary, warming_text

_DECISIONS: Mapping[Reason, Decision] = {
    Reason.NEW_LADDER: Decision.NEW_LADDER,
    Reason.SPEC_CHANGED: Decision.SPEC_CHANGED,
    Reason.WORKLOAD_CHANGED: Decision.WORKLOAD_CHANGED,
    Reason.RETRY: Decision.RETRY,
    Reason.BASELINE_TAKEN: Decision.BASELINE_TAKEN,
    Reason.CANARY_STARTED: Decision.CANARY_STARTED,
    Reason.PILOT_PASSED: Decision.PILOT_PASSED,
    Reason.PROMOTED: Decision.PROMOTED,
    Reason.MANUAL_PROMOTE: Decision.MANUAL_PROMOTE,
    Reason.LEVEL_PROMOTED: Decision.LEVEL_PROMOTED,
    Reason.OBSERVE_SWITCHED: Decision.OBSERVE_SWITCHED,
}
"""The decision a move on the ladder records, by the reason it moved for."""


def continue_ladder(ctx: Ctx, mode: Mode) -> Outcome:
    if newly_inconclusive(ctx, mode):
        return pause_inconclusive(ctx, mode)
    if mode is Mode.BASELINE:
        return _run_baseline(ctx)
    if mode is Mode.STEP:
        return _run_step(ctx)
    return hold(ctx, mode)


def start_ladder(ctx: Ctx, level: Level, reason: Reason, why: str) -> Outcome:
    """Every replica on ``level``; a baseline when there is a level to climb to, else Stable."""
    stable = VariantPlan(level.index, ctx.spec.replicas, ctx.hash_of(level))
    stage = stage_at(level, 0, ctx.now)
    if level.index == ctx.top.index:
        message = f"{why}; {level.name} is the top level: Stable, the guard watches"
        return Outcome(
            mode=Mode.STABLE,
            stage=stage,
            stable=stable,
            canary=None,
            reason=Reason.LADDER_COMPLETE,
            message=message,
            event=Event("Normal", reason, message),
            decision=_DECISIONS[reason],
            new_ladder=True,
        )
    duration = ctx.spec.rollout.baseline_duration
    message = f"{why}; baseline of {level.name} on {ctx.spec.replicas} replicas for {duration}"
    if preflight_due(ctx, level):
        message += "; then the preflight judges whether offload can pay"
    return Outcome(
        mode=Mode.BASELINE,
        stage=stage,
        stable=stable,
        canary=None,
        reason=Reason.BASELINE_RUNNING,
        message=message,
        event=Event("Normal", reason, message),
        decision=_DECISIONS[reason],
        new_ladder=True,
    )


def _run_baseline(ctx: Ctx) -> Outcome:
    duration = parse_duration(ctx.spec.rollout.baseline_duration)
    if ctx.paused or too_inconclusive(ctx):
        return hold(ctx, Mode.BASELINE)
    if ctx.elapsed < duration:
        return hold(ctx, Mode.BASELINE, f"measuring the baseline: {progress_text(ctx, duration)}")
    verdict = ctx.obs.assessment
    if verdict is None or verdict.verdict is Verdict.INCONCLUSIVE:
        why = verdict.message if verdict is not None else "no analysis this cycle"
        return hold(ctx, Mode.BASELINE, f"baseline extended ({format_duration(ctx.elapsed)}): {why}")
    return finish_baseline(ctx, manual=False)


def finish_baseline(ctx: Ctx, *, manual: bool) -> Outcome:
    """Record the stable figures and start the next level's canary.

    A fleet already over budget does not stop the climb (offload may be the cure),
    but the Event says so as a Warning.
    """
    baseline = baseline_from(ctx)
    level = ctx.level(ctx.stable.level)
    figures = baseline_text(baseline)
    judgment: PreflightJudgment | None = None
    preflight = ctx.spec.rollout.preflight
    if manual:
        why, reason = f"baseline cut short by {PROMOTE} ({figures})", Reason.MANUAL_PROMOTE
        if preflight_due(ctx, level):
            why += "; the preflight was not judged"
    else:
        why = f"baseline of {level.name} taken over {format_duration(ctx.elapsed)}: {figures}"
        reason = Reason.BASELINE_TAKEN
        if preflight is not None and preflight_due(ctx, level):
            judgment = judge(preflight, baseline, ctx.obs.price)
            if not judgment.pays:
                return _hold_will_not_pay(ctx, baseline, judgment, why)
            why += f"; preflight: {judgment.message}"
    outcome = _start_canary(ctx, stable_plan(ctx), ctx.level(level.index + 1), reason, why)
    verdict = ctx.obs.assessment
    if verdict is not None and verdict.verdict is Verdict.FAIL and not manual:
        message = f"{outcome.message}; the {level.name} fleet is already over budget: {verdict.message}"
        outcome = replace(outcome, message=message, event=Event("Warning", reason, message))
    return replace(outcome, baseline=baseline, preflight=judgment.status(ctx.now) if judgment is not None else None)


def _hold_will_not_pay(ctx: Ctx, baseline: BaselineStatus, judgment: PreflightJudgment, why: str) -> Outcome:
    """Offload cannot pay: every replica stays on GPU-only and no canary is spent, until retry or a new spec."""
    level = ctx.level(ctx.stable.level)
    message = (
        f"{why}; {judgment.message}; holding on {level.name}, no canary started: set {RETRY} to take a new "
        "baseline and judge again, or change the spec (without rollout.preflight the ladder climbs anyway)"
    )
    return Outcome(
        mode=Mode.HELD,
        stage=stage_at(level, 0, ctx.now),
        stable=replace(stable_plan(ctx), replicas=ctx.spec.replicas),
        canary=None,
        reason=Reason.OFFLOAD_WILL_NOT_PAY,
        message=message,
        event=Event("Warning", Reason.OFFLOAD_WILL_NOT_PAY, message),
        decision=Decision.OFFLOAD_WILL_NOT_PAY,
        paused=False,
        inconclusive=False,
        baseline=baseline,
        preflight=judgment.status(ctx.now),
    )


def _start_canary(ctx: Ctx, stable: VariantPlan, level: Level, reason: Reason, why: str) -> Outcome:
    """``canaryReplicas`` on ``level``; the stable side shrinks beyond maxSurge."""
    count = canary_replicas(ctx.spec, 0)
    stable = replace(stable, replicas=stable_replicas(ctx.spec, count))
    canary = VariantPlan(level.index, count, ctx.hash_of(level))
    message = (
        f"{why}; canary {level.name}{cpu_text(level)} on {count} of {ctx.spec.replicas} replicas, "
        f"stable {ctx.level(stable.level).name} keeps {stable.replicas}"
    )
    return Outcome(
        mode=Mode.STEP,
        stage=stage_at(level, 0, ctx.now),
        stable=stable,
        canary=canary,
        reason=Reason.CANARY_RUNNING,
        message=message,
        event=Event("Normal", reason, message),
        decision=_DECISIONS[reason],
        inconclusive=False,
    )


def _run_step(ctx: Ctx) -> Outcome:
    canary = ctx.status.canary
    assert canary is not None
    duration = parse_duration(ctx.spec.rollout.step_duration)
    if ctx.paused or too_inconclusive(ctx):
        return hold(ctx, Mode.STEP)
    warming = "" if warmed_up_canary(ctx.spec, ctx.status, ctx.now) else f", {warming_text(ctx)}"
    stuck = unschedulable_text([p for p in ctx.obs.canary.pods if p.config_hash in (None, canary.config_hash)])
    if ctx.elapsed < duration:
        return hold(
            ctx, Mode.STEP, f"{step_name(ctx)}: {progress_text(ctx, duration)}{warming}, {verdict_text(ctx)}{stuck}"
        )
    ready = ready_of(ctx.obs.canary, canary.config_hash)
    wanted = canary_replicas(ctx.spec, ctx.stage.step)
    if ready < wanted:  # first: the warm-up waits for them too
        return hold(ctx, Mode.STEP, f"{step_name(ctx)}: waiting for canaries Ready ({ready}/{wanted}){stuck}")
    if warming:
        return hold(ctx, Mode.STEP, f"{step_name(ctx)}: step over, {warming_text(ctx)}; {verdict_text(ctx)}")
    verdict = ctx.obs.assessment
    if verdict is None or verdict.verdict is not Verdict.PASS:
        return hold(ctx, Mode.STEP, f"{step_name(ctx)}: step over, waiting for a Pass; {verdict_text(ctx)}")
    if not ctx.spec.rollout.auto_promote:
        return hold(
            ctx,
            Mode.STEP,
            f"{step_name(ctx)}: passed ({figures_text(ctx.evidence)}); waiting for {PROMOTE}",
            reason=Reason.AWAITING_PROMOTION,
        )
    return promote(ctx, manual=False)


def promote(ctx: Ctx, *, manual: bool) -> Outcome:
    """The step is done: the next promotion step, the next level, or the top."""
    canary = ctx.status.canary
    assert canary is not None
    level = ctx.level(canary.level)
    evidence = (
        f"promoted by {PROMOTE} without waiting for evidence (last: {figures_text(ctx.evidence)})"
        if manual
        else f"{step_name(ctx)} passed after {format_duration(ctx.elapsed)} ({figures_text(ctx.evidence)})"
    )
    manual_reason = Reason.MANUAL_PROMOTE if manual else None
    if level.canary_only:
        return _start_canary(
            ctx, stable_plan(ctx), ctx.level(level.index + 1), manual_reason or Reason.PILOT_PASSED, evidence
        )
    step = next_step(ctx.spec, ctx.stage.step)
    if step is not None:
        count = canary_replicas(ctx.spec, step)
        stable = replace(stable_plan(ctx), replicas=stable_replicas(ctx.spec, count))
        pct = ctx.spec.rollout.promotion_steps[step - 1]
        message = f"{evidence}; {level.name} now on {count} of {ctx.spec.replicas} replicas ({pct}%)"
        reason = manual_reason or Reason.PROMOTED
        return Outcome(
            mode=Mode.STEP,
            stage=stage_at(level, step, ctx.now),
            stable=stable,
            canary=replace(plan_of(canary), replicas=count),
            reason=Reason.PROMOTION_RUNNING,
            message=message,
            event=Event("Normal", reason, message),
            decision=_DECISIONS[reason],
        )
    promoted = VariantPlan(level.index, ctx.spec.replicas, canary.config_hash)
    reason = manual_reason or Reason.LEVEL_PROMOTED
    if level.index == ctx.top.index:
        message = f"{evidence}; {level.name} is stable on all {ctx.spec.replicas} replicas: the top of the ladder"
        return Outcome(
            mode=Mode.STABLE,
            stage=stage_at(level, 0, ctx.now),
            stable=promoted,
            canary=None,
            reason=Reason.LADDER_COMPLETE,
            message=message,
            event=Event("Normal", reason, message),
            decision=_DECISIONS[reason],
        )
    return _start_canary(ctx, promoted, ctx.level(level.index + 1), reason, f"{evidence}; {level.name} is stable")
