"""Rendering: the Kubernetes manifests of one ladder level (Deployment, Service, PodMonitor).

Python computes every value (the engine's command line and environment, from ``engines/``;
sizes, labels and the config hash); the Jinja2 templates
in ``templates/`` only give them their structure. Pure: no I/O apart from
reading the packaged templates.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import math
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import yaml

from kvoffload import __version__
from kvoffload.api.conventions import (
    ANNOTATION_LEVEL_INDEX,
    ANNOTATION_PREFIX,
    ANNOTATION_TIER_CAPACITY,
    ANNOTATION_TIERS,
    LABEL_CONFIG_HASH,
    LABEL_LEVEL,
    LABEL_POLICY,
    SERIES_POD_LABELS,
    VARIANTS,
    Variant,
)
from kvoffload.api.errors import FieldError, PolicyError
from kvoffload.api.podspec import LabelSelector, NodeSelectorTerm, PodAffinityTerm, PodTemplate, Toleration
from kvoffload.api.quantity import parse_duration, to_quantity
from kvoffload.api.types import (
    AdoptedWorkload,
    KVOffloadPolicy,
    KVOffloadPolicySpec,
    SecondaryTier,
)
from kvoffload.engines import PORT, SHM_PATH, engine_for
from kvoffload.policy.catalog import GPUClass, find_gpu_class, gpu_class_names
from kvoffload.policy.derive import check_workload, derived_pod, engine_port
from kvoffload.policy.ladder import Level
from kvoffload.policy.sizing import (
    SHM_EXTRA_BYTES,
    SizingError,
    host_memory,
    progress_deadline_seconds,
    startup_seconds,
    tier_capacity_tokens,
)
from kvoffload.policy.volumes import disk_scratch_bytes, tier_volume, under, volume_name

STARTUP_PROBE_PERIOD_SECONDS = 10
TERMINATION_GRACE_SECONDS = 60

# Hardening every engine pod gets: Pod Security "baseline" without a hostPath tier, and all of "restricted"
# but runAsNonRoot (vLLM's images run as root). Pinning the CPU tier (cudaHostRegister of the /dev/shm
# file) needs no capability: the driver pins the pages itself (docs/security.md).
POD_SECURITY: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}

# Mounting a tier here would hide what the image or the kernel needs.
_SYSTEM_DIRS = ("/bin", "/dev", "/etc", "/lib", "/lib64", "/proc", "/root", "/sbin", "/sys", "/usr", "/var")
# ...and nothing may be mounted inside these.
_NO_MOUNTS_UNDER = ("/dev", "/proc", "/sys")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

# Prometheus Operator durations: ``1h2m3s4ms``, whole units only (monitoring.coreos.com/v1).
_PROM_UNITS = (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1))


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


# --- checks only rendering can make ----------------------------------------------------


def _mount_path_problem(path: str) -> str | None:
    """Why nothing may be mounted at ``path`` in the engine container; None when it may."""
    if posixpath.normpath(path) != path:
        return f"{path!r} must be a normalized absolute path (no '..', '//' or trailing /)"
    if under(SHM_PATH, path) or under(path, SHM_PATH):
        return f"{path!r} collides with {SHM_PATH}, where the engine keeps the CPU pool and its IPC"
    if any(under(path, d) for d in _NO_MOUNTS_UNDER) or any(under(d, path) for d in _SYSTEM_DIRS):
        return f"{path!r} would hide a system directory of the image"
    return None


def _check_tier_paths(tiers: Iterable[SecondaryTier]) -> list[FieldError]:
    errors: list[FieldError] = []
    seen: list[str] = []
    for i, tier in enumerate(tiers):
        where = f"spec.offload.secondaryTiers[{i}].path"
        path = tier.path
        if problem := _mount_path_problem(path):
            errors.append(FieldError(where, problem))
            continue
        for other in seen:
            if under(path, other) or under(other, path):
                errors.append(FieldError(where, f"{path!r} overlaps the tier mounted at {other!r}"))
        seen.append(path)
    return errors


def _label_key_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    return bool(_LABEL_NAME.match(name)) and (not prefix or (len(prefix) <= 253 and bool(_LABEL_PREFIX.match(prefix))))


def _check_scheduling(spec: KVOffloadPolicySpec) -> list[FieldError]:
    """What the API server refuses in a pod's nodeSelector and tolerations."""
    errors: list[FieldError] = []
    for key, value in spec.gpu.node_selector.items():
        where = f"spec.gpu.nodeSelector[{key!r}]"
        if not _label_key_ok(key):
            errors.append(FieldError(where, "the key must be a label name, optionally prefixed (example.com/name)"))
        if value and not _LABEL_NAME.match(value):
            errors.append(
                FieldError(where, "the value must be a label value (alphanumerics, '-', '_', '.'; 63 at most)")
            )
    return errors + _check_tolerations(spec.gpu.tolerations, "spec.gpu.tolerations")


