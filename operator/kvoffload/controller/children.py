"""Writing the policy's children: one Deployment per ladder level (shrinking ones first), with the ConfigMap of its
engine's config files where the engine reads some, its Service and its PodMonitor, each only when what it is
rendered from changed (``kvoffload.io/render-input``) or, for the Service and PodMonitor, after the resync period."""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from kvoffload.api.conventions import ANNOTATION_APPLIED, ANNOTATION_RENDER_INPUT
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.controller.apierrors import ApiRejectedError
from kvoffload.controller.cycle import ControllerBase, Reconcile, ReconcileError
from kvoffload.controller.gateway import PolicyRef
from kvoffload.controller.kubestate import DeploymentState, OwnedWorkloads, resource_version
from kvoffload.controller.owned import level_deployment
from kvoffload.controller.settings import ControllerSettings
from kvoffload.engines import engine_for
from kvoffload.policy.ladder import Level
from kvoffload.policy.render import (
    deployment_name,
    render_config_map,
    render_deployment,
    render_pod_monitor,
    render_service,
)
from kvoffload.policy.sized import Sized
from kvoffload.rollout.observations import PodMonitorRef
from kvoffload.rollout.plan import Variants

log = logging.getLogger(__name__)


CHILDREN: tuple[tuple[str, Callable[[KVOffloadPolicy, ControllerSettings], dict[str, Any]]], ...] = (
    ("Service", lambda policy, _: render_service(policy)),
    ("PodMonitor", lambda policy, settings: render_pod_monitor(policy, settings.monitor_labels)),
)
"""The policy's children besides its Deployments, by kind: one per policy, resynced by ``_apply_shared``."""


