"""What a trace's reuse would give each tier of a policy: hit shares by tier, from one LRU curve.

The tiers are modelled as inclusive LRU caches, as vLLM's offloading runs them: every block the
GPU computes is also stored to the CPU tier (and on to the filesystem tiers), so a tier holding
``C`` blocks holds the ``C`` most recently used ones. A re-access at reuse distance ``d`` is then
served by the fastest tier larger than ``d``: the GPU when ``d < gpu``, else the CPU tier when
``d < cpu``, and so on; past the largest tier it is recomputed. One reuse profile prices every
level of the ladder at once.

The fleet is taken as one cache of ``replicas ×`` the per-pod capacity: a prefix-aware router that
pins each conversation to one engine splits the key space between the pods, so together they hold
what one cache of their summed size would. A round-robin router would hold much less.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvoffload.economics.stackdist import ReuseProfile
from kvoffload.policy.sizing import SizingPlan

GPU_TIER = "gpu"
CPU_TIER = "cpu"


@dataclass(frozen=True)
class TierShare:
    """One tier's capacity and the share of all prompt blocks it serves."""

    tier: str
    blocks: int
    """Capacity of the whole fleet, in trace blocks."""
    share: float
    """Served from this tier / all prompt blocks."""


@dataclass(frozen=True)
class LevelSimulation:
    """The hit shares of one ladder level on the trace."""

    index: int
    name: str
    tiers: tuple[TierShare, ...]
    """Fastest first: the GPU, the CPU tier, the filesystem tiers."""
    recomputed: float
    """Share of prompt blocks no tier holds: first accesses and reuse beyond the largest tier."""

    @property
    def external_share(self) -> float:
        """Share served from the offload tiers: what the operator's externalShare gate measures."""
        return sum(t.share for t in self.tiers if t.tier != GPU_TIER)


def tier_shares(profile: ReuseProfile, capacities: Sequence[tuple[str, int]]) -> tuple[list[TierShare], float]:
    """Each tier's share of all accesses, and the recomputed share; ``capacities`` fastest first."""
    if profile.accesses == 0:
        return [TierShare(name, blocks, 0.0) for name, blocks in capacities], 0.0
    shares: list[TierShare] = []
    reach, served = 0, 0
    for name, blocks in capacities:
        if blocks < 0:
            raise ValueError(f"{name}: capacity must be >= 0 blocks, got {blocks}")
        # An inclusive tier smaller than a faster one adds nothing: the faster one already holds it.
        reach = max(reach, blocks)
        hits = profile.hits(reach)
        shares.append(TierShare(name, blocks, (hits - served) / profile.accesses))
        served = hits
    return shares, 1.0 - served / profile.accesses


def simulate_plan(
    profile: ReuseProfile, plan: SizingPlan, *, block_tokens: int, replicas: int, gpu_blocks: int | None = None
) -> list[LevelSimulation]:
    """Hit shares of every level of a sized policy on a trace of ``block_tokens``-token blocks.

    ``gpu_blocks`` is the fleet's GPU KV capacity in blocks; by default the plan's estimate.
    """
    if gpu_blocks is None:
        if plan.gpu_kv_cache_tokens is None:
            raise ValueError(f"the GPU KV cache of {plan.model} is unknown (no weight size): give the GPU blocks")
        gpu_blocks = replicas * plan.gpu_kv_cache_tokens // block_tokens
    out: list[LevelSimulation] = []
    for level in plan.levels:
        capacities = [(GPU_TIER, gpu_blocks)]
        if level.cpu_tokens is not None:
            capacities.append((CPU_TIER, replicas * level.cpu_tokens // block_tokens))
        capacities += [(t.name, replicas * t.tokens // block_tokens) for t in level.secondary_tiers]
        shares, recomputed = tier_shares(profile, capacities)
        out.append(LevelSimulation(level.index, level.name, tuple(shares), recomputed))
    return out


def default_sizes(unique: int, points: int = 16) -> list[int]:
    """Cache sizes for a curve: geometric from 100 blocks (or fewer) to every distinct block."""
    top = max(unique, 1)
    low = min(100, top)
    if points < 2 or top == low:
        return [top]
    ratio = (top / low) ** (1 / (points - 1))
    sizes = sorted({round(low * ratio**i) for i in range(points)} | {top})
    return sizes


def smallest_within(profile: ReuseProfile, sizes: Sequence[int], *, floor: int = 0, tolerance: float = 0.05) -> int:
    """The smallest size whose hit ratio is within ``tolerance`` (relative) of the best of ``sizes``.

    ``floor`` is a faster inclusive tier below it (the GPU): a size under it counts as the floor.
    """
    if not sizes:
        raise ValueError("sizes: give at least one size")
    ratios = {size: profile.hit_ratio(max(size, floor)) for size in sizes}
    best = max(ratios.values())
    return min(size for size, ratio in ratios.items() if ratio >= best * (1 - tolerance) - math.ulp(best))
