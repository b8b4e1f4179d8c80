"""The sizing plan: every ladder level sized and the warnings, what ``kvoffload plan`` reports
(docs/design.md, "Sizing"). The figures come from ``kvshape``, ``hostmemory`` and ``startup``; the checks no
node could pass are ``nodefit``'s, the table ``plantable``'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from kvoffload.api.errors import FieldError, PolicyError
from kvoffload.api.quantity import format_bytes, format_duration, parse_duration, quantity_bytes
from kvoffload.api.serving import Architecture, Backend
from kvoffload.api.types import KVOffloadPolicy, KVOffloadPolicySpec
from kvoffload.policy.catalog import (
    ConfigError,
    architecture_from_configmap_data,
    find_gpu_class,
    find_model,
)
from kvoffload.policy.hostmemory import host_memory
from kvoffload.policy.kvshape import (
    SizingError,
    architecture,
    bytes_per_token,
    kv_dtype_bytes,
    kv_replication,
    tokens_held,
    with_architecture,
)
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.startup import (
    MAX_STRETCHED_PROGRESS_DEADLINE_SECONDS,
    PROGRESS_DEADLINE_MARGIN_SECONDS,
    progress_deadline_seconds,
    startup_seconds,
    weight_bytes,
)

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


def format_tokens(n: int) -> str:
    """A token count as the plan prints it: ``12,345 tokens``."""
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
                    f"tier {tier_name} holds {format_tokens(tokens)}, less than one maxModelLen prompt "
                    f"({format_tokens(max_len)}, {format_bytes(max_len * stored)})",
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
            f"offload.cpu {format_bytes(cpu_bytes)} ({format_tokens(tokens_held(cpu_bytes, stored))}) is smaller "
            f"than the GPU KV cache (~{format_bytes(gpu_kv)}, {format_tokens(gpu_kv // stored)}): blocks the GPU "
            "evicts find little room, so the CPU tier adds little reuse",
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
                f"tensorParallelSize {tp} is more than numKVHeads {arch.num_kv_heads}: the engine replicates KV heads, "
                f"so a token takes {stored:,} B across ranks, not {per_token:,} B",
            )
        if max(tp, arch.num_kv_heads) % min(tp, arch.num_kv_heads):
            warn(
                WarningCode.TP_DOES_NOT_DIVIDE_KV_HEADS,
                f"tensorParallelSize {tp} and numKVHeads {arch.num_kv_heads} do not divide: the engine may refuse "
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
