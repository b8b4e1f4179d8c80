"""Observe-only policies (``spec.rollout.observeOnly``): the ladder climbs in status over a running fleet the
operator did not render, and nothing is applied (docs/design.md, "Observe-only policies").

``decide`` runs as it always does; what differs is what it sees and what becomes of its plan:

- **The roles are virtual.** ``observed_roles`` builds the observations of the Deployments a real climb would
  run (stable, canary, draining levels) from the status, which holds what the last decision asked of each, and
  from the observed fleet's Ready pods, which stand in for their engines. A step waits on its canaries, so
  they are counted Ready first. No pod is a canary's, so no canary pod failure can be seen.
- **The analysis is the fleet's.** The controller measures the fleet's pods (namespace and pod name, as the
  team's own scrape labels its series) for both roles, and ``assess(observing=True)`` judges the absolute
  budgets on them; what needs an offload tier, or a canary apart from its stable side, is reported as not
  judged (``NOT_JUDGED``), never faked.
- **Nothing is written** but the policy's status and Events: the controller's one gate. ``would_apply``
  words the Events of what a real climb would have written.
- **Switching** ``observeOnly`` either way starts a new ladder (``switched``): from GPU-only into observing,
  and, back to applying, from GPU-only or a Deployment of the policy that still runs a level exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from kvoffload.api.conventions import OBSERVING, Reason
from kvoffload.api.status import Condition, KVOffloadPolicyStatus, ObserveStatus
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.policy.render import deployment_name
from kvoffload.rollout import conditions as cond
from kvoffload.rollout.observations import FleetObservation, Observations, VariantObservation
from kvoffload.rollout.plan import Event, Variants

Put = Callable[[list[Condition], str, bool, str, str], list[Condition]]
"""How ``record`` sets a condition (with its clock and generation)."""

OBSERVE_PREFIX = "observe-only: "

NOT_JUDGED = (
    "externalShare, tierHits, tierHitShare: the observed fleet runs no offload tier, so no prompt token can come "
    "from one",
    "liveConfig: the fleet runs its own engine config, not the level's",
    "ttftP99Ratio, itlP99Ratio: canary and stable are the same engines (1.0 by construction)",
    "canary pod failures (OOMKilled, restarts, CrashLoopBackOff, allocation mismatch): no canary pod runs",
    "hostMemory: what the levels would ask of a node, never seen on one",
)
"""What an observe-only policy cannot judge on a fleet without the tier (``status.observe.notJudged``)."""


def observing(spec: KVOffloadPolicySpec) -> bool:
    return spec.rollout.observe_only


def switched(status: KVOffloadPolicyStatus, spec: KVOffloadPolicySpec) -> bool:
    """Whether ``observeOnly`` differs from what the status was written under (``status.observe`` is set only
    while observing). A status without a ladder yet has nothing to switch from."""
    return status.stable is not None and (status.observe is not None) != observing(spec)


def without_roles(status: KVOffloadPolicyStatus) -> KVOffloadPolicyStatus:
    """The status with the old mode's ladder dropped (roles, stage, baseline, preflight), its history, conditions
    and manual annotations kept: the roles of one mode are no evidence for the other."""
    return status.model_copy(
        update={
            "stage": None,
            "stable": None,
            "canary": None,
            "retiring": [],
            "warmup": None,
            "baseline": None,
            "preflight": None,
            "mode": None,
        }
    )


def switch_text(spec: KVOffloadPolicySpec) -> str:
    if observing(spec):
        return (
            "rollout.observeOnly turned on: nothing is applied from now on (the policy's Deployments are left as "
            "they are, never deleted); a new ladder is analysed over the observed fleet; "
        )
    return "rollout.observeOnly turned off: a new ladder, applied for real; "


def observed_roles(status: KVOffloadPolicyStatus | None, observations: Observations) -> Observations:
    """The observations with the roles a real climb would run, made of the status and the fleet's Ready pods.

    Each role's Deployment "exists" with the replicas the last decision asked of it, and as many of them Ready
    as the fleet has Ready pods left, the canary first. No role has pods of its own."""
    fleet = observations.fleet or FleetObservation("")
    if status is None or status.stable is None:
        return replace(observations, stable=VariantObservation(), canary=VariantObservation(), retiring=())
    left = fleet.ready

    def role(config_hash: str, level: int | None, replicas: int) -> VariantObservation:
        nonlocal left
        ready = min(replicas, left)
        left -= ready
        return VariantObservation(
            exists=True, config_hash=config_hash, level=level, desired_replicas=replicas, ready_replicas=ready
        )

    canary = status.canary
    canary_seen = role(canary.config_hash, canary.level, canary.replicas) if canary is not None else None
    stable = role(status.stable.config_hash, status.stable.level, status.stable.replicas)
    retiring = tuple(role(r.config_hash, None, r.replicas) for r in status.retiring)
    return replace(observations, stable=stable, canary=canary_seen or VariantObservation(), retiring=retiring)


def observe_status(spec: KVOffloadPolicySpec, fleet: FleetObservation | None) -> ObserveStatus | None:
    """``status.observe``: set only while observing."""
    observe = spec.rollout.observe
    if not observing(spec) or observe is None:
        return None
    seen = fleet or FleetObservation(observe.selector.label_selector())
    return ObserveStatus(selector=seen.selector, pods=len(seen.pods), ready=seen.ready, not_judged=list(NOT_JUDGED))


def observe_message(spec: KVOffloadPolicySpec, message: str) -> str:
    """The status's one-line summary, marked while observing (``kubectl get kvop -o wide`` shows it)."""
    marked = observing(spec) and not message.startswith(OBSERVE_PREFIX)  # a hold keeps the last message
    return f"{OBSERVE_PREFIX}{message}" if marked else message