def _check_tolerations(tolerations: Iterable[Toleration], where: str) -> list[FieldError]:
    errors: list[FieldError] = []
    for i, toleration in enumerate(tolerations):
        at = f"{where}[{i}]"
        if toleration.key and not _label_key_ok(toleration.key):
            errors.append(FieldError(f"{at}.key", "must be a label name, optionally prefixed"))
        if toleration.operator == "Exists" and toleration.value:
            errors.append(FieldError(f"{at}.value", "must be empty when operator is Exists"))
        if not toleration.key and toleration.operator != "Exists":
            errors.append(FieldError(f"{at}.operator", "must be Exists when key is empty"))
        if toleration.value and not _LABEL_NAME.match(toleration.value):
            errors.append(FieldError(f"{at}.value", "must be a label value"))
    return errors


def check_renderable(policy: KVOffloadPolicy) -> list[FieldError]:
    """What only shows when rendering: names, mount paths, backend limits. Empty when it renders."""
    spec = policy.spec
    offload = spec.offload
    errors: list[FieldError] = []
    name = policy.metadata.name
    if len(name) > 63 or not _DNS1035.match(name):
        errors.append(
            FieldError(
                "metadata.name",
                f"{name!r} must be a DNS-1035 label (a-z, 0-9 and '-', starting with a letter, at most 63 "
                "characters): it names the Service and labels every pod",
            )
        )
    if find_gpu_class(spec.gpu.class_) is None:
        known = ", ".join(gpu_class_names())
        errors.append(FieldError("spec.gpu.class", f"unknown GPU class {spec.gpu.class_!r}; known: {known}"))
    errors += _check_scheduling(spec)
    errors += _check_tier_paths(offload.secondary_tiers)
    for i, tier in enumerate(offload.secondary_tiers):
        pvc = tier.volume.persistent_volume_claim
        if pvc is not None and pvc.read_only:
            errors.append(
                FieldError(
                    f"spec.offload.secondaryTiers[{i}].volume.persistentVolumeClaim.readOnly",
                    "an offload tier is written to; it cannot be read-only",
                )
            )
    engine = engine_for(spec)
    errors += engine.check(policy)
    for i, env in enumerate(spec.pod_template.env if spec.pod_template is not None else []):
        ref = env.value_from.resource_field_ref if env.value_from is not None else None
        if ref is not None and ref.container_name not in (None, engine.container):
            errors.append(
                FieldError(
                    f"spec.podTemplate.env[{i}].valueFrom.resourceFieldRef.containerName",
                    f"{ref.container_name!r} is no container of the pod: {engine.title} runs in {engine.container!r}",
                )
            )
    names: set[str] = set()
    overlay_env = spec.pod_template.env if spec.pod_template is not None else []
    for where, env_name in (
        *((f"spec.model.env[{i}].name", e.name) for i, e in enumerate(spec.model.env)),
        *((f"spec.podTemplate.env[{i}].name", e.name) for i, e in enumerate(overlay_env)),
    ):
        if env_name in names:
            errors.append(FieldError(where, f"{env_name} is set twice"))
        names.add(env_name)
    for key in spec.prometheus.monitor_labels:
        errors += check_label(f"spec.prometheus.monitorLabels[{key!r}]", key, spec.prometheus.monitor_labels[key])
    if spec.pod_template is not None:
        errors += _check_pod_template(spec.pod_template, spec, policy.metadata.namespace)
    if spec.workload is not None:
        errors += check_workload(spec, spec.workload)
    return errors


