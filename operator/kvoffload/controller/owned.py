"""What a cycle sees of the policy's engines, as ``decide()`` takes it: the Deployments that hold the stable
and canary roles and the draining levels, their pods, and an observe-only policy's fleet."""

from __future__ import annotations

from kvoffload.analysis.measurements import Measurements, not_scraped
from kvoffload.api.conventions import ANNOTATION_LEVEL_INDEX, LABEL_CONFIG_HASH, LEGACY_DEPLOYMENT_ROLES
from kvoffload.api.status import KVOffloadPolicyStatus, VariantStatus
from kvoffload.controller.kubestate import DeploymentState, OwnedWorkloads, PodState
from kvoffload.policy.render import deployment_name
from kvoffload.rollout.observations import FleetObservation, PodObservation, VariantObservation


def fleet_measurements(fleet: FleetObservation, namespace: str, measurements: Measurements) -> Measurements:
    """An observed fleet's measurements, or the reason there are none: no pod matches, or Prometheus holds no
    series of its pods (the team's scrape must label them ``namespace`` and ``pod``). Either is Inconclusive."""
    if measurements.error is not None:
        return measurements
    if not fleet.pods:
        error = f"observe-only: no pod in namespace {namespace} matches spec.rollout.observe.selector {fleet.selector}"
    elif not_scraped(measurements):
        error = (
            f"observe-only: Prometheus holds no engine series of the {len(fleet.pods)} pod(s) {fleet.selector} in "
            f"namespace {namespace}: is the fleet scraped, its series labelled namespace and pod?"
        )
    else:
        return measurements
    return Measurements(canary=None, stable=None, error=error)


def _deployment(owned: OwnedWorkloads, name: str) -> DeploymentState | None:
    return next((d for d in owned.deployments if d.name == name), None)


def level_deployment(
    owned: OwnedWorkloads, policy: str, level: str, config_hash_: str | None
) -> DeploymentState | None:
    """The Deployment of one level: ``<policy>-<level>``, else a legacy ``<policy>-stable``/``-canary`` whose
    pod template runs exactly that level and config (adopted as it is)."""
    found = _deployment(owned, deployment_name(policy, level))
    if found is not None:
        return found
    for role in LEGACY_DEPLOYMENT_ROLES:
        legacy = _deployment(owned, f"{policy}-{role}")
        matches = legacy is not None and legacy.variant == role and legacy.level == level
        if matches and legacy is not None and legacy.labels.get(LABEL_CONFIG_HASH) in (config_hash_, None):
            return legacy
    return None


def observe_roles(
    owned: OwnedWorkloads, policy: str, status: KVOffloadPolicyStatus | None
) -> tuple[VariantObservation, VariantObservation, tuple[VariantObservation, ...]]:
    """The Deployments that hold the stable and canary roles and the draining levels, as status records them.

    A policy without a status (first seen) gets, as its stable candidate for adoption, a legacy
    ``<policy>-stable`` if there is one, else the level Deployment with the most replicas."""
    if status is None or status.stable is None:
        legacy = _deployment(owned, f"{policy}-stable")
        candidates = [legacy] if legacy is not None else sorted(owned.deployments, key=lambda d: -d.replicas)
        first = candidates[0] if candidates else None
        return (_observe(owned, first) if first is not None else VariantObservation()), VariantObservation(), ()

    def role(variant: VariantStatus | None) -> VariantObservation:
        if variant is None or not 0 <= variant.level < len(status.ladder):
            return VariantObservation()
        found = level_deployment(owned, policy, status.ladder[variant.level], variant.config_hash)
        return _observe(owned, found) if found is not None else VariantObservation()

    retiring = []
    for r in status.retiring:
        found = level_deployment(owned, policy, r.level_name, r.config_hash)
        retiring.append(_observe(owned, found) if found is not None else VariantObservation())
    return role(status.stable), role(status.canary), tuple(retiring)


def pod_observation(p: PodState, config_hash: str | None) -> PodObservation:
    """What decide() sees of a pod; ``config_hash`` None where the operator did not render it (a fleet observed)."""
    return PodObservation(
        name=p.name,
        ready=p.ready,
        restarts=p.restarts,
        oom_killed=p.oom_killed,
        crash_looping=p.crash_looping,
        config_hash=config_hash,
        unschedulable=p.unschedulable,
    )


def _observe(owned: OwnedWorkloads, deployment: DeploymentState) -> VariantObservation:
    """One level's Deployment and its live pods; ready counts only pods on the Deployment's config."""
    current = deployment.labels.get(LABEL_CONFIG_HASH)
    pods = tuple(
        pod_observation(p, config_hash=p.config_hash)
        for p in owned.pods
        if _belongs(p, deployment) and not p.terminating
    )
    ready = sum(1 for p in pods if p.ready and p.config_hash in (None, current))
    level_text = deployment.annotations.get(ANNOTATION_LEVEL_INDEX, "")
    return VariantObservation(
        exists=True,
        config_hash=current,
        level=int(level_text) if level_text.isdigit() else None,
        desired_replicas=deployment.replicas,
        ready_replicas=ready,
        pods=pods,
    )


def _belongs(pod: PodState, deployment: DeploymentState) -> bool:
    """A legacy Deployment selects its role label; a level Deployment its level (on pods without a role)."""
    if deployment.variant is not None:
        return pod.variant == deployment.variant
    return pod.variant is None and pod.level == deployment.level
