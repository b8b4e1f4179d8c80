"""Warm-up: a fresh canary's cache fills before its latency is judged, and what the analysis judges meanwhile.

Warm is a property of the cache, not a request count: a new engine starts with an empty prefix cache while the
stable engines' is full, so until the canary's prefix-cache hit rate has caught up (``analysis.warmup.cacheParity``
of the stable's) its tail latency measures coldness, not the tier. The warm-up ends then (with the least time and
requests met), or at ``maxDuration`` at the latest; the canary is judged from one analysis window later
(``judgedFrom``), so no window it is judged on overlaps the warm-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from kvoffload.api.conventions import Reason
from kvoffload.api.quantity import format_duration, parse_duration
from kvoffload.api.status import KVOffloadPolicyStatus, Mode, WarmupStatus
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.policy.ladder import Level
from kvoffload.rollout.context import Ctx, Outcome, ready_of
from kvoffload.rollout.observe import observing
from kvoffload.rollout.plan import AnalysisSubject, Event
from kvoffload.rollout.replicas import canary_replicas


def analysis_subject(
    spec: KVOffloadPolicySpec, ladder: Sequence[Level], status: KVOffloadPolicyStatus | None, now: datetime
) -> AnalysisSubject:
    """The level of ``ladder`` (the sized plan's) to judge and whether its tiers count as warm.

    Warm after the first half of a canary or promotion step. The stable guard
    and the baseline are never warm: they are held to the absolute budgets only.
    """
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
        comparing=warmed_up_canary(spec, status, now),
    )


def judged_from(warmup: WarmupStatus | None) -> datetime | None:
    """When the step's canary is judged: ``judgedFrom``, else ``warmAt`` (a status written before judgedFrom)."""
    if warmup is None:
        return None
    return warmup.judged_from if warmup.judged_from is not None else warmup.warm_at


def warmed_up_canary(spec: KVOffloadPolicySpec, status: KVOffloadPolicyStatus, now: datetime) -> bool:
    """The step's canary is judged (``analysis.warmup`` over and one window since, or off): its latency counts.

    A step without a warm-up record (a status written before warm-ups existed) is judged at once."""
    if not spec.analysis.warmup.enabled or status.warmup is None:
        return True
    start = judged_from(status.warmup)
    return start is not None and now >= start


def longest_warmup_seconds(spec: KVOffloadPolicySpec) -> float:
    """``analysis.warmup.maxDuration``, else half the step; never under the least duration, which the spec asks for."""
    w = spec.analysis.warmup
    longest = parse_duration(w.max_duration) if w.max_duration is not None else None
    if longest is None:
        longest = parse_duration(spec.rollout.step_duration) / 2
    return max(longest, spec.analysis.warmup_seconds())


def _hit_rates(ctx: Ctx, before: WarmupStatus) -> tuple[float | None, float | None]:
    """The canary's and the stable's prefix-cache hit rates this cycle; the last ones when nothing was measured."""
    m = ctx.obs.measurements
    if m is None or m.error is not None:
        return before.canary_hit_rate, before.stable_hit_rate
    return (
        m.canary.prefix_cache_hit_rate if m.canary is not None else None,
        m.stable.prefix_cache_hit_rate if m.stable is not None else None,
    )


def _parity_text(w: WarmupStatus) -> tuple[bool, str]:
    """Whether the canary's cache caught up with the stable's (or parity is not checked), and the words for it."""
    if w.cache_parity is None:
        return True, "cache parity not required (analysis.warmup.cacheParity 0)"
    if w.canary_hit_rate is None or w.stable_hit_rate is None:
        rates = (("canary", w.canary_hit_rate), ("stable", w.stable_hit_rate))
        unknown = " or ".join(who for who, rate in rates if rate is None)
        return True, f"cache parity not checked: no {unknown} prefix-cache hit rate in the window"
    need = w.cache_parity * w.stable_hit_rate
    ok = w.canary_hit_rate >= need
    return ok, (
        f"prefix-cache hit rate {w.canary_hit_rate:.0%}, {'at least' if ok else 'under'} {need:.0%} "
        f"({w.cache_parity:.0%} of the stable's {w.stable_hit_rate:.0%})"
    )


def _all_ready(ctx: Ctx, o: Outcome) -> bool:
    """Every canary replica of the step is Ready (a promotion step's fresh pods among them)."""
    if o.canary is None:
        return False
    return ready_of(ctx.obs.canary, o.canary.config_hash) >= canary_replicas(ctx.spec, o.stage.step)


def warmup_of(ctx: Ctx, o: Outcome) -> tuple[WarmupStatus | None, Event | None]:
    """The step's warm-up after this cycle, and the Event when it ended now.

    A new step starts a new warm-up. It ends at the first cycle at which the least time has passed, the canary's
    requests in the window reach the least count, and its prefix-cache hit rate has caught up with the stable's
    (unless parity is off or a hit rate is unknown), or, past the longest warm-up, without that catch-up: cold. A
    canary short of requests is not cold but unseen (its verdicts are Inconclusive), and one short of Ready replicas
    may hide a fresh pod behind a warm one (a promotion step's): either keeps warming. The canary is judged one
    analysis window after the end (``judgedFrom``)."""
    analysis = ctx.spec.analysis
    if o.mode is not Mode.STEP or not analysis.warmup.enabled or o.stage.started_at is None:
        return None, None
    before = ctx.status.warmup
    since = o.stage.started_at
    parity = analysis.warmup.cache_parity or None
    if before is None or before.since != since:
        if before is None and ctx.status.mode is Mode.STEP and ctx.status.stage == o.stage:
            return None, None  # a step that began before warm-ups existed: it is judged at once
        return (
            WarmupStatus(
                since=since,
                duration=format_duration(analysis.warmup_seconds()),
                requests=analysis.warmup_requests(),
                cache_parity=parity,
            ),
            None,
        )
    if before.warm_at is not None:
        return before, None
    sample = ctx.obs.measurements.canary if ctx.obs.measurements is not None else None
    served = sample.requests if sample is not None and sample.requests is not None else before.served
    canary_hit, stable_hit = _hit_rates(ctx, before)
    current = before.model_copy(
        update={
            "served": served,
            "cache_parity": parity,
            "canary_hit_rate": canary_hit,
            "stable_hit_rate": stable_hit,
        }
    )
    elapsed = (ctx.now - since).total_seconds()
    busy = served is not None and served >= before.requests
    caught_up, parity_words = _parity_text(current)
    longest = longest_warmup_seconds(ctx.spec)
    ready = observing(ctx.spec) or _all_ready(ctx, o)  # an observed fleet's pods are no fresh canaries
    if elapsed < analysis.warmup_seconds() or not busy or not ready or not (caught_up or elapsed >= longest):
        return current, None
    window = parse_duration(analysis.window)
    judged = ctx.now + timedelta(seconds=window)
    level = ctx.level(o.canary.level).name if o.canary is not None else o.stage.name
    count = "no" if served is None else f"{served:.0f}"
    judged_words = (
        f"its latency is judged {format_duration(window)} from now (one analysis window, so no window it is "
        "judged on holds a request served cold)"
    )
    if caught_up:
        message = (
            f"canary {level} warm after {format_duration(elapsed)}: {count} requests in the analysis window "
            f"(at least {before.requests}), at least {before.duration} passed, {parity_words}; {judged_words}"
        )
    else:
        message = (
            f"canary {level} judged while still cold: its {parity_words} after the longest warm-up "
            f"({format_duration(longest)}, analysis.warmup.maxDuration or half the step); a tier that keeps its "
            f"cache cold is what the analysis is for; {judged_words}"
        )
    return current.model_copy(update={"warm_at": ctx.now, "judged_from": judged}), Event(
        "Normal", Reason.WARMED_UP, message
    )


def warmup_reason(warmup: WarmupStatus, spec: KVOffloadPolicySpec) -> str:
    parity = (
        f", and its prefix-cache hit rate at {warmup.cache_parity:.0%} of the stable's"
        if warmup.cache_parity is not None
        else ""
    )
    return (
        f"warm-up: the canary's latency (absolute budgets and canary/stable ratios) and offload hit checks are "
        f"judged one analysis window after it is warm: after {warmup.duration}, with every canary Ready, "
        f"{warmup.requests} canary requests in the window{parity} (a fresh canary's cache is empty, the stable "
        f"engines' is full; its cache is waited for up to {format_duration(longest_warmup_seconds(spec))}); the "
        "error gate and hard failures act at once"
    )


def warming_text(ctx: Ctx) -> str:
    w = ctx.status.warmup
    if w is None:
        return "warming up"
    if w.warm_at is not None:
        start = judged_from(w)
        left = format_duration(max(0.0, (start - ctx.now).total_seconds())) if start is not None else "?"
        return f"warm, judged in {left} (the analysis window still holds requests served cold)"
    served = "no" if w.served is None else f"{w.served:.0f}"
    parts = [f"{served} of {w.requests} canary requests in the window", f"at least {w.duration}"]
    canary, stage = ctx.status.canary, ctx.status.stage
    if canary is not None and stage is not None and not observing(ctx.spec):
        ready, wanted = ready_of(ctx.obs.canary, canary.config_hash), canary_replicas(ctx.spec, stage.step)
        if ready < wanted:
            parts.append(f"{ready}/{wanted} canaries Ready")
    if w.cache_parity is not None:
        if w.canary_hit_rate is not None and w.stable_hit_rate is not None:
            parts.append(
                f"prefix-cache hit rate {w.canary_hit_rate:.0%}, needs {w.cache_parity * w.stable_hit_rate:.0%} "
                f"({w.cache_parity:.0%} of the stable's {w.stable_hit_rate:.0%})"
            )
        parts.append(f"cache waited for up to {format_duration(longest_warmup_seconds(ctx.spec))}")
    return f"warming up ({', '.join(parts)})"