class ChildWriter(ControllerBase):
    """The ``Controller``'s writing of the policy's Deployments, Service and PodMonitor."""

    _children: dict[tuple[str, str], tuple[str, float]]
    _unserved: dict[str, float]
    _told_unserved: set[tuple[str, str]]
    _rng: random.Random

    def _defer_children(self, uid: str, key: str) -> None:
        """Resync this policy's Service and PodMonitor at a random time within the resync period, not now."""
        period = self.settings.children_resync_seconds
        written = self._monotonic() - period + self._rng.uniform(0.0, period)
        for kind, _ in CHILDREN:
            self._children[(uid, kind)] = (key, written)

    async def _apply_deployments(
        self,
        ctx: Reconcile,
        policy: KVOffloadPolicy,
        sized: Sized,
        variants: Variants,
        owned: OwnedWorkloads,
        key: str,
    ) -> bool:
        """Write the level Deployments that differ from the plan, the shrinking ones first; True if none did.

        A role's Deployment is rendered (server-side apply), after its engine's ConfigMap where the engine reads
        config files; a draining level's and an adopted legacy one's are only scaled, so their pods never restart;
        one the plan does not name, or names at 0, goes, and its ConfigMap with it. A Deployment whose render input
        and replicas are the plan's is not rendered at all."""
        steps: list[tuple[int, str, Callable[[], Awaitable[object]]]] = []
        kept: set[str] = set()
        wanted: list[tuple[str, str, int, bool]] = [
            (sized[vp.level].level.name, vp.config_hash, vp.replicas, True)
            for vp in (variants.stable, variants.canary)
            if vp is not None
        ]
        wanted += [(r.level_name, r.config_hash, r.replicas, False) for r in variants.retiring]
        levels = {s.level.name: s for s in sized}
        for level_name, config_hash_, replicas, rendered in wanted:
            current = level_deployment(owned, ctx.ref.name, level_name, config_hash_)
            name = current.name if current is not None else deployment_name(ctx.ref.name, level_name)
            if replicas == 0:
                continue  # goes below, with whatever the plan does not keep
            kept.add(name)
            legacy = name != deployment_name(ctx.ref.name, level_name)
            if legacy or not rendered or level_name not in levels:
                if current is not None and current.replicas != replicas:
                    scale = _bind(self._scale, ctx, (name, replicas))
                    steps.append((replicas - current.replicas, f"scale {name}", scale))
                continue
            if current is not None and _up_to_date(current, key, replicas):
                continue
            config = render_config_map(policy, levels[level_name])
            # the ConfigMap first: the new pods mount it
            manifests = [
                with_digest(m, key)
                for m in (config, render_deployment(policy, levels[level_name], replicas))
                if m is not None
            ]
            grows = replicas - (current.replicas if current is not None else 0)
            steps.append((grows, f"apply {name}", _bind(self._apply_all, ctx, manifests)))
        going = [d for d in owned.deployments if d.name not in kept]
        files = bool(going) and _reads_config_files(policy, sized.ladder)
        for d in going:
            steps.append((-d.replicas, f"delete {d.name}", _bind(self._delete, ctx, (d.name, files))))
        for _, what, run in sorted(steps, key=lambda s: s[0]):  # stable sort: shrink before grow
            log.debug("%s: %s", ctx.ref, what)
            await run()
        return not steps

    async def _apply_shared(self, ctx: Reconcile, policy: KVOffloadPolicy, key: str) -> None:
        """Service and PodMonitor: written when their render input changed, or after the resync period.

        Without the Prometheus Operator the PodMonitor kind is not served (404). That is asked once per resync
        period for the whole fleet, not once per policy, and each policy is told once, by an Event: over 1,000
        policies the per-policy retries were three requests and a warning line each every 5 minutes."""
        now = self._monotonic()
        period = self.settings.children_resync_seconds
        for kind, render_child in CHILDREN:
            if kind == "Service" and policy.spec.workload_ref is not None:
                continue  # the team's own Service selects the derived pods by the labels they keep
            child = (ctx.ref.uid, kind)
            written = self._children.get(child)
            if written is not None and written[0] == key and now - written[1] < period:
                continue
            unserved = self._unserved.get(kind)
            if unserved is not None and now - unserved < period:
                await self._tell_unserved(ctx.ref, kind)
                self._children[child] = (key, now)
                continue
            manifest = with_digest(render_child(policy, self.settings))
            try:
                await self._apply(ctx, manifest)
            except ReconcileError as exc:
                cause = exc.__cause__
                if kind == "PodMonitor" and isinstance(cause, ApiRejectedError) and cause.status == 404:
                    self._unserved[kind] = now  # no Prometheus Operator: scraping is configured some other way
                    await self._tell_unserved(ctx.ref, kind)
                else:
                    raise
            else:
                if self._unserved.pop(kind, None) is not None:  # served again: a later loss is told again
                    self._told_unserved = {told for told in self._told_unserved if told[1] != kind}
            self._children[child] = (key, now)

    def _pod_monitor(self, policy: KVOffloadPolicy) -> PodMonitorRef:
        """The PodMonitor as rendered, with every label it carries, for the PodsNotScraped message."""
        metadata = render_pod_monitor(policy, self.settings.monitor_labels)["metadata"]
        return PodMonitorRef(metadata["name"], dict(metadata.get("labels") or {}))

    async def _tell_unserved(self, ref: PolicyRef, kind: str) -> None:
        """Say once per policy that its PodMonitor cannot be written, and go on."""
        if (ref.uid, kind) in self._told_unserved:
            return
        self._told_unserved.add((ref.uid, kind))
        await self.gateway.emit_event(
            ref,
            "Warning",
            "PodMonitorUnavailable",
            "the PodMonitor kind is not served (no Prometheus Operator?): scrape the engines another way",
        )

    async def _apply_all(self, ctx: Reconcile, manifests: list[dict[str, Any]]) -> None:
        for manifest in manifests:
            await self._apply(ctx, manifest)

    async def _apply(self, ctx: Reconcile, manifest: dict[str, Any]) -> None:
        stored = await self._api("apply", self.gateway.apply(manifest, ctx.ref), ctx.ref)
        if manifest["kind"] == "Deployment":
            self.workloads.wrote(ctx.ref, manifest["metadata"]["name"], resource_version(stored))

    async def _scale(self, ctx: Reconcile, target: tuple[str, int]) -> None:
        stored = await self._api("scale", self.gateway.scale_owned(target[0], target[1], ctx.ref), ctx.ref)
        self.workloads.wrote(ctx.ref, target[0], resource_version(stored))

    async def _delete(self, ctx: Reconcile, target: tuple[str, bool]) -> None:
        """Delete a level's Deployment, then, where the engine reads config files, its ConfigMap (same name)."""
        name, files = target
        await self._api("delete", self.gateway.delete_owned("Deployment", name, ctx.ref), ctx.ref)
        self.workloads.deleted(ctx.ref, name)
        if files:
            await self._api("delete", self.gateway.delete_owned("ConfigMap", name, ctx.ref), ctx.ref)


def with_digest(manifest: dict[str, Any], render_input: str | None = None) -> dict[str, Any]:
    """The manifest with ``kvoffload.io/applied-digest``, a hash of everything rendered, and with
    ``kvoffload.io/render-input`` when it is given."""
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    meta = manifest["metadata"]
    stamps = {ANNOTATION_APPLIED: digest} | ({ANNOTATION_RENDER_INPUT: render_input} if render_input else {})
    return {**manifest, "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}), **stamps}}}


def _reads_config_files(policy: KVOffloadPolicy, ladder: list[Level]) -> bool:
    """Whether the policy's engine reads config files on any level, so a Deployment that goes has a ConfigMap to
    take with it. A policy whose engine reads none asks nothing more of the API server than before."""
    engine = engine_for(policy.spec)
    return any(engine.config_files(policy, level) for level in ladder)


def _up_to_date(current: DeploymentState, render_input: str, replicas: int) -> bool:
    return current.annotations.get(ANNOTATION_RENDER_INPUT) == render_input and current.replicas == replicas


def _bind(fn: Callable[[Reconcile, Any], Awaitable[None]], ctx: Reconcile, arg: Any) -> Callable[[], Awaitable[None]]:
    return lambda: fn(ctx, arg)
