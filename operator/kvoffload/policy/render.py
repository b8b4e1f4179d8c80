"""Rendering: the Kubernetes manifests of one ladder level (Deployment, its engine's ConfigMap where the engine
reads config files, Service, PodMonitor).

Python computes every value (the engine's command line and environment, from ``engines/``;
sizes, labels and the config hash); the Jinja2 templates
in ``templates/`` only give them their structure. Pure: no I/O apart from
reading the packaged templates.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from kvoffload.api.conventions import (
    ANNOTATION_LEVEL_INDEX,
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
from kvoffload.api.quantity import parse_duration
from kvoffload.api.types import KVOffloadPolicy, KVOffloadPolicySpec
from kvoffload.engines import PORT, engine_for
from kvoffload.engines.engine import CONFIG_DIR
from kvoffload.policy.catalog import GPUClass
from kvoffload.policy.derive import engine_port
from kvoffload.policy.engine_config import engine_config
from kvoffload.policy.kvshape import SizingError
from kvoffload.policy.ladder import Level
from kvoffload.policy.renderable import CONFIG_VOLUME, check_renderable
from kvoffload.policy.sized import SizedLevel, sized_level
from kvoffload.policy.templating import from_template

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

# Prometheus Operator durations: ``1h2m3s4ms``, whole units only (monitoring.coreos.com/v1).
_PROM_UNITS = (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1))


def _tolerations(spec: KVOffloadPolicySpec, gpu: GPUClass) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    extra = spec.pod_template.tolerations if spec.pod_template is not None else []
    for toleration in (*gpu.tolerations, *spec.gpu.tolerations, *extra):
        item = toleration.model_dump(by_alias=True, exclude_none=True)
        if item not in merged:
            merged.append(item)
    return merged


def _prometheus_duration(seconds: float) -> str:
    millis = max(1, round(seconds * 1000))
    parts = []
    for unit, size in _PROM_UNITS:
        count, millis = divmod(millis, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def _sized(policy: KVOffloadPolicy, level: Level | SizedLevel) -> SizedLevel:
    """The level as the sized plan gives it (sized here when a bare ``Level`` is given).

    PolicyError names the field when the model's KV shape is unknown (a configMap not read).
    """
    try:
        return sized_level(policy, level)
    except SizingError as exc:
        message = str(exc).removeprefix(f"{exc.path}: ")
        raise PolicyError([FieldError(exc.path, message)], policy.metadata.name) from None


def tier_capacity_annotation(sized: SizedLevel) -> str:
    """The ``kvoffload.io/tier-capacity-tokens`` value of a level's pods: compact JSON, tiers in ladder order."""
    return json.dumps(dict(sized.capacity), separators=(",", ":"))


def _common_labels(policy: KVOffloadPolicy) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": engine_for(policy.spec).name,
        "app.kubernetes.io/instance": policy.metadata.name,
        "app.kubernetes.io/component": "engine",
        "app.kubernetes.io/managed-by": "kvoffload",
        LABEL_POLICY: policy.metadata.name,
    }


# --- the public renderers --------------------------------------------------------------------


def _require_renderable(policy: KVOffloadPolicy) -> None:
    if errors := check_renderable(policy):
        raise PolicyError(errors, policy.metadata.name)


def deployment_name(policy: str, level: str) -> str:
    """The engine Deployment of one ladder level: ``<policy>-<level name>``. One per level, whatever role
    (stable, canary) it holds: a promotion moves the role, never the pods."""
    return f"{policy}-{level}"


def _level_labels(policy: KVOffloadPolicy, level: Level, config_hash_: str) -> dict[str, str]:
    return {**_common_labels(policy), LABEL_LEVEL: level.name, LABEL_CONFIG_HASH: config_hash_}


def render_config_map(policy: KVOffloadPolicy, level: Level | SizedLevel) -> dict[str, Any] | None:
    """The ConfigMap of ``level``'s engine config files (``Engine.config_files``), named and labelled as the level's
    Deployment, which mounts it at ``CONFIG_DIR``; None where the engine reads no file."""
    _require_renderable(policy)
    bare = level.level if isinstance(level, SizedLevel) else level
    if not engine_for(policy.spec).config_files(policy, bare):
        return None  # without building the whole container config: most engines read no file
    sized = _sized(policy, level)
    engine = engine_config(policy, bare, sized.memory)
    return from_template(
        "configmap.yaml.j2",
        name=deployment_name(policy.metadata.name, bare.name),
        namespace=policy.metadata.namespace,
        labels=_level_labels(policy, bare, sized.config_hash),
        data=engine.files,
    )


