"""What only rendering can check: names, labels, mount paths, the pod template overlay's fields.

Each check returns FieldErrors naming the field; ``check_renderable`` gathers them for a policy.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable

from kvoffload.api.conventions import ANNOTATION_PREFIX
from kvoffload.api.errors import FieldError
from kvoffload.api.podspec import LabelSelector, NodeSelectorTerm, PodAffinityTerm, PodTemplate, Toleration
from kvoffload.api.serving import SecondaryTier
from kvoffload.api.types import KVOffloadPolicy, KVOffloadPolicySpec
from kvoffload.engines import SHM_PATH, engine_for
from kvoffload.engines.engine import CONFIG_DIR
from kvoffload.policy.catalog import find_gpu_class, gpu_class_names
from kvoffload.policy.derive import check_workload
from kvoffload.policy.volumes import under, volume_name

# Mounting a tier here would hide what the image or the kernel needs.
_SYSTEM_DIRS = ("/bin", "/dev", "/etc", "/lib", "/lib64", "/proc", "/root", "/sbin", "/sys", "/usr", "/var")
# ...and nothing may be mounted inside these.
_NO_MOUNTS_UNDER = ("/dev", "/proc", "/sys")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

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


CONFIG_VOLUME = "engine-config"
"""The volume of the level's ConfigMap (``render.render_config_map``), mounted read-only at ``CONFIG_DIR``."""


def _operator_volume_names(spec: KVOffloadPolicySpec) -> set[str]:
    return {"dshm", CONFIG_VOLUME, *(volume_name(t, i) for i, t in enumerate(spec.offload.secondary_tiers))}


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
            errors.append(
                FieldError(f"{at}.name", f"{volume.name} names a volume of the operator (/dev/shm, a tier, its files)")
            )
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
    taken = [
        (SHM_PATH, "/dev/shm"),
        (CONFIG_DIR, "the engine's option files"),
        *((t.path, f"the {t.name} tier") for t in spec.offload.secondary_tiers),
    ]
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
