"""Writing an ``Outcome`` into the plan: status, conditions, history, Events and when to come back."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime

from kvoffload.analysis import measurements
from kvoffload.analysis.assess import Assessment, record_verdict
from kvoffload.api.conventions import (
    ANALYSIS_INCONCLUSIVE,
    DEGRADED,
    INVALID,
    LABEL_POLICY,
    MANUAL_ANNOTATIONS,
    OFFLOAD_WILL_NOT_PAY,
    PAUSED,
    PODS_NOT_SCRAPED,
    PROGRESSING,
    PROMETHEUS_TOKEN_UNREADABLE,
    READY,
    RECONCILING,
    STALLED,
    Reason,
)
from kvoffload.api.quantity import parse_duration, to_quantity
from kvoffload.api.status import (
    AnalysisStatus,
    BaselineStatus,
    Condition,
    HistoryEntry,
    HostMemoryStatus,
    KVOffloadPolicyStatus,
    Mode,
    Percentiles,
    PreflightStatus,
    RetiringStatus,
    VariantStatus,
    Verdict,
)
from kvoffload.policy.ladder import Level
from kvoffload.rollout import conditions as cond
from kvoffload.rollout.context import (
    Ctx,
    Outcome,
    annotation_changed,
    level_below,
    preflight_due,
    ready_of,
    spec_digest,
)
from kvoffload.rollout.observations import Observations, VariantObservation
from kvoffload.rollout.observe import observe_message, observe_status, observing_condition
from kvoffload.rollout.pace import capacity_dip, observed_variant, pace
from kvoffload.rollout.plan import Event, Plan, VariantPlan, Variants
from kvoffload.rollout.takeover import workload_status
from kvoffload.rollout.texts import display_of, not_scraped_message
from kvoffload.rollout.warmup import judged_from, warmup_of, warmup_reason

HISTORY_LIMIT = 20
PENDING_REQUEUE_SECONDS = 1.0
"""How soon to come back when another manual annotation waits its turn."""


def write_plan(ctx: Ctx, o: Outcome) -> Plan:
    """Turn an outcome into the Plan: conditions, phase, status, history, events."""
    seen = o.seen if o.seen is not None else ctx.seen
    paused = o.paused if o.paused is not None else ctx.paused
    conditions = _conditions(ctx, o, paused)
    stage_level = ctx.level(o.stage.index)
    paced = pace(ctx, o)
    warmup, warmed = warmup_of(ctx, o)
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
        stable=_variant_status(ctx.level(o.stable.level), paced.stable, observed_variant(ctx, o.stable.config_hash)),
        canary=(
            _variant_status(
                ctx.level(paced.canary.level), paced.canary, observed_variant(ctx, paced.canary.config_hash)
            )
            if paced.canary is not None
            else None
        ),
        warmup=warmup,
        retiring=[
            RetiringStatus(
                level_name=r.level_name,
                config_hash=r.config_hash,
                replicas=r.replicas,
                ready=ready_of(observed_variant(ctx, r.config_hash), r.config_hash),
            )
            for r in paced.retiring
        ],
        baseline=o.baseline if o.baseline is not None else ctx.status.baseline,
        preflight=_preflight_of(ctx, o),
        observe=observe_status(ctx.spec, ctx.obs.fleet),
        last_analysis=last_analysis,
        host_memory=_host_memory(ctx, paced),
        selector=f"{LABEL_POLICY}={ctx.obs.sized.policy}",  # every engine of the policy, whatever its level
        conditions=conditions,
        history=history[-HISTORY_LIMIT:],
        annotations_seen=dict(seen),
        message=observe_message(ctx.spec, o.message),
        replicas=paced.total_replicas,
        workload=workload_status(ctx),
        spec_digest=spec_digest(ctx.spec),
        **display_of(o, last_analysis),
    )
    event = o.event
    if event is not None and (dip := capacity_dip(ctx, o)) is not None:
        event = replace(event, message=f"{event.message}; {dip}")
    if event is not None and warmup is not None and warmup.since == ctx.now and warmup.warm_at is None:
        event = replace(event, message=f"{event.message}; {warmup_reason(warmup, ctx.spec)}")
    events = tuple(e for e in (event, warmed) if e is not None)
    return Plan(
        status=status,
        variants=paced,
        events=(*events, *_token_events(ctx), *_scrape_events(ctx)),
        requeue_after=_requeue_after(ctx, o, seen, paused),
    )


def _host_memory(ctx: Ctx, variants: Variants) -> HostMemoryStatus:
    """Per replica, for the running level that needs the most (the canary's while it needs more): the figure the
    nodes must have room for during the step."""
    levels = [variants.stable.level] + ([variants.canary.level] if variants.canary is not None else [])
    biggest = max((ctx.obs.sized[index].memory for index in levels), key=lambda m: m.request)
    return HostMemoryStatus(
        pinned=to_quantity(biggest.pinned),
        shm=to_quantity(biggest.shm),
        request=to_quantity(biggest.request),
        limit=to_quantity(biggest.limit),
    )


def _preflight_of(ctx: Ctx, o: Outcome) -> PreflightStatus | None:
    if o.preflight is not None:
        return o.preflight
    return None if o.new_ladder else ctx.status.preflight


def _conditions(ctx: Ctx, o: Outcome, paused: bool) -> list[Condition]:
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
    c = observing_condition(ctx.spec, c, put)
    token = ctx.obs.token
    # Written once a token is asked for and cannot be read, and kept (False) from then on.
    if token is not None and (token.problem is not None or cond.find(c, PROMETHEUS_TOKEN_UNREADABLE) is not None):
        c = put(
            c, PROMETHEUS_TOKEN_UNREADABLE, token.problem is not None, token.problem or Reason.TOKEN_READ, token.message
        )
    return _pods_not_scraped(ctx, c, put)


def _pods_not_scraped(
    ctx: Ctx, c: list[Condition], put: Callable[[list[Condition], str, bool, str, str], list[Condition]]
) -> list[Condition]:
    """PodsNotScraped: True while no Prometheus scrapes the policy's pods; written once it was True, and kept
    (False) from then on. A cycle with no analysis keeps it as it was."""
    if ctx.obs.measurements is None:
        return c
    message = not_scraped_message(ctx)
    if message is None and cond.find(c, PODS_NOT_SCRAPED) is None:
        return c
    if message is None:
        return put(c, PODS_NOT_SCRAPED, False, Reason.SCRAPED, "")
    return put(c, PODS_NOT_SCRAPED, True, Reason.NOT_SCRAPED, message)


def _scrape_events(ctx: Ctx) -> tuple[Event, ...]:
    """A Warning when the policy's pods are found not scraped, once (not every cycle)."""
    message = not_scraped_message(ctx)
    if message is None or cond.is_true(ctx.status.conditions, PODS_NOT_SCRAPED):
        return ()
    return (Event("Warning", Reason.NOT_SCRAPED, message),)


def _token_events(ctx: Ctx) -> tuple[Event, ...]:
    """A Warning when the token becomes unreadable (or unreadable for another reason), not every cycle."""
    token = ctx.obs.token
    if token is None or token.problem is None:
        return ()
    was = cond.find(ctx.status.conditions, PROMETHEUS_TOKEN_UNREADABLE)
    if was is not None and was.status == "True" and was.message == token.message:
        return ()
    return (Event("Warning", token.problem, token.message),)


def _offload_will_not_pay(
    ctx: Ctx, o: Outcome, c: list[Condition], put: Callable[[list[Condition], str, bool, str, str], list[Condition]]
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
    elif o.mode is Mode.BASELINE and preflight_due(ctx, ctx.level(o.stable.level)):
        why = "judged at the end of the GPU-only baseline"
    elif o.mode is Mode.BASELINE:
        why = f"the baseline runs on {ctx.level(o.stable.level).name}, not GPU-only: no preflight on this ladder"
    else:
        why = "no preflight verdict on this ladder"
    return put(c, OFFLOAD_WILL_NOT_PAY, False, Reason.PREFLIGHT_NOT_JUDGED, why)


def _requeue_after(ctx: Ctx, o: Outcome, seen: Mapping[str, str], paused: bool) -> float | None:
    """Seconds after ``ctx.now`` when the next decision falls due, if sooner than never: the loop comes back at the
    earlier of this and its ``analysis.interval``."""
    if any(annotation_changed(ctx.obs.annotations, seen, key) for key in MANUAL_ANNOTATIONS):
        return PENDING_REQUEUE_SECONDS
    due = [left for left in (_stage_left(ctx, o, paused), breach_left(ctx, o)) if left is not None]
    return min(due) if due else None


def _stage_left(ctx: Ctx, o: Outcome, paused: bool) -> float | None:
    """Seconds until the running baseline or step ends."""
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


def breach_left(ctx: Ctx, o: Outcome) -> float | None:
    """Seconds until the open Fail run has lasted ``sustainedFor`` (``failingSince + sustainedFor - now``), where a
    sustained breach would roll back what ``o`` keeps running: a canary step, or the stable guard at the top.

    The cycle at that instant can decide the rollback, rather than the first one after it that the analysis
    interval brings (up to an interval later). A pause does not stop a rollback, so it does not stop this either.
    None when no Fail run is open, when the run began before the stage (a streak never spans a step start, so it
    ends with this cycle's new stage), or when the time is already up (the next verdict decides: ``sustained()``
    also needs two Fail verdicts), so never zero or negative.
    """
    evidence = ctx.evidence
    if evidence is None or evidence.verdict is not Verdict.FAIL or evidence.failing_since is None:
        return None
    if o.mode is Mode.STABLE:
        if level_below(ctx, ctx.level(o.stable.level)) is None:
            return None  # no level below: the guard has nowhere to roll the fleet to
    elif o.mode is not Mode.STEP:
        return None
    started = o.stage.started_at
    if started is not None and evidence.failing_since <= started:
        return None
    elapsed = (ctx.now - evidence.failing_since).total_seconds()
    left = parse_duration(ctx.spec.analysis.sustained_for) - elapsed
    return left if left > 0 else None


def _variant_status(level: Level, plan: VariantPlan, seen: VariantObservation) -> VariantStatus:
    return VariantStatus(
        config_hash=plan.config_hash,
        level=plan.level,
        tiers=level.tiers,
        cpu_size=to_quantity(level.cpu_bytes) if level.cpu_bytes is not None else None,
        replicas=plan.replicas,
        ready=ready_of(seen, plan.config_hash),
    )


def evidence_of(
    status: KVOffloadPolicyStatus, assessment: Assessment | None, now: datetime, *, starting: bool = False
) -> AnalysisStatus | None:
    """The verdict's running record after this cycle's ``assessment`` (None: the record as it stands now).

    A streak never spans a step start. Nor does a Fail run (the verdict's and each custom metric's
    ``failingSince``) span the end of the step's warm-up: what was seen while the canary was cold does not count
    once it is judged. The Inconclusive count does: missing evidence is missing either way, except while
    ``starting`` (a role has no Ready pod yet, :func:`roles_starting`): there is none to miss before an engine
    serves, so an Inconclusive verdict then is recorded with no streak. An engine that takes longer to start than
    ``maxInconclusive`` intervals (a large model, a large pinned pool) does not pause the ladder; a canary that is
    never Ready is the progress deadline's."""
    previous = status.last_analysis
    started = status.stage.started_at if status.stage is not None else None
    if previous is not None and started is not None and previous.time <= started:
        previous = None  # a streak never spans a step start
    judged = judged_from(status.warmup)
    if previous is not None and judged is not None and previous.time < judged <= now:
        previous = without_fail_run(previous)
    if assessment is None:
        return previous
    recorded = record_verdict(previous, assessment, now)
    if starting and assessment.verdict is Verdict.INCONCLUSIVE:
        return recorded.model_copy(update={"consecutive_inconclusive": 0})
    return recorded


def roles_starting(status: KVOffloadPolicyStatus, observations: Observations) -> bool:
    """Whether a role the status names (stable, canary) has no Ready pod on its config yet."""
    roles = ((status.stable, observations.stable), (status.canary, observations.canary))
    return any(role is not None and ready_of(seen, role.config_hash) == 0 for role, seen in roles)


def without_fail_run(analysis: AnalysisStatus) -> AnalysisStatus:
    """``analysis`` with no Fail run open: neither the verdict's nor any custom metric's."""
    metrics = [
        m.model_copy(update={"failing_since": None, "sustained": None if m.sustained is None else False})
        for m in analysis.metrics
    ]
    return analysis.model_copy(update={"consecutive_failures": 0, "failing_since": None, "metrics": metrics})


def baseline_from(ctx: Ctx) -> BaselineStatus:
    sample = ctx.obs.measurements.stable if ctx.obs.measurements is not None else None
    if sample is None:
        return BaselineStatus(taken_at=ctx.now)
    w = sample.workload or measurements.WorkloadSample()
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


def _percentiles(p: measurements.Percentiles) -> Percentiles | None:
    if p.p50 is None and p.p95 is None and p.p99 is None:
        return None
    return Percentiles(p50=p.p50, p95=p.p95, p99=p.p99)