# --- the pod template overlay --------------------------------------------------------------

# Pod labels the operator selects on or sets; annotations that would undo the hardening.
_MANAGED_LABELS = frozenset(
    {
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/component",
        "app.kubernetes.io/managed-by",
    }
)
# (The security profile annotations are the models' and the CRD's to refuse: api/podspec.py.)
_MANAGED_ANNOTATIONS = frozenset({"kubectl.kubernetes.io/default-container"})
_VALUES_NEEDED = {"In": True, "NotIn": True, "Exists": False, "DoesNotExist": False}


def check_label(where: str, key: str, value: str | None = None) -> list[FieldError]:
    errors: list[FieldError] = []
    if not _label_key_ok(key):
        errors.append(FieldError(where, "the key must be a label name, optionally prefixed (example.com/name)"))
    if value and not _LABEL_NAME.match(value):
        errors.append(FieldError(where, "the value must be a label value (alphanumerics, '-', '_', '.'; 63 at most)"))
    return errors


def _check_selector(where: str, selector: LabelSelector | None) -> list[FieldError]:
    if selector is None:
        return []
    errors: list[FieldError] = []
    for key, value in selector.match_labels.items():
        errors += check_label(f"{where}.matchLabels[{key!r}]", key, value)
    for i, req in enumerate(selector.match_expressions):
        at = f"{where}.matchExpressions[{i}]"
        errors += check_label(f"{at}.key", req.key)
        if bool(req.values) != _VALUES_NEEDED[req.operator]:
            errors.append(
                FieldError(
                    f"{at}.values", f"{req.operator} {'needs' if _VALUES_NEEDED[req.operator] else 'takes no'} values"
                )
            )
        errors += [
            FieldError(f"{at}.values[{j}]", "must be a label value")
            for j, v in enumerate(req.values)
            if v and not _LABEL_NAME.match(v)
        ]
    return errors


def _check_node_term(where: str, term: NodeSelectorTerm) -> list[FieldError]:
    errors: list[FieldError] = []
    for field, requirements in (("matchExpressions", term.match_expressions), ("matchFields", term.match_fields)):
        for i, req in enumerate(requirements):
            at = f"{where}.{field}[{i}]"
            if field == "matchFields" and req.key != "metadata.name":
                errors.append(FieldError(f"{at}.key", "matchFields supports metadata.name only"))
            elif field == "matchExpressions":
                errors += check_label(f"{at}.key", req.key)
            if req.operator in ("Gt", "Lt"):
                if len(req.values) != 1 or not req.values[0].lstrip("-").isdigit():
                    errors.append(FieldError(f"{at}.values", f"{req.operator} needs exactly one integer value"))
            elif bool(req.values) != _VALUES_NEEDED[req.operator]:
                errors.append(
                    FieldError(
                        f"{at}.values",
                        f"{req.operator} {'needs' if _VALUES_NEEDED[req.operator] else 'takes no'} values",
                    )
                )
    return errors


def _operator_volume_names(spec: KVOffloadPolicySpec) -> set[str]:
    return {"dshm", *(volume_name(t, i) for i, t in enumerate(spec.offload.secondary_tiers))}


