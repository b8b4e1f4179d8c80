"""Host memory of one replica: the pinned pool, /dev/shm and the memory request and limit.

Pure functions of the spec and a ladder level (docs/design.md, "Sizing"). The
figures they rest on are the constants below, each with its source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvoffload.api.quantity import GIB, MIB, quantity_bytes
from kvoffload.api.serving import Backend, EngineName
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.api.versions import parse_version, version_from_image
from kvoffload.engines import engine_for
from kvoffload.policy.kvshape import SizingError, architecture
from kvoffload.policy.ladder import Level

# --- figures ---------------------------------------------------------------------

# /dev/shm holds the pool (vLLM PR 50094) plus room for NCCL and torch IPC
# (docs/design.md, "The pinned pool and /dev/shm").
SHM_EXTRA_BYTES = 1 * GIB
# Before vLLM 0.27 the single-tier CPUOffloadingSpec does not use that pool: every TP rank pins one
# `torch.zeros(..., pin_memory=True)` tensor per KV tensor (one per attention layer), and PyTorch's
# CUDA host allocator rounds each allocation up to a power of two. vLLM 0.26.0 wheel:
# v1/kv_offload/cpu/spec.py lines 135-140 (create_worker passes no mmap_region), cpu/gpu_worker.py
# lines 493-502 (the per-tensor torch.zeros). vLLM PR 50094 (merged 2026-07-29, first released in
# 0.27.0: v1/kv_offload/cpu/spec.py lines 149-161 of its sdist) moved it onto the /dev/shm region,
# sized num_chunks x chunk <= cpu_bytes_to_use exactly. Measured on an H100 with vLLM 0.26.0
# (tests/gpu/README.md): a 4 GiB tier on Qwen3-0.6B's 28 layers pinned 28 x 256 MiB = 7 GiB.
PER_LAYER_PINNED_BEFORE: tuple[int, ...] = (0, 27)
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


def engine_version(spec: KVOffloadPolicySpec) -> tuple[int, ...] | None:
    """The engine's vLLM version as the dialect table resolves it: ``model.vllmVersion``, else the
    image tag; None when neither tells (the newest engine is assumed, as for the dialect)."""
    version = spec.model.vllm_version or version_from_image(spec.image)
    if version is None:
        return None
    try:
        return parse_version(version)
    except ValueError:
        return None


def pins_per_layer(spec: KVOffloadPolicySpec, level: Level) -> bool:
    """Whether the level's engine pins its CPU tier as one power-of-two-rounded tensor per layer and
    TP rank: the native single-tier CPUOffloadingSpec of vLLM before 0.27 (``PER_LAYER_PINNED_BEFORE``).

    A level with secondary tiers runs TieringOffloadingSpec, which keeps the tier in the /dev/shm
    region in every version; lmcache allocates its own buffers.
    """
    if spec.engine != EngineName.VLLM or spec.offload.backend != Backend.NATIVE:
        return False
    if level.cpu_bytes is None or level.secondary_tiers:
        return False
    version = engine_version(spec)
    return version is not None and version < PER_LAYER_PINNED_BEFORE


def per_layer_pinned_bytes(tier_bytes: int, tensors: int) -> int:
    """Host bytes ``tensors`` pinned tensors take when they share ``tier_bytes`` and each is rounded
    up to a power of two (PyTorch's CUDA host allocator).

    Each tensor holds at most ``ceil(tier / tensors)`` bytes (vLLM floors the tier to whole blocks),
    so this is an upper bound, exact unless a tensor's share sits within one block above a power of two.
    """
    each = math.ceil(tier_bytes / tensors)
    return tensors * (1 << (each - 1).bit_length())


def engine_pinned_bytes(spec: KVOffloadPolicySpec, level: Level) -> int:
    """Host bytes the engine pins for the level's CPU tier, before overheadFactor (0 without one).

    The tier itself where the engine keeps it in the /dev/shm region; for ``pins_per_layer`` engines
    ``per_layer_pinned_bytes`` over layers × TP ranks, or twice the tier (the most power-of-two
    rounding can add) while the model's layers are unknown (a ``configMap`` not read yet).
    """
    if level.cpu_bytes is None:
        return 0
    if not pins_per_layer(spec, level):
        return level.cpu_bytes
    try:
        layers = architecture(spec).num_layers
    except SizingError:
        return 2 * level.cpu_bytes
    return per_layer_pinned_bytes(level.cpu_bytes, layers * spec.model.tensor_parallel_size)


def pinned_pool_bytes(spec: KVOffloadPolicySpec, level: Level) -> int:
    """The pinned CPU pool of one replica: what the engine pins for the CPU tier
    (``engine_pinned_bytes``: the tier, or its per-layer power-of-two tensors before vLLM 0.27)
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
    tier, + what the engine keeps free beside its pool: SGLang's 10 GiB). vLLM's pool lives in
    /dev/shm, whose tmpfs pages count against the limit, so it is counted once. All figures are whole MiB.
    """
    engine = engine_for(spec)
    pinned = pinned_pool_bytes(spec, level)
    # an engine that pins per layer, or pins anonymous memory, keeps nothing of the pool in /dev/shm
    in_shm = engine.pool_in_shm(spec, level) and not pins_per_layer(spec, level)
    shm = pinned + SHM_EXTRA_BYTES if pinned and in_shm else 0
    request = (
        quantity_bytes(spec.resources.base_memory)
        + pinned
        + quantity_bytes(spec.resources.headroom)
        + memory_backed_tier_bytes(level)
        + engine.host_reserve(spec, level)
    )
    return HostMemory(pinned=pinned, shm=shm, request=_round_up(request))
