"""The parsed states of the policy's engines: what the rollout needs to know of a Deployment and of a pod, read
from the objects the API server returns (``parse_deployment``, ``parse_pod``), and an object's resourceVersion."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from kvoffload.api.conventions import LABEL_CONFIG_HASH, LABEL_LEVEL, LABEL_VARIANT


@dataclasses.dataclass(frozen=True)
class PodState:
    """What the rollout needs to know about one engine pod."""

    name: str
    variant: str | None  # legacy: the role label of pods from <policy>-stable/-canary (issue 9); None on new pods
    config_hash: str | None  # the engine config the pod runs (its template's config-hash label)
    level: str | None  # the ladder level's name (its template's level label)
    ready: bool
    restarts: int
    oom_killed: bool  # a container's current or last termination was OOMKilled
    crash_looping: bool  # a container is waiting in CrashLoopBackOff
    unschedulable: str | None  # the scheduler's message while PodScheduled is False (Unschedulable)
    started_at: datetime.datetime | None
    phase: str
    terminating: bool


@dataclasses.dataclass(frozen=True)
class DeploymentState:
    """One owned engine Deployment and how far its rollout got."""

    name: str
    variant: str | None  # legacy role label on <policy>-stable/-canary; None on per-level Deployments
    level: str | None  # the ladder level's name its pods run
    replicas: int
    ready_replicas: int
    updated_replicas: int
    available_replicas: int
    generation: int
    observed_generation: int
    labels: Mapping[str, str]
    annotations: Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class OwnedWorkloads:
    """The policy's Deployments and the pods that carry its label."""

    deployments: tuple[DeploymentState, ...]
    pods: tuple[PodState, ...]


def _rfc3339(value: str | None) -> datetime.datetime | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def resource_version(obj: Mapping[str, Any]) -> str | None:
    """metadata.resourceVersion, or None where there is none. Opaque: the API conventions let a client compare
    two only for equality, never for order (an aggregated or non-etcd server need not count)."""
    value = (obj.get("metadata") or {}).get("resourceVersion")
    return value if isinstance(value, str) and value else None


def parse_pod(pod: Mapping[str, Any]) -> PodState:
    """Read readiness, restarts, OOM kills and crash loops from a pod's status."""
    meta, status = pod.get("metadata", {}), pod.get("status") or {}
    containers = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    terminations = [
        (container.get(state) or {}).get("terminated") or {}
        for container in containers
        for state in ("state", "lastState")
    ]
    waiting = [((container.get("state") or {}).get("waiting") or {}) for container in containers]
    conditions = status.get("conditions") or []
    scheduled: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "PodScheduled"), {})
    unschedulable = scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"
    labels = meta.get("labels") or {}
    return PodState(
        name=meta["name"],
        variant=labels.get(LABEL_VARIANT),
        config_hash=labels.get(LABEL_CONFIG_HASH),
        level=labels.get(LABEL_LEVEL),
        ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
        restarts=sum(int(container.get("restartCount") or 0) for container in containers),
        oom_killed=any(term.get("reason") == "OOMKilled" for term in terminations),
        crash_looping=any(wait.get("reason") == "CrashLoopBackOff" for wait in waiting),
        unschedulable=(scheduled.get("message") or "no node fits the pod") if unschedulable else None,
        started_at=_rfc3339(status.get("startTime")),
        phase=status.get("phase") or "Unknown",
        terminating=bool(meta.get("deletionTimestamp")),
    )


def parse_deployment(deployment: Mapping[str, Any]) -> DeploymentState:
    meta, spec, status = deployment["metadata"], deployment.get("spec") or {}, deployment.get("status") or {}
    labels = meta.get("labels") or {}
    return DeploymentState(
        name=meta["name"],
        variant=labels.get(LABEL_VARIANT),
        level=labels.get(LABEL_LEVEL),
        replicas=int(spec.get("replicas", 1)),
        ready_replicas=int(status.get("readyReplicas") or 0),
        updated_replicas=int(status.get("updatedReplicas") or 0),
        available_replicas=int(status.get("availableReplicas") or 0),
        generation=int(meta.get("generation") or 0),
        observed_generation=int(status.get("observedGeneration") or 0),
        labels=labels,
        annotations=meta.get("annotations") or {},
    )