def _check_pod_template(overlay: PodTemplate, spec: KVOffloadPolicySpec, namespace: str) -> list[FieldError]:
    """What the API server would refuse in the overlay, and what would override what the operator manages."""
    where = "spec.podTemplate"
    errors: list[FieldError] = []
    for key, value in overlay.metadata.labels.items():
        at = f"{where}.metadata.labels[{key!r}]"
        errors += check_label(at, key, value)
        if key in _MANAGED_LABELS or key.startswith(ANNOTATION_PREFIX):
            errors.append(FieldError(at, f"{key} is set by the operator, which selects its pods on it"))
    for key in overlay.metadata.annotations:
        at = f"{where}.metadata.annotations[{key!r}]"
        errors += check_label(at, key)
        if key in _MANAGED_ANNOTATIONS or key.startswith(ANNOTATION_PREFIX):
            errors.append(FieldError(at, f"{key} is set by the operator"))
    reserved = _operator_volume_names(spec)
    declared: set[str] = set()
    for i, volume in enumerate(overlay.volumes):
        at = f"{where}.volumes[{i}]"
        if volume.name in reserved:
            errors.append(FieldError(f"{at}.name", f"{volume.name} names a volume of the operator (/dev/shm, a tier)"))
        elif volume.name in declared:
            errors.append(FieldError(f"{at}.name", f"{volume.name} is declared twice"))
        declared.add(volume.name)
        if volume.empty_dir is not None and volume.empty_dir.medium == "Memory":
            errors.append(
                FieldError(
                    f"{at}.emptyDir.medium",
                    "a memory-backed volume counts against the memory limit the sizing computed for the pinned "
                    "pool; use a disk emptyDir, or raise spec.resources.headroom and ask for it there",
                )
            )
    taken = [(SHM_PATH, "/dev/shm"), *((t.path, f"the {t.name} tier") for t in spec.offload.secondary_tiers)]
    for i, mount in enumerate(overlay.volume_mounts):
        at = f"{where}.volumeMounts[{i}]"
        if mount.name not in declared:
            errors.append(FieldError(f"{at}.name", f"{mount.name} is not one of spec.podTemplate.volumes"))
        if problem := _mount_path_problem(mount.mount_path):
            errors.append(FieldError(f"{at}.mountPath", problem))
            continue
        for path, what in taken:
            if mount.mount_path == path or (under(mount.mount_path, path) and what != "/dev/shm"):
                errors.append(FieldError(f"{at}.mountPath", f"{mount.mount_path!r} is where {what} is mounted"))
                break
            if under(path, mount.mount_path):
                errors.append(FieldError(f"{at}.mountPath", f"{mount.mount_path!r} would hide {what} at {path!r}"))
                break
        taken.append((mount.mount_path, f"volumeMounts[{i}]"))
    errors += _check_tolerations(overlay.tolerations, f"{where}.tolerations")
    affinity = overlay.affinity
    if affinity is not None and affinity.node_affinity is not None:
        node = affinity.node_affinity
        at = f"{where}.affinity.nodeAffinity"
        if node.required_during_scheduling_ignored_during_execution is not None:
            for i, term in enumerate(node.required_during_scheduling_ignored_during_execution.node_selector_terms):
                errors += _check_node_term(
                    f"{at}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]", term
                )
        for i, preferred in enumerate(node.preferred_during_scheduling_ignored_during_execution):
            errors += _check_node_term(
                f"{at}.preferredDuringSchedulingIgnoredDuringExecution[{i}].preference", preferred.preference
            )
    for kind, pod in (
        ("podAffinity", affinity and affinity.pod_affinity),
        ("podAntiAffinity", affinity and affinity.pod_anti_affinity),
    ):
        if not pod:
            continue
        at = f"{where}.affinity.{kind}"
        terms: list[tuple[str, PodAffinityTerm]] = [
            (f"{at}.requiredDuringSchedulingIgnoredDuringExecution[{i}]", t)
            for i, t in enumerate(pod.required_during_scheduling_ignored_during_execution)
        ]
        terms += [
            (f"{at}.preferredDuringSchedulingIgnoredDuringExecution[{i}].podAffinityTerm", w.pod_affinity_term)
            for i, w in enumerate(pod.preferred_during_scheduling_ignored_during_execution)
        ]
        for term_at, pod_term in terms:
            errors += check_label(f"{term_at}.topologyKey", pod_term.topology_key)
            errors += _check_selector(f"{term_at}.labelSelector", pod_term.label_selector)
            # Another namespace's pods: the tenant could find out where they run, or keep its engines off
            # their nodes (anti-affinity); the own namespace is the default, so naming it is all a term may do.
            errors += [
                FieldError(
                    f"{term_at}.namespaces[{j}]",
                    f"{ns} is not the policy's namespace ({namespace}), the only one a term may name",
                )
                for j, ns in enumerate(pod_term.namespaces)
                if ns != namespace
            ]
    for i, spread in enumerate(overlay.topology_spread_constraints):
        at = f"{where}.topologySpreadConstraints[{i}]"
        errors += check_label(f"{at}.topologyKey", spread.topology_key)
        errors += _check_selector(f"{at}.labelSelector", spread.label_selector)
        if spread.min_domains is not None and spread.when_unsatisfiable != "DoNotSchedule":
            errors.append(FieldError(f"{at}.minDomains", "applies only when whenUnsatisfiable is DoNotSchedule"))
    return errors


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


