"""The ladder: the config levels a policy climbs, derived from its spec.

L0 is GPU-only, L1 the CPU pilot (when ``rollout.pilotCpu`` is set; canary
only), then the full CPU tier, then one more secondary tier per level.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.api.quantity import quantity_bytes
from kvoffload.api.serving import SecondaryTier
from kvoffload.api.types import KVOffloadPolicySpec

GPU_ONLY = "gpu-only"
CPU_PILOT = "cpu-pilot"
CPU = "cpu"


@dataclass(frozen=True)
class Level:
    """One rung: which offload tiers run, and how big the CPU tier is."""

    index: int
    name: str
    cpu_bytes: int | None
    """CPU tier bytes, total across TP ranks; None on the GPU-only level."""
    secondary_tiers: tuple[SecondaryTier, ...] = ()
    canary_only: bool = False
    """The pilot is tried on the canary and never promoted to the whole fleet."""

    @property
    def tiers(self) -> list[str]:
        """Tier names, in order: ``[]``, ``["cpu"]``, ``["cpu", "nvme"]``..."""
        if self.cpu_bytes is None:
            return []
        return [CPU, *(t.name for t in self.secondary_tiers)]

    @property
    def offloads(self) -> bool:
        return self.cpu_bytes is not None


def build_ladder(spec: KVOffloadPolicySpec) -> list[Level]:
    """Every level, bottom (GPU-only) first."""
    levels = [Level(0, GPU_ONLY, None)]
    if spec.rollout.pilot_cpu is not None:
        levels.append(Level(len(levels), CPU_PILOT, quantity_bytes(spec.rollout.pilot_cpu), canary_only=True))
    cpu = quantity_bytes(spec.offload.cpu)
    levels.append(Level(len(levels), CPU, cpu))
    for i, tier in enumerate(spec.offload.secondary_tiers):
        levels.append(Level(len(levels), tier.name, cpu, tuple(spec.offload.secondary_tiers[: i + 1])))
    return levels


def find_level(ladder: list[Level], *, index: int | None = None, name: str | None = None) -> Level:
    """A level by index or name (the top one when neither is given); KeyError names the choices."""
    if index is None and name is None:
        return ladder[-1]
    for level in ladder:
        if level.index == index or level.name == name:
            return level
    choices = ", ".join(f"{lv.index}={lv.name}" for lv in ladder)
    raise KeyError(f"no ladder level {index if name is None else name!r}; the levels are {choices}")
