"""Host memory of one replica: the pinned pool, /dev/shm and the memory request and limit.

Pure functions of the spec and a ladder level (docs/design.md, "Sizing"). The
figures they rest on are the constants below, each with its source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvoffload.api.quantity import GIB, MIB, quantity_bytes
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.engines import engine_for
from kvoffload.policy.kvshape import SizingError, architecture
from kvoffload.policy.ladder import Level

# --- figures ---------------------------------------------------------------------

# /dev/shm holds the pool, where the engine keeps it there (``Engine.pool_in_shm``), plus room for NCCL and torch
# IPC (docs/design.md, "The pinned pool and /dev/shm").
SHM_EXTRA_BYTES = 1 * GIB
# Sizes are rounded up to whole MiB so they render as exact quantities.
_ROUND = MIB


@dataclass(frozen=True)
class HostMemory:
    """Host memory of one replica at one ladder level, in bytes."""

    pinned: int
    """Pinned CPU pool: what the engine pins for the CPU tier times the overhead factor (0 without offload)."""
    shm: int
    """/dev/shm emptyDir sizeLimit: the pool plus 1 GiB (0 when no pool, or the engine pins it outside /dev/shm)."""
    request: int
    """Memory request = limit = base + pool + headroom (tmpfs pages count once)."""

    @property
    def limit(self) -> int:
        return self.request


def _round_up(n: float, unit: int = _ROUND) -> int:
    return math.ceil(n / unit) * unit


# --- host memory and time --------------------------------------------------------------


def model_layers(spec: KVOffloadPolicySpec) -> int | None:
    """The model's attention layers, for an engine that pins per layer; None while unknown (a configMap not read)."""
    try:
        return architecture(spec).num_layers
    except SizingError:
        return None


def engine_pinned_bytes(spec: KVOffloadPolicySpec, level: Level) -> int:
    """Host bytes the engine pins for the level's CPU tier, before overheadFactor (0 without one): the engine's own
    rule (``Engine.pinned_bytes``), given the model's layers."""
    if level.cpu_bytes is None:
        return 0
    return engine_for(spec).pinned_bytes(spec, level, model_layers(spec))


def pinned_pool_bytes(spec: KVOffloadPolicySpec, level: Level) -> int:
    """The pinned CPU pool of one replica: what the engine pins for the CPU tier
    (``engine_pinned_bytes``: the tier, or what the engine's allocator rounds it to)
    × overheadFactor, rounded up to MiB."""
    if level.cpu_bytes is None:
        return 0
    return _round_up(engine_pinned_bytes(spec, level) * spec.offload.overhead_factor)


def memory_backed_tier_bytes(level: Level) -> int:
    """Secondary tiers on a memory-medium emptyDir: their tmpfs pages count against the limit too."""
    return sum(
        quantity_bytes(t.size)
        for t in level.secondary_tiers
        if t.volume.empty_dir is not None and t.volume.empty_dir.medium == "Memory"
    )


def host_memory(spec: KVOffloadPolicySpec, level: Level) -> HostMemory:
    """Host memory of one replica running ``level``.

    pinned = what the engine pins for the CPU tier × overheadFactor (``pinned_pool_bytes``);
    shm = pinned + 1 GiB (0 without a pool, or where the engine keeps it outside /dev/shm);
    request = limit = baseMemory + pinned + headroom (+ any memory-backed secondary
    tier, + what the engine keeps free beside its pool: ``Engine.host_reserve``). A pool in /dev/shm is in
    tmpfs pages, which count against the limit, so it is counted once. All figures are whole MiB.
    """
    engine = engine_for(spec)
    pinned = pinned_pool_bytes(spec, level)
    shm = pinned + SHM_EXTRA_BYTES if pinned and engine.pool_in_shm(spec, level) else 0
    request = (
        quantity_bytes(spec.resources.base_memory)
        + pinned
        + quantity_bytes(spec.resources.headroom)
        + memory_backed_tier_bytes(level)
        + engine.host_reserve(spec, level)
    )
    return HostMemory(pinned=pinned, shm=shm, request=_round_up(request))
