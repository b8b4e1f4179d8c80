"""Manual control: the annotations abort, pause, resume, retry and promote, each acted on once per change
of its value.
"""

from __future__ import annotations

from dataclasses import replace

from kvoffload.api.conventions import (
    ABORT,
    ANALYSIS_INCONCLUSIVE,
    MANUAL_ANNOTATIONS,
    OFFLOAD_WILL_NOT_PAY,
    PAUSE,
    PROMOTE,
    RESUME,
    RETRY,
    Decision,
    Reason,
)
from kvoffload.api.status import Mode
from kvoffload.rollout import conditions as cond
from kvoffload.rollout.climb import finish_baseline, promote, start_ladder
from kvoffload.rollout.context import Ctx, Outcome, annotation_changed
from kvoffload.rollout.hold import hold
from kvoffload.rollout.plan import Event
from kvoffload.rollout.rollback import roll_back


def next_manual(ctx: Ctx) -> str | None:
    return next((key for key in MANUAL_ANNOTATIONS if annotation_changed(ctx.obs.annotations, ctx.seen, key)), None)


def manual_action(ctx: Ctx, mode: Mode, key: str) -> Outcome:
    """Act on one changed annotation (and remember its value), or say why it does nothing."""
    seen = {**ctx.seen, key: ctx.obs.annotations[key]}
    stopped = ctx.paused or cond.is_true(ctx.status.conditions, ANALYSIS_INCONCLUSIVE)
    outcome: Outcome | None = None
    if key == ABORT and mode in (Mode.BASELINE, Mode.STEP):
        outcome = replace(roll_back(ctx, mode, Reason.ABORTED, f"aborted by {ABORT}"), decision=Decision.ABORT)
    elif key == PAUSE and mode not in (Mode.ROLLED_BACK, Mode.HELD) and not ctx.paused:
        message = f"paused by {PAUSE}: nothing advances until {RESUME} (rollbacks still apply)"
        outcome = hold(
            ctx, mode, message, paused=True, event=Event("Normal", Reason.PAUSED, message), decision=Decision.PAUSE
        )
    elif key == RESUME and stopped:
        outcome = _resume(ctx, mode)
    elif key == RETRY and (mode in (Mode.ROLLED_BACK, Mode.HELD) or stopped):
        level = ctx.level(ctx.stable.level)
        outcome = replace(
            start_ladder(ctx, level, Reason.RETRY, f"retry by {RETRY} from {level.name}"),
            paused=False,
            inconclusive=False,
        )
    elif key == PROMOTE and mode is Mode.BASELINE:
        outcome = finish_baseline(ctx, manual=True)
    elif key == PROMOTE and mode is Mode.STEP:
        outcome = promote(ctx, manual=True)
    elif key == PROMOTE and mode is Mode.HELD:
        message = (
            f"{key}={ctx.obs.annotations[key]!r} ignored: offload will not pay ({OFFLOAD_WILL_NOT_PAY}), so no "
            f"canary starts; set {RETRY} to judge again, or remove rollout.preflight from the spec to climb anyway"
        )
        outcome = hold(ctx, mode, message, event=Event("Normal", Reason.MANUAL_ACTION_IGNORED, message))
    if outcome is None:
        message = f"{key}={ctx.obs.annotations[key]!r} ignored: nothing to do in phase {ctx.status.phase.value}"
        outcome = hold(ctx, mode, message, event=Event("Normal", Reason.MANUAL_ACTION_IGNORED, message))
    return replace(outcome, seen=seen)


def _resume(ctx: Ctx, mode: Mode) -> Outcome:
    """Clear the pause and restart the step clock: evidence is gathered while running."""
    stage = ctx.stage.model_copy(update={"started_at": ctx.now}) if mode in (Mode.BASELINE, Mode.STEP) else ctx.stage
    message = f"resumed by {RESUME}; the step clock restarts"
    held = hold(
        ctx, mode, message, paused=False, event=Event("Normal", Reason.RESUMED, message), decision=Decision.RESUME
    )
    return replace(held, stage=stage, inconclusive=False)
