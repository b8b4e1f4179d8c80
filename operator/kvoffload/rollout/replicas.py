"""Replica arithmetic: how many replicas each role runs at a step, and the Ready floor a move keeps."""

from __future__ import annotations

import math

from kvoffload.api.types import KVOffloadPolicySpec


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


def ready_floor(spec: KVOffloadPolicySpec, *, to_full: bool) -> int:
    """The fewest Ready replicas a paced move may leave: ``replicas - max(0, canaryReplicas - maxSurge)``;
    ``replicas`` across a promotion to 100% (``to_full``) when ``maxSurge >= 1``."""
    surge = spec.rollout.max_surge
    if to_full and surge >= 1:
        return spec.replicas
    return spec.replicas - max(0, min(spec.rollout.canary_replicas, spec.replicas) - surge)
