"""The reconcile cycle of one policy: gather observations, assess, decide, apply the plan.

``Controller.reconcile(body)`` is everything the kopf handlers do for a policy; they
only call it at the right times (``kvoffload.handlers``). One cycle:

1. Parse the policy (and read its ``spec.model.configMap`` through the gateway). A
   spec that cannot work gets ``rollout.invalid``: phase Invalid with every field path
   in the condition's message and a Warning Event; no Deployment is touched, and
   nothing is raised (bad input must not make kopf retry forever).
2. Observe: the config hash of every ladder level, the policy's own Deployments and
   pods (ready pods per config hash; OOMKilled, CrashLoopBackOff and restarts), from the
   operator's watch of them under ``kvoffload run`` (``controller/workloads.py``), else by a list.
3. Measure the analysis subject through the ``MeasurementHub`` (one batched query per
   metric for all policies) and ``assess()`` it, at most about once per
   ``analysis.interval`` (a reconcile woken early by an edit does not add a verdict).
   While the ladder is in its baseline the target asks for the workload figures too
   (``Target.workload``), which ``status.baseline`` records; with ``rollout.preflight``
   the cycle also prices restore against recompute for the preflight
   (``economics.breakeven`` on the shipped profile of the GPU class, the prompt from
   ``rollout.preflight.prompt_tokens_for``), which ``decide`` judges when the baseline ends.
4. ``rollout.decide`` the Plan, then apply it: one Deployment per ladder level
   (``<policy>-<level>``), whichever role status gives it; those that shrink first, then
   those that grow, so the fleet never holds more GPUs than the plan allows; a level's
   Deployment that the plan no longer names (or names at 0 replicas) deleted; Service and
   PodMonitor; the status (only when it changed); the plan's Events. Spec is never written.

Deployments of the older naming (``<policy>-stable`` and ``<policy>-canary``, told apart by
a role label on their pods) are adopted as the Deployment of the level their pods run while
that config is wanted: they are only ever scaled (``spec.replicas`` by merge patch), never
rendered again, so their pods do not restart; they go once their level drains.

A Deployment is written only when what it is rendered from or its replicas differ: each carries
a digest of its render input (``kvoffload.io/render-input``: the resolved policy's name,
namespace and spec, and the renderer's version), so a quiet cycle renders nothing and writes
nothing, a restarted operator's first one included. A policy met for the first time since the
operator started whose Deployments are all up to date (a restart over the same spec) has its
Service and PodMonitor resynced at a random time within ``children_resync_seconds`` rather than
at once, so a restart over a large fleet does not rewrite every policy's children in one wave.
Kubernetes API failures raise ``ReconcileError`` (after counting them, and an Event
where a person can act on it); the handler turns that into a retry.

The sized plan (``policy.sized``: every ladder level's host memory, capacity, deadlines and config hash) is
worked out once per render input, beside its dialect, and handed to ``decide`` (which writes the whole status from
it, ``status.hostMemory`` and ``status.selector`` included), to the Deployments rendered and to the metrics.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from kvoffload.analysis.assess import assess
from kvoffload.analysis.hub import MeasurementHub
from kvoffload.analysis.measurements import not_scraped
from kvoffload.analysis.payoff import payoff_since, payoff_sub_window
from kvoffload.analysis.queries import Target
from kvoffload.api.conventions import (
    HAND_BACK_FINALIZER,
    RELEASE,
)
from kvoffload.api.errors import PolicyError
from kvoffload.api.notifications import NotificationsSpec
from kvoffload.api.quantity import parse_duration
from kvoffload.api.status import Mode
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.controller.bodies import plain_body, unpacked_body
from kvoffload.controller.children import CHILDREN, ChildWriter
from kvoffload.controller.custommetrics import judged_with_custom
from kvoffload.controller.cycle import Reconcile
from kvoffload.controller.gateway import KubernetesGateway, PolicyRef
from kvoffload.controller.inputs import InputReader
from kvoffload.controller.measuring import Measuring, forecast_saving, restore_price
from kvoffload.controller.metrics import OperatorMetrics, PolicySeries
from kvoffload.controller.owned import fleet_measurements, observe_roles, pod_observation
from kvoffload.controller.settings import ControllerSettings, SecretLocation
from kvoffload.controller.statuswrite import RESTING_MODES, StatusWriter
from kvoffload.controller.takeover import give_back, hand_back, hand_over
from kvoffload.controller.workloads import Workloads
from kvoffload.notify.notifier import Notifier
from kvoffload.rollout.decide import decide, invalid
from kvoffload.rollout.observations import (
    FleetObservation,
    Observations,
    TokenCheck,
)
from kvoffload.rollout.observe import observing, would_apply
from kvoffload.rollout.plan import Plan
from kvoffload.rollout.preflight import prompt_tokens_for
from kvoffload.rollout.record import evidence_of
from kvoffload.rollout.release import is_released, released, taking_over_again
from kvoffload.rollout.warmup import analysis_subject

log = logging.getLogger(__name__)


Clock = Callable[[], datetime]


HAND_BACK_SECONDS = 3.0
"""How soon a release looks again at the Deployment it gives back."""


def utc_now() -> datetime:
    return datetime.now(UTC)


class Controller(InputReader, ChildWriter, StatusWriter, Measuring):
    """Reconciles KVOffloadPolicies. One instance serves every policy; calls for one policy must not overlap
    (the handlers hold a per-policy lock)."""

    def __init__(
        self,
        gateway: KubernetesGateway,
        hub: MeasurementHub,
        settings: ControllerSettings | None = None,
        clock: Clock = utc_now,
        metrics: OperatorMetrics | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        workloads: Workloads | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.gateway = gateway
        self.notifier = notifier
        """Where the transitions a status write records are told (``notify``); None: nowhere."""
        self.hub = hub
        self.settings = settings or ControllerSettings()
        self.clock = clock
        self.metrics = metrics or OperatorMetrics()
        if hub.query_counter is None:
            hub.query_counter = self.metrics.prometheus_queries
        self._monotonic = monotonic
        self.workloads = workloads or Workloads(gateway, self.metrics, monotonic)
        # (policy uid, kind) -> (render input, when written): Service and PodMonitor are not listed each cycle.
        self._children: dict[tuple[str, str], tuple[str, float]] = {}
        # child kind -> when the API server last answered that it does not serve it; (policy uid, kind) told so.
        self._unserved: dict[str, float] = {}
        self._told_unserved: set[tuple[str, str]] = set()
        # policy uid -> what its render input was judged to give, while the input stays the same.
        self._judged = {}
        self._rng = random.Random()
        # Token Secrets the API server refused to let us read: when, and what the condition says.
        self._forbidden: dict[SecretLocation, tuple[float, TokenCheck]] = {}
        # policy uid -> (the status last written, as JSON, and the resourceVersion of the body that cycle read),
        # until a body with another version arrives. Text, not the model: it is read back only when kopf hands a cycle
        # an older body, and 1,000 policies' status models held for that would outweigh the rest of the state.
        self._written: dict[str, tuple[str, str]] = {}

    # --- the cycle -----------------------------------------------------------------------

    async def reconcile(self, body: Mapping[str, Any] | bytes) -> Plan:
        """One cycle for the policy ``body`` (a kopf body, a plain object or a ``packed_body``, with metadata.uid).

        Returns the Plan it applied. Never raises for a bad spec (the Plan is Invalid); raises
        ReconcileError when the Kubernetes API failed (nothing is half-judged: the next cycle
        decides again from the status as stored).
        """
        ctx = self._begin(body)
        try:
            plan = await self._cycle(ctx)
        finally:
            self.metrics.cycle_seconds.observe(time.perf_counter() - ctx.started)
        series = PolicySeries.of(ctx.ref.namespace, ctx.ref.name, plan.status, ctx.spec, ctx.sized)
        self.metrics.publish_policy(ctx.ref.uid, series)
        return plan

    def _begin(self, body: Mapping[str, Any] | bytes) -> Reconcile:
        """The cycle's inputs. A packed body is unpacked into the cycle's own dict, which goes once parsed (see
        ``_cycle``); a dict is the caller's own snapshot; a kopf Body is a view that kopf replaces on every watch
        event, so the cycle copies it."""
        if isinstance(body, bytes):
            plain = unpacked_body(body)
        elif type(body) is dict:
            plain = body
        else:
            plain = plain_body(body)
        ref = PolicyRef.from_body(plain)
        return Reconcile(ref, plain, self._freshest_status(ref.uid, plain), self.clock())

    async def synced(self, namespace: str) -> None:
        """Wait until what a cycle reads of a policy in ``namespace`` is in: the first lists of its engines."""
        await self.workloads.synced(namespace)

    def forget(self, uid: str) -> None:
        """Drop what is remembered of a policy (it was deleted or is no longer watched)."""
        self._written.pop(uid, None)
        self._judged.pop(uid, None)
        self.workloads.forget(uid)
        for key in [k for k in self._children if k[0] == uid]:
            del self._children[key]
        self._told_unserved = {told for told in self._told_unserved if told[0] != uid}
        self.metrics.forget_policy(uid)
        self.hub.forget(uid)  # its Prometheus client, when no other policy asks the same source

    async def _cycle(self, ctx: Reconcile) -> Plan:
        meta = ctx.body.get("metadata") or {}
        generation = meta.get("generation")
        try:
            policy, judged = await self._parse(ctx)
        except PolicyError as exc:
            plan = invalid(ctx.status, [str(e) for e in exc.errors], generation, ctx.now)
            ctx.notifications = _chosen_sinks(ctx.body)
            await self._finish(ctx, plan)
            return plan

        # The models hold the rest of the body now: the dict goes while the cycle waits (200 cycles may).
        ctx.body = {"metadata": meta}
        spec, sized = policy.spec, judged.sized
        ctx.spec, ctx.sized, ctx.notifications = spec, sized, spec.notifications
        if spec.workload_ref is not None and RELEASE in (meta.get("annotations") or {}):
            plan = await self._release(ctx, spec.workload_ref.name, meta, generation)
            await self._finish(ctx, plan)
            return plan
        if is_released(ctx.status):
            assert ctx.status is not None
            ctx.status = taking_over_again(ctx.status)
        dialect = judged.dialect
        owned = await self._api("list", self.workloads.owned(ctx.ref), ctx.ref)
        stable_seen, canary_seen, retiring_seen = observe_roles(owned, ctx.ref.name, ctx.status)
        fleet = await self._observed_fleet(ctx, spec) if observing(spec) else None

        assessment = measurements = price = token = None
        if self._analysis_due(policy, ctx, generation):
            subject = analysis_subject(spec, sized.ladder, ctx.status, ctx.now)
            in_baseline = ctx.status is None or ctx.status.mode is Mode.BASELINE
            stable_role = ctx.status.stable if ctx.status is not None else None
            canary_role = ctx.status.canary if ctx.status is not None else None
            target = Target(
                namespace=ctx.ref.namespace,
                policy=ctx.ref.name,
                window=spec.analysis.window,
                dialect=dialect,
                extra_matchers=spec.prometheus.extra_matchers,
                stable_hash=stable_role.config_hash if stable_role is not None else None,
                canary_hash=canary_role.config_hash if canary_role is not None else None,
                workload=in_baseline,
                pods=tuple(p.name for p in fleet.pods) if fleet is not None else None,
                payoff_since=payoff_since(ctx.status, subject.level) if fleet is None else None,
                payoff_step=payoff_sub_window(spec.analysis),
            )
            resting = ctx.status is not None and ctx.status.mode in RESTING_MODES
            # At rest a request may wait for others to share its batch: a quarter of its interval at most, so a
            # resting policy's analyses stay about as often as it asked (the hub caps it at 2 s).
            patience = parse_duration(spec.analysis.interval) / 4 if resting else 0.0
            measurements, token, source = await self._measure(target, spec, ctx.ref, ctx.now, patience=patience)
            if fleet is not None:
                measurements = fleet_measurements(fleet, ctx.ref.namespace, measurements)
            baseline = ctx.status.baseline if ctx.status is not None else None
            assessment = assess(
                spec,
                subject.level,
                measurements,
                warmed_up=subject.warmed_up,
                baseline=baseline,
                stable_side=subject.stable_side,
                comparing=subject.comparing,
                observing=fleet is not None,
                forecast_saving_us_per_token=forecast_saving(spec) if subject.level.offloads else None,
            )
            if source is not None and (spec.analysis.metrics or spec.analysis.templates):
                # A template that cannot be read is a not-judged row (counted here), never the end of the cycle.
                unread = functools.partial(self.metrics.count_api_error, "read_analysis_template")
                assessment = await judged_with_custom(
                    gateway=self.gateway,
                    provider=self.hub.provider_for(source),
                    spec=spec,
                    target=target,
                    subject=subject,
                    assessment=assessment,
                    # Cut at the step start and at judgedFrom as decide() cuts the verdict's streak: a custom
                    # metric's failingSince never spans either.
                    previous=evidence_of(ctx.status, None, ctx.now) if ctx.status is not None else None,
                    now=ctx.now,
                    on_read_error=unread,
                )
            self.metrics.verdicts.labels(verdict=assessment.verdict.value).inc()
            if in_baseline and spec.rollout.preflight is not None:
                price = restore_price(spec, prompt_tokens_for(spec.rollout.preflight, measurements.stable))

        observations = Observations(
            generation=generation,
            sized=sized,
            annotations=dict(meta.get("annotations") or {}),
            stable=stable_seen,
            canary=canary_seen,
            retiring=retiring_seen,
            assessment=assessment,
            measurements=measurements,
            price=price,
            token=token,
            pod_monitor=self._pod_monitor(policy) if not_scraped(measurements) else None,
            fleet=fleet,
            workload=ctx.workload,
        )
        plan = decide(spec, ctx.status, observations, ctx.now)
        status, variants = plan.status, plan.variants
        assert variants is not None  # decide always plans Deployments
        if observing(spec):
            # Observe-only, the one gate: no Deployment, Service or PodMonitor is written, created or deleted;
            # Events say what would have been. The policy's own status and Events are all that is written.
            would = would_apply(ctx.ref.name, ctx.status, status.ladder, variants)
            plan = replace(plan, events=(*plan.events, *would))
        else:
            first_meeting = not any((ctx.ref.uid, kind) in self._children for kind, _ in CHILDREN)
            unchanged = await self._apply_deployments(ctx, policy, sized, variants, owned, judged.key)
            if first_meeting and unchanged and owned.deployments:
                self._defer_children(ctx.ref.uid, judged.key)
            await self._apply_shared(ctx, policy, judged.key)
            held = status.workload
            if held is not None and ctx.workload is not None and held.replicas < ctx.workload.replicas:
                await self._api("hand_over", hand_over(self.gateway, ctx.ref, meta, held), ctx.ref)
        await self._finish(ctx, plan)
        return plan

    async def _observed_fleet(self, ctx: Reconcile, spec: KVOffloadPolicySpec) -> FleetObservation:
        """An observe-only policy's fleet: the pods of ``spec.rollout.observe.selector`` in its namespace, read
        (one list a cycle) and never written."""
        assert spec.rollout.observe is not None  # the models require it with observeOnly
        selector = spec.rollout.observe.selector.label_selector()
        pods = await self._api("list_pods", self.gateway.list_pods(ctx.ref.namespace, selector), ctx.ref)
        return FleetObservation(
            selector,
            tuple(pod_observation(p, config_hash=None) for p in pods if not p.terminating),
        )

    async def _release(self, ctx: Reconcile, name: str, meta: Mapping[str, Any], generation: int | None) -> Plan:
        """``kvoffload.io/release``: the Deployment given back, Ready, before the operator's own engines go."""
        waiting = await self._api("give_back", give_back(self.gateway, ctx.ref, name), ctx.ref)
        if waiting is None:
            owned = await self._api("list", self.workloads.owned(ctx.ref), ctx.ref)
            for deployment in owned.deployments:
                # A taken-over Deployment's engine reads no config files (refused for an engine that does).
                await self._delete(ctx, (deployment.name, False))
            await self._api("finalizer", self.gateway.set_finalizer(ctx.ref, meta, HAND_BACK_FINALIZER, False), ctx.ref)
            message = (
                f"released by {RELEASE}: Deployment {name} serves at its own count and none of the operator's "
                f"engines run; remove {RELEASE} to take it over again (a new ladder from GPU-only)"
            )
        else:
            message = f"releasing by {RELEASE}: {waiting}; the operator's engines go once it is Ready"
        plan = released(ctx.status, message, generation, ctx.now)
        return replace(plan, requeue_after=HAND_BACK_SECONDS if waiting is not None else None)

    async def hand_back(self, body: Mapping[str, Any]) -> str | None:
        """One step of handing a deleted policy's Deployment back (``controller/takeover.py``); None once done."""
        ref = PolicyRef.from_body(body)
        waiting: str | None = await self._api("hand_back", hand_back(self.gateway, body), ref)
        return waiting


def _chosen_sinks(body: Mapping[str, Any]) -> NotificationsSpec | None:
    """``spec.notifications`` of a policy whose spec as a whole is invalid, if that part alone is valid."""
    spec = body.get("spec")
    raw = spec.get("notifications") if isinstance(spec, Mapping) else None
    if raw is None:
        return None
    try:
        return NotificationsSpec.model_validate(raw)
    except ValidationError:
        return None


__all__ = ["Controller", "utc_now"]
