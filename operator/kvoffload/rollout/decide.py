"""The ladder state machine: ``decide(spec, status, observations, now) -> Plan``.

One pure function decides, each cycle, what the fleet should run next. The
kopf handler gathers ``Observations`` (Deployments, pods, annotations, this
cycle's ``Assessment``), calls ``decide`` and applies the ``Plan``: the
Deployments per variant, the new status, the Events. ``decide`` does no I/O,
never reads the clock and never touches spec (GitOps owns it).

The rules (docs/design.md, "The ladder" and "Analysis"):

- **Baseline.** A new ladder starts with every replica on the stable level
  (GPU-only for a new policy) for ``baselineDuration``. Inconclusive extends
  it; then the stable figures go into ``status.baseline``. A fleet already
  over budget still climbs (offload may be the cure), with a Warning Event.
  A new ladder that starts at the top level is Stable at once.
- **Canary.** ``canaryReplicas`` run the next level. With ``maxSurge: s`` the
  stable side shrinks by ``max(0, canary - s)``, so the fleet never uses more
  than ``(replicas + maxSurge) × gpu.count`` GPUs.
- **Roles, not pods.** Every level runs in its own Deployment, named by level;
  "stable" and "canary" are roles in status. At 100% the canary level's
  Deployment becomes stable and keeps its pods; the old stable level is
  recorded as ``retiring`` and drains. Every move of replicas from one level
  to another is paced (``pace``): the new level grows as far as the GPU budget
  ``replicas + maxSurge`` allows, and a Ready pod of the old level goes only
  while Ready replicas stay at or above ``replicas - max(0, canaryReplicas -
  maxSurge)`` (``replicas`` itself across a promotion to 100% with ``maxSurge
  >= 1``); pods that are not Ready go first and cost nothing. With ``maxSurge:
  0`` there is no spare GPU, so a swap takes a Ready pod away before its
  replacement is Ready; the transition's Event says so (CapacityDip). A canary
  with a hard failure goes at once; after a sustained breach, an abort or a new
  spec it drains, paced, as the stable level's pods become Ready.
- **Promotion.** The level then takes ``promotionSteps`` percent of the
  replicas (``ceil(pct × replicas / 100)``, at least ``canaryReplicas``; a step
  that would not add a replica is skipped). Every step lasts ``stepDuration``
  and advances only on a Pass verdict at its end with every canary Ready;
  never on Inconclusive or Fail. At 100% the level becomes stable and the next
  level's canary starts; at the top the phase is Stable. ``autoPromote:
  false`` waits at the end of each step for ``kvoffload.io/promote``.
- **Preflight** (``spec.rollout.preflight``, off when absent): at the end of a
  GPU-only baseline, before any canary, ``rollout.preflight.judge`` decides from
  the baseline's figures and the restore price whether offload can pay. When it
  cannot, the fleet holds on GPU-only (mode and phase Held, ``OffloadWillNotPay``
  and ``Stalled`` True, a Warning Event, a history entry) and no canary is ever
  started while it holds; promote is refused there; ``kvoffload.io/retry`` or a
  new generation starts a new baseline and judges again. A baseline cut short by
  ``kvoffload.io/promote`` is not judged (a person chose to go on without evidence).
- **The CPU pilot** is canary-only: when it passes, the canary moves on to the
  full CPU level while the stable side stays where it is.
- **Rollback.** A Fail that has held for ``sustainedFor`` (``analysis.sustained``)
  or a hard failure (a canary pod OOMKilled, restarted or in CrashLoopBackOff,
  a canary engine that allocated another CPU tier than the level rendered, as
  ``vllm:kv_offload_config_info`` shows from vLLM 0.33 on (``liveConfig`` failed),
  or canaries not Ready within the progress deadline from the step start;
  ``sizing.progress_deadline_seconds`` stretches it with the pinned pool)
  removes the canary; the stable level stays exactly as it was (index and
  config hash). The ladder then halts (RolledBack) until a new generation or
  ``kvoffload.io/retry``.
- **Stable guard.** At the top level, analysis goes on against the absolute
  budgets; a sustained breach rolls the whole fleet to the level below
  (skipping the canary-only pilot), phase RolledBack. The guard runs while
  the ladder rests at the top (paused or not); after a rollback the ladder
  halts and nothing moves on its own, so the guard does not run there.
- **Inconclusive** holds; ``maxInconclusive`` in a row pause a baseline or a
  step (``AnalysisInconclusive``) until evidence returns or a person resumes.
  The guard never pauses: a quiet night at the top is not a problem.
- **Manual control** through annotations, each acted on once per change of
  value (``status.annotationsSeen``), one per cycle in the order abort, pause,
  resume, retry, promote. Annotations already on a policy when it is first
  seen are recorded, not acted on.
- **Pause stops forward motion, never a rollback.** While paused nothing
  advances, but a hard failure or a sustained breach still rolls back: an
  engine that is OOM-killed is not left serving because a person looked away.
- **A resume restarts the step clock:** a step's evidence is gathered while
  the policy is running, never across a pause.
- **A streak never spans a step start:** verdicts from before the current step
  began do not count toward its rollback or pause.
- **Spec changed** (a new generation): the canary goes and a new ladder starts
  from the current stable level, found in the new ladder by name; when that
  name is gone, the nearest level below it in the old ladder whose name is
  still there (never the canary-only pilot), else GPU-only. A manual pause
  is kept.
- **Observe-only** (``spec.rollout.observeOnly``, ``rollout.observe``): the same
  decisions over Deployments that are never applied; their observations are
  made of the status and the observed fleet's Ready pods. Switching the flag
  either way starts a new ladder (reason ObserveSwitched).
- **Replicas changed alone** (``/scale``: a new generation whose spec differs only in
  ``replicas``, by ``status.specDigest``): no new ladder; the stage and its clock stay, and the
  shares follow the new count by the step's percentage, paced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime

from kvoffload.analysis.assess import LIVE_CONFIG
from kvoffload.analysis.custom import breach_sustained
from kvoffload.api.conventions import (
    ABORT,
    ANALYSIS_INCONCLUSIVE,
    DEGRADED,
    INVALID,
    MANUAL_ANNOTATIONS,
    OFFLOAD_WILL_NOT_PAY,
    PAUSE,
    PROGRESSING,
    PROMOTE,
    READY,
    RECONCILING,
    RESUME,
    RETRY,
    STALLED,
    Decision,
    Reason,
)
from kvoffload.api.errors import summary
from kvoffload.api.quantity import format_duration, parse_duration
from kvoffload.api.types import BaselineStatus, HistoryEntry, KVOffloadPolicySpec, KVOffloadPolicyStatus, Mode, Verdict
from kvoffload.policy.ladder import Level, build_ladder
from kvoffload.policy.sizing import progress_deadline_seconds
from kvoffload.rollout import conditions as cond
from kvoffload.rollout.context import (
    Ctx,
    Outcome,
    annotation_changed,
    inconclusive_count,
    level_below,
    plan_of,
    preflight_due,
    ready_of,
    spec_digest,
    stable_plan,
    stage_at,
    too_inconclusive,
)
from kvoffload.rollout.observations import Observations, PodObservation
from kvoffload.rollout.observe import observed_roles, observing, switch_text, switched, without_roles
from kvoffload.rollout.pace import target_plans
from kvoffload.rollout.plan import Event, Plan, VariantPlan
from kvoffload.rollout.preflight import PreflightJudgment, judge
from kvoffload.rollout.record import HISTORY_LIMIT, baseline_from, evidence_of, write_plan
from kvoffload.rollout.replicas import canary_replicas, next_step, stable_replicas
from kvoffload.rollout.takeover import template_changed
from kvoffload.rollout.texts import (
    baseline_text,
    cpu_text,
    failing_for,
    figures_text,
    not_scraped_message,
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


def decide(
    spec: KVOffloadPolicySpec,
    status: KVOffloadPolicyStatus | None,
    observations: Observations,
    now: datetime,
) -> Plan:
    """The next step of the ladder for one policy.

    Pure: the same inputs give the same Plan, and neither input is changed.
    ``observations.level_hashes`` must hold every level of ``build_ladder(spec)``
    (KeyError otherwise). Guarantees: no promotion without a Pass verdict at
    the end of a full step (or a manual promote); the fleet never has zero
    replicas; it never asks for more than ``(replicas + maxSurge)`` replicas.
    """
    ladder = build_ladder(spec)
    missing = [lv.index for lv in ladder if lv.index not in observations.level_hashes]
    if missing:
        raise KeyError(f"observations.level_hashes lacks ladder levels {missing}")
    current = status if status is not None else KVOffloadPolicyStatus()
    switching = switched(current, spec)
    if switching:
        current = without_roles(current)
    if observing(spec):  # the Deployments a real climb would run, standing on the observed fleet
        observations = observed_roles(current, observations)
    ctx = Ctx(
        spec=spec,
        ladder=ladder,
        status=current,
        obs=observations,
        now=now,
        evidence=evidence_of(current, observations.assessment, now),
        seen=_seen_still_set(current.annotations_seen, observations.annotations),
    )

    if switching:
        return write_plan(ctx, _start_fresh(ctx, Reason.OBSERVE_SWITCHED, switch_text(spec)))
    if current.stable is None or current.stage is None:
        return write_plan(ctx, _start_fresh(ctx))
    if (moved := template_changed(ctx)) is not None:
        return write_plan(ctx, _new_template(ctx, moved))
    changed = observations.generation != current.observed_generation or current.ladder != [lv.name for lv in ladder]
    if changed and not _resized_only(ctx):  # a change of replicas alone (/scale) resizes the shares in place
        return write_plan(ctx, _new_spec(ctx))
    mode = _mode_of(current)
    if mode is None:
        return write_plan(ctx, _start_ladder(ctx, _map_level(ctx), Reason.NEW_LADDER, "status was incomplete"))
    if (failure := _failure(ctx, mode)) is not None:
        return write_plan(ctx, _roll_back(ctx, mode, *failure))
    if (key := _next_manual(ctx)) is not None:
        return write_plan(ctx, _manual(ctx, mode, key))
    return write_plan(ctx, _continue(ctx, mode))


def invalid(status: KVOffloadPolicyStatus | None, errors: Sequence[str], generation: int | None, now: datetime) -> Plan:
    """The Plan for a spec that fails validation: phase Invalid, the field errors in the
    condition's message, and no Deployment touched (``variants is None``).

    The rest of the status is kept, so a fixed spec (a new generation) resumes
    from the stable level it had.
    """
    current = status if status is not None else KVOffloadPolicyStatus()
    message = summary(errors) or "the spec is invalid"
    was = cond.find(current.conditions, INVALID)
    news = was is None or was.status != "True" or was.message != message
    conditions = cond.set_condition(current.conditions, INVALID, True, Reason.SPEC_INVALID, message, now, generation)
    conditions = cond.set_condition(conditions, RECONCILING, False, Reason.SPEC_INVALID, "", now, generation)
    conditions = cond.set_condition(conditions, STALLED, True, Reason.SPEC_INVALID, message, now, generation)
    history = list(current.history)
    if news:
        stage = current.stage.name if current.stage is not None else ""
        history.append(
            HistoryEntry(time=now, stage=stage, decision=Decision.INVALID, reason=Reason.SPEC_INVALID, message=message)
        )
    new_status = current.model_copy(
        update={
            "conditions": conditions,
            "phase": cond.derive_phase(conditions, current.mode, current.stage),
            "observed_generation": generation,
            "history": history[-HISTORY_LIMIT:],
            "message": f"invalid spec: {message}",
        }
    )
    events = (Event("Warning", Reason.SPEC_INVALID, message),) if news else ()
    return Plan(status=new_status, variants=None, events=events)


def _mode_of(status: KVOffloadPolicyStatus) -> Mode | None:
    if status.mode is not None:
        return status.mode
    # A status written before the mode had a field of its own: read it off the conditions once.
    if status.canary is not None:
        return Mode.STEP
    progressing = cond.find(status.conditions, PROGRESSING)
    if progressing is not None and progressing.status == "True" and progressing.reason == Reason.BASELINE_RUNNING:
        return Mode.BASELINE
    if cond.is_true(status.conditions, DEGRADED):
        return Mode.ROLLED_BACK
    if cond.is_true(status.conditions, READY):
        return Mode.STABLE
    return None


def _failure(ctx: Ctx, mode: Mode) -> tuple[Reason, str] | None:
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
    deadline = progress_deadline_seconds(ctx.spec, level)
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


def _next_manual(ctx: Ctx) -> str | None:
    return next((key for key in MANUAL_ANNOTATIONS if annotation_changed(ctx.obs.annotations, ctx.seen, key)), None)


def _continue(ctx: Ctx, mode: Mode) -> Outcome:
    if _newly_inconclusive(ctx, mode):
        return _pause_inconclusive(ctx, mode)
    if mode is Mode.BASELINE:
        return _run_baseline(ctx)
    if mode is Mode.STEP:
        return _run_step(ctx)
    return _hold(ctx, mode)


def _start_fresh(ctx: Ctx, reason: Reason = Reason.NEW_LADDER, why: str = "") -> Outcome:
    """A policy seen for the first time (or one that switched ``observeOnly``): a ladder from GPU-only, or from
    the level that already runs."""
    adopted = _adopted_level(ctx)
    level = adopted or ctx.ladder[0]
    why += f"adopted the running {level.name} Deployment; " if adopted else ""
    seen = {k: v for k in MANUAL_ANNOTATIONS if (v := ctx.obs.annotations.get(k, ""))}
    outcome = _start_ladder(ctx, level, reason, f"{why}ladder {' → '.join(lv.name for lv in ctx.ladder)}")
    return replace(outcome, seen=seen, paused=False)


def _resized_only(ctx: Ctx) -> bool:
    """The new generation changed ``replicas`` and nothing else (an autoscaler through /scale): the ladder
    goes on where it is, and the shares follow the new count by the step's percentages. Not after an
    invalid generation: a fixed spec starts a new ladder, as any other change does."""
    same_ladder = ctx.status.ladder == [lv.name for lv in ctx.ladder]
    digest = ctx.status.spec_digest
    was_invalid = cond.is_true(ctx.status.conditions, INVALID)
    return same_ladder and not was_invalid and digest is not None and digest == spec_digest(ctx.spec)


def _new_spec(ctx: Ctx) -> Outcome:
    level = _map_level(ctx)
    old = ctx.status.observed_generation
    dropped = f"dropped canary {ctx.level_name(ctx.status.canary.level)}; " if ctx.status.canary else ""
    outcome = _start_ladder(
        ctx, level, Reason.SPEC_CHANGED, f"generation {old} → {ctx.obs.generation}: {dropped}stable level {level.name}"
    )
    return outcome  # the old canary drains, paced, as the new ladder's stable level grows Ready


def _new_template(ctx: Ctx, what: str) -> Outcome:
    """The taken-over Deployment runs another engine now (an image, a flag): what was judged on the old one
    proves nothing, so the new ladder starts from GPU-only, as a new policy does."""
    dropped = f"dropped canary {ctx.level_name(ctx.status.canary.level)}; " if ctx.status.canary else ""
    return _start_ladder(
        ctx, ctx.ladder[0], Reason.WORKLOAD_CHANGED, f"{what}: {dropped}stable level {ctx.ladder[0].name}"
    )


def _start_ladder(ctx: Ctx, level: Level, reason: Reason, why: str) -> Outcome:
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
        return _hold(ctx, Mode.BASELINE)
    if ctx.elapsed < duration:
        return _hold(ctx, Mode.BASELINE, f"measuring the baseline: {progress_text(ctx, duration)}")
    verdict = ctx.obs.assessment
    if verdict is None or verdict.verdict is Verdict.INCONCLUSIVE:
        why = verdict.message if verdict is not None else "no analysis this cycle"
        return _hold(ctx, Mode.BASELINE, f"baseline extended ({format_duration(ctx.elapsed)}): {why}")
    return _finish_baseline(ctx, manual=False)


def _finish_baseline(ctx: Ctx, *, manual: bool) -> Outcome:
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
        return _hold(ctx, Mode.STEP)
    warming = "" if warmed_up_canary(ctx.spec, ctx.status, ctx.now) else f", {warming_text(ctx)}"
    stuck = unschedulable_text([p for p in ctx.obs.canary.pods if p.config_hash in (None, canary.config_hash)])
    if ctx.elapsed < duration:
        return _hold(
            ctx, Mode.STEP, f"{step_name(ctx)}: {progress_text(ctx, duration)}{warming}, {verdict_text(ctx)}{stuck}"
        )
    ready = ready_of(ctx.obs.canary, canary.config_hash)
    wanted = canary_replicas(ctx.spec, ctx.stage.step)
    if ready < wanted:  # first: the warm-up waits for them too
        return _hold(ctx, Mode.STEP, f"{step_name(ctx)}: waiting for canaries Ready ({ready}/{wanted}){stuck}")
    if warming:
        return _hold(ctx, Mode.STEP, f"{step_name(ctx)}: step over, {warming_text(ctx)}; {verdict_text(ctx)}")
    verdict = ctx.obs.assessment
    if verdict is None or verdict.verdict is not Verdict.PASS:
        return _hold(ctx, Mode.STEP, f"{step_name(ctx)}: step over, waiting for a Pass; {verdict_text(ctx)}")
    if not ctx.spec.rollout.auto_promote:
        return _hold(
            ctx,
            Mode.STEP,
            f"{step_name(ctx)}: passed ({figures_text(ctx.evidence)}); waiting for {PROMOTE}",
            reason=Reason.AWAITING_PROMOTION,
        )
    return _promote(ctx, manual=False)


def _promote(ctx: Ctx, *, manual: bool) -> Outcome:
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


def _roll_back(ctx: Ctx, mode: Mode, reason: Reason, why: str) -> Outcome:
    """The canary goes; the stable level stays exactly (the guard: the fleet drops a level)."""
    if mode is Mode.STABLE:
        current = ctx.level(ctx.stable.level)
        below = level_below(ctx, current)
        assert below is not None  # _failure checks it
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


def _manual(ctx: Ctx, mode: Mode, key: str) -> Outcome:
    """Act on one changed annotation (and remember its value), or say why it does nothing."""
    seen = {**ctx.seen, key: ctx.obs.annotations[key]}
    stopped = ctx.paused or cond.is_true(ctx.status.conditions, ANALYSIS_INCONCLUSIVE)
    outcome: Outcome | None = None
    if key == ABORT and mode in (Mode.BASELINE, Mode.STEP):
        outcome = replace(_roll_back(ctx, mode, Reason.ABORTED, f"aborted by {ABORT}"), decision=Decision.ABORT)
    elif key == PAUSE and mode not in (Mode.ROLLED_BACK, Mode.HELD) and not ctx.paused:
        message = f"paused by {PAUSE}: nothing advances until {RESUME} (rollbacks still apply)"
        outcome = _hold(
            ctx, mode, message, paused=True, event=Event("Normal", Reason.PAUSED, message), decision=Decision.PAUSE
        )
    elif key == RESUME and stopped:
        outcome = _resume(ctx, mode)
    elif key == RETRY and (mode in (Mode.ROLLED_BACK, Mode.HELD) or stopped):
        level = ctx.level(ctx.stable.level)
        outcome = replace(
            _start_ladder(ctx, level, Reason.RETRY, f"retry by {RETRY} from {level.name}"),
            paused=False,
            inconclusive=False,
        )
    elif key == PROMOTE and mode is Mode.BASELINE:
        outcome = _finish_baseline(ctx, manual=True)
    elif key == PROMOTE and mode is Mode.STEP:
        outcome = _promote(ctx, manual=True)
    elif key == PROMOTE and mode is Mode.HELD:
        message = (
            f"{key}={ctx.obs.annotations[key]!r} ignored: offload will not pay ({OFFLOAD_WILL_NOT_PAY}), so no "
            f"canary starts; set {RETRY} to judge again, or remove rollout.preflight from the spec to climb anyway"
        )
        outcome = _hold(ctx, mode, message, event=Event("Normal", Reason.MANUAL_ACTION_IGNORED, message))
    if outcome is None:
        message = f"{key}={ctx.obs.annotations[key]!r} ignored: nothing to do in phase {ctx.status.phase.value}"
        outcome = _hold(ctx, mode, message, event=Event("Normal", Reason.MANUAL_ACTION_IGNORED, message))
    return replace(outcome, seen=seen)


def _resume(ctx: Ctx, mode: Mode) -> Outcome:
    """Clear the pause and restart the step clock: evidence is gathered while running."""
    stage = ctx.stage.model_copy(update={"started_at": ctx.now}) if mode in (Mode.BASELINE, Mode.STEP) else ctx.stage
    message = f"resumed by {RESUME}; the step clock restarts"
    held = _hold(
        ctx, mode, message, paused=False, event=Event("Normal", Reason.RESUMED, message), decision=Decision.RESUME
    )
    return replace(held, stage=stage, inconclusive=False)


def _newly_inconclusive(ctx: Ctx, mode: Mode) -> bool:
    """``maxInconclusive`` Inconclusive verdicts in a row have just been reached in a baseline or a step."""
    inconclusive = mode in (Mode.BASELINE, Mode.STEP) and too_inconclusive(ctx)
    return inconclusive and not cond.is_true(ctx.status.conditions, ANALYSIS_INCONCLUSIVE)


def _pause_inconclusive(ctx: Ctx, mode: Mode) -> Outcome:
    """Stop where the ladder is, with a Warning: the evidence has been Inconclusive too long."""
    why = not_scraped_message(ctx) or (ctx.evidence.message if ctx.evidence is not None else "")
    message = (
        f"paused: {inconclusive_count(ctx)} Inconclusive verdicts in a row "
        f"(maxInconclusive {ctx.spec.analysis.max_inconclusive}): {why}"
    )
    return _hold(
        ctx, mode, message, event=Event("Warning", Reason.TOO_MANY_INCONCLUSIVE, message), decision=Decision.PAUSE
    )


def _hold(
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


def _seen_still_set(seen: Mapping[str, str], annotations: Mapping[str, str]) -> dict[str, str]:
    """Forget values of annotations that were removed, so setting one again counts as a change."""
    return {k: v for k, v in seen.items() if k in annotations}


def _adopted_level(ctx: Ctx) -> Level | None:
    """A stable Deployment already running a known level with the exact config: keep it."""
    seen = ctx.obs.stable
    if not seen.exists or seen.level is None or not 0 <= seen.level < len(ctx.ladder):
        return None
    level = ctx.ladder[seen.level]
    if level.canary_only or seen.config_hash != ctx.hash_of(level):
        return None
    return level


def _map_level(ctx: Ctx) -> Level:
    """The stable level in the new ladder by name; if gone, the nearest lower old level that remains."""
    by_name = {lv.name: lv for lv in ctx.ladder if not lv.canary_only}
    old = ctx.status.ladder
    index = ctx.stable.level
    for name in reversed(old[: index + 1]):
        if name in by_name:
            return by_name[name]
    return ctx.ladder[0]


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
