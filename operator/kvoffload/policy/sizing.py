"""Sizing: KV bytes per token, tokens per tier, the pinned pool, /dev/shm and host memory.

Pure functions of the spec and a ladder level (docs/design.md, "Sizing"). The
figures they rest on are the constants below, each with its source.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from kvoffload.api.errors import FieldError, PolicyError
from kvoffload.api.quantity import GIB, MIB, format_bytes, format_duration, parse_duration, quantity_bytes
from kvoffload.api.types import (
    Architecture,
    Backend,
    EngineName,
    KVCacheDtype,
    KVOffloadPolicy,
    KVOffloadPolicySpec,
)
from kvoffload.api.versions import parse_version, version_from_image
from kvoffload.engines import engine_for
from kvoffload.policy.catalog import (
    MODELS,
    ConfigError,
    GPUClass,
    architecture_from_configmap_data,
    find_gpu_class,
    find_model,
    gpu_class_names,
)
from kvoffload.policy.ladder import CPU, Level, build_ladder

# --- figures ---------------------------------------------------------------------

# Pinning host memory on an H200 host: 0.6 s / 1 GiB, 2.8 s / 4 GiB, 12.6 s / 16 GiB
# (docs/design.md "Startup"); the slope between the ends is (12.6 - 0.6) / 15 = 0.8 s/GiB.
# Raw cuMemHostAlloc / shm + cuMemHostRegister on an H200 host measured 0.40-0.69 s/GiB
# (1-32 GiB); 0.8 is the slower, end-to-end figure.
PIN_SECONDS_PER_GIB = 0.8
# Engine start without offload: process start, CUDA init, profiling and graph capture.
# An assumption (typical vLLM start of a small model is 1-3 min), not measured here.
MODEL_LOAD_BASE_SECONDS = 180.0
# Reading weights into GPU memory, from a node-local cache. An assumption (~1 GiB/s
# safetensors load), not measured here; it only makes big models' budgets longer.
WEIGHT_LOAD_SECONDS_PER_GIB = 1.0
# Startup budget = this × the estimate: pinning and loading vary with NUMA, THP and disks.
STARTUP_SAFETY_FACTOR = 2.0
# Scheduling, image start and the first readiness probe, on top of the startup budget.
PROGRESS_DEADLINE_MARGIN_SECONDS = 120.0
# The stretch of rollout.progressDeadline stops here (docs/design.md, "Startup"). The largest
# budget a policy that fits a catalog node can have: a pool of a whole 2 TiB node (1,638 s of
# pinning) plus the 180 s base and a model's weights on one GPU (at most ~625 s, DeepSeek-V3),
# doubled: about 81 minutes. Two hours is above every such budget, so it bites only where the
# estimate has run away, and an unschedulable canary cannot hold the ladder for longer.
MAX_STRETCHED_PROGRESS_DEADLINE_SECONDS = 2 * 3600.0
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

_KV_DTYPE_BYTES = {
    KVCacheDtype.BFLOAT16: 2,
    KVCacheDtype.FLOAT16: 2,
    KVCacheDtype.FP8: 1,
    KVCacheDtype.FP8_E4M3: 1,
    KVCacheDtype.FP8_E5M2: 1,
}


class SizingError(ValueError):
    """The spec cannot be sized as it stands; ``path`` names the field."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")


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


# --- the model's KV shape ------------------------------------------------------------


def with_architecture(spec: KVOffloadPolicySpec, architecture: Architecture) -> KVOffloadPolicySpec:
    """The spec with ``model.architecture`` set (and ``configMap`` cleared).

    The operator fetches a ``model.configMap``, reads it with
    ``catalog.architecture_from_configmap_data`` and sizes this copy.
    """
    model = spec.model.model_copy(update={"architecture": architecture, "config_map": None})
    return spec.model_copy(update={"model": model})