def observing_condition(spec: KVOffloadPolicySpec, conditions: list[Condition], put: Put) -> list[Condition]:
    """Observing: True while observing; written False once when it stops, and absent on a policy that never did."""
    observe = spec.rollout.observe
    if observing(spec) and observe is not None:
        message = (
            f"the fleet of pods {observe.selector.label_selector()} is analysed and every decision recorded; "
            "no Deployment, Service or PodMonitor is written (Events WouldApply say what would have been)"
        )
        return put(conditions, OBSERVING, True, Reason.OBSERVE_ONLY, message)
    if cond.find(conditions, OBSERVING) is None:
        return conditions
    return put(conditions, OBSERVING, False, Reason.APPLYING, "")


def would_apply(
    policy: str, before: KVOffloadPolicyStatus | None, ladder: list[str], variants: Variants
) -> tuple[Event, ...]:
    """The Events of what a real climb would have written this cycle: one per level Deployment whose config or
    replicas differ from what the status last asked of it (while observing), and one per Deployment that would
    go. ``ladder``: the current ladder's level names."""
    had: dict[str, tuple[str, int]] = {}
    if before is not None and before.observe is not None:
        for variant in (before.stable, before.canary):
            if variant is not None and 0 <= variant.level < len(before.ladder):
                had[before.ladder[variant.level]] = (variant.config_hash, variant.replicas)
        had.update({r.level_name: (r.config_hash, r.replicas) for r in before.retiring})
    wanted: dict[str, tuple[str, int]] = {}
    for plan in (variants.stable, variants.canary):
        if plan is not None and plan.replicas > 0:
            wanted[ladder[plan.level]] = (plan.config_hash, plan.replicas)
    wanted.update({r.level_name: (r.config_hash, r.replicas) for r in variants.retiring if r.replicas > 0})
    events = []
    for level, (config_hash, replicas) in wanted.items():
        if had.get(level) != (config_hash, replicas):
            events.append(
                Event(
                    "Normal",
                    Reason.WOULD_APPLY,
                    f"not applied (observe-only): Deployment {deployment_name(policy, level)} would run {replicas} "
                    f"replica(s) of level {level}, config {config_hash}",
                )
            )
    for level in had.keys() - wanted.keys():
        events.append(
            Event(
                "Normal",
                Reason.WOULD_APPLY,
                f"not applied (observe-only): Deployment {deployment_name(policy, level)} would be deleted "
                f"(level {level} drained)",
            )
        )
    return tuple(events)
