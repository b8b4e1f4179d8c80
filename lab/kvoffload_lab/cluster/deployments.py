"""The Deployment controller's rules as the local cluster plays them: pods from the template, rolling limits, status."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from kvoffload_lab.cluster.kubeemu import Obj, now_rfc3339

POD_TEMPLATE_HASH = "pod-template-hash"


def template_hash(template: Mapping[str, Any]) -> str:
    """A stable short hash of a pod template (the Deployment controller's ``pod-template-hash``)."""
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def _int_or_percent(value: Any, total: int, *, round_up: bool, default: str) -> int:
    raw = default if value is None else value
    if isinstance(raw, str) and raw.endswith("%"):
        share = total * float(raw[:-1]) / 100
        return math.ceil(share) if round_up else math.floor(share)
    return int(raw)


def rolling_limits(deployment: Mapping[str, Any]) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) of a RollingUpdate Deployment, as numbers of pods (never both 0)."""
    spec = deployment.get("spec") or {}
    desired = int(spec.get("replicas", 1))
    rolling = ((spec.get("strategy") or {}).get("rollingUpdate")) or {}
    surge = _int_or_percent(rolling.get("maxSurge"), desired, round_up=True, default="25%")
    unavailable = _int_or_percent(rolling.get("maxUnavailable"), desired, round_up=False, default="25%")
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


def pod_manifest(deployment: Mapping[str, Any], name: str, pod_hash: str, annotations: Mapping[str, str]) -> Obj:
    """A pod of the Deployment's template, owned by it, with ``annotations`` added."""
    meta, spec = deployment["metadata"], deployment["spec"]
    template = spec.get("template") or {}
    tmeta, tspec = template.get("metadata") or {}, template.get("spec") or {}
    labels = {**(tmeta.get("labels") or {}), POD_TEMPLATE_HASH: pod_hash}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": {**(tmeta.get("annotations") or {}), **annotations},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {**tspec, "nodeName": "localhost"},
    }


def deployment_status(deployment: Obj, *, updated: int, outdated: int, ready: int, min_available: int) -> Obj:
    """The status to report: replica counts and the Available and Progressing conditions."""
    meta, spec = deployment["metadata"], deployment.get("spec") or {}
    desired = int(spec.get("replicas", 1))
    status: Obj = {
        "observedGeneration": int(meta.get("generation") or 0),
        "replicas": updated + outdated,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "unavailableReplicas": max(0, desired - ready),
    }
    complete = updated == desired and not outdated and ready == desired
    available_ok = ready >= min_available
    status["conditions"] = _conditions(deployment, available_ok, complete)
    return status


def status_changed(current: Mapping[str, Any], status: Obj) -> bool:
    """Whether ``status`` says something ``current`` does not (a condition's times alone do not count)."""
    return any(current.get(k) != v for k, v in status.items() if k != "conditions") or _changed_conditions(
        current.get("conditions") or [], status["conditions"]
    )


def _conditions(deployment: Obj, available: bool, complete: bool) -> list[Obj]:
    previous = {c.get("type"): c for c in (deployment.get("status") or {}).get("conditions") or []}
    now = now_rfc3339()

    def condition(type_: str, ok: bool, reason: str, message: str) -> Obj:
        status = "True" if ok else "False"
        before = previous.get(type_) or {}
        changed = before.get("status") != status
        return {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastUpdateTime": now if changed or before.get("reason") != reason else before.get("lastUpdateTime"),
            "lastTransitionTime": now if changed else before.get("lastTransitionTime", now),
        }

    name = deployment["metadata"]["name"]
    return [
        condition(
            "Available",
            available,
            "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
            "Deployment has minimum availability." if available else "Deployment does not have minimum availability.",
        ),
        condition(
            "Progressing",
            True,
            "NewReplicaSetAvailable" if complete else "ReplicaSetUpdated",
            f'Deployment "{name}" has successfully progressed.' if complete else f'Deployment "{name}" is progressing.',
        ),
    ]


def _changed_conditions(before: list[Obj], after: list[Obj]) -> bool:
    def essence(conditions: list[Obj]) -> list[tuple[Any, ...]]:
        return sorted((c.get("type"), c.get("status"), c.get("reason")) for c in conditions)

    return essence(before) != essence(after)