def _volumes(spec: KVOffloadPolicySpec, level: Level) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    shm = host_memory(spec, level).shm or SHM_EXTRA_BYTES  # NCCL and torch IPC need /dev/shm too
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


def _resources(spec: KVOffloadPolicySpec, level: Level, gpu: GPUClass) -> dict[str, Any]:
    memory = to_quantity(host_memory(spec, level).request)
    # request = limit for CPU and memory: Guaranteed QoS, so pinned pages are never
    # the first to go under node pressure.
    # Quantities as strings, as the API server returns them, so GitOps diffs stay quiet.
    limits: dict[str, Any] = {"cpu": str(spec.resources.cpu), "memory": memory, gpu.resource: str(spec.gpu.count)}
    requests = dict(limits)
    if scratch := disk_scratch_bytes(level):
        requests["ephemeral-storage"] = to_quantity(scratch)
    return {"requests": requests, "limits": limits}


def _tolerations(spec: KVOffloadPolicySpec, gpu: GPUClass) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    extra = spec.pod_template.tolerations if spec.pod_template is not None else []
    for toleration in (*gpu.tolerations, *spec.gpu.tolerations, *extra):
        item = toleration.model_dump(by_alias=True, exclude_none=True)
        if item not in merged:
            merged.append(item)
    return merged


