"""The policies' Deployments and pods, as each cycle reads them.

Listing them costs two API calls per policy per cycle: 2,000 a cycle for 1,000 policies, each a TLS round
trip and a JSON decode in the operator. Under kopf they come instead from one watch per kind (kopf indexes,
with the server-side label selector ``kvoffload.io/policy``, the policy label every engine carries), kept
as the few fields the cycle reads (``DeploymentState``, ``PodState``), as controller-runtime's cache does.

A watch can be behind the operator's own write: kopf batches an object's events for a moment, so the cycle
right after a write could see the Deployment as it was before it and write again. A policy whose Deployment
this operator wrote is therefore read by a list until the watch has shown that write (the resourceVersion the
write returned, or a later one, or the object gone after a delete), or for at most ``EXPECTATION_TTL``
seconds: the "expectations" of Kubernetes' ReplicaSet controller. Before a watch is attached (a Controller
run without kopf: tests, the lab) every read is a list.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kvoffload.api.conventions import LABEL_POLICY
from kvoffload.controller.gateway import (
    DeploymentState,
    KubernetesGateway,
    OwnedWorkloads,
    PodState,
    PolicyRef,
    parse_deployment,
    parse_pod,
)
from kvoffload.controller.metrics import OperatorMetrics

EXPECTATION_TTL = 60.0
"""Seconds after which a write the watch has not shown no longer makes its policy list (a watch that far
behind is being re-established by kopf; a list then would not be fresher for long)."""

Index = Mapping[Any, Iterable[Any]]
"""A kopf index as the cycle reads it: key -> the values of every object indexed under that key."""


def index_deployment(body: Mapping[str, Any]) -> dict[str, DeploymentState]:
    """A Deployment under the uid of each policy it names as an owner (``list_owned`` checks the same)."""
    if LABEL_POLICY not in (body.get("metadata", {}).get("labels") or {}):
        return {}
    state = parse_deployment(body)
    refs = body.get("metadata", {}).get("ownerReferences") or []
    return {str(ref["uid"]): state for ref in refs if ref.get("uid")}


def index_pod(body: Mapping[str, Any]) -> dict[tuple[str, str], PodState]:
    """A pod under (namespace, policy label), as ``list_owned`` selects them."""
    meta = body.get("metadata", {})
    policy = (meta.get("labels") or {}).get(LABEL_POLICY)
    if not policy:
        return {}
    return {(str(meta.get("namespace")), str(policy)): parse_pod(body)}


class Workloads:
    """Reads a policy's Deployments and pods: from the attached watch indexes where they can be trusted,
    else by a list through the gateway."""

    def __init__(
        self,
        gateway: KubernetesGateway,
        metrics: OperatorMetrics | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gateway = gateway
        self._metrics = metrics or OperatorMetrics()
        self._monotonic = monotonic
        self._deployments: Index | None = None
        self._pods: Index | None = None
        # policy uid -> Deployment name -> (resourceVersion its write returned, None for a delete; when written)
        self._expected: dict[str, dict[str, tuple[int | None, float]]] = {}

    @property
    def watched(self) -> bool:
        return self._deployments is not None and self._pods is not None

    def attach(self, deployments: Index, pods: Index) -> None:
        """Read from these indexes (``index_deployment``, ``index_pod``) from now on. kopf hands its handlers
        the same live indexes every time, and only once every index has been filled by its first list."""
        self._deployments, self._pods = deployments, pods

    async def owned(self, policy: PolicyRef) -> OwnedWorkloads:
        """The policy's Deployments and the pods with its label, sorted by name."""
        if self._deployments is None or self._pods is None or not self._caught_up(policy.uid, self._deployments):
            self._metrics.workload_reads.labels(source="list").inc()
            return await self._gateway.list_owned(policy)
        self._metrics.workload_reads.labels(source="watch").inc()
        deployments: Iterable[DeploymentState] = self._deployments.get(policy.uid, ())
        pods: Iterable[PodState] = self._pods.get((policy.namespace, policy.name), ())
        return OwnedWorkloads(
            deployments=tuple(sorted(deployments, key=lambda d: d.name)),
            pods=tuple(sorted(pods, key=lambda p: p.name)),
        )

    def wrote(self, policy: PolicyRef, name: str, resource_version: int | None) -> None:
        """The operator wrote the policy's Deployment ``name`` and the API server answered with this version."""
        if resource_version is not None:
            self._expected.setdefault(policy.uid, {})[name] = (resource_version, self._monotonic())

    def deleted(self, policy: PolicyRef, name: str) -> None:
        self._expected.setdefault(policy.uid, {})[name] = (None, self._monotonic())

    def forget(self, uid: str) -> None:
        self._expected.pop(uid, None)

    def _caught_up(self, uid: str, deployments: Index) -> bool:
        """Whether the watch shows every write of this policy's Deployments that the operator made."""
        expected = self._expected.get(uid)
        if not expected:
            return True
        seen = {d.name: d.resource_version for d in deployments.get(uid, ())}
        now = self._monotonic()
        for name, (version, when) in list(expected.items()):
            shown = name not in seen if version is None else (seen.get(name) or 0) >= version
            if shown or now - when > EXPECTATION_TTL:
                del expected[name]
        if not expected:
            del self._expected[uid]
            return True
        return False