def architecture(spec: KVOffloadPolicySpec) -> Architecture:
    """The model's KV shape: ``model.architecture``, else the catalog entry for ``model.name``.

    Raises SizingError when neither is there (a ``configMap`` must be resolved first,
    see ``with_architecture``).
    """
    if spec.model.architecture is not None:
        return spec.model.architecture
    if spec.model.config_map is not None:
        raise SizingError(
            "spec.model.configMap",
            f"ConfigMap {spec.model.config_map.name!r} must be read first "
            "(or set spec.model.architecture to size offline)",
        )
    entry = find_model(spec.model.name)
    if entry is None:
        raise SizingError("spec.model.name", _not_in_catalog(spec.model.name))
    return entry.architecture


def kv_dtype_bytes(spec: KVOffloadPolicySpec, arch: Architecture | None = None) -> int:
    """Bytes per KV element: the kvCacheDtype, or the model's dtype when it is ``auto``."""
    dtype = spec.model.kv_cache_dtype
    if dtype == KVCacheDtype.AUTO:
        return (arch or architecture(spec)).dtype_bytes
    return _KV_DTYPE_BYTES[dtype]


def bytes_per_token(arch: Architecture, dtype_bytes: int) -> int:
    """KV bytes one token takes in all layers: MHA/GQA ``2·L·H·D·b``, MLA ``L·(rank+rope)·b``."""
    if arch.kv_lora_rank is not None:
        return arch.num_layers * (arch.kv_lora_rank + (arch.qk_rope_head_dim or 0)) * dtype_bytes
    if arch.num_kv_heads is None or arch.head_dim is None:  # Architecture's validator rules this out
        raise SizingError("spec.model.architecture", "give numKVHeads and headDim, or kvLoraRank (MLA)")
    return 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * dtype_bytes


def kv_bytes_per_token(spec: KVOffloadPolicySpec) -> int:
    """KV bytes per token for the whole model (all layers, all TP ranks together), one copy.

    ``stored_bytes_per_token`` adds the copies TP makes; tiers divide by that.
    """
    arch = architecture(spec)
    return bytes_per_token(arch, kv_dtype_bytes(spec, arch))


