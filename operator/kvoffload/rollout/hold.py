"""Holding: the roles stay where they are (the pacing goes on toward their targets), with the reason why;
and the pause once the evidence has been Inconclusive too long.
"""

from __future__ import annotations

from kvoffload.api.conventions import ANALYSIS_INCONCLUSIVE, DEGRADED, RESUME, Decision, Reason
from kvoffload.api.status import Mode
from kvoffload.rollout import conditions as cond
from kvoffload.rollout.context import Ctx, Outcome, inconclusive_count, too_inconclusive
from kvoffload.rollout.pace import target_plans
from kvoffload.rollout.plan import Event
from kvoffload.rollout.texts import not_scraped_message


def newly_inconclusive(ctx: Ctx, mode: Mode) -> bool:
    """``maxInconclusive`` Inconclusive verdicts in a row have just been reached in a baseline or a step."""
    inconclusive = mode in (Mode.BASELINE, Mode.STEP) and too_inconclusive(ctx)
    return inconclusive and not cond.is_true(ctx.status.conditions, ANALYSIS_INCONCLUSIVE)


def pause_inconclusive(ctx: Ctx, mode: Mode) -> Outcome:
    """Stop where the ladder is, with a Warning: the evidence has been Inconclusive too long."""
    why = not_scraped_message(ctx) or (ctx.evidence.message if ctx.evidence is not None else "")
    message = (
        f"paused: {inconclusive_count(ctx)} Inconclusive verdicts in a row "
        f"(maxInconclusive {ctx.spec.analysis.max_inconclusive}): {why}"
    )
    return hold(
        ctx, mode, message, event=Event("Warning", Reason.TOO_MANY_INCONCLUSIVE, message), decision=Decision.PAUSE
    )


def hold(
    ctx: Ctx,
    mode: Mode,
    message: str | None = None,
    *,
    reason: Reason | None = None,
    paused: bool | None = None,
    event: Event | None = None,
    decision: Decision | None = None,
) -> Outcome:
    """Keep the roles where they are (the pacing goes on toward their targets); report why (a pause on
    too many Inconclusive verdicts included)."""
    stable, canary = target_plans(ctx, mode)
    if reason is None:
        reason = _resting_reason(ctx, mode)
    inconclusive = mode in (Mode.BASELINE, Mode.STEP) and too_inconclusive(ctx)
    if message is None:
        if paused if paused is not None else ctx.paused:
            message = f"paused; set {RESUME} to go on"
        elif inconclusive:
            message = (
                f"paused: {inconclusive_count(ctx)} Inconclusive verdicts in a row; set {RESUME} or wait for evidence"
            )
            if why := not_scraped_message(ctx):  # say why, every cycle, rather than only in the first one
                message += f": {why}"
        else:
            message = ctx.status.message
    return Outcome(
        mode=mode,
        stage=ctx.stage,
        stable=stable,
        canary=canary,
        reason=reason,
        message=message,
        event=event,
        decision=decision,
        paused=paused,
        inconclusive=inconclusive,
    )


def _resting_reason(ctx: Ctx, mode: Mode) -> Reason:
    if mode is Mode.BASELINE:
        return Reason.BASELINE_RUNNING
    if mode is Mode.STEP:
        return Reason.CANARY_RUNNING if ctx.stage.step == 0 else Reason.PROMOTION_RUNNING
    if mode is Mode.STABLE:
        return Reason.LADDER_COMPLETE
    if mode is Mode.HELD:
        return Reason.OFFLOAD_WILL_NOT_PAY
    degraded = cond.find(ctx.status.conditions, DEGRADED)
    return Reason(degraded.reason) if degraded is not None and degraded.reason in set(Reason) else Reason.ABORTED