@dataclass(frozen=True)
class _Engine:
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

    @property
    def hash(self) -> str:
        # Not dataclasses.asdict: it would deep-copy the GPU class too, only to drop it (the gpu shows in resources).
        # What a policy without spec.podTemplate or workloadRef leaves empty is left out, so its hash is the one it
        # always had.
        hashed = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "gpu" and (f.name not in ("env_from", "pod", "workload") or getattr(self, f.name))
        }
        canonical = json.dumps(hashed, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def _image(spec: KVOffloadPolicySpec) -> str:
    if spec.image is None:
        raise PolicyError([FieldError("spec.workloadRef", "the referenced Deployment has not been read")])
    return spec.image


def _engine(policy: KVOffloadPolicy, level: Level) -> _Engine:
    spec = policy.spec
    if spec.workload is not None:
        return _adopted_engine(policy, level, spec.workload)
    overlay = spec.pod_template
    gpu = _gpu_class(spec)
    volumes, mounts = _volumes(spec, level)
    return _Engine(
        image=_image(spec),
        command=engine_for(spec).command(spec),
        args=engine_args(policy, level),
        env=engine_env(spec, level),
        resources=_resources(spec, level, gpu),
        volume_mounts=mounts,
        volumes=volumes,
        gpu=gpu,
        env_from=[_dump(e) for e in overlay.env_from] if overlay is not None else [],
        pod=_overlay_pod(overlay),
    )


# --- a Deployment the team runs (spec.workloadRef) ------------------------------------------


def _adopted_engine(policy: KVOffloadPolicy, level: Level, workload: AdoptedWorkload) -> _Engine:
    """The referenced pod template with only what offload needs changed: the offload flags and variables, memory,
    /dev/shm and the tier volumes. Everything else is the user's, as written."""
    spec = policy.spec
    template, container, derived = derived_pod(spec, level, workload)
    pod = template["spec"]
    return _Engine(
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
    always gives the same hash (rollback restores a level exactly, by this hash)."""
    return _engine(policy, level).hash


def _prometheus_duration(seconds: float) -> str:
    millis = max(1, round(seconds * 1000))
    parts = []
    for unit, size in _PROM_UNITS:
        count, millis = divmod(millis, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def tier_capacity_annotation(policy: KVOffloadPolicy, level: Level) -> str:
    """The ``kvoffload.io/tier-capacity-tokens`` value of a level's pods: compact JSON, tiers in ladder order.

    PolicyError names the field when the model's KV shape is unknown (a configMap not read).
    """
    try:
        capacity = tier_capacity_tokens(policy.spec, level)
    except SizingError as exc:
        message = str(exc).removeprefix(f"{exc.path}: ")
        raise PolicyError([FieldError(exc.path, message)], policy.metadata.name) from None
    return json.dumps(capacity, separators=(",", ":"))


def _common_labels(policy: KVOffloadPolicy) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": engine_for(policy.spec).name,
        "app.kubernetes.io/instance": policy.metadata.name,
        "app.kubernetes.io/component": "engine",
        "app.kubernetes.io/managed-by": "kvoffload",
        LABEL_POLICY: policy.metadata.name,
    }


# --- templates ------------------------------------------------------------------------------


# libyaml's loader and dumper when PyYAML has them (its wheels do): every cycle renders every level, and the
# pure-Python scanner was a third of the operator's time at 1,000 policies (bench/operator).
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_Dumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _flow_yaml(value: Any) -> str:
    """One line of flow YAML that ``yaml.safe_load`` turns back into exactly ``value``."""
    text = yaml.dump(value, Dumper=_Dumper, default_flow_style=True, allow_unicode=True, sort_keys=False, width=2**30)
    return text.rstrip("\n").removesuffix("\n...")


def _templates_dir() -> Path:
    packaged = resources.files("kvoffload") / "templates"
    if packaged.is_dir():  # the wheel: force-included as kvoffload/templates
        return Path(str(packaged))
    return Path(__file__).resolve().parents[3] / "templates"  # the editable install: <repo>/templates


@functools.cache
def renderer_version() -> str:
    """A digest of what renders a policy besides the policy itself: the package's version and its templates.
    Equal inputs under an equal renderer render equal manifests, so the operator compares inputs, not renders."""
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(_templates_dir().glob("*")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def render_input(policy: KVOffloadPolicy) -> str:
    """A digest of everything a render reads: the policy's name, namespace and resolved spec (but its
    ``notifications``, which no render reads), the referenced pod template where spec.workloadRef was read, and
    the renderer."""
    meta = policy.metadata
    spec = policy.spec.model_dump_json(by_alias=True, exclude={"notifications"})
    text = f"{renderer_version()}\0{meta.namespace}/{meta.name}\0{spec}"
    workload = policy.spec.workload
    if workload is not None:  # only then, so that every other policy's digest stays what it was
        text += f"\0{workload.digest}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_templates_dir()),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        auto_reload=False,  # the templates ship with the package: no stat() per render
    )
    env.filters["yaml"] = _flow_yaml
    return env


def _from_template(template: str, /, **context: Any) -> dict[str, Any]:
    text = _environment().get_template(template).render(**context)
    obj = yaml.load(text, Loader=_Loader)  # a safe loader: libyaml's CSafeLoader
    if not isinstance(obj, dict):  # pragma: no cover - a template bug, not bad input
        raise TypeError(f"template {template} did not render a mapping")
    return obj


# --- the public renderers --------------------------------------------------------------------


def _require_renderable(policy: KVOffloadPolicy) -> None:
    if errors := check_renderable(policy):
        raise PolicyError(errors, policy.metadata.name)


def deployment_name(policy: str, level: str) -> str:
    """The engine Deployment of one ladder level: ``<policy>-<level name>``. One per level, whatever role
    (stable, canary) it holds: a promotion moves the role, never the pods."""
    return f"{policy}-{level}"


def render_deployment(policy: KVOffloadPolicy, level: Level, replicas: int) -> dict[str, Any]:
    """The engine Deployment ``<policy>-<level>`` running ``level`` with ``replicas`` pods.

    Its pods carry only labels that never change while they run (policy, level, config hash), so that a
    role moving from one level to another rewrites no pod template. With an adopted workload
    (spec.workloadRef), the pod template is the referenced one, derived for the level."""
    _require_renderable(policy)
    if replicas < 0:
        raise ValueError("replicas must not be negative")
    spec = policy.spec
    engine = _engine(policy, level)
    gpu = engine.gpu
    tiers = ",".join(level.tiers) or "none"
    selector = {LABEL_POLICY: policy.metadata.name, LABEL_LEVEL: level.name}
    labels = {
        **_common_labels(policy),
        LABEL_LEVEL: level.name,
        LABEL_CONFIG_HASH: engine.hash,
    }
    annotations = {
        ANNOTATION_TIERS: tiers,
        # What each tier holds, for KV-aware routers that size their per-pod prefix index.
        ANNOTATION_TIER_CAPACITY: tier_capacity_annotation(policy, level),
    }
    adopted = spec.workload is not None
    pod = {} if adopted else dict(engine.pod)
    # The overlay's labels and annotations go under the operator's, which win (check_renderable refuses clashes).
    pod_labels = {**pod.pop("labels", {}), **labels}
    container = spec.workload.container if spec.workload is not None else engine_for(spec).container
    pod_annotations = {
        **pod.pop("annotations", {}),
        "kubectl.kubernetes.io/default-container": container,
        **annotations,
    }
    surge = spec.rollout.max_surge
    deployment = _from_template(
        "deployment.yaml.j2",
        name=deployment_name(policy.metadata.name, level.name),
        namespace=policy.metadata.namespace,
        labels=labels,
        annotations={ANNOTATION_LEVEL_INDEX: str(level.index), ANNOTATION_TIERS: tiers},
        replicas=replicas,
        # A GPU node rarely has a spare GPU: replace pods one at a time, extra pods only
        # as far as rollout.maxSurge allows. Recreate would take the whole fleet down.
        max_surge=surge,
        max_unavailable=0 if surge else 1,
        progress_deadline_seconds=math.ceil(progress_deadline_seconds(spec, level)),
        selector=selector,
        pod_labels=pod_labels,
        pod_annotations=pod_annotations,
        pod_fields=pod,
        termination_grace_seconds=TERMINATION_GRACE_SECONDS,
        pod_security=POD_SECURITY,
        container_security=CONTAINER_SECURITY,
        node_selector={**gpu.node_labels, **spec.gpu.node_selector},
        tolerations=_tolerations(spec, gpu),
        container=container,
        image=engine.image,
        command=engine.command,
        args=engine.args,
        env=engine.env,
        env_from=engine.env_from,
        port=PORT,
        resources=engine.resources,
        volume_mounts=engine.volume_mounts,
        volumes=engine.volumes,
        # vLLM opens its port only after loading the model and pinning the pool.
        startup={
            "period": STARTUP_PROBE_PERIOD_SECONDS,
            "failures": max(1, math.ceil(startup_seconds(spec, level) / STARTUP_PROBE_PERIOD_SECONDS)),
        },
    )
    if adopted:
        # The template gives the Deployment around the pod; the pod is the user's, derived. Its own labels (those
        # their Service or InferencePool selects) and annotations stay; the operator's go on top.
        template = copy.deepcopy(engine.pod)
        meta = template.setdefault("metadata", {})
        meta["labels"] = {**(meta.get("labels") or {}), **{k: labels[k] for k in SERIES_POD_LABELS}}
        meta["annotations"] = {**(meta.get("annotations") or {}), **pod_annotations}
        deployment["spec"]["template"] = template
    return deployment


def render_service(policy: KVOffloadPolicy) -> dict[str, Any]:
    """The Service in front of both variants (selects the policy only)."""
    _require_renderable(policy)
    return _from_template(
        "service.yaml.j2",
        name=policy.metadata.name,
        namespace=policy.metadata.namespace,
        labels=_common_labels(policy),
        selector={LABEL_POLICY: policy.metadata.name},
        port=PORT,
    )


SAMPLE_LIMIT = 10_000
"""Samples one engine's scrape may hold (the PodMonitor's ``sampleLimit``): a scrape past it is dropped whole, so
one policy cannot flood the Prometheus others share (issue 33). vLLM 0.32 serving one model exposes 450
(``tests/data/vllm-0.32.0-cpu-metrics.txt``), 0.26 with offload 514: twenty times that is room for LoRA
adapters and the SGLang families."""


def render_pod_monitor(policy: KVOffloadPolicy, monitor_labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The PodMonitor that scrapes every engine of the policy every ``analysis.interval``.

    It carries ``monitor_labels`` (the operator's ``--monitor-label``, e.g. the ``release`` label a
    kube-prometheus-stack selects PodMonitors on), then spec.prometheus.monitorLabels, then the operator's own
    labels, each winning over the one before."""
    _require_renderable(policy)
    monitor = _from_template(
        "podmonitor.yaml.j2",
        name=policy.metadata.name,
        namespace=policy.metadata.namespace,
        labels={**(monitor_labels or {}), **policy.spec.prometheus.monitor_labels, **_common_labels(policy)},
        selector={LABEL_POLICY: policy.metadata.name},
        pod_target_labels=list(SERIES_POD_LABELS),
        interval=_prometheus_duration(parse_duration(policy.spec.analysis.interval)),
        sample_limit=SAMPLE_LIMIT,
    )
    target = engine_port(policy)
    if target is not None:  # an adopted engine's port is not named http
        endpoint = monitor["spec"]["podMetricsEndpoints"][0]
        del endpoint["port"]
        where = {"port": target} if isinstance(target, str) else {"portNumber": target}
        monitor["spec"]["podMetricsEndpoints"][0] = {**where, **endpoint}
    return monitor


