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
  to another is paced (``_pace``): the new level grows as far as the GPU budget
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
- **Replicas changed alone** (``/scale``: a new generation whose spec differs only in
  ``replicas``, by ``status.specDigest``): no new ladder; the stage and its clock stay, and the
  shares follow the new count by the step's percentage, paced.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Literal

from kvoffload.analysis import assess
from kvoffload.analysis.assess import (
    EXTERNAL_SHARE,
    ITL_P99,
    LIVE_CONFIG,
    TTFT_P99,
    Assessment,
    Measurements,
    record_verdict,
    sustained,
)
from kvoffload.api.conventions import (
    ABORT,
    ANALYSIS_INCONCLUSIVE,
    DEGRADED,
    INVALID,
    MANUAL_ANNOTATIONS,
    OFFLOAD_WILL_NOT_PAY,
    PAUSE,
    PAUSED,
    PODS_NOT_SCRAPED,
    PROGRESSING,
    PROMETHEUS_TOKEN_UNREADABLE,
    PROMOTE,
    READY,
    RECONCILING,
    RESUME,
    RETRY,
    STALLED,
    Decision,
    Reason,
)
from kvoffload.api.quantity import format_duration, parse_duration, to_quantity
from kvoffload.api.types import (
    AnalysisStatus,
    BaselineStatus,
    Condition,
    HistoryEntry,
    KVOffloadPolicySpec,
    KVOffloadPolicyStatus,
    Mode,
    Percentiles,
    PreflightStatus,
    RetiringStatus,
    StageStatus,
    VariantStatus,
    Verdict,
    WarmupStatus,
)
from kvoffload.policy.ladder import Level, build_ladder
from kvoffload.policy.sizing import progress_deadline_seconds
from kvoffload.rollout import conditions as cond
from kvoffload.rollout.preflight import PreflightJudgment, RestorePrice, judge

"""The manual-control annotations, in the order they are acted on when several change at once."""

HISTORY_LIMIT = 20
PENDING_REQUEUE_SECONDS = 1.0
"""How soon to come back when another manual annotation waits its turn."""


# --- what decide sees ------------------------------------------------------------------


@dataclass(frozen=True)
class PodObservation:
    """One engine pod of a variant."""

    name: str
    ready: bool = False
    restarts: int = 0
    """Container restarts, summed over the pod's containers."""
    oom_killed: bool = False
    """A container's last or current state was terminated with reason OOMKilled."""
    crash_looping: bool = False
    """A container waits with reason CrashLoopBackOff."""
    config_hash: str | None = None
    """The config hash label of the pod; None when unknown (then it is judged as current)."""
    unschedulable: str | None = None
    """The scheduler's message while it cannot place the pod (condition PodScheduled False, Unschedulable)."""


@dataclass(frozen=True)
class VariantObservation:
    """The Deployment of one variant (stable or canary) as the cluster shows it."""

    exists: bool = False
    config_hash: str | None = None
    """The config hash in the Deployment's pod template."""
    level: int | None = None
    """The ladder level label in the Deployment's pod template."""
    desired_replicas: int = 0
    ready_replicas: int = 0
    """Ready replicas running ``config_hash`` (pods of an older template are not counted)."""
    pods: tuple[PodObservation, ...] = ()


@dataclass(frozen=True)
class TokenCheck:
    """Whether the Secret with the Prometheus bearer token could be read this cycle."""

    problem: Reason | None
    """None: read; else why not (``Reason.SECRET_FORBIDDEN``, ``Reason.SECRET_NOT_FOUND``)."""
    message: str = ""
    """What is missing, naming the Secret (and, when forbidden, the permission)."""


