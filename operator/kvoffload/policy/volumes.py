"""The volumes a level mounts in the engine container: its tiers' and what they ask of the node."""

from __future__ import annotations

from typing import Any

from kvoffload.api.quantity import quantity_bytes, to_quantity
from kvoffload.api.serving import SecondaryTier, TierVolume
from kvoffload.policy.ladder import Level


def under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def volume_name(tier: SecondaryTier, index: int) -> str:
    name = f"kv-{tier.name}"
    return name if len(name) <= 63 else f"kv-tier-{index}"


def tier_volume(tier: SecondaryTier) -> dict[str, Any]:
    source: TierVolume = tier.volume
    if source.persistent_volume_claim is not None:
        return {"persistentVolumeClaim": {"claimName": source.persistent_volume_claim.claim_name}}
    if source.host_path is not None:
        host: dict[str, Any] = {"path": source.host_path.path}
        if source.host_path.type:
            host["type"] = source.host_path.type
        return {"hostPath": host}
    empty = source.empty_dir
    spec: dict[str, Any] = {}
    if empty is not None and empty.medium:
        spec["medium"] = empty.medium
    # vLLM's fs tier never deletes files, so the volume's limit is the tier's only bound.
    limit = empty.size_limit if empty is not None and empty.size_limit is not None else tier.size
    spec["sizeLimit"] = to_quantity(quantity_bytes(limit))
    return {"emptyDir": spec}


def disk_scratch_bytes(level: Level) -> int:
    """Node disk the level's emptyDir tiers may fill: requested so the scheduler finds room."""
    total = 0
    for tier in level.secondary_tiers:
        empty = tier.volume.empty_dir
        if empty is not None and empty.medium != "Memory":
            total += quantity_bytes(empty.size_limit if empty.size_limit is not None else tier.size)
    return total
