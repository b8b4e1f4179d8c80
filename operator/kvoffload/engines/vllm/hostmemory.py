"""What vLLM pins for a level's CPU tier: the tier itself in its /dev/shm region (0.27 on), or, before 0.27, one
power-of-two-rounded tensor per layer and TP rank (docs/design.md, "The pinned pool and /dev/shm")."""

from __future__ import annotations

import math

from kvoffload.api.serving import Backend
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.api.versions import parse_version, version_from_image
from kvoffload.engines.engine import Rung

# Before vLLM 0.27 the single-tier CPUOffloadingSpec does not use that pool: every TP rank pins one
# `torch.zeros(..., pin_memory=True)` tensor per KV tensor (one per attention layer), and PyTorch's
# CUDA host allocator rounds each allocation up to a power of two. vLLM 0.26.0 wheel:
# v1/kv_offload/cpu/spec.py lines 135-140 (create_worker passes no mmap_region), cpu/gpu_worker.py
# lines 493-502 (the per-tensor torch.zeros). vLLM PR 50094 (merged 2026-07-29, first released in
# 0.27.0: v1/kv_offload/cpu/spec.py lines 149-161 of its sdist) moved it onto the /dev/shm region,
# sized num_chunks x chunk <= cpu_bytes_to_use exactly. Measured on an H100 with vLLM 0.26.0
# (tests/gpu/README.md): a 4 GiB tier on Qwen3-0.6B's 28 layers pinned 28 x 256 MiB = 7 GiB.
PER_LAYER_PINNED_BEFORE: tuple[int, ...] = (0, 27)


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


def pins_per_layer(spec: KVOffloadPolicySpec, level: Rung) -> bool:
    """Whether the level's engine pins its CPU tier as one power-of-two-rounded tensor per layer and
    TP rank: the native single-tier CPUOffloadingSpec of vLLM before 0.27 (``PER_LAYER_PINNED_BEFORE``).

    A level with secondary tiers runs TieringOffloadingSpec, which keeps the tier in the /dev/shm
    region in every version; lmcache allocates its own buffers.
    """
    if spec.offload.backend != Backend.NATIVE:
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


def pinned_bytes(spec: KVOffloadPolicySpec, level: Rung, layers: int | None) -> int:
    """Host bytes vLLM pins for the level's CPU tier, before overheadFactor (0 without one).

    The tier itself where vLLM keeps it in the /dev/shm region; for ``pins_per_layer`` engines
    ``per_layer_pinned_bytes`` over layers × TP ranks, or twice the tier (the most power-of-two
    rounding can add) while the model's layers are unknown (a ``configMap`` not read yet).
    """
    if level.cpu_bytes is None:
        return 0
    if not pins_per_layer(spec, level):
        return level.cpu_bytes
    if layers is None:
        return 2 * level.cpu_bytes
    return per_layer_pinned_bytes(level.cpu_bytes, layers * spec.model.tensor_parallel_size)
