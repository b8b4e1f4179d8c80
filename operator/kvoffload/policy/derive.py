"""Each level of a Deployment the team runs (spec.workloadRef): its pod template with only what offload needs
changed, the offload flags and variables (the engine's ``derive``), memory, /dev/shm and the tier volumes.

Pure; ``policy/render.py`` puts the derived pod into the operator's Deployment for the level.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kvoffload.api.errors import FieldError
from kvoffload.api.quantity import quantity_bytes, to_quantity
from kvoffload.api.serving import AdoptedWorkload
from kvoffload.api.types import KVOffloadPolicy, KVOffloadPolicySpec
from kvoffload.engines import SHM_PATH, engine_for
from kvoffload.engines.engine import DerivedContainer
from kvoffload.policy.hostmemory import SHM_EXTRA_BYTES, HostMemory
from kvoffload.policy.ladder import Level
from kvoffload.policy.volumes import disk_scratch_bytes, tier_volume, under, volume_name
from kvoffload.policy.workload import WHERE, adopted_container


def memory_emptydir(pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, Any] | None:
    """The volume ``container`` mounts at /dev/shm when it is a memory emptyDir; None when it mounts none there."""
    mount = next((m for m in container.get("volumeMounts") or [] if m.get("mountPath") == SHM_PATH), None)
    if mount is None:
        return None
    volume = next((v for v in pod.get("volumes") or [] if v.get("name") == mount.get("name")), None)
    empty = (volume or {}).get("emptyDir")
    return volume if isinstance(empty, dict) and empty.get("medium") == "Memory" else None


def check_workload(spec: KVOffloadPolicySpec, workload: AdoptedWorkload) -> list[FieldError]:
    """Where the operator's /dev/shm and tier volumes would clash with the referenced pod's."""
    pod = workload.template.get("spec") or {}
    container = adopted_container(workload)
    name = workload.container
    volumes = {str(v.get("name")) for v in pod.get("volumes") or []}
    mounts = [(str(m.get("mountPath", "")), str(m.get("name"))) for m in container.get("volumeMounts") or []]
    errors: list[FieldError] = []
    shm = next((m for m in mounts if m[0] == SHM_PATH), None)
    if shm is not None and memory_emptydir(pod, container) is None:
        errors.append(
            FieldError(
                WHERE,
                f"container {name!r} mounts volume {shm[1]!r} at {SHM_PATH}, which is no memory emptyDir: the "
                "operator sizes /dev/shm for the pinned pool and NCCL",
            )
        )
    if shm is None and "dshm" in volumes:
        errors.append(FieldError(WHERE, "the pod has a volume named dshm, the name of the operator's /dev/shm"))
    for i, tier in enumerate(spec.offload.secondary_tiers):
        at = f"spec.offload.secondaryTiers[{i}]"
        if (volume := volume_name(tier, i)) in volumes:
            errors.append(FieldError(f"{at}.name", f"the referenced pod has a volume named {volume} already"))
        for path, mounted in mounts:
            if under(tier.path, path) or under(path, tier.path):
                errors.append(
                    FieldError(
                        f"{at}.path",
                        f"{tier.path!r} collides with volume {mounted!r}, which container {name!r} mounts at {path!r}",
                    )
                )
    return errors


def raise_to(values: dict[str, Any], key: str, floor: int) -> None:
    """``values[key]`` at least ``floor`` bytes; the user's own quantity kept as written where it is as large."""
    if key not in values or quantity_bytes(str(values[key])) < floor:
        values[key] = to_quantity(floor)


def adopted_resources(level: Level, sized: HostMemory, resources: Any) -> dict[str, Any]:
    """The user's resources with memory raised to the sized host memory, never lowered, and the level's disk
    scratch added to ephemeral storage. A missing request is the limit (the API server defaults it so); a missing
    limit is no limit, which stays."""
    out: dict[str, Any] = copy.deepcopy(resources) if isinstance(resources, dict) else {}
    requests: dict[str, Any] = out.get("requests") or {}
    limits: dict[str, Any] = out.get("limits") or {}
    memory = sized.request
    if "memory" in requests or "memory" not in limits:
        raise_to(requests, "memory", memory)
    if "memory" in limits:
        raise_to(limits, "memory", memory)
    if scratch := disk_scratch_bytes(level):
        key = "ephemeral-storage"
        for values in (requests, limits):
            if key in values:
                values[key] = to_quantity(quantity_bytes(str(values[key])) + scratch)
        if key not in requests and key not in limits:
            requests[key] = to_quantity(scratch)
    for part, values in (("requests", requests), ("limits", limits)):
        if values:
            out[part] = values
    return out


def adopted_volumes(level: Level, memory: HostMemory, pod: dict[str, Any], container: dict[str, Any]) -> None:
    """The level's /dev/shm (the user's memory emptyDir there, grown to size if smaller) and tier volumes."""
    shm = memory.shm or SHM_EXTRA_BYTES
    volumes: list[dict[str, Any]] = pod.setdefault("volumes", [])
    mounts: list[dict[str, Any]] = container.setdefault("volumeMounts", [])
    own = memory_emptydir(pod, container)
    if own is not None:
        limit = own["emptyDir"].get("sizeLimit")
        if limit is not None:  # none: as large as the memory limit lets it grow
            raise_to(own["emptyDir"], "sizeLimit", shm)
    else:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": to_quantity(shm)}})
        mounts.append({"name": "dshm", "mountPath": SHM_PATH})
    for i, tier in enumerate(level.secondary_tiers):
        name = volume_name(tier, i)
        volumes.append({"name": name, **tier_volume(tier)})
        mounts.append({"name": name, "mountPath": tier.path})


def derived_pod(
    spec: KVOffloadPolicySpec, level: Level, memory: HostMemory, workload: AdoptedWorkload
) -> tuple[dict[str, Any], dict[str, Any], DerivedContainer]:
    """The referenced pod template for ``level`` (before the operator's labels and annotations), its engine
    container in it, and what the engine changed in that container."""
    template = copy.deepcopy(workload.template)
    pod = template.setdefault("spec", {})
    container = next(c for c in pod["containers"] if c.get("name") == workload.container)
    derived = engine_for(spec).derive(container, spec, level)
    for field, value in (("command", derived.command), ("args", derived.args), ("env", derived.env)):
        if value is not None:
            container[field] = value
    container["resources"] = adopted_resources(level, memory, container.get("resources"))
    adopted_volumes(level, memory, pod, container)
    return template, container, derived


def engine_port(policy: KVOffloadPolicy) -> str | int | None:
    """How the PodMonitor reaches an adopted engine that has no port named ``http``: its port's name,
    else its number. None where ``http`` does."""
    workload = policy.spec.workload
    if workload is None:
        return None
    container = adopted_container(workload)
    port = engine_for(policy.spec).served(container).port
    declared = [p for p in container.get("ports") or [] if p.get("containerPort") == port]
    name = declared[0].get("name") if declared else None
    if name == "http":
        return None
    return str(name) if name else port
