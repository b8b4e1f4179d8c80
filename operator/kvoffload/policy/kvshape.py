"""The model's KV shape: KV bytes per token (with the copies tensor parallelism makes) and the tokens each
offload tier holds (docs/design.md, "KV bytes per token").
"""

from __future__ import annotations

from kvoffload.api.quantity import quantity_bytes
from kvoffload.api.serving import Architecture, KVCacheDtype
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.policy.catalog import MODELS, find_model
from kvoffload.policy.ladder import CPU, Level

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
        raise SizingError("spec.model.name", not_in_catalog(spec.model.name))
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


def not_in_catalog(name: str) -> str:
    known = ", ".join(m.name for m in MODELS)
    return (
        f"{name!r} is not in the model catalog; set spec.model.architecture or spec.model.configMap "
        f"(the catalog knows {known})"
    )
