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
  ``startup.progress_deadline_seconds`` stretches it with the pinned pool)
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
  A verdict while a role has no Ready pod yet starts no streak (``evidence_of``).
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

from kvoffload.api.conventions import (
    DEGRADED,
    INVALID,
    MANUAL_ANNOTATIONS,
    PROGRESSING,
    READY,
    RECONCILING,
    STALLED,
    Decision,
    Reason,
)
from kvoffload.api.errors import summary
from kvoffload.api.status import HistoryEntry, KVOffloadPolicyStatus, Mode
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.policy.ladder import Level
from kvoffload.rollout import conditions as cond
from kvoffload.rollout.climb import continue_ladder, start_ladder
from kvoffload.rollout.context import Ctx, Outcome, spec_digest
from kvoffload.rollout.manual import manual_action, next_manual
from kvoffload.rollout.observations import Observations
from kvoffload.rollout.observe import observed_roles, observing, switch_text, switched, without_roles
from kvoffload.rollout.plan import Event, Plan
from kvoffload.rollout.record import HISTORY_LIMIT, evidence_of, roles_starting, write_plan
from kvoffload.rollout.rollback import failure_of, roll_back
from kvoffload.rollout.takeover import template_changed


def decide(
    spec: KVOffloadPolicySpec,
    status: KVOffloadPolicyStatus | None,
    observations: Observations,
    now: datetime,
) -> Plan:
    """The next step of the ladder for one policy.

    Pure: the same inputs give the same Plan, and neither input is changed.
    ``observations.sized`` is the sized plan of ``spec`` (``policy.sized``): its ladder is the one climbed,
    and the status' hostMemory and selector come from it. Guarantees: no promotion without a Pass verdict at
    the end of a full step (or a manual promote); the fleet never has zero
    replicas; it never asks for more than ``(replicas + maxSurge)`` replicas.
    """
    ladder = observations.sized.ladder
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
        evidence=evidence_of(current, observations.assessment, now, starting=roles_starting(current, observations)),
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
        return write_plan(ctx, start_ladder(ctx, _map_level(ctx), Reason.NEW_LADDER, "status was incomplete"))
    if (failure := failure_of(ctx, mode)) is not None:
        return write_plan(ctx, roll_back(ctx, mode, *failure))
    if (key := next_manual(ctx)) is not None:
        return write_plan(ctx, manual_action(ctx, mode, key))
    return write_plan(ctx, continue_ladder(ctx, mode))


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


def _start_fresh(ctx: Ctx, reason: Reason = Reason.NEW_LADDER, why: str = "") -> Outcome:
    """A policy seen for the first time (or one that switched ``observeOnly``): a ladder from GPU-only, or from
    the level that already runs."""
    adopted = _adopted_level(ctx)
    level = adopted or ctx.ladder[0]
    why += f"adopted the running {level.name} Deployment; " if adopted else ""
    seen = {k: v for k in MANUAL_ANNOTATIONS if (v := ctx.obs.annotations.get(k, ""))}
    outcome = start_ladder(ctx, level, reason, f"{why}ladder {' → '.join(lv.name for lv in ctx.ladder)}")
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
    outcome = start_ladder(
        ctx, level, Reason.SPEC_CHANGED, f"generation {old} → {ctx.obs.generation}: {dropped}stable level {level.name}"
    )
    return outcome  # the old canary drains, paced, as the new ladder's stable level grows Ready


def _new_template(ctx: Ctx, what: str) -> Outcome:
    """The taken-over Deployment runs another engine now (an image, a flag): what was judged on the old one
    proves nothing, so the new ladder starts from GPU-only, as a new policy does."""
    dropped = f"dropped canary {ctx.level_name(ctx.status.canary.level)}; " if ctx.status.canary else ""
    return start_ladder(
        ctx, ctx.ladder[0], Reason.WORKLOAD_CHANGED, f"{what}: {dropped}stable level {ctx.ladder[0].name}"
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