def render(
    policy: KVOffloadPolicy,
    level: Level,
    role: Variant = "stable",
    replicas: int | None = None,
    monitor_labels: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The manifests of one level: its Deployment, then the shared Service (none with spec.workloadRef: the team's
    own Service selects the derived pods by the labels they keep) and PodMonitor.

    ``replicas`` defaults to what the role would run: spec.replicas as stable, rollout.canaryReplicas as
    canary (the role changes nothing else). Raises PolicyError naming the fields when the policy cannot
    be rendered.
    """
    if role not in VARIANTS:
        raise ValueError(f"role must be one of {', '.join(VARIANTS)}, not {role!r}")
    if replicas is None:
        replicas = policy.spec.replicas if role == "stable" else policy.spec.rollout.canary_replicas
    service = [render_service(policy)] if policy.spec.workload_ref is None else []
    return [render_deployment(policy, level, replicas), *service, render_pod_monitor(policy, monitor_labels)]


def render_level(
    policy: KVOffloadPolicy, level: Level, monitor_labels: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """GitOps output: every replica on ``level`` as the stable Deployment, plus Service and PodMonitor."""
    return render(policy, level, "stable", policy.spec.replicas, monitor_labels)


def dump_yaml(documents: Iterable[dict[str, Any]]) -> str:
    """Multi-document YAML (``---`` separated), keys in rendering order, long lines unfolded."""
    return yaml.safe_dump_all(
        list(documents),
        explicit_start=True,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=2**31,
    )
