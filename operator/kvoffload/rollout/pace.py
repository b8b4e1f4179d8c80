"""Pacing: moving replicas between levels within the GPU budget and the Ready floor (docs/design.md, "The ladder")."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvoffload.api.conventions import Reason
from kvoffload.api.status import Mode
from kvoffload.rollout.context import Ctx, Outcome, plan_of, stable_plan
from kvoffload.rollout.observations import VariantObservation
from kvoffload.rollout.plan import RetiringPlan, VariantPlan, Variants
from kvoffload.rollout.replicas import canary_replicas, ready_floor, stable_replicas


def target_plans(ctx: Ctx, mode: Mode) -> tuple[VariantPlan, VariantPlan | None]:
    """The replicas each role is headed for in ``mode`` at the current stage (what a hold keeps heading to)."""
    stable = stable_plan(ctx)
    canary = ctx.status.canary
    if mode is not Mode.STEP or canary is None:
        return replace(stable, replicas=ctx.spec.replicas), None
    count = canary_replicas(ctx.spec, ctx.stage.step)
    return replace(stable, replicas=stable_replicas(ctx.spec, count)), replace(plan_of(canary), replicas=count)


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


def pace(ctx: Ctx, o: Outcome) -> Variants:
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
        seen = observed_variant(ctx, config_hash)
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


def _running(ctx: Ctx, o: Outcome) -> list[tuple[str, str, int, bool]]:
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


def observed_variant(ctx: Ctx, config_hash: str) -> VariantObservation:
    """The observed Deployment that runs ``config_hash``, whichever role it had when observed."""
    for seen in (ctx.obs.stable, ctx.obs.canary, *ctx.obs.retiring):
        if seen.exists and seen.config_hash == config_hash:
            return seen
    return VariantObservation()


def capacity_dip(ctx: Ctx, o: Outcome) -> str | None:
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
