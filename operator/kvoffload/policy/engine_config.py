"""The engine container's config for one ladder level (command line, environment, resources, volumes, the
pod template overlay or the adopted workload's pod) and its config hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from kvoffload.api.errors import FieldError, PolicyError
from kvoffload.api.podspec import PodTemplate
from kvoffload.api.quantity import to_quantity
from kvoffload.api.serving import AdoptedWorkload
from kvoffload.api.types import KVOffloadPolicy, KVOffloadPolicySpec
from kvoffload.engines import SHM_PATH, engine_for
from kvoffload.policy.catalog import GPUClass, find_gpu_class
from kvoffload.policy.derive import derived_pod
from kvoffload.policy.hostmemory import SHM_EXTRA_BYTES, HostMemory, host_memory
from kvoffload.policy.ladder import Level
from kvoffload.policy.volumes import disk_scratch_bytes, tier_volume, volume_name

# --- the engine command line ---------------------------------------------------------


def engine_args(policy: KVOffloadPolicy, level: Level) -> list[str]:
    """The engine's arguments for a level (``spec.engine``'s: managed flags, offload flags, then extraArgs)."""
    return engine_for(policy.spec).args(policy, level)


def engine_env(spec: KVOffloadPolicySpec, level: Level) -> list[dict[str, Any]]:
    """The engine's environment: its offload's variables, then spec.model.env, then spec.podTemplate.env."""
    overlay = spec.pod_template.env if spec.pod_template is not None else []
    return [
        *engine_for(spec).env(spec, level),
        *({"name": e.name, "value": e.value} for e in spec.model.env),
        *(_dump(e) for e in overlay),
    ]


def _dump(model: Any) -> dict[str, Any]:
    """A spec model as the API server would hold it: camelCase, unset and default fields left out."""
    return model.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True)  # type: ignore[no-any-return]


def _overlay_pod(overlay: PodTemplate | None) -> dict[str, Any]:
    """What the overlay adds to the pod beside the container: its labels and annotations, and the pod spec
    fields it sets. Empty without an overlay."""
    if overlay is None:
        return {}
    fields: dict[str, Any] = {
        "labels": overlay.metadata.labels,
        "annotations": overlay.metadata.annotations,
        "imagePullSecrets": [_dump(r) for r in overlay.image_pull_secrets],
        "serviceAccountName": overlay.service_account_name,
        "priorityClassName": overlay.priority_class_name,
        "runtimeClassName": overlay.runtime_class_name,
        "affinity": _dump(overlay.affinity) if overlay.affinity is not None else None,
        "topologySpreadConstraints": [_dump(t) for t in overlay.topology_spread_constraints],
    }
    return {k: v for k, v in fields.items() if v}


# --- Kubernetes objects -------------------------------------------------------------------


def _gpu_class(spec: KVOffloadPolicySpec) -> GPUClass:
    found = find_gpu_class(spec.gpu.class_)
    if found is None:  # check_renderable refused it already
        raise PolicyError([FieldError("spec.gpu.class", f"unknown GPU class {spec.gpu.class_!r}")])
    return found


def _volumes(
    spec: KVOffloadPolicySpec, level: Level, memory: HostMemory
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    shm = memory.shm or SHM_EXTRA_BYTES  # NCCL and torch IPC need /dev/shm too
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": to_quantity(shm)}}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": SHM_PATH}]
    for i, tier in enumerate(level.secondary_tiers):
        name = volume_name(tier, i)
        volumes.append({"name": name, **tier_volume(tier)})
        mounts.append({"name": name, "mountPath": tier.path})
    if spec.pod_template is not None:
        volumes += (_dump(v) for v in spec.pod_template.volumes)
        mounts += (_dump(m) for m in spec.pod_template.volume_mounts)
    return volumes, mounts


def _resources(spec: KVOffloadPolicySpec, level: Level, gpu: GPUClass, sized: HostMemory) -> dict[str, Any]:
    memory = to_quantity(sized.request)
    # request = limit for CPU and memory: Guaranteed QoS, so pinned pages are never
    # the first to go under node pressure.
    # Quantities as strings, as the API server returns them, so GitOps diffs stay quiet.
    limits: dict[str, Any] = {"cpu": str(spec.resources.cpu), "memory": memory, gpu.resource: str(spec.gpu.count)}
    requests = dict(limits)
    if scratch := disk_scratch_bytes(level):
        requests["ephemeral-storage"] = to_quantity(scratch)
    return {"requests": requests, "limits": limits}


@dataclass(frozen=True)
class EngineConfig:
    """The engine container's config for one level, and its hash."""

    image: str
    command: list[str]
    args: list[str]
    env: list[dict[str, Any]]
    resources: dict[str, Any]
    volume_mounts: list[dict[str, Any]]
    volumes: list[dict[str, Any]]
    gpu: GPUClass
    env_from: list[dict[str, Any]]
    pod: dict[str, Any]
    """What spec.podTemplate adds to the pod: its metadata, scheduling and identity; with an adopted workload, the
    whole derived pod template (before the operator's labels and annotations)."""
    workload: str = ""
    """The adopted pod template's digest (``AdoptedWorkload.digest``); empty without one."""
    files: dict[str, str] = field(default_factory=dict)
    """The engine's config files (name -> text), the level's ConfigMap; empty for an engine that reads none."""

    @property
    def hash(self) -> str:
        # Not dataclasses.asdict: it would deep-copy the GPU class too, only to drop it (the gpu shows in resources).
        # What a policy without spec.podTemplate or workloadRef, or an engine without config files, leaves empty is
        # left out, so its hash is the one it always had. The files' text is in: a changed file rolls the pods.
        hashed = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "gpu" and (f.name not in ("env_from", "pod", "workload", "files") or getattr(self, f.name))
        }
        canonical = json.dumps(hashed, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def _image(spec: KVOffloadPolicySpec) -> str:
    if spec.image is None:
        raise PolicyError([FieldError("spec.workloadRef", "the referenced Deployment has not been read")])
    return spec.image


def engine_config(policy: KVOffloadPolicy, level: Level, memory: HostMemory) -> EngineConfig:
    """The engine container's config for ``level``, whose host memory is ``memory`` (the sized plan's)."""
    spec = policy.spec
    if spec.workload is not None:
        return _adopted_engine(policy, level, memory, spec.workload)
    overlay = spec.pod_template
    gpu = _gpu_class(spec)
    volumes, mounts = _volumes(spec, level, memory)
    return EngineConfig(
        image=_image(spec),
        command=engine_for(spec).command(spec),
        args=engine_args(policy, level),
        env=engine_env(spec, level),
        resources=_resources(spec, level, gpu, memory),
        volume_mounts=mounts,
        volumes=volumes,
        gpu=gpu,
        env_from=[_dump(e) for e in overlay.env_from] if overlay is not None else [],
        pod=_overlay_pod(overlay),
        files=engine_for(spec).config_files(policy, level),
    )


# --- a Deployment the team runs (spec.workloadRef) ------------------------------------------


def _adopted_engine(
    policy: KVOffloadPolicy, level: Level, memory: HostMemory, workload: AdoptedWorkload
) -> EngineConfig:
    """The referenced pod template with only what offload needs changed: the offload flags and variables, memory,
    /dev/shm and the tier volumes. Everything else is the user's, as written."""
    spec = policy.spec
    engine = engine_for(spec)
    if engine.config_files(policy, level):
        # Deriving would have to add a volume and rewrite the team's own option file flag: not done.
        raise PolicyError(
            [
                FieldError(
                    "spec.workloadRef",
                    f"{engine.title} reads its options from a config file the operator would mount; a Deployment "
                    "the team runs cannot be adopted for it: describe the engine with spec.model instead",
                )
            ],
            policy.metadata.name,
        )
    template, container, derived = derived_pod(spec, level, memory, workload)
    pod = template["spec"]
    return EngineConfig(
        image=workload.image,
        command=derived.command or [],
        args=derived.args or [],
        env=derived.env or [],
        resources=container["resources"],
        volume_mounts=container["volumeMounts"],
        volumes=pod["volumes"],
        gpu=_gpu_class(spec),
        env_from=[],
        pod=template,
        workload=workload.digest,
    )


def config_hash(policy: KVOffloadPolicy, level: Level) -> str:
    """A short, stable hash of the engine config of a level: image, command, args, env,
    resources and volumes. Replicas and the variant do not enter it, so the same level
    always gives the same hash (rollback restores a level exactly, by this hash). For one level off the cycle's
    path (a test, a script); the cycle reads ``SizedLevel.config_hash`` from the sized plan."""
    return engine_config(policy, level, host_memory(policy.spec, level)).hash