@dataclass(frozen=True)
class PodMonitorRef:
    """The policy's PodMonitor: what a Prometheus must select to scrape its engines."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    """Every label it carries (the operator's ``--monitor-label`` ones included)."""


@dataclass(frozen=True)
class Observations:
    """Everything ``decide`` needs to know about the world, gathered by the adapter."""

    generation: int | None
    """metadata.generation of the policy."""
    level_hashes: Mapping[int, str]
    """Config hash of every ladder level of the current spec, by level index (from the renderer)."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    """The policy's annotations; only the ``kvoffload.io/`` control keys are read."""
    stable: VariantObservation = field(default_factory=VariantObservation)
    canary: VariantObservation = field(default_factory=VariantObservation)
    retiring: tuple[VariantObservation, ...] = ()
    """The Deployments of ``status.retiring``, in its order."""
    assessment: Assessment | None = None
    """This cycle's verdict from ``assess()``; None when no analysis ran this cycle."""
    measurements: Measurements | None = None
    """This cycle's raw figures; the baseline is taken from ``measurements.stable``."""
    price: RestorePrice | None = None
    """The preflight's restore-vs-recompute price on the policy's GPU class (the adapter prices it with
    ``economics.breakeven`` while a preflight may be due); None when not priced this cycle."""
    token: TokenCheck | None = None
    """The bearer token's Secret, when this cycle read one; None keeps the PrometheusTokenUnreadable condition."""
    pod_monitor: PodMonitorRef | None = None
    """The policy's PodMonitor as rendered, named in the PodsNotScraped message; None: named from the policy."""


# --- what decide returns ---------------------------------------------------------------


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
    """Seconds until the next decision is due (a step ends, another annotation waits), if useful."""


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
    """False while the step's canary warms up (``analysis.warmup``): canary/stable ratios are not gated."""


# --- replica arithmetic -------------------------------------------------------------


def canary_replicas(spec: KVOffloadPolicySpec, step: int) -> int:
    """Canary replicas at ``step`` (0 = canary; n = promotionSteps[n-1] percent), at most ``replicas``."""
    total = spec.replicas
    first = min(spec.rollout.canary_replicas, total)
    if step == 0:
        return first
    pct = spec.rollout.promotion_steps[step - 1]
    return min(total, max(first, math.ceil(pct * total / 100)))


def stable_replicas(spec: KVOffloadPolicySpec, canary: int) -> int:
    """Stable replicas beside ``canary`` canaries: ``replicas - max(0, canary - maxSurge)``."""
    return spec.replicas - max(0, canary - spec.rollout.max_surge)


def next_step(spec: KVOffloadPolicySpec, step: int) -> int | None:
    """The next promotion step that adds canary replicas, or None when the level is at 100%."""
    current = canary_replicas(spec, step)
    for n in range(step + 1, len(spec.rollout.promotion_steps) + 1):
        if canary_replicas(spec, n) > current:
            return n
    return None


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


# --- decide ---------------------------------------------------------------------------


_DECISIONS: Mapping[Reason, Decision] = {
    Reason.NEW_LADDER: Decision.NEW_LADDER,
    Reason.SPEC_CHANGED: Decision.SPEC_CHANGED,
    Reason.RETRY: Decision.RETRY,
    Reason.BASELINE_TAKEN: Decision.BASELINE_TAKEN,
    Reason.CANARY_STARTED: Decision.CANARY_STARTED,
    Reason.PILOT_PASSED: Decision.PILOT_PASSED,
    Reason.PROMOTED: Decision.PROMOTED,
    Reason.MANUAL_PROMOTE: Decision.MANUAL_PROMOTE,
    Reason.LEVEL_PROMOTED: Decision.LEVEL_PROMOTED,
}
"""The decision a move on the ladder records, by the reason it moved for."""


@dataclass(frozen=True)
class _Ctx:
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

    def hash_of(self, level: Level) -> str:
        return self.obs.level_hashes[level.index]

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
class _Outcome:
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
    ctx = _Ctx(
        spec=spec,
        ladder=ladder,
        status=current,
        obs=observations,
        now=now,
        evidence=_evidence(current, observations.assessment, now),
        seen=_seen_still_set(current.annotations_seen, observations.annotations),
    )

    if current.stable is None or current.stage is None:
        return _write(ctx, _start_fresh(ctx))
    changed = observations.generation != current.observed_generation or current.ladder != [lv.name for lv in ladder]
    if changed and not _resized_only(ctx):  # a change of replicas alone (/scale) resizes the shares in place
        return _write(ctx, _new_spec(ctx))
    mode = _mode_of(current)
    if mode is None:
        return _write(ctx, _start_ladder(ctx, _map_level(ctx), Reason.NEW_LADDER, "status was incomplete"))
    if (failure := _failure(ctx, mode)) is not None:
        return _write(ctx, _roll_back(ctx, mode, *failure))
    if (key := _next_manual(ctx)) is not None:
        return _write(ctx, _manual(ctx, mode, key))
    return _write(ctx, _continue(ctx, mode))


def invalid(status: KVOffloadPolicyStatus | None, errors: Sequence[str], generation: int | None, now: datetime) -> Plan:
    """The Plan for a spec that fails validation: phase Invalid, the field errors in the
    condition's message, and no Deployment touched (``variants is None``).

    The rest of the status is kept, so a fixed spec (a new generation) resumes
    from the stable level it had.
    """
    current = status if status is not None else KVOffloadPolicyStatus()
    message = "; ".join(errors) or "the spec is invalid"
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


# --- situations -------------------------------------------------------------------------


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


def _failure(ctx: _Ctx, mode: Mode) -> tuple[Reason, str] | None:
    """Why the newest level must go now, if it must: a canary's hard failure or a sustained breach."""
    if mode is Mode.STEP:
        if (hard := _hard_failure(ctx)) is not None:
            return hard
        if sustained(ctx.evidence, ctx.spec.analysis.sustained_for, ctx.now):
            return Reason.ANALYSIS_FAILED, f"canary failed for {_failing_for(ctx)}: {_figures(ctx.evidence)}"
    guarded = mode is Mode.STABLE and _level_below(ctx, ctx.level(ctx.stable.level)) is not None
    if guarded and sustained(ctx.evidence, ctx.spec.analysis.sustained_for, ctx.now):
        return Reason.GUARD_BREACH, f"stable fleet over budget for {_failing_for(ctx)}: {_figures(ctx.evidence)}"
    return None


def _hard_failure(ctx: _Ctx) -> tuple[Reason, str] | None:
    canary = ctx.status.canary
    assert canary is not None
    level = ctx.level(canary.level)
    pods = [p for p in ctx.obs.canary.pods if p.config_hash in (None, canary.config_hash)]
    where = f"at level {level.name}{_cpu_text(level)}"
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
    ready = _ready(ctx.obs.canary, canary.config_hash)
    wanted = canary_replicas(ctx.spec, ctx.stage.step)
    if ready < wanted and ctx.elapsed >= deadline:
        return (
            Reason.PROGRESS_DEADLINE_EXCEEDED,
            f"only {ready}/{wanted} canary replicas Ready {format_duration(ctx.elapsed)} after the step "
            f"started (progress deadline {format_duration(deadline)}) {where}{_unschedulable_text(pods)}",
        )
    return None


def _unschedulable_text(pods: Sequence[PodObservation]) -> str:
    """Why the scheduler cannot place a canary pod, when it cannot: the first such pod, in its own words."""
    stuck = next((p for p in pods if p.unschedulable), None)
    return f"; pod {stuck.name} cannot be scheduled: {stuck.unschedulable}" if stuck is not None else ""


def _allocation_mismatch(ctx: _Ctx, pods: list[PodObservation]) -> str | None:
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


def _next_manual(ctx: _Ctx) -> str | None:
    return next((key for key in MANUAL_ANNOTATIONS if _changed(ctx.obs.annotations, ctx.seen, key)), None)


def _continue(ctx: _Ctx, mode: Mode) -> _Outcome:
    if _newly_inconclusive(ctx, mode):
        return _pause_inconclusive(ctx, mode)
    if mode is Mode.BASELINE:
        return _run_baseline(ctx)
    if mode is Mode.STEP:
        return _run_step(ctx)
    return _hold(ctx, mode)


# --- transitions ------------------------------------------------------------------------


def _start_fresh(ctx: _Ctx) -> _Outcome:
    """A policy seen for the first time: a ladder from GPU-only, or from the level that already runs."""
    adopted = _adopted_level(ctx)
    level = adopted or ctx.ladder[0]
    why = f"adopted the running {level.name} Deployment; " if adopted else ""
    seen = {k: v for k in MANUAL_ANNOTATIONS if (v := ctx.obs.annotations.get(k, ""))}
    outcome = _start_ladder(ctx, level, Reason.NEW_LADDER, f"{why}ladder {' → '.join(lv.name for lv in ctx.ladder)}")
    return replace(outcome, seen=seen, paused=False)


def spec_digest(spec: KVOffloadPolicySpec) -> str:
    """A digest of everything in the spec but ``replicas`` (what /scale changes)."""
    text = json.dumps(spec.model_dump(mode="json", by_alias=True, exclude={"replicas"}), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _resized_only(ctx: _Ctx) -> bool:
    """The new generation changed ``replicas`` and nothing else (an autoscaler through /scale): the ladder
    goes on where it is, and the shares follow the new count by the step's percentages. Not after an
    invalid generation: a fixed spec starts a new ladder, as any other change does."""
    same_ladder = ctx.status.ladder == [lv.name for lv in ctx.ladder]
    digest = ctx.status.spec_digest
    was_invalid = cond.is_true(ctx.status.conditions, INVALID)
    return same_ladder and not was_invalid and digest is not None and digest == spec_digest(ctx.spec)


def _new_spec(ctx: _Ctx) -> _Outcome:
    level = _map_level(ctx)
    old = ctx.status.observed_generation
    dropped = f"dropped canary {ctx.level_name(ctx.status.canary.level)}; " if ctx.status.canary else ""
    outcome = _start_ladder(
        ctx, level, Reason.SPEC_CHANGED, f"generation {old} → {ctx.obs.generation}: {dropped}stable level {level.name}"
    )
    return outcome  # the old canary drains, paced, as the new ladder's stable level grows Ready


def _start_ladder(ctx: _Ctx, level: Level, reason: Reason, why: str) -> _Outcome:
    """Every replica on ``level``; a baseline when there is a level to climb to, else Stable."""
    stable = VariantPlan(level.index, ctx.spec.replicas, ctx.hash_of(level))
    stage = _stage(level, 0, ctx.now)
    if level.index == ctx.top.index:
        message = f"{why}; {level.name} is the top level: Stable, the guard watches"
        return _Outcome(
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
    if _preflight_due(ctx, level):
        message += "; then the preflight judges whether offload can pay"
    return _Outcome(
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


def _run_baseline(ctx: _Ctx) -> _Outcome:
    duration = parse_duration(ctx.spec.rollout.baseline_duration)
    if ctx.paused or _too_inconclusive(ctx):
        return _hold(ctx, Mode.BASELINE)
    if ctx.elapsed < duration:
        return _hold(ctx, Mode.BASELINE, f"measuring the baseline: {_progress(ctx, duration)}")
    verdict = ctx.obs.assessment
    if verdict is None or verdict.verdict is Verdict.INCONCLUSIVE:
        why = verdict.message if verdict is not None else "no analysis this cycle"
        return _hold(ctx, Mode.BASELINE, f"baseline extended ({format_duration(ctx.elapsed)}): {why}")
    return _finish_baseline(ctx, manual=False)


def _finish_baseline(ctx: _Ctx, *, manual: bool) -> _Outcome:
    """Record the stable figures and start the next level's canary.

    A fleet already over budget does not stop the climb (offload may be the cure),
    but the Event says so as a Warning.
    """
    baseline = _baseline_from(ctx)
    level = ctx.level(ctx.stable.level)
    figures = _baseline_text(baseline)
    judgment: PreflightJudgment | None = None
    preflight = ctx.spec.rollout.preflight
    if manual:
        why, reason = f"baseline cut short by {PROMOTE} ({figures})", Reason.MANUAL_PROMOTE
        if _preflight_due(ctx, level):
            why += "; the preflight was not judged"
    else:
        why = f"baseline of {level.name} taken over {format_duration(ctx.elapsed)}: {figures}"
        reason = Reason.BASELINE_TAKEN
        if preflight is not None and _preflight_due(ctx, level):
            judgment = judge(preflight, baseline, ctx.obs.price)
            if not judgment.pays:
                return _hold_will_not_pay(ctx, baseline, judgment, why)
            why += f"; preflight: {judgment.message}"
    outcome = _start_canary(ctx, _stable_plan(ctx), ctx.level(level.index + 1), reason, why)
    verdict = ctx.obs.assessment
    if verdict is not None and verdict.verdict is Verdict.FAIL and not manual:
        message = f"{outcome.message}; the {level.name} fleet is already over budget: {verdict.message}"
        outcome = replace(outcome, message=message, event=Event("Warning", reason, message))
    return replace(outcome, baseline=baseline, preflight=judgment.status(ctx.now) if judgment is not None else None)


def _preflight_due(ctx: _Ctx, level: Level) -> bool:
    """A preflight is asked for and this baseline runs on GPU-only: its figures are what offload would change."""
    return ctx.spec.rollout.preflight is not None and not level.offloads


def _hold_will_not_pay(ctx: _Ctx, baseline: BaselineStatus, judgment: PreflightJudgment, why: str) -> _Outcome:
    """Offload cannot pay: every replica stays on GPU-only and no canary is spent, until retry or a new spec."""
    level = ctx.level(ctx.stable.level)
    message = (
        f"{why}; {judgment.message}; holding on {level.name}, no canary started: set {RETRY} to take a new "
        "baseline and judge again, or change the spec (without rollout.preflight the ladder climbs anyway)"
    )
    return _Outcome(
        mode=Mode.HELD,
        stage=_stage(level, 0, ctx.now),
        stable=replace(_stable_plan(ctx), replicas=ctx.spec.replicas),
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


def _start_canary(ctx: _Ctx, stable: VariantPlan, level: Level, reason: Reason, why: str) -> _Outcome:
    """``canaryReplicas`` on ``level``; the stable side shrinks beyond maxSurge."""
    count = canary_replicas(ctx.spec, 0)
    stable = replace(stable, replicas=stable_replicas(ctx.spec, count))
    canary = VariantPlan(level.index, count, ctx.hash_of(level))
    message = (
        f"{why}; canary {level.name}{_cpu_text(level)} on {count} of {ctx.spec.replicas} replicas, "
        f"stable {ctx.level(stable.level).name} keeps {stable.replicas}"
    )
    return _Outcome(
        mode=Mode.STEP,
        stage=_stage(level, 0, ctx.now),
        stable=stable,
        canary=canary,
        reason=Reason.CANARY_RUNNING,
        message=message,
        event=Event("Normal", reason, message),
        decision=_DECISIONS[reason],
        inconclusive=False,
    )


def _run_step(ctx: _Ctx) -> _Outcome:
    canary = ctx.status.canary
    assert canary is not None
    duration = parse_duration(ctx.spec.rollout.step_duration)
    if ctx.paused or _too_inconclusive(ctx):
        return _hold(ctx, Mode.STEP)
    warming = "" if warmed_up_canary(ctx.spec, ctx.status) else f", {_warming_text(ctx)}"
    stuck = _unschedulable_text([p for p in ctx.obs.canary.pods if p.config_hash in (None, canary.config_hash)])
    if ctx.elapsed < duration:
        return _hold(
            ctx, Mode.STEP, f"{_step_name(ctx)}: {_progress(ctx, duration)}{warming}, {_verdict_text(ctx)}{stuck}"
        )
    if warming:
        return _hold(ctx, Mode.STEP, f"{_step_name(ctx)}: step over, {_warming_text(ctx)}; {_verdict_text(ctx)}")
    ready = _ready(ctx.obs.canary, canary.config_hash)
    wanted = canary_replicas(ctx.spec, ctx.stage.step)
    if ready < wanted:
        return _hold(ctx, Mode.STEP, f"{_step_name(ctx)}: waiting for canaries Ready ({ready}/{wanted}){stuck}")
    verdict = ctx.obs.assessment
    if verdict is None or verdict.verdict is not Verdict.PASS:
        return _hold(ctx, Mode.STEP, f"{_step_name(ctx)}: step over, waiting for a Pass; {_verdict_text(ctx)}")
    if not ctx.spec.rollout.auto_promote:
        return _hold(
            ctx,
            Mode.STEP,
            f"{_step_name(ctx)}: passed ({_figures(ctx.evidence)}); waiting for {PROMOTE}",
            reason=Reason.AWAITING_PROMOTION,
        )
    return _promote(ctx, manual=False)


def _promote(ctx: _Ctx, *, manual: bool) -> _Outcome:
    """The step is done: the next promotion step, the next level, or the top."""
    canary = ctx.status.canary
    assert canary is not None
    level = ctx.level(canary.level)
    evidence = (
        f"promoted by {PROMOTE} without waiting for evidence (last: {_figures(ctx.evidence)})"
        if manual
        else f"{_step_name(ctx)} passed after {format_duration(ctx.elapsed)} ({_figures(ctx.evidence)})"
    )
    manual_reason = Reason.MANUAL_PROMOTE if manual else None
    if level.canary_only:
        return _start_canary(
            ctx, _stable_plan(ctx), ctx.level(level.index + 1), manual_reason or Reason.PILOT_PASSED, evidence
        )
    step = next_step(ctx.spec, ctx.stage.step)
    if step is not None:
        count = canary_replicas(ctx.spec, step)
        stable = replace(_stable_plan(ctx), replicas=stable_replicas(ctx.spec, count))
        pct = ctx.spec.rollout.promotion_steps[step - 1]
        message = f"{evidence}; {level.name} now on {count} of {ctx.spec.replicas} replicas ({pct}%)"
        reason = manual_reason or Reason.PROMOTED
        return _Outcome(
            mode=Mode.STEP,
            stage=_stage(level, step, ctx.now),
            stable=stable,
            canary=replace(_plan_of(canary), replicas=count),
            reason=Reason.PROMOTION_RUNNING,
            message=message,
            event=Event("Normal", reason, message),
            decision=_DECISIONS[reason],
        )
    promoted = VariantPlan(level.index, ctx.spec.replicas, canary.config_hash)
    reason = manual_reason or Reason.LEVEL_PROMOTED
    if level.index == ctx.top.index:
        message = f"{evidence}; {level.name} is stable on all {ctx.spec.replicas} replicas: the top of the ladder"
        return _Outcome(
            mode=Mode.STABLE,
            stage=_stage(level, 0, ctx.now),
            stable=promoted,
            canary=None,
            reason=Reason.LADDER_COMPLETE,
            message=message,
            event=Event("Normal", reason, message),
            decision=_DECISIONS[reason],
        )
    return _start_canary(ctx, promoted, ctx.level(level.index + 1), reason, f"{evidence}; {level.name} is stable")


def _roll_back(ctx: _Ctx, mode: Mode, reason: Reason, why: str) -> _Outcome:
    """The canary goes; the stable level stays exactly (the guard: the fleet drops a level)."""
    if mode is Mode.STABLE:
        current = ctx.level(ctx.stable.level)
        below = _level_below(ctx, current)
        assert below is not None  # _failure checks it
        landing = below
        target = VariantPlan(below.index, ctx.spec.replicas, ctx.hash_of(below))
        message = f"{why}; took away {current.name}: the fleet rolls back to {below.name}"
    else:
        target = replace(_stable_plan(ctx), replicas=ctx.spec.replicas)
        landing = ctx.level(target.level)
        dropped = f"canary {ctx.level_name(ctx.status.canary.level)} removed" if ctx.status.canary else "ladder halted"
        message = f"{why}; {dropped}, all {ctx.spec.replicas} replicas on {landing.name} ({target.config_hash})"
    return _Outcome(
        mode=Mode.ROLLED_BACK,
        stage=_stage(landing, 0, ctx.now),
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


def _manual(ctx: _Ctx, mode: Mode, key: str) -> _Outcome:
    """Act on one changed annotation (and remember its value), or say why it does nothing."""
    seen = {**ctx.seen, key: ctx.obs.annotations[key]}
    stopped = ctx.paused or cond.is_true(ctx.status.conditions, ANALYSIS_INCONCLUSIVE)
    outcome: _Outcome | None = None
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


def _resume(ctx: _Ctx, mode: Mode) -> _Outcome:
    """Clear the pause and restart the step clock: evidence is gathered while running."""
    stage = ctx.stage.model_copy(update={"started_at": ctx.now}) if mode in (Mode.BASELINE, Mode.STEP) else ctx.stage
    message = f"resumed by {RESUME}; the step clock restarts"
    held = _hold(
        ctx, mode, message, paused=False, event=Event("Normal", Reason.RESUMED, message), decision=Decision.RESUME
    )
    return replace(held, stage=stage, inconclusive=False)


def _newly_inconclusive(ctx: _Ctx, mode: Mode) -> bool:
    """``maxInconclusive`` Inconclusive verdicts in a row have just been reached in a baseline or a step."""
    inconclusive = mode in (Mode.BASELINE, Mode.STEP) and _too_inconclusive(ctx)
    return inconclusive and not cond.is_true(ctx.status.conditions, ANALYSIS_INCONCLUSIVE)


def _pause_inconclusive(ctx: _Ctx, mode: Mode) -> _Outcome:
    """Stop where the ladder is, with a Warning: the evidence has been Inconclusive too long."""
    why = _not_scraped_message(ctx) or (ctx.evidence.message if ctx.evidence is not None else "")
    message = (
        f"paused: {_inconclusive_count(ctx)} Inconclusive verdicts in a row "
        f"(maxInconclusive {ctx.spec.analysis.max_inconclusive}): {why}"
    )
    return _hold(
        ctx, mode, message, event=Event("Warning", Reason.TOO_MANY_INCONCLUSIVE, message), decision=Decision.PAUSE
    )


def _hold(
    ctx: _Ctx,
    mode: Mode,
    message: str | None = None,
    *,
    reason: Reason | None = None,
    paused: bool | None = None,
    event: Event | None = None,
    decision: Decision | None = None,
) -> _Outcome:
    """Keep the roles where they are (the pacing goes on toward their targets); report why (a pause on
    too many Inconclusive verdicts included)."""
    stable, canary = _targets(ctx, mode)
    if reason is None:
        reason = _resting_reason(ctx, mode)
    inconclusive = mode in (Mode.BASELINE, Mode.STEP) and _too_inconclusive(ctx)
    if message is None:
        if paused if paused is not None else ctx.paused:
            message = f"paused; set {RESUME} to go on"
        elif inconclusive:
            message = (
                f"paused: {_inconclusive_count(ctx)} Inconclusive verdicts in a row; set {RESUME} or wait for evidence"
            )
            if why := _not_scraped_message(ctx):  # say why, every cycle, rather than only in the first one
                message += f": {why}"
        else:
            message = ctx.status.message
    return _Outcome(
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


# --- writing the plan -------------------------------------------------------------------


def _write(ctx: _Ctx, o: _Outcome) -> Plan:
    """Turn an outcome into the Plan: conditions, phase, status, history, events."""
    seen = o.seen if o.seen is not None else ctx.seen
    paused = o.paused if o.paused is not None else ctx.paused
    conditions = _conditions(ctx, o, paused)
    stage_level = ctx.level(o.stage.index)
    paced = _pace(ctx, o)
    warmup, warmed = _warmup_of(ctx, o)
    last_analysis = ctx.evidence if ctx.evidence is not None else ctx.status.last_analysis
    history = list(ctx.status.history)
    if o.decision is not None:
        history.append(
            HistoryEntry(
                time=ctx.now,
                stage=stage_level.name,
                decision=o.decision,
                reason=o.reason if o.event is None else o.event.reason,
                message=o.message,
            )
        )
    status = KVOffloadPolicyStatus(
        phase=cond.derive_phase(conditions, o.mode, o.stage),
        mode=o.mode,
        observed_generation=ctx.obs.generation,
        stage=o.stage,
        ladder=[lv.name for lv in ctx.ladder],
        stable=_variant_status(ctx.level(o.stable.level), paced.stable, _seen(ctx, o.stable.config_hash)),
        canary=(
            _variant_status(ctx.level(paced.canary.level), paced.canary, _seen(ctx, paced.canary.config_hash))
            if paced.canary is not None
            else None
        ),
        warmup=warmup,
        retiring=[
            RetiringStatus(
                level_name=r.level_name,
                config_hash=r.config_hash,
                replicas=r.replicas,
                ready=_ready(_seen(ctx, r.config_hash), r.config_hash),
            )
            for r in paced.retiring
        ],
        baseline=o.baseline if o.baseline is not None else ctx.status.baseline,
        preflight=_preflight_of(ctx, o),
        last_analysis=last_analysis,
        host_memory=ctx.status.host_memory,
        conditions=conditions,
        history=history[-HISTORY_LIMIT:],
        annotations_seen=dict(seen),
        message=o.message,
        replicas=paced.total_replicas,
        spec_digest=spec_digest(ctx.spec),
        **_display(o, last_analysis),
    )
    event = o.event
    if event is not None and (dip := _dip(ctx, o)) is not None:
        event = replace(event, message=f"{event.message}; {dip}")
    if event is not None and warmup is not None and warmup.since == ctx.now and warmup.warm_at is None:
        event = replace(event, message=f"{event.message}; {_warmup_reason(warmup)}")
    events = tuple(e for e in (event, warmed) if e is not None)
    return Plan(
        status=status,
        variants=paced,
        events=(*events, *_token_events(ctx), *_scrape_events(ctx)),
        requeue_after=_requeue_after(ctx, o, seen, paused),
    )


def _display(o: _Outcome, analysis: AnalysisStatus | None) -> dict[str, str]:
    """The printer-column strings: tiers, canary/stable replicas, the subject's p99 TTFT and external share."""

    def subject(name: str) -> float | None:
        found = next((m for m in analysis.metrics if m.name == name), None) if analysis is not None else None
        if found is None:
            return None
        return found.canary if o.canary is not None else found.stable

    ttft, share = subject(TTFT_P99), subject(EXTERNAL_SHARE)
    return {
        "tiers_summary": "+".join(o.stage.tiers) or "none",
        "canary_summary": f"{o.canary.replicas if o.canary is not None else 0}/{o.stable.replicas}",  # the targets
        "ttft_p99": "" if ttft is None else f"{ttft * 1000:.0f}ms",
        "external_share": "" if share is None else f"{share:.1%}",
    }


def _preflight_of(ctx: _Ctx, o: _Outcome) -> PreflightStatus | None:
    if o.preflight is not None:
        return o.preflight
    return None if o.new_ladder else ctx.status.preflight


def _conditions(ctx: _Ctx, o: _Outcome, paused: bool) -> list[Condition]:
    def put(conds: list[Condition], type_: str, status: bool, reason: str, message: str = "") -> list[Condition]:
        return cond.set_condition(conds, type_, status, reason, message, ctx.now, ctx.obs.generation)

    c = list(ctx.status.conditions)
    if o.mode in (Mode.BASELINE, Mode.STEP):
        c = put(c, READY, False, Reason.ROLLOUT_IN_PROGRESS)
        c = put(c, PROGRESSING, True, o.reason, o.message)
        c = put(c, DEGRADED, False, Reason.AS_EXPECTED)
    elif o.mode is Mode.STABLE:
        c = put(c, READY, True, Reason.LADDER_COMPLETE, o.message)
        c = put(c, PROGRESSING, False, Reason.LADDER_COMPLETE)
        c = put(c, DEGRADED, False, Reason.AS_EXPECTED)
    elif o.mode is Mode.HELD:  # not Degraded: the fleet runs as it did, and stays so
        c = put(c, READY, False, Reason.OFFLOAD_WILL_NOT_PAY, o.message)
        c = put(c, PROGRESSING, False, Reason.OFFLOAD_WILL_NOT_PAY)
        c = put(c, DEGRADED, False, Reason.AS_EXPECTED)
    else:
        c = put(c, READY, False, o.reason)
        c = put(c, PROGRESSING, False, o.reason)
        c = put(c, DEGRADED, True, o.reason, o.message)
    climbing = o.mode in (Mode.BASELINE, Mode.STEP)
    c = put(c, RECONCILING, climbing, Reason.CLIMBING if climbing else Reason.AT_REST, o.message if climbing else "")
    # kstatus: Stalled tells GitOps tools the climb needs a person (rolled back, or held by the preflight).
    stalled = o.mode in (Mode.ROLLED_BACK, Mode.HELD)
    c = put(c, STALLED, stalled, o.reason if stalled else Reason.AS_EXPECTED, o.message if stalled else "")
    c = _offload_will_not_pay(ctx, o, c, put)
    c = put(c, PAUSED, paused, Reason.PAUSED if paused else Reason.NOT_PAUSED)
    c = put(
        c,
        ANALYSIS_INCONCLUSIVE,
        o.inconclusive,
        Reason.TOO_MANY_INCONCLUSIVE if o.inconclusive else Reason.ENOUGH_EVIDENCE,
        o.message if o.inconclusive else "",
    )
    c = put(c, INVALID, False, Reason.SPEC_VALID)
    token = ctx.obs.token
    # Written once a token is asked for and cannot be read, and kept (False) from then on.
    if token is not None and (token.problem is not None or cond.find(c, PROMETHEUS_TOKEN_UNREADABLE) is not None):
        c = put(
            c, PROMETHEUS_TOKEN_UNREADABLE, token.problem is not None, token.problem or Reason.TOKEN_READ, token.message
        )
    return _pods_not_scraped(ctx, c, put)


def _not_scraped_message(ctx: _Ctx) -> str | None:
    """Why the evidence is missing, when the reason is that no Prometheus scrapes the policy's pods: Prometheus
    answered with no series of any of them, ``maxInconclusive`` cycles in a row (so not a pod's first scrape)."""
    if not (assess.not_scraped(ctx.obs.measurements) and _too_inconclusive(ctx)):
        return None
    monitor = ctx.obs.pod_monitor
    if monitor is not None:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(monitor.labels.items())) or "none"
        named = f"its PodMonitor {monitor.name} (labels: {labels})"
    else:
        policy = (ctx.status.selector or "").partition("=")[2]
        own = ", ".join(f"{k}={v}" for k, v in sorted(ctx.spec.prometheus.monitor_labels.items()))
        named = f"its PodMonitor {policy or '(named after the policy)'}"
        named += f" (labels from spec.prometheus.monitorLabels: {own or 'none'}, and the operator's --monitor-label)"
    return (
        f"Prometheus holds no series of any pod of this policy after {_inconclusive_count(ctx)} analysis cycles: "
        f"no Prometheus scrapes {named}, or what scrapes the pods does not copy their kvoffload.io labels. "
        "A Prometheus scrapes only the PodMonitors its podMonitorSelector selects (kube-prometheus-stack's "
        "selects release: <its release name>); give the PodMonitor that label with kvoffload run "
        "--monitor-label KEY=VALUE or spec.prometheus.monitorLabels"
    )


def _pods_not_scraped(
    ctx: _Ctx, c: list[Condition], put: Callable[[list[Condition], str, bool, str, str], list[Condition]]
) -> list[Condition]:
    """PodsNotScraped: True while no Prometheus scrapes the policy's pods; written once it was True, and kept
    (False) from then on. A cycle with no analysis keeps it as it was."""
    if ctx.obs.measurements is None:
        return c
    message = _not_scraped_message(ctx)
    if message is None and cond.find(c, PODS_NOT_SCRAPED) is None:
        return c
    if message is None:
        return put(c, PODS_NOT_SCRAPED, False, Reason.SCRAPED, "")
    return put(c, PODS_NOT_SCRAPED, True, Reason.NOT_SCRAPED, message)


def _scrape_events(ctx: _Ctx) -> tuple[Event, ...]:
    """A Warning when the policy's pods are found not scraped, once (not every cycle)."""
    message = _not_scraped_message(ctx)
    if message is None or cond.is_true(ctx.status.conditions, PODS_NOT_SCRAPED):
        return ()
    return (Event("Warning", Reason.NOT_SCRAPED, message),)


def _token_events(ctx: _Ctx) -> tuple[Event, ...]:
    """A Warning when the token becomes unreadable (or unreadable for another reason), not every cycle."""
    token = ctx.obs.token
    if token is None or token.problem is None:
        return ()
    was = cond.find(ctx.status.conditions, PROMETHEUS_TOKEN_UNREADABLE)
    if was is not None and was.status == "True" and was.message == token.message:
        return ()
    return (Event("Warning", token.problem, token.message),)


def _offload_will_not_pay(
    ctx: _Ctx, o: _Outcome, c: list[Condition], put: Callable[[list[Condition], str, bool, str, str], list[Condition]]
) -> list[Condition]:
    """OffloadWillNotPay: True while held; False once a preflight passed, or when none judged this ladder.

    Written only for a policy with a preflight, or to clear one that was written before."""
    preflight = _preflight_of(ctx, o)
    if o.mode is Mode.HELD and preflight is not None and not preflight.pays:
        reason = preflight.refused[0] if preflight.refused else Reason.OFFLOAD_WILL_NOT_PAY
        return put(c, OFFLOAD_WILL_NOT_PAY, True, reason, preflight.message)
    if preflight is not None and preflight.pays:
        return put(c, OFFLOAD_WILL_NOT_PAY, False, Reason.OFFLOAD_MAY_PAY, preflight.message)
    if ctx.spec.rollout.preflight is None and cond.find(c, OFFLOAD_WILL_NOT_PAY) is None:
        return c
    if ctx.spec.rollout.preflight is None:
        why = "no preflight in the spec"
    elif o.mode is Mode.BASELINE and _preflight_due(ctx, ctx.level(o.stable.level)):
        why = "judged at the end of the GPU-only baseline"
    elif o.mode is Mode.BASELINE:
        why = f"the baseline runs on {ctx.level(o.stable.level).name}, not GPU-only: no preflight on this ladder"
    else:
        why = "no preflight verdict on this ladder"
    return put(c, OFFLOAD_WILL_NOT_PAY, False, Reason.PREFLIGHT_NOT_JUDGED, why)


def _requeue_after(ctx: _Ctx, o: _Outcome, seen: Mapping[str, str], paused: bool) -> float | None:
    if any(_changed(ctx.obs.annotations, seen, key) for key in MANUAL_ANNOTATIONS):
        return PENDING_REQUEUE_SECONDS
    if paused or o.inconclusive or o.stage.started_at is None:
        return None
    if o.mode is Mode.BASELINE:
        duration = parse_duration(ctx.spec.rollout.baseline_duration)
    elif o.mode is Mode.STEP:
        duration = parse_duration(ctx.spec.rollout.step_duration)
    else:
        return None
    left = duration - (ctx.now - o.stage.started_at).total_seconds()
    return left if left > 0 else None


# --- warm-up: a fresh canary's cache fills before comparisons count ---------------------


def _warmup_of(ctx: _Ctx, o: _Outcome) -> tuple[WarmupStatus | None, Event | None]:
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


def _warmup_reason(warmup: WarmupStatus) -> str:
    return (
        f"warm-up: canary/stable ratios and offload hit checks count only after {warmup.duration} and "
        f"{warmup.requests} canary requests in the analysis window, whichever is later (a fresh canary's cache "
        "is empty, the stable engines' is full); the absolute budgets and hard failures apply at once"
    )


def _warming_text(ctx: _Ctx) -> str:
    w = ctx.status.warmup
    if w is None:
        return "warming up"
    served = "no" if w.served is None else f"{w.served:.0f}"
    return f"warming up ({served} of {w.requests} canary requests in the window, at least {w.duration})"


# --- pacing: moving replicas between levels within the capacity rules -------------------


def _targets(ctx: _Ctx, mode: Mode) -> tuple[VariantPlan, VariantPlan | None]:
    """The replicas each role is headed for in ``mode`` at the current stage (what a hold keeps heading to)."""
    stable = _stable_plan(ctx)
    canary = ctx.status.canary
    if mode is not Mode.STEP or canary is None:
        return replace(stable, replicas=ctx.spec.replicas), None
    count = canary_replicas(ctx.spec, ctx.stage.step)
    return replace(stable, replicas=stable_replicas(ctx.spec, count)), replace(_plan_of(canary), replicas=count)


def ready_floor(spec: KVOffloadPolicySpec, *, to_full: bool) -> int:
    """The fewest Ready replicas a paced move may leave: ``replicas - max(0, canaryReplicas - maxSurge)``;
    ``replicas`` across a promotion to 100% (``to_full``) when ``maxSurge >= 1``."""
    surge = spec.rollout.max_surge
    if to_full and surge >= 1:
        return spec.replicas
    return spec.replicas - max(0, min(spec.rollout.canary_replicas, spec.replicas) - surge)


@dataclass
class _Slot:
    """One level's Deployment during pacing: what it runs, has, is headed for, and its Ready pods."""

    name: str
    config_hash: str
    level: int | None
    """Index in the current ladder; None for a level the spec no longer has."""
    current: int
    target: int
    ready: int


def _pace(ctx: _Ctx, o: _Outcome) -> Variants:
    """This cycle's replicas per level, moving from what runs toward the outcome's targets.

    1. A canary that must go (``drop_canary``) goes at once.
    2. Levels that grow take the room the GPU budget ``replicas + maxSurge`` leaves.
    3. Levels that shrink lose their pods that are not Ready first (free), then Ready ones only while the
       Ready total stays at or above ``ready_floor`` (or where it is, if it is already below).
    4. Growing levels take the room that freed.
    Pure; the same move over several cycles converges as the new pods become Ready.
    """
    spec = ctx.spec
    slots: dict[str, _Slot] = {}
    for plan in (o.stable, o.canary):
        if plan is not None:
            name = ctx.level(plan.level).name
            slots[name] = _Slot(name, plan.config_hash, plan.level, 0, plan.replicas, 0)
    for name, config_hash, replicas, dropped in _running(ctx, o):
        slot = slots.get(name)
        if slot is None:
            level = next((lv.index for lv in ctx.ladder if lv.name == name), None)
            slot = slots[name] = _Slot(name, config_hash, level, 0, 0, 0)
        if dropped:
            continue
        seen = _seen(ctx, config_hash)
        slot.current += replicas
        slot.ready += min(replicas, sum(1 for p in seen.pods if p.ready) if seen.pods else seen.ready_replicas)
    for slot in slots.values():
        slot.ready = min(slot.ready, slot.current)
    budget = spec.replicas + spec.rollout.max_surge
    to_full = o.mode is Mode.STEP and o.canary is not None and o.canary.replicas >= spec.replicas
    held = sum(s.ready for s in slots.values())
    slack = held - min(ready_floor(spec, to_full=to_full), held)

    def grow() -> None:
        room = budget - sum(s.current for s in slots.values())
        for slot in slots.values():
            add = max(0, min(slot.target - slot.current, room))
            slot.current += add
            room -= add

    grow()
    # Where the budget still blocks a level that grows, a Ready pod goes only to make room for it.
    need = sum(max(0, s.target - s.current) for s in slots.values()) or None
    for slot in reversed(list(slots.values())):  # what drains first, then the canary, then the stable
        excess = slot.current - slot.target
        if excess <= 0:
            continue
        free = min(excess, slot.current - slot.ready)
        if need is not None:
            need = max(0, need - free)
        take = min(excess - free, slack if need is None else min(slack, need))
        slot.current -= free + take
        slot.ready -= take
        slack -= take
        if need is not None:
            need -= take
    grow()

    def plan_of(plan: VariantPlan | None) -> VariantPlan | None:
        return None if plan is None else replace(plan, replicas=slots[ctx.level(plan.level).name].current)

    roles = {ctx.level(p.level).name for p in (o.stable, o.canary) if p is not None}
    stable = plan_of(o.stable)
    assert stable is not None
    return Variants(
        stable=stable,
        canary=plan_of(o.canary),
        retiring=tuple(
            RetiringPlan(s.name, s.current, s.config_hash) for s in slots.values() if s.name not in roles and s.current
        ),
    )


def _running(ctx: _Ctx, o: _Outcome) -> list[tuple[str, str, int, bool]]:
    """(level name, config hash, replicas asked for, goes at once) of every level's Deployment status names."""
    status = ctx.status
    out: list[tuple[str, str, int, bool]] = []
    names = status.ladder
    for role, variant in (("stable", status.stable), ("canary", status.canary)):
        if variant is None:
            continue
        name = names[variant.level] if 0 <= variant.level < len(names) else ctx.level_name(variant.level)
        out.append((name, variant.config_hash, variant.replicas, role == "canary" and o.drop_canary))
    out += [(r.level_name, r.config_hash, r.replicas, False) for r in status.retiring]
    return out


def _seen(ctx: _Ctx, config_hash: str) -> VariantObservation:
    """The observed Deployment that runs ``config_hash``, whichever role it had when observed."""
    for seen in (ctx.obs.stable, ctx.obs.canary, *ctx.obs.retiring):
        if seen.exists and seen.config_hash == config_hash:
            return seen
    return VariantObservation()


def _dip(ctx: _Ctx, o: _Outcome) -> str | None:
    """With no spare GPU (maxSurge 0), what a transition that moves replicas tells its Event: how far Ready
    replicas dip (CapacityDip)."""
    spec = ctx.spec
    if o.decision is None or o.mode is not Mode.STEP or o.canary is None or spec.rollout.max_surge > 0:
        return None
    before = ctx.status.canary
    had = before.replicas if before is not None and before.config_hash == o.canary.config_hash else 0
    moving = o.canary.replicas - had
    if moving <= 0:
        return None
    floor = ready_floor(spec, to_full=False)
    target = ctx.level(o.canary.level).name
    return (
        f"{Reason.CAPACITY_DIP}: maxSurge 0 leaves no spare GPU, so to move {moving} replica(s) onto {target} Ready "
        f"engines go before their replacements are Ready and Ready replicas may dip to {floor} of {spec.replicas} "
        "(rollout.maxSurge 1 or more keeps every replica Ready)"
    )


# --- small helpers ----------------------------------------------------------------------


def _plan_of(variant: VariantStatus) -> VariantPlan:
    """The VariantPlan a variant status describes."""
    return VariantPlan(variant.level, variant.replicas, variant.config_hash)


def _stable_plan(ctx: _Ctx) -> VariantPlan:
    return _plan_of(ctx.stable)


def _stage(level: Level, step: int, now: datetime) -> StageStatus:
    return StageStatus(index=level.index, name=level.name, tiers=level.tiers, step=step, started_at=now)


def _variant_status(level: Level, plan: VariantPlan, seen: VariantObservation) -> VariantStatus:
    return VariantStatus(
        config_hash=plan.config_hash,
        level=plan.level,
        tiers=level.tiers,
        cpu_size=to_quantity(level.cpu_bytes) if level.cpu_bytes is not None else None,
        replicas=plan.replicas,
        ready=_ready(seen, plan.config_hash),
    )


def _ready(seen: VariantObservation, config_hash: str) -> int:
    """Ready replicas running ``config_hash``; a Deployment still on another config counts none."""
    return seen.ready_replicas if seen.exists and seen.config_hash == config_hash else 0


def _evidence(status: KVOffloadPolicyStatus, assessment: Assessment | None, now: datetime) -> AnalysisStatus | None:
    previous = status.last_analysis
    started = status.stage.started_at if status.stage is not None else None
    if previous is not None and started is not None and previous.time <= started:
        previous = None  # a streak never spans a step start
    if assessment is None:
        return previous
    return record_verdict(previous, assessment, now)


def _too_inconclusive(ctx: _Ctx) -> bool:
    return _inconclusive_count(ctx) >= ctx.spec.analysis.max_inconclusive


def _inconclusive_count(ctx: _Ctx) -> int:
    return ctx.evidence.consecutive_inconclusive if ctx.evidence is not None else 0


def _changed(annotations: Mapping[str, str], seen: Mapping[str, str], key: str) -> bool:
    value = annotations.get(key, "")
    return bool(value) and seen.get(key) != value


def _seen_still_set(seen: Mapping[str, str], annotations: Mapping[str, str]) -> dict[str, str]:
    """Forget values of annotations that were removed, so setting one again counts as a change."""
    return {k: v for k, v in seen.items() if k in annotations}


def _adopted_level(ctx: _Ctx) -> Level | None:
    """A stable Deployment already running a known level with the exact config: keep it."""
    seen = ctx.obs.stable
    if not seen.exists or seen.level is None or not 0 <= seen.level < len(ctx.ladder):
        return None
    level = ctx.ladder[seen.level]
    if level.canary_only or seen.config_hash != ctx.hash_of(level):
        return None
    return level


def _map_level(ctx: _Ctx) -> Level:
    """The stable level in the new ladder by name; if gone, the nearest lower old level that remains."""
    by_name = {lv.name: lv for lv in ctx.ladder if not lv.canary_only}
    old = ctx.status.ladder
    index = ctx.stable.level
    for name in reversed(old[: index + 1]):
        if name in by_name:
            return by_name[name]
    return ctx.ladder[0]


def _level_below(ctx: _Ctx, level: Level) -> Level | None:
    """The level the guard falls back to: the next lower one that may hold the whole fleet."""
    return next((lv for lv in reversed(ctx.ladder[: level.index]) if not lv.canary_only), None)


def _resting_reason(ctx: _Ctx, mode: Mode) -> Reason:
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


def _baseline_from(ctx: _Ctx) -> BaselineStatus:
    sample = ctx.obs.measurements.stable if ctx.obs.measurements is not None else None
    if sample is None:
        return BaselineStatus(taken_at=ctx.now)
    w = sample.workload or assess.WorkloadSample()
    return BaselineStatus(
        ttft_p99=sample.ttft_p99,
        itl_p99=sample.itl_p99,
        request_rate=sample.request_rate,
        gpu_kv_usage=sample.kv_usage,
        taken_at=ctx.now,
        prompt_tokens=_percentiles(w.prompt_tokens),
        ttft=_percentiles(w.ttft),
        itl=_percentiles(w.itl),
        e2e_latency=_percentiles(w.e2e),
        concurrency=w.running_requests,
        prefix_cache_hit_rate=w.prefix_cache_hit_rate,
        gpu_kv_usage_max=w.kv_usage_max,
        preemption_rate=w.preemptions_per_second,
    )


def _percentiles(p: assess.Percentiles) -> Percentiles | None:
    if p.p50 is None and p.p95 is None and p.p99 is None:
        return None
    return Percentiles(p50=p.p50, p95=p.p95, p99=p.p99)


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else format_duration(value)


def _baseline_text(b: BaselineStatus) -> str:
    rate = "n/a" if b.request_rate is None else f"{b.request_rate:.2f} req/s"
    usage = "n/a" if b.gpu_kv_usage is None else f"{b.gpu_kv_usage:.0%}"
    text = f"p99 TTFT {_seconds(b.ttft_p99)}, p99 ITL {_seconds(b.itl_p99)}, {rate}, GPU KV {usage}"
    extra: list[str] = []
    if b.prompt_tokens is not None and b.prompt_tokens.p50 is not None:
        extra.append(f"p50 prompt {b.prompt_tokens.p50:,.0f} tokens")
    if b.concurrency is not None:
        extra.append(f"{b.concurrency:.1f} running per engine")
    if b.prefix_cache_hit_rate is not None:
        extra.append(f"prefix-cache hits {b.prefix_cache_hit_rate:.1%}")
    if b.gpu_kv_usage_max is not None:
        extra.append(f"max GPU KV {b.gpu_kv_usage_max:.0%}")
    if b.preemption_rate is not None:
        extra.append(f"{b.preemption_rate:.3g} preemptions/s")
    return ", ".join([text, *extra])


def _figures(analysis: AnalysisStatus | None) -> str:
    """A verdict with its key figures, for Events and messages."""
    if analysis is None:
        return "no analysis yet"
    parts: list[str] = []
    for m in analysis.metrics:
        if m.name not in (TTFT_P99, ITL_P99, EXTERNAL_SHARE):
            continue
        show = (lambda v: f"{v:.1%}") if m.name == EXTERNAL_SHARE else _seconds
        values = [f"{who} {show(v)}" for who, v in (("canary", m.canary), ("stable", m.stable)) if v is not None]
        if values:
            parts.append(f"{m.name} {' / '.join(values)}")
    figures = f"; {', '.join(parts)}" if parts else ""
    return f"{analysis.verdict.value}: {analysis.message}{figures}"


def _verdict_text(ctx: _Ctx) -> str:
    return f"last verdict {_figures(ctx.evidence)}" if ctx.evidence is not None else "no verdict yet"


def _failing_for(ctx: _Ctx) -> str:
    since = ctx.evidence.failing_since if ctx.evidence is not None else None
    return format_duration((ctx.now - since).total_seconds()) if since is not None else "?"


def _progress(ctx: _Ctx, duration: float) -> str:
    return f"{format_duration(ctx.elapsed)} of {format_duration(duration)}"


def _step_name(ctx: _Ctx) -> str:
    level = ctx.level(ctx.stage.index)
    step = ctx.stage.step
    if step == 0:
        return f"canary {level.name}"
    return f"{level.name} at {ctx.spec.rollout.promotion_steps[step - 1]}%"


def _cpu_text(level: Level) -> str:
    return f" ({to_quantity(level.cpu_bytes)} CPU tier)" if level.cpu_bytes is not None else ""
