"""The adapter of spec.workloadRef: the taken-over Deployment read, scaled down as ``decide`` allows, and handed
back before the policy goes.

The operator never owns, applies or deletes that Deployment: it writes only its ``spec.replicas`` and two
annotations (the count it ran before, and which policy holds it). A policy that has scaled it down carries the
``kvoffload.io/hand-back`` finalizer, so deleting the policy first brings the Deployment back to its count and
waits for it to be Ready; only then do the operator's own Deployments go, by their ownerReferences.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kvoffload.api.conventions import ANNOTATION_ORIGINAL_REPLICAS, ANNOTATION_TAKEN_BY, HAND_BACK_FINALIZER
from kvoffload.api.status import WorkloadStatus
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.controller.apierrors import MissingObjectError
from kvoffload.controller.gateway import KubernetesGateway, PolicyRef
from kvoffload.policy.workload import original_replicas
from kvoffload.rollout.observations import WorkloadObservation

log = logging.getLogger(__name__)


def taker_problem(deployment: Mapping[str, Any], policy: str) -> str | None:
    """Why ``policy`` may not take the Deployment over: another policy holds it."""
    meta = deployment.get("metadata") or {}
    holder = (meta.get("annotations") or {}).get(ANNOTATION_TAKEN_BY)
    if holder and holder != policy:
        return f"Deployment {meta.get('name')} is already taken over by policy {holder}"
    return None


def observed(policy: KVOffloadPolicy, deployment: Mapping[str, Any]) -> WorkloadObservation:
    """What ``decide`` sees of the Deployment ``adopt`` read into ``policy``."""
    workload = policy.spec.workload
    assert workload is not None  # adopted
    replicas = (deployment.get("spec") or {}).get("replicas")
    return WorkloadObservation(
        name=workload.name,
        digest=workload.digest,
        original_replicas=workload.replicas,
        replicas=replicas if isinstance(replicas, int) else 1,
    )


def holding(ref: PolicyRef, workload: WorkloadStatus) -> dict[str, str | None]:
    """The annotations a held Deployment carries."""
    return {ANNOTATION_ORIGINAL_REPLICAS: str(workload.original_replicas), ANNOTATION_TAKEN_BY: ref.name}


RELEASED: dict[str, str | None] = {ANNOTATION_ORIGINAL_REPLICAS: None, ANNOTATION_TAKEN_BY: None}


async def hand_over(
    gateway: KubernetesGateway, ref: PolicyRef, metadata: Mapping[str, Any], workload: WorkloadStatus
) -> None:
    """Scale the Deployment down to what ``decide`` left it, the finalizer set first: a policy deleted from now
    on gives the replicas back before its own engines go."""
    await gateway.set_finalizer(ref, metadata, HAND_BACK_FINALIZER, True)
    await gateway.scale_workload(ref.namespace, workload.name, workload.replicas, holding(ref, workload))


def _ready(deployment: Mapping[str, Any]) -> int:
    status = deployment.get("status") or {}
    meta = deployment.get("metadata") or {}
    if (status.get("observedGeneration") or 0) < (meta.get("generation") or 0):
        return 0  # the controller has not seen the new count yet
    return int(status.get("readyReplicas") or 0)


async def give_back(gateway: KubernetesGateway, ref: PolicyRef, name: str) -> str | None:
    """One step of giving the Deployment back at the count recorded on it when it was first scaled down; None once
    it runs that many Ready and carries no annotation of ours (or is gone, or was never scaled down), else what
    the step waits for."""
    try:
        deployment = await gateway.read_deployment(ref.namespace, name)
    except MissingObjectError:
        return None
    annotations = (deployment.get("metadata") or {}).get("annotations") or {}
    if annotations.get(ANNOTATION_TAKEN_BY) != ref.name:
        return None  # not held by this policy: nothing to give back
    want = original_replicas(deployment)
    if (deployment.get("spec") or {}).get("replicas") != want:
        await gateway.scale_workload(ref.namespace, name, want, {})
        return f"Deployment {name} scaled back to {want}"
    if (ready := _ready(deployment)) < want:
        return f"Deployment {name}: {ready} of {want} Ready"
    await gateway.scale_workload(ref.namespace, name, want, RELEASED)
    return None


async def hand_back(gateway: KubernetesGateway, body: Mapping[str, Any]) -> str | None:
    """One step of giving a deleted policy's Deployment back; None once done (the finalizer is off, so its own
    engines go), else what it waits for."""
    ref = PolicyRef.from_body(body)
    name = ((body.get("spec") or {}).get("workloadRef") or {}).get("name")
    if name and (waiting := await give_back(gateway, ref, str(name))) is not None:
        return waiting
    await gateway.set_finalizer(ref, body.get("metadata") or {}, HAND_BACK_FINALIZER, False)
    log.info("%s: Deployment %s handed back; its own engines go now", ref, name)
    return None