def kv_replication(spec: KVOffloadPolicySpec, arch: Architecture | None = None) -> int:
    """How many copies of each token's KV the TP ranks keep together (1 = sharded, no copies).

    vLLM gives every rank ``max(1, kv_heads // tp)`` heads, so past ``tp = kv_heads``
    heads are replicated; an MLA latent is not split by head and every rank keeps
    all of it. Offload tiers store what the ranks hold, copies included.
    """
    arch = arch or architecture(spec)
    tp = spec.model.tensor_parallel_size
    if arch.kv_lora_rank is not None:
        return tp
    heads = arch.num_kv_heads or 1
    return max(1, (max(1, heads // tp) * tp) // heads)


def stored_bytes_per_token(spec: KVOffloadPolicySpec) -> int:
    """KV bytes one token takes across all TP ranks, replicas included: what a tier divides by."""
    arch = architecture(spec)
    return bytes_per_token(arch, kv_dtype_bytes(spec, arch)) * kv_replication(spec, arch)


def tokens_held(size_bytes: int, per_token: int) -> int:
    """Whole tokens a tier of ``size_bytes`` holds (the size is the total over TP ranks)."""
    return size_bytes // per_token


def tier_capacity_tokens(spec: KVOffloadPolicySpec, level: Level) -> dict[str, int]:
    """Tokens each offload tier of ``level`` holds in one pod (all TP ranks together), in tier order.

    ``{"cpu": n, "<secondary tier>": m, ...}``; ``{}`` on the GPU-only level. These are the
    figures ``kvoffload plan`` prints per level, published on the pods and as a metric for
    KV-aware routers. The GPU cache is left out: vLLM reports it itself, exactly.
    Raises SizingError when the model's KV shape is unknown (a ``configMap`` not read yet).
    """
    if level.cpu_bytes is None:
        return {}
    per_token = stored_bytes_per_token(spec)
    capacity = {CPU: tokens_held(level.cpu_bytes, per_token)}
    for tier in level.secondary_tiers:
        capacity[tier.name] = tokens_held(quantity_bytes(tier.size), per_token)
    return capacity


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


def weight_bytes(spec: KVOffloadPolicySpec) -> int | None:
    """Rough weight bytes (all ranks) from the catalog; None for models it does not know."""
    entry = find_model(spec.model.name)
    return entry.weight_bytes if entry is not None else None


def startup_seconds(spec: KVOffloadPolicySpec, level: Level) -> int:
    """Seconds the startup probe allows: model load plus pinning the pool (grows with the pool).

    ``STARTUP_SAFETY_FACTOR × (base + weights GiB × load rate + pool GiB × pin rate)``,
    rounded up to 10 s. Weights of a model outside the catalog count as zero.
    """
    weights = (weight_bytes(spec) or 0) / spec.gpu.count  # ranks load their shards in parallel
    estimate = (
        MODEL_LOAD_BASE_SECONDS
        + weights / GIB * WEIGHT_LOAD_SECONDS_PER_GIB
        + pinned_pool_bytes(spec, level) / GIB * PIN_SECONDS_PER_GIB
    )
    return math.ceil(estimate * STARTUP_SAFETY_FACTOR / 10) * 10


def progress_deadline_seconds(spec: KVOffloadPolicySpec, level: Level) -> float:
    """rollout.progressDeadline, stretched to the startup budget plus a margin when that is longer,
    but by no more than to ``MAX_STRETCHED_PROGRESS_DEADLINE_SECONDS`` (a longer progressDeadline
    that the spec sets itself is kept)."""
    stretched = min(
        startup_seconds(spec, level) + PROGRESS_DEADLINE_MARGIN_SECONDS, MAX_STRETCHED_PROGRESS_DEADLINE_SECONDS
    )
    return max(parse_duration(spec.rollout.progress_deadline), stretched)


# --- checks ------------------------------------------------------------------------


def _not_in_catalog(name: str) -> str:
    known = ", ".join(m.name for m in MODELS)
    return (
        f"{name!r} is not in the model catalog; set spec.model.architecture or spec.model.configMap "
        f"(the catalog knows {known})"
    )


def check_fits_node(spec: KVOffloadPolicySpec, gpu: GPUClass) -> list[FieldError]:
    """What can never be scheduled on a node of the GPU class: more GPUs than a node has, a tier
    or a pod's memory request larger than the node's whole host memory. Each error names the field
    to change; empty when every level fits.
    """
    errors: list[FieldError] = []
    node = gpu.host_ram_per_node_bytes
    where = f"a whole {gpu.name} node's host memory, {format_bytes(node)} ({gpu.host_ram_source})"
    if spec.gpu.count > gpu.gpus_per_node:
        errors.append(
            FieldError(
                "spec.gpu.count", f"{spec.gpu.count} GPUs per engine, but a {gpu.name} node has {gpu.gpus_per_node}"
            )
        )
    top = build_ladder(spec)[-1]  # the levels only add tiers, so the top one needs the most
    pool = pinned_pool_bytes(spec, top)
    if pool > node:
        factor = spec.offload.overhead_factor
        pinned = f"{format_bytes(pool)} pinned" + (f" with overheadFactor {factor}" if factor != 1.0 else "")
        errors.append(
            FieldError("spec.offload.cpu", f"the CPU tier ({pinned}) is larger than {where}; no node can hold it")
        )
    for i, tier in enumerate(top.secondary_tiers):
        size = quantity_bytes(tier.size)
        if tier.volume.empty_dir is not None and tier.volume.empty_dir.medium == "Memory" and size > node:
            errors.append(
                FieldError(
                    f"spec.offload.secondaryTiers[{i}].size",
                    f"the memory-backed tier ({format_bytes(size)}) is larger than {where}; no node can hold it",
                )
            )
    if errors:
        return errors
    request = host_memory(spec, top).request
    if request > node:
        parts = {
            "spec.resources.baseMemory": quantity_bytes(spec.resources.base_memory),
            "spec.offload.cpu": pool,
            "spec.resources.headroom": quantity_bytes(spec.resources.headroom),
        }
        biggest = max(parts, key=lambda k: parts[k])
        errors.append(
            FieldError(
                biggest,
                f"the memory request of level {top.name}, {format_bytes(request)} per replica (baseMemory "
                f"{format_bytes(parts['spec.resources.baseMemory'])} + pinned pool {format_bytes(pool)} + headroom "
                f"{format_bytes(parts['spec.resources.headroom'])}"
                + (
                    f" + memory-backed tiers {format_bytes(memory_backed_tier_bytes(top))}"
                    if memory_backed_tier_bytes(top)
                    else ""
                )
                + f") is more than {where}; no node can schedule it",
            )
        )
    return errors


def check_policy(policy: KVOffloadPolicy) -> list[FieldError]:
    """Problems the schema cannot see (unknown catalog entries, what no node of the GPU class can
    hold); empty when the policy can be sized and scheduled.

    Only hard errors: things that are merely unwise (a TP size that does not divide
    the KV heads, a small tier) are ``plan`` warnings.
    """
    spec = policy.spec
    errors: list[FieldError] = []
    gpu = find_gpu_class(spec.gpu.class_)
    if gpu is None:
        errors.append(
            FieldError(
                "spec.gpu.class", f"unknown GPU class {spec.gpu.class_!r}; known: {', '.join(gpu_class_names())}"
            )
        )
    else:
        errors += check_fits_node(spec, gpu)
    arch = spec.model.architecture
    if arch is None and spec.model.config_map is None and find_model(spec.model.name) is None:
        errors.append(FieldError("spec.model.name", _not_in_catalog(spec.model.name)))
    if arch is not None and arch.kv_lora_rank is not None and arch.qk_rope_head_dim is None:
        errors.append(FieldError("spec.model.architecture.qkRopeHeadDim", "required with kvLoraRank (MLA)"))
    return errors


# --- the whole plan ----------------------------------------------------------------


class WarningCode(StrEnum):
    """Why a plan warns; stable names for scripts and alerts."""

    HOST_MEMORY_OVER_NODE_SHARE = "HostMemoryOverNodeShare"
    CPU_TIER_BELOW_GPU_KV_CACHE = "CpuTierBelowGpuKvCache"
    TIER_BELOW_MAX_MODEL_LEN = "TierBelowMaxModelLen"
    WEIGHTS_FILL_GPU = "WeightsFillGpu"
    GPU_KV_CACHE_UNKNOWN = "GpuKvCacheUnknown"
    TP_REPLICATES_KV = "TensorParallelReplicatesKv"
    TP_DOES_NOT_DIVIDE_KV_HEADS = "TensorParallelDoesNotDivideKvHeads"
    SLIDING_WINDOW_UPPER_BOUND = "SlidingWindowUpperBound"
    MEMORY_BACKED_TIER = "MemoryBackedTier"
    PROGRESS_DEADLINE_STRETCHED = "ProgressDeadlineStretched"
    LMCACHE_SIZING = "LMCacheSizing"


class _Out(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class SizingWarning(_Out):
    """One thing worth knowing before rolling out: a stable code and a sentence with the figures."""

    code: WarningCode
    message: str
    level: str | None = None
    """The ladder level it is about, if one."""

    def __str__(self) -> str:
        where = f" ({self.level})" if self.level else ""
        return f"{self.code.value}{where}: {self.message}"


class TierPlan(_Out):
    name: str
    bytes: int
    tokens: int


class LevelPlan(_Out):
    """One ladder level of one replica: its tiers and what they cost the host."""

    index: int
    name: str
    tiers: list[str]
    canary_only: bool
    cpu_bytes: int | None
    cpu_tokens: int | None
    secondary_tiers: list[TierPlan]
    pinned_bytes: int
    shm_bytes: int
    memory_request_bytes: int
    memory_limit_bytes: int
    startup_seconds: int
    progress_deadline_seconds: float


class SizingPlan(_Out):
    """Everything ``kvoffload plan`` reports for a policy."""

    policy: str
    model: str
    architecture_source: str
    architecture: Architecture
    kv_dtype_bytes: int
    kv_bytes_per_token: int
    """Whole model, one copy: docs/design.md, "KV bytes per token"."""
    stored_bytes_per_token: int
    """Across all TP ranks with replicas: what the tiers divide by."""
    tensor_parallel_size: int
    max_model_len: int
    max_model_len_bytes: int
    gpu_class: str
    gpu_count: int
    gpu_memory_bytes: int
    weight_bytes: int | None
    gpu_kv_cache_bytes: int | None
    """GPU memory × count × memoryUtilization − weights; rough (activations not counted)."""
    gpu_kv_cache_tokens: int | None
    host_ram_per_replica_bytes: int
    """The GPU class's host RAM per GPU × GPUs per replica."""
    host_ram_source: str
    levels: list[LevelPlan]
    warnings: list[SizingWarning]


def _tokens(n: int) -> str:
    return f"{n:,} tokens"


def _architecture_source(spec: KVOffloadPolicySpec) -> str:
    if spec.model.architecture is not None:
        return "spec.model.architecture"
    entry = find_model(spec.model.name)
    return f"catalog: {entry.source}" if entry is not None else "unknown"


def plan_spec(spec: KVOffloadPolicySpec, name: str = "", *, architecture_source: str | None = None) -> SizingPlan:
    """Size every ladder level of ``spec`` and collect the warnings.

    The spec must name a known GPU class and a model the catalog knows, or carry
    ``model.architecture`` (resolve a ``configMap`` with ``with_architecture`` first);
    otherwise SizingError names the field.
    """
    gpu = find_gpu_class(spec.gpu.class_)
    if gpu is None:
        raise SizingError("spec.gpu.class", f"unknown GPU class {spec.gpu.class_!r}")
    arch = architecture(spec)
    dtype = kv_dtype_bytes(spec, arch)
    per_token = bytes_per_token(arch, dtype)
    replicas = kv_replication(spec, arch)
    stored = per_token * replicas
    entry = find_model(spec.model.name) if spec.model.architecture is None else None
    weights = weight_bytes(spec)
    count = spec.gpu.count
    gpu_kv = None if weights is None else int(gpu.memory_bytes * count * spec.gpu.memory_utilization) - weights
    host_share = gpu.host_ram_per_gpu_bytes * count
    max_len = spec.model.max_model_len
    warnings: list[SizingWarning] = []

    def warn(code: WarningCode, message: str, level: str | None = None) -> None:
        warnings.append(SizingWarning(code=code, message=message, level=level))

    levels: list[LevelPlan] = []
    seen_tiers: set[str] = set()
    for level in build_ladder(spec):
        mem = host_memory(spec, level)
        secondary = [
            TierPlan(name=t.name, bytes=quantity_bytes(t.size), tokens=tokens_held(quantity_bytes(t.size), stored))
            for t in level.secondary_tiers
        ]
        startup = startup_seconds(spec, level)
        deadline = progress_deadline_seconds(spec, level)
        cpu_tokens = None if level.cpu_bytes is None else tokens_held(level.cpu_bytes, stored)
        levels.append(
            LevelPlan(
                index=level.index,
                name=level.name,
                tiers=level.tiers,
                canary_only=level.canary_only,
                cpu_bytes=level.cpu_bytes,
                cpu_tokens=cpu_tokens,
                secondary_tiers=secondary,
                pinned_bytes=mem.pinned,
                shm_bytes=mem.shm,
                memory_request_bytes=mem.request,
                memory_limit_bytes=mem.limit,
                startup_seconds=startup,
                progress_deadline_seconds=deadline,
            )
        )
        if mem.request > host_share:
            warn(
                WarningCode.HOST_MEMORY_OVER_NODE_SHARE,
                f"memory request {format_bytes(mem.request)} per replica is over this GPU class's share of a "
                f"node, {format_bytes(host_share)} ({count} × {format_bytes(gpu.host_ram_per_gpu_bytes)}, "
                f"{gpu.host_ram_source}); replicas may not fit beside each other",
                level.name,
            )
        tier_sizes = [] if cpu_tokens is None else [("cpu" if not level.canary_only else "cpu-pilot", cpu_tokens)]
        tier_sizes += [(t.name, t.tokens) for t in secondary]
        for tier_name, tokens in tier_sizes:
            if tokens < max_len and tier_name not in seen_tiers:
                warn(
                    WarningCode.TIER_BELOW_MAX_MODEL_LEN,
                    f"tier {tier_name} holds {_tokens(tokens)}, less than one maxModelLen prompt "
                    f"({_tokens(max_len)}, {format_bytes(max_len * stored)})",
                    level.name,
                )
            seen_tiers.add(tier_name)
        newest = level.secondary_tiers[-1] if level.secondary_tiers else None
        if newest is not None and newest.volume.empty_dir is not None and newest.volume.empty_dir.medium == "Memory":
            warn(
                WarningCode.MEMORY_BACKED_TIER,
                f"tier {newest.name} is a memory-medium emptyDir: its {format_bytes(quantity_bytes(newest.size))} "
                "count against the memory limit (added to the request)",
                level.name,
            )

    longest = max(reversed(levels), key=lambda lv: lv.progress_deadline_seconds)  # the top one on ties
    if parse_duration(spec.rollout.progress_deadline) < longest.progress_deadline_seconds:
        stretched = [
            lv.name for lv in levels if lv.progress_deadline_seconds > parse_duration(spec.rollout.progress_deadline)
        ]
        capped = longest.startup_seconds + PROGRESS_DEADLINE_MARGIN_SECONDS > longest.progress_deadline_seconds
        why = (
            f"startup {format_duration(longest.startup_seconds)}, but the stretch stops at "
            f"{format_duration(MAX_STRETCHED_PROGRESS_DEADLINE_SECONDS)}"
            if capped
            else f"startup {format_duration(longest.startup_seconds)} + margin"
        )
        warn(
            WarningCode.PROGRESS_DEADLINE_STRETCHED,
            f"rollout.progressDeadline {spec.rollout.progress_deadline} is shorter than the startup budget; "
            f"the operator waits up to {format_duration(longest.progress_deadline_seconds)} "
            f"({why}) on levels {', '.join(stretched)}",
            longest.name,
        )
    cpu_bytes = quantity_bytes(spec.offload.cpu)
    if gpu_kv is None:
        warn(
            WarningCode.GPU_KV_CACHE_UNKNOWN,
            f"{spec.model.name!r} is not in the catalog, so its weights and the GPU KV cache are not estimated",
        )
    elif gpu_kv <= 0:
        warn(
            WarningCode.WEIGHTS_FILL_GPU,
            f"weights (~{format_bytes(weights or 0)}) fill {count} × {gpu.name} at memoryUtilization "
            f"{spec.gpu.memory_utilization}: no room for a KV cache",
        )
    elif cpu_bytes < gpu_kv:
        warn(
            WarningCode.CPU_TIER_BELOW_GPU_KV_CACHE,
            f"offload.cpu {format_bytes(cpu_bytes)} ({_tokens(tokens_held(cpu_bytes, stored))}) is smaller than "
            f"the GPU KV cache (~{format_bytes(gpu_kv)}, {_tokens(gpu_kv // stored)}): blocks the GPU evicts find "
            "little room, so the CPU tier adds little reuse",
        )
    tp = spec.model.tensor_parallel_size
    if arch.kv_lora_rank is not None and tp > 1:
        warn(
            WarningCode.TP_REPLICATES_KV,
            f"MLA keeps the whole latent on every one of the {tp} TP ranks: a token takes "
            f"{stored:,} B across ranks, not {per_token:,} B, and the tiers hold {tp}× fewer tokens",
        )
    elif arch.num_kv_heads is not None and tp > 1:
        if replicas > 1:
            warn(
                WarningCode.TP_REPLICATES_KV,
                f"tensorParallelSize {tp} is more than numKVHeads {arch.num_kv_heads}: vLLM replicates KV heads, "
                f"so a token takes {stored:,} B across ranks, not {per_token:,} B",
            )
        if max(tp, arch.num_kv_heads) % min(tp, arch.num_kv_heads):
            warn(
                WarningCode.TP_DOES_NOT_DIVIDE_KV_HEADS,
                f"tensorParallelSize {tp} and numKVHeads {arch.num_kv_heads} do not divide: vLLM may refuse "
                "the split or leave ranks uneven",
            )
    if entry is not None and entry.sliding_window_layers:
        warn(
            WarningCode.SLIDING_WINDOW_UPPER_BOUND,
            f"{entry.note}; the bytes per token are an upper bound for long prompts",
        )
    if spec.offload.backend == Backend.LMCACHE:
        warn(
            WarningCode.LMCACHE_SIZING,
            "lmcache: the pinned pool, /dev/shm and startup figures assume LMCache pins the CPU tier once, "
            "as the native backend does; they are not measured for LMCache",
        )

    return SizingPlan(
        policy=name,
        model=spec.model.name,
        architecture_source=architecture_source or _architecture_source(spec),
        architecture=arch,
        kv_dtype_bytes=dtype,
        kv_bytes_per_token=per_token,
        stored_bytes_per_token=stored,
        tensor_parallel_size=tp,
        max_model_len=max_len,
        max_model_len_bytes=max_len * stored,
        gpu_class=gpu.name,
        gpu_count=count,
        gpu_memory_bytes=gpu.memory_bytes,
        weight_bytes=weights,
        gpu_kv_cache_bytes=gpu_kv,
        gpu_kv_cache_tokens=None if gpu_kv is None else max(0, gpu_kv) // stored,
        host_ram_per_replica_bytes=host_share,
        host_ram_source=gpu.host_ram_source,
        levels=levels,
        warnings=warnings,
    )


def plan_policy(policy: KVOffloadPolicy, *, architecture_source: str | None = None) -> SizingPlan:
    """``plan_spec`` for a whole object, named ``namespace/name``."""
    name = f"{policy.metadata.namespace}/{policy.metadata.name}"
    return plan_spec(policy.spec, name, architecture_source=architecture_source)


def resolve_config_map(policy: KVOffloadPolicy, documents: Iterable[Any], source: str = "") -> KVOffloadPolicy:
    """The policy with ``model.configMap`` replaced by the architecture read from a ConfigMap among ``documents``.

    For offline use (``kvoffload plan`` reads the ConfigMap from the same file); the
    operator reads the real ConfigMap and calls ``with_architecture`` itself.
    Raises PolicyError at ``spec.model.configMap`` when it is missing or unreadable.
    """
    ref = policy.spec.model.config_map
    if ref is None or policy.spec.model.architecture is not None:
        return policy
    path = "spec.model.configMap"
    found = [
        d
        for d in documents
        if isinstance(d, dict)
        and d.get("kind") == "ConfigMap"
        and isinstance(d.get("metadata"), dict)
        and d["metadata"].get("name") == ref.name
    ]
    if not found:
        raise PolicyError(
            [
                FieldError(
                    path,
                    f"ConfigMap {ref.name!r} is not in this file; add it as another document "
                    "or set spec.model.architecture to size offline",
                )
            ],
            source,
        )
    try:
        arch = architecture_from_configmap_data(found[0].get("data"), ref.key)
    except ConfigError as exc:
        raise PolicyError([FieldError(path, f"ConfigMap {ref.name!r} key {ref.key!r}: {exc}")], source) from None
    return policy.model_copy(update={"spec": with_architecture(policy.spec, arch)})


# --- the table -----------------------------------------------------------------------


def _shape(plan: SizingPlan) -> str:
    a = plan.architecture
    if a.kv_lora_rank is not None:
        return (
            f"MLA: {a.num_layers} layers × ({a.kv_lora_rank} + {a.qk_rope_head_dim or 0}) × "
            f"{plan.kv_dtype_bytes} B = {plan.kv_bytes_per_token:,} B/token"
        )
    return (
        f"2 × {a.num_layers} layers × {a.num_kv_heads} KV heads × {a.head_dim} head dim × {plan.kv_dtype_bytes} B "
        f"= {plan.kv_bytes_per_token:,} B/token"
    )


def _columns(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    ]


def format_plan(plan: SizingPlan) -> str:
    """The plan as a person reads it: a header, one aligned row per level, then the warnings."""
    lines = [f"Policy      {plan.policy}", f"Model       {plan.model}  ({plan.architecture_source})"]
    lines.append(f"KV          {_shape(plan)}")
    if plan.stored_bytes_per_token != plan.kv_bytes_per_token:
        lines.append(f"            {plan.stored_bytes_per_token:,} B/token across {plan.tensor_parallel_size} TP ranks")
    lines.append(f"Max prompt  {_tokens(plan.max_model_len)} = {format_bytes(plan.max_model_len_bytes)} of KV")
    gpu = f"GPU         {plan.gpu_count} × {plan.gpu_class} ({format_bytes(plan.gpu_memory_bytes)} each)"
    if plan.gpu_kv_cache_bytes is not None and plan.weight_bytes is not None:
        gpu += (
            f"; KV cache ~{format_bytes(max(0, plan.gpu_kv_cache_bytes))} "
            f"(~{_tokens(plan.gpu_kv_cache_tokens or 0)}) after ~{format_bytes(plan.weight_bytes)} of weights"
        )
    lines.append(gpu)
    lines.append(f"Host RAM    {format_bytes(plan.host_ram_per_replica_bytes)} per replica ({plan.host_ram_source})")
    lines.append("")
    rows = [["LEVEL", "TIERS", "CPU TIER", "HOLDS", "PINNED", "/DEV/SHM", "MEMORY REQ=LIMIT", "STARTUP", "DEADLINE"]]
    for lv in plan.levels:
        rows.append(
            [
                f"{lv.index} {lv.name}" + (" (canary only)" if lv.canary_only else ""),
                "+".join(lv.tiers) or "-",
                "-" if lv.cpu_bytes is None else format_bytes(lv.cpu_bytes),
                "-" if lv.cpu_tokens is None else _tokens(lv.cpu_tokens),
                format_bytes(lv.pinned_bytes) if lv.pinned_bytes else "-",
                format_bytes(lv.shm_bytes) if lv.shm_bytes else "-",
                format_bytes(lv.memory_request_bytes),
                format_duration(lv.startup_seconds),
                format_duration(lv.progress_deadline_seconds),
            ]
        )
    lines += _columns(rows, right={2, 3, 4, 5, 6, 7, 8})
    top = plan.levels[-1].secondary_tiers
    if top:
        lines.append("")
        lines += [f"Tier {t.name}: {format_bytes(t.bytes)}, holds {_tokens(t.tokens)}" for t in top]
    lines.append("")
    if plan.warnings:
        lines.append(f"Warnings ({len(plan.warnings)}):")
        lines += [f"  - {w}" for w in plan.warnings]
    else:
        lines.append("No warnings.")
    return "\n".join(lines)