def render_deployment(policy: KVOffloadPolicy, level: Level | SizedLevel, replicas: int) -> dict[str, Any]:
    """The engine Deployment ``<policy>-<level>`` running ``level`` with ``replicas`` pods.

    Its pods carry only labels that never change while they run (policy, level, config hash), so that a
    role moving from one level to another rewrites no pod template. With an adopted workload
    (spec.workloadRef), the pod template is the referenced one, derived for the level. ``level`` from the sized
    plan (``policy.sized``) is rendered as sized; a bare ``Level`` is sized here."""
    _require_renderable(policy)
    if replicas < 0:
        raise ValueError("replicas must not be negative")
    spec = policy.spec
    sized = _sized(policy, level)
    level = sized.level
    engine = engine_config(policy, level, sized.memory)
    gpu = engine.gpu
    tiers = ",".join(level.tiers) or "none"
    selector = {LABEL_POLICY: policy.metadata.name, LABEL_LEVEL: level.name}
    labels = _level_labels(policy, level, sized.config_hash)
    volumes, volume_mounts = engine.volumes, engine.volume_mounts
    if engine.files:  # not with spec.workloadRef: engine_config refuses that
        name = deployment_name(policy.metadata.name, level.name)
        volumes = [*volumes, {"name": CONFIG_VOLUME, "configMap": {"name": name}}]
        volume_mounts = [*volume_mounts, {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True}]
    annotations = {
        ANNOTATION_TIERS: tiers,
        # What each tier holds, for KV-aware routers that size their per-pod prefix index.
        ANNOTATION_TIER_CAPACITY: tier_capacity_annotation(sized),
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
    deployment = from_template(
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
        progress_deadline_seconds=math.ceil(sized.progress_deadline_seconds),
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
        volume_mounts=volume_mounts,
        volumes=volumes,
        # vLLM opens its port only after loading the model and pinning the pool.
        startup={
            "period": STARTUP_PROBE_PERIOD_SECONDS,
            "failures": max(1, math.ceil(sized.startup_seconds / STARTUP_PROBE_PERIOD_SECONDS)),
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
    return from_template(
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
    monitor = from_template(
        "podmonitor.yaml.j2",
        name=policy.metadata.name,
        namespace=policy.metadata.namespace,
        labels={**(monitor_labels or {}), **policy.spec.prometheus.monitor_labels, **_common_labels(policy)},
        selector={LABEL_POLICY: policy.metadata.name},
        pod_target_labels=list(SERIES_POD_LABELS),
        interval=_prometheus_duration(parse_duration(policy.spec.analysis.interval)),
        sample_limit=SAMPLE_LIMIT,
        metrics_path=engine_for(policy.spec).metrics_path,
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
    level: Level | SizedLevel,
    role: Variant = "stable",
    replicas: int | None = None,
    monitor_labels: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The manifests of one level: its engine's ConfigMap (where the engine reads config files), its Deployment, then
    the shared Service (none with spec.workloadRef: the team's own Service selects the derived pods by the labels
    they keep) and PodMonitor.

    ``replicas`` defaults to what the role would run: spec.replicas as stable, rollout.canaryReplicas as
    canary (the role changes nothing else). Raises PolicyError naming the fields when the policy cannot
    be rendered.
    """
    if role not in VARIANTS:
        raise ValueError(f"role must be one of {', '.join(VARIANTS)}, not {role!r}")
    if replicas is None:
        replicas = policy.spec.replicas if role == "stable" else policy.spec.rollout.canary_replicas
    service = [render_service(policy)] if policy.spec.workload_ref is None else []
    _require_renderable(policy)
    level = _sized(policy, level)  # once, for the ConfigMap and the Deployment
    config = render_config_map(policy, level)
    files = [config] if config is not None else []
    return [*files, render_deployment(policy, level, replicas), *service, render_pod_monitor(policy, monitor_labels)]


def render_level(
    policy: KVOffloadPolicy, level: Level | SizedLevel, monitor_labels: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """GitOps output: every replica on ``level`` as the stable Deployment (after its ConfigMap, where the engine has
    one), plus Service and PodMonitor."""
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
