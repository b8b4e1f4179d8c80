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

``status.hostMemory`` is the per-replica host memory of the running level that needs
the most: the stable level's, or the canary's while a canary needs more. That is the
figure the nodes must have room for during the step.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from pydantic import ValidationError

from kvoffload.analysis.assess import Measurements, assess, not_scraped
from kvoffload.analysis.dialects import Dialect, confirm_dialect, policy_dialect
from kvoffload.analysis.hub import MeasurementHub, PrometheusSource
from kvoffload.analysis.payoff import payoff_since, payoff_sub_window
from kvoffload.analysis.prometheus import Connection, Target
from kvoffload.api.conventions import (
    ANNOTATION_APPLIED,
    ANNOTATION_LEVEL_INDEX,
    ANNOTATION_RENDER_INPUT,
    HAND_BACK_FINALIZER,
    LABEL_CONFIG_HASH,
    LABEL_POLICY,
    LEGACY_DEPLOYMENT_ROLES,
    RELEASE,
    Reason,
)
from kvoffload.api.errors import FieldError, PolicyError
from kvoffload.api.notifications import NotificationsSpec
from kvoffload.api.quantity import parse_duration, to_quantity
from kvoffload.api.types import (
    HostMemoryStatus,
    KVOffloadPolicy,
    KVOffloadPolicySpec,
    KVOffloadPolicyStatus,
    Mode,
    VariantStatus,
    Verdict,
)
from kvoffload.controller.bodies import plain_body, unpacked_body
from kvoffload.controller.custommetrics import judged_with_custom
from kvoffload.controller.gateway import (
    ApiRejectedError,
    DeploymentState,
    GatewayError,
    KubernetesGateway,
    MissingObjectError,
    NotOwnedError,
    OwnedWorkloads,
    PodState,
    PolicyRef,
    resource_version,
)
from kvoffload.controller.metrics import OperatorMetrics, PolicySeries
from kvoffload.controller.takeover import give_back, hand_back, hand_over, observed, taker_problem
from kvoffload.controller.workloads import Workloads
from kvoffload.economics.breakeven import DEFAULT_PROMPT_TOKENS, breakeven
from kvoffload.economics.enginecost import saving_us_per_token
from kvoffload.economics.profile import Profile, ProfileError, shipped_profile
from kvoffload.notify.derive import notices
from kvoffload.notify.notifier import Notifier
from kvoffload.policy.catalog import ConfigError, architecture_from_configmap_data
from kvoffload.policy.ladder import Level, build_ladder
from kvoffload.policy.loading import parse_policy
from kvoffload.policy.render import (
    check_renderable,
    config_hash,
    deployment_name,
    render_deployment,
    render_input,
    render_pod_monitor,
    render_service,
)
from kvoffload.policy.sizing import (
    SizingError,
    host_memory,
    kv_bytes_per_token,
    tier_capacity_tokens,
    with_architecture,
)
from kvoffload.policy.tenancy import DEFAULT_TENANCY, Tenancy, check_tenancy, url_under
from kvoffload.policy.workload import adopt, workload_warnings
from kvoffload.rollout.decide import decide, invalid
from kvoffload.rollout.observations import (
    FleetObservation,
    Observations,
    PodMonitorRef,
    PodObservation,
    TokenCheck,
    VariantObservation,
    WorkloadObservation,
)
from kvoffload.rollout.observe import observing, would_apply
from kvoffload.rollout.plan import Plan, Variants
from kvoffload.rollout.preflight import RestorePrice, prompt_tokens_for
from kvoffload.rollout.record import evidence_of
from kvoffload.rollout.release import is_released, released, taking_over_again
from kvoffload.rollout.warmup import analysis_subject

log = logging.getLogger(__name__)


Clock = Callable[[], datetime]


HAND_BACK_SECONDS = 3.0
"""How soon a release looks again at the Deployment it gives back."""


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class ControllerSettings:
    """Operator-wide choices for the reconcile cycle."""

    prometheus_url: str | None = None
    """Query this Prometheus for every policy instead of spec.prometheus.url (local clusters, tests)."""
    children_resync_seconds: float = 300.0
    """Service and PodMonitor are rewritten at most this often when unchanged (heals drift, e.g. a deletion)."""
    retry_delay_seconds: float = 10.0
    """How soon a cycle that hit a Kubernetes API error is tried again."""
    analysis_due_fraction: float = 0.5
    """A cycle measures only when this share of analysis.interval has passed since the last verdict."""
    prometheus_token: SecretLocation | None = None
    """The operator's own Prometheus bearer token (a Secret in its namespace), for every policy that names
    no ``spec.prometheus.bearerTokenSecret``."""
    forbidden_retry_seconds: float = 300.0
    """A token Secret the API server refused to let the operator read is asked for again only this often."""
    prometheus_connection: Connection = field(default_factory=Connection)
    """The admin's extra headers (``X-Scope-OrgID``), basic auth and TLS settings (``--prometheus-header``, ...).
    Like the operator's token, they go only to ``prometheus_url`` or an allowed URL (see ``_token_may_go``)."""
    monitor_labels: Mapping[str, str] = field(default_factory=dict)
    """Labels every rendered PodMonitor carries (``--monitor-label``): what the cluster's Prometheus selects
    PodMonitors on, e.g. kube-prometheus-stack's ``release``."""
    tenancy: Tenancy = DEFAULT_TENANCY
    """What the cluster admin lets a policy ask for (``policy/tenancy.py``); its ``prometheus_url`` and
    ``operator_token`` are taken from the two fields above (see :attr:`judged_tenancy`)."""
    resting_refresh_seconds: float = 300.0
    """At rest (Stable, RolledBack, Held), a status whose only change is the latest analysis's readings (its
    time, figures and the messages that quote them) is written at most this often, as the kubelet writes an
    unchanged Node status (KEP-589): a resting fleet then costs the API server almost no writes. A change of
    verdict, counter, condition, replicas or decision is written at once, and so is everything during a climb."""

    @functools.cached_property
    def judged_tenancy(self) -> Tenancy:
        """:attr:`tenancy` with the operator's own Prometheus and token, as policies are judged against it."""
        # Headers and basic auth are credentials too (a tenant ID picks whose data is read): the token's rule holds.
        credentials = self.prometheus_token is not None or self.prometheus_connection.configured
        return replace(self.tenancy, prometheus_url=self.prometheus_url, operator_token=credentials)


@dataclass(frozen=True)
class SecretLocation:
    """One key of one Secret."""

    namespace: str
    name: str
    key: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class ReconcileError(Exception):
    """A Kubernetes API operation failed; the cycle should be retried after ``delay`` seconds."""

    def __init__(self, message: str, *, operation: str, delay: float) -> None:
        super().__init__(message)
        self.operation = operation
        self.delay = delay


@dataclass(frozen=True)
class _Judged:
    """What one policy's render input (``render_input``) was judged to give: its metric dialect and the config
    hash of each ladder level. Pure functions of the input, so they are worked out once per input."""

    key: str
    dialect: Dialect
    level_hashes: dict[int, str]


_CHILDREN: tuple[tuple[str, Callable[[KVOffloadPolicy, ControllerSettings], dict[str, Any]]], ...] = (
    ("Service", lambda policy, _: render_service(policy)),
    ("PodMonitor", lambda policy, settings: render_pod_monitor(policy, settings.monitor_labels)),
)
"""The policy's children besides its Deployments, by kind: one per policy, resynced by ``_apply_shared``."""


@dataclass
class _Reconcile:
    """One cycle's inputs."""

    ref: PolicyRef
    body: dict[str, Any]
    """The policy as read; once parsed, its metadata only."""
    status: KVOffloadPolicyStatus | None
    now: datetime
    started: float = field(default_factory=time.perf_counter)
    spec: KVOffloadPolicySpec | None = None
    """The parsed spec (model shape resolved), once it parsed."""
    ladder: list[Level] = field(default_factory=list)
    notifications: NotificationsSpec | None = None
    """The sinks the policy chose (read on its own from an invalid spec, so that Invalid is told too)."""
    workload: WorkloadObservation | None = None
    """spec.workloadRef's Deployment, as read this cycle."""


class Controller:
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
        self._judged: dict[str, _Judged] = {}
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
        series = PolicySeries.of(ctx.ref.namespace, ctx.ref.name, plan.status, ctx.spec, ctx.ladder)
        self.metrics.publish_policy(ctx.ref.uid, series)
        return plan

    def _begin(self, body: Mapping[str, Any] | bytes) -> _Reconcile:
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
        return _Reconcile(ref, plain, self._freshest_status(ref.uid, plain), self.clock())

    def _freshest_status(self, uid: str, body: Mapping[str, Any]) -> KVOffloadPolicyStatus | None:
        """The body's status, unless this operator has since written a newer one.

        kopf hands a cycle the body of the last watch event it has seen; on a real API server the event
        of the status this operator has just written can come after the next cycle has started, and that
        cycle would then judge from a status already replaced: a policy seen with no status at all starts
        its ladder again (seen on kube-apiserver v1.37.2: "NewLadder" twice, the second one "adopted the
        running gpu-only Deployment"). kopf's bodies only move forward, and a resourceVersion may be compared
        only for equality: a body with the version the writing cycle read is that stale copy; any other is
        the write or what came after it."""
        stored = _stored_status(body)
        written = self._written.get(uid)
        if written is not None:
            if resource_version(body) == written[1]:
                return KVOffloadPolicyStatus.model_validate_json(written[0])
            del self._written[uid]  # kopf has caught up with that write
        return stored

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

    async def _cycle(self, ctx: _Reconcile) -> Plan:
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
        spec = policy.spec
        ladder = build_ladder(spec)
        ctx.spec, ctx.ladder, ctx.notifications = spec, ladder, spec.notifications
        if spec.workload_ref is not None and RELEASE in (meta.get("annotations") or {}):
            plan = await self._release(ctx, spec.workload_ref.name, meta, generation)
            await self._finish(ctx, plan)
            return plan
        if is_released(ctx.status):
            assert ctx.status is not None
            ctx.status = taking_over_again(ctx.status)
        level_hashes, dialect = judged.level_hashes, judged.dialect
        owned = await self._api("list", self.workloads.owned(ctx.ref), ctx.ref)
        stable_seen, canary_seen, retiring_seen = _observe_roles(owned, ctx.ref.name, ctx.status)
        fleet = await self._observed_fleet(ctx, spec) if observing(spec) else None

        assessment = measurements = price = token = None
        if self._analysis_due(policy, ctx, generation):
            subject = analysis_subject(spec, ctx.status, ctx.now)
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
            level_hashes=level_hashes,
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
        decided = decide(spec, ctx.status, observations, ctx.now)
        variants = decided.variants
        assert variants is not None  # decide always plans Deployments
        status = decided.status.model_copy(
            update={
                "host_memory": _host_memory(policy, ladder, variants),
                "selector": f"{LABEL_POLICY}={ctx.ref.name}",  # every engine of the policy, whatever its level
            }
        )
        plan = Plan(status=status, variants=variants, events=decided.events, requeue_after=decided.requeue_after)
        if observing(spec):
            # Observe-only, the one gate: no Deployment, Service or PodMonitor is written, created or deleted;
            # Events say what would have been. The policy's own status and Events are all that is written.
            would = would_apply(ctx.ref.name, ctx.status, status.ladder, variants)
            plan = replace(plan, events=(*plan.events, *would))
        else:
            first_meeting = not any((ctx.ref.uid, kind) in self._children for kind, _ in _CHILDREN)
            unchanged = await self._apply_deployments(ctx, policy, ladder, variants, owned, judged.key)
            if first_meeting and unchanged and owned.deployments:
                self._defer_children(ctx.ref.uid, judged.key)
            await self._apply_shared(ctx, policy, judged.key)
            held = status.workload
            if held is not None and ctx.workload is not None and held.replicas < ctx.workload.replicas:
                await self._api("hand_over", hand_over(self.gateway, ctx.ref, meta, held), ctx.ref)
        await self._finish(ctx, plan)
        return plan

    async def _observed_fleet(self, ctx: _Reconcile, spec: KVOffloadPolicySpec) -> FleetObservation:
        """An observe-only policy's fleet: the pods of ``spec.rollout.observe.selector`` in its namespace, read
        (one list a cycle) and never written."""
        assert spec.rollout.observe is not None  # the models require it with observeOnly
        selector = spec.rollout.observe.selector.label_selector()
        pods = await self._api("list_pods", self.gateway.list_pods(ctx.ref.namespace, selector), ctx.ref)
        return FleetObservation(
            selector,
            tuple(_pod_observation(p, config_hash=None) for p in pods if not p.terminating),
        )

    def _defer_children(self, uid: str, key: str) -> None:
        """Resync this policy's Service and PodMonitor at a random time within the resync period, not now."""
        period = self.settings.children_resync_seconds
        written = self._monotonic() - period + self._rng.uniform(0.0, period)
        for kind, _ in _CHILDREN:
            self._children[(uid, kind)] = (key, written)

    async def _parse(self, ctx: _Reconcile) -> tuple[KVOffloadPolicy, _Judged]:
        """The policy, with a ConfigMap architecture resolved, and what its input gives (judged once per input:
        ``judge_resolved`` and the level config hashes); PolicyError names fields."""
        obj = {k: v for k, v in ctx.body.items() if k != "status"}  # status is ours, not input
        with judging(ctx.ref):
            policy = parse_policy(obj, f"{ctx.ref.namespace}/{ctx.ref.name}", self.settings.judged_tenancy)
        spec = policy.spec
        ref = spec.model.config_map
        if ref is not None and spec.model.architecture is None:
            path = "spec.model.configMap"
            try:
                text = await self._api(
                    "read_configmap", self.gateway.read_configmap(ctx.ref.namespace, ref.name, ref.key), ctx.ref
                )
                arch = architecture_from_configmap_data({ref.key: text}, ref.key)
            except MissingObjectError as exc:
                raise PolicyError([FieldError(path, str(exc))]) from None
            except ConfigError as exc:
                raise PolicyError([FieldError(path, f"ConfigMap {ref.name!r} key {ref.key!r}: {exc}")]) from None
            policy = policy.model_copy(update={"spec": with_architecture(spec, arch)})
        if spec.workload_ref is not None:
            policy = await self._adopted(ctx, policy)
        key = render_input(policy)
        known = self._judged.get(ctx.ref.uid)
        if known is None or known.key != key:
            with judging(ctx.ref):
                known = _Judged(key, *judge_resolved(policy))
            self._judged[ctx.ref.uid] = known
            for warning in workload_warnings(policy):  # once per input: what the derived levels change
                await self.gateway.emit_event(ctx.ref, "Warning", "WorkloadAdjusted", warning)
        return policy, known

    async def _adopted(self, ctx: _Reconcile, policy: KVOffloadPolicy) -> KVOffloadPolicy:
        """The policy with the Deployment its spec.workloadRef names read in (``ctx.workload`` too)."""
        ref = policy.spec.workload_ref
        assert ref is not None
        path = "spec.workloadRef.name"
        try:
            deployment = await self._api(
                "read_deployment", self.gateway.read_deployment(ctx.ref.namespace, ref.name), ctx.ref
            )
        except MissingObjectError as exc:
            raise PolicyError([FieldError(path, str(exc))]) from None
        if (problem := taker_problem(deployment, ctx.ref.name)) is not None:
            raise PolicyError([FieldError(path, problem)])
        with judging(ctx.ref):
            policy = adopt(policy, deployment)
            # The admin's allow-lists judge the referenced pod as they judge a rendered one.
            if errors := check_tenancy(policy, self.settings.judged_tenancy):
                raise PolicyError(errors)
        ctx.workload = observed(policy, deployment)
        return policy

    async def _release(self, ctx: _Reconcile, name: str, meta: Mapping[str, Any], generation: int | None) -> Plan:
        """``kvoffload.io/release``: the Deployment given back, Ready, before the operator's own engines go."""
        waiting = await self._api("give_back", give_back(self.gateway, ctx.ref, name), ctx.ref)
        if waiting is None:
            owned = await self._api("list", self.workloads.owned(ctx.ref), ctx.ref)
            for deployment in owned.deployments:
                await self._delete(ctx, deployment.name)
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

    def _analysis_due(self, policy: KVOffloadPolicy, ctx: _Reconcile, generation: int | None) -> bool:
        status = ctx.status
        if status is None or status.stable is None or status.stage is None:
            return False  # a new ladder starts; there is nothing to judge yet
        if status.observed_generation != generation:
            return False  # a new spec starts a new ladder
        last = status.last_analysis
        if last is None:
            return True
        interval = parse_duration(policy.spec.analysis.interval)
        if (ctx.now - last.time).total_seconds() >= self.settings.analysis_due_fraction * interval:
            return True
        # The cycle a Fail run's sustainedFor brings (the plan's requeue_after) judges afresh, however soon after the
        # last verdict: a rollback stands on a verdict of the moment the breach fell due, not on an older one.
        since = last.failing_since
        if last.verdict is not Verdict.FAIL or since is None:
            return False
        due = since + timedelta(seconds=parse_duration(policy.spec.analysis.sustained_for))
        return last.time < due <= ctx.now

    # --- applying --------------------------------------------------------------------------

    async def _apply_deployments(
        self,
        ctx: _Reconcile,
        policy: KVOffloadPolicy,
        ladder: list[Level],
        variants: Variants,
        owned: OwnedWorkloads,
        key: str,
    ) -> bool:
        """Write the level Deployments that differ from the plan, the shrinking ones first; True if none did.

        A role's Deployment is rendered (server-side apply); a draining level's and an adopted legacy one's
        are only scaled, so their pods never restart; one the plan does not name, or names at 0, goes.
        A Deployment whose render input and replicas are the plan's is not rendered at all."""
        steps: list[tuple[int, str, Callable[[], Awaitable[object]]]] = []
        kept: set[str] = set()
        wanted: list[tuple[str, str, int, bool]] = [
            (ladder[vp.level].name, vp.config_hash, vp.replicas, True)
            for vp in (variants.stable, variants.canary)
            if vp is not None
        ]
        wanted += [(r.level_name, r.config_hash, r.replicas, False) for r in variants.retiring]
        levels = {lv.name: lv for lv in ladder}
        for level_name, config_hash_, replicas, rendered in wanted:
            current = _level_deployment(owned, ctx.ref.name, level_name, config_hash_)
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
            manifest = with_digest(render_deployment(policy, levels[level_name], replicas), key)
            grows = replicas - (current.replicas if current is not None else 0)
            steps.append((grows, f"apply {name}", _bind(self._apply, ctx, manifest)))
        for d in owned.deployments:
            if d.name not in kept:
                steps.append((-d.replicas, f"delete {d.name}", _bind(self._delete, ctx, d.name)))
        for _, what, run in sorted(steps, key=lambda s: s[0]):  # stable sort: shrink before grow
            log.debug("%s: %s", ctx.ref, what)
            await run()
        return not steps

    async def _apply_shared(self, ctx: _Reconcile, policy: KVOffloadPolicy, key: str) -> None:
        """Service and PodMonitor: written when their render input changed, or after the resync period.

        Without the Prometheus Operator the PodMonitor kind is not served (404). That is asked once per resync
        period for the whole fleet, not once per policy, and each policy is told once, by an Event: over 1,000
        policies the per-policy retries were three requests and a warning line each every 5 minutes."""
        now = self._monotonic()
        period = self.settings.children_resync_seconds
        for kind, render_child in _CHILDREN:
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

    async def _apply(self, ctx: _Reconcile, manifest: dict[str, Any]) -> None:
        stored = await self._api("apply", self.gateway.apply(manifest, ctx.ref), ctx.ref)
        if manifest["kind"] == "Deployment":
            self.workloads.wrote(ctx.ref, manifest["metadata"]["name"], resource_version(stored))

    async def _scale(self, ctx: _Reconcile, target: tuple[str, int]) -> None:
        stored = await self._api("scale", self.gateway.scale_owned(target[0], target[1], ctx.ref), ctx.ref)
        self.workloads.wrote(ctx.ref, target[0], resource_version(stored))

    async def _delete(self, ctx: _Reconcile, name: str) -> None:
        await self._api("delete", self.gateway.delete_owned("Deployment", name, ctx.ref), ctx.ref)
        self.workloads.deleted(ctx.ref, name)

    async def _finish(self, ctx: _Reconcile, plan: Plan) -> None:
        """Write the status if it changed, then the Events; count the new decisions."""
        new = _dump(plan.status)
        old = _dump(ctx.status) if ctx.status is not None else None
        if new != old and (old is None or self._worth_writing(ctx.status, plan.status, old, new, ctx.now)):
            body = plan.status.model_dump(mode="json", by_alias=True)  # None removes a key (merge patch)
            await self._api("patch_status", self.gateway.patch_status(ctx.ref, body), ctx.ref)
            read = resource_version(ctx.body)
            if read is not None:
                self._written[ctx.ref.uid] = (plan.status.model_dump_json(by_alias=True), read)
            self._notify(ctx, plan.status)
        before = ctx.status.history if ctx.status is not None else []
        self.metrics.count_decisions(e.decision for e in plan.status.history if e not in before)
        for event in plan.events:
            await self.gateway.emit_event(ctx.ref, event.type, event.reason, event.message)

    def _notify(self, ctx: _Reconcile, written: KVOffloadPolicyStatus) -> None:
        """Queue what the status just written decided for the policy's sinks: only once the write is stored, so a
        failed write tells nothing (the next cycle decides again), and never in the cycle's way."""
        if self.notifier is None or ctx.notifications is None:
            return
        try:
            found = notices(ctx.ref.namespace, ctx.ref.name, ctx.status, written, ctx.now)
            self.notifier.send(ctx.notifications, found)
        except Exception:  # a bug in telling must never cost a decision
            log.exception("%s: notifications could not be queued", ctx.ref)

    def _worth_writing(
        self,
        old: KVOffloadPolicyStatus | None,
        new: KVOffloadPolicyStatus,
        old_doc: Mapping[str, Any],
        new_doc: Mapping[str, Any],
        now: datetime,
    ) -> bool:
        """Whether a changed status (``new``, dumped as ``new_doc``) is written now: always, unless both are at rest
        in the same mode, only the readings changed, and the stored analysis is younger than
        ``resting_refresh_seconds``."""
        if old is None or new.mode is not old.mode or new.mode not in RESTING_MODES:
            return True
        if old.last_analysis is None or _without_readings(new_doc) != _without_readings(old_doc):
            return True
        return (now - old.last_analysis.time).total_seconds() >= self.settings.resting_refresh_seconds

    async def _measure(
        self, target: Target, spec: KVOffloadPolicySpec, ref: PolicyRef, now: datetime, *, patience: float
    ) -> tuple[Measurements, TokenCheck | None, PrometheusSource | None]:
        """This cycle's measurements, in the dialect confirmed against the series Prometheus holds, and how
        reading the bearer token went; a token that cannot be read makes them inconclusive, with the reason.
        ``patience``: how long the request may wait for others to share its batch (``MeasurementHub.measure``).
        Also the Prometheus source asked (None when the token could not be read), for the custom metrics."""
        token, check = await self._bearer_token(spec, ref)
        if check is not None and check.problem is not None:
            return Measurements(canary=None, stable=None, error=check.message), check, None
        connection = self.settings.prometheus_connection if self._token_may_go(spec) else None
        source = PrometheusSource(self.settings.prometheus_url or spec.prometheus.url, token, connection)
        self.hub.assign(ref.uid, source)  # the source it asked before, now asked by no one, is closed
        present = await self.hub.present_names(source, now.timestamp())
        target = replace(target, dialect=confirm_dialect(target.dialect, present))
        return await self.hub.measure(target, source, patience=patience), check, source

    async def _bearer_token(self, spec: KVOffloadPolicySpec, ref: PolicyRef) -> tuple[str | None, TokenCheck | None]:
        """The policy's own token Secret, else the operator's; (None, None) when neither is set.

        A Secret the operator may not read (403) is a condition on the policy, not an API error to retry:
        only RBAC can change it, so it is logged once and asked for again every ``forbidden_retry_seconds``.
        """
        own = spec.prometheus.bearer_token_secret
        if own is not None:
            where, field_path = SecretLocation(ref.namespace, own.name, own.key), "spec.prometheus.bearerTokenSecret"
        elif self.settings.prometheus_token is not None and self._token_may_go(spec):
            where, field_path = self.settings.prometheus_token, "the operator's --prometheus-token-secret"
        else:
            return None, None
        refused = self._forbidden.get(where)
        if refused is not None and self._monotonic() - refused[0] < self.settings.forbidden_retry_seconds:
            return None, refused[1]

        async def read() -> str | TokenCheck:
            try:
                return await self.gateway.read_secret(where.namespace, where.name, where.key)
            except ApiRejectedError as exc:
                if exc.status != 403:
                    raise
                self.metrics.count_api_error("read_secret", exc)
                hint = (
                    f"grant it get on secrets in namespace {where.namespace} (chart value prometheusAuth.policySecrets)"
                    if own is not None
                    else "check the operator's Role in its own namespace"
                )
                return TokenCheck(
                    Reason.SECRET_FORBIDDEN,
                    f"{field_path}: the operator's service account may not get Secret {where}: {hint}",
                )

        try:
            got = await self._api("read_secret", read(), ref)
        except MissingObjectError as exc:
            return None, TokenCheck(Reason.SECRET_NOT_FOUND, f"{field_path}: {exc}")
        if isinstance(got, TokenCheck):
            if where not in self._forbidden:
                log.warning(
                    "%s: %s (403 Forbidden; asked again every %.0fs)",
                    ref,
                    got.message,
                    self.settings.forbidden_retry_seconds,
                )
            self._forbidden[where] = (self._monotonic(), got)
            return None, got
        if self._forbidden.pop(where, None) is not None:
            log.info("%s: Secret %s can be read again", ref, where)
        return str(got), TokenCheck(None)

    def _token_may_go(self, spec: KVOffloadPolicySpec) -> bool:
        """Whether the operator's own token may go to this policy's Prometheus: its fixed one, or a URL the admin
        allowed. ``parse_policy`` refuses the rest as Invalid already; this keeps the token home regardless."""
        if self.settings.prometheus_url is not None:
            return True
        return any(url_under(spec.prometheus.url, p) for p in self.settings.tenancy.prometheus_url_prefixes)

    async def _api(self, operation: str, call: Awaitable[Any], ref: PolicyRef) -> Any:
        """Await a gateway call; a failure is counted, told in an Event when a person can act, and re-raised typed."""
        try:
            return await call
        except MissingObjectError as exc:
            self.metrics.count_api_error(operation, exc)
            raise
        except GatewayError as exc:
            self.metrics.count_api_error(operation, exc)
            if isinstance(exc, NotOwnedError | ApiRejectedError) and not _is_404(exc):
                await self.gateway.emit_event(ref, "Warning", exc.reason, str(exc))
            log.warning("%s: %s failed: %s", ref, operation, exc)
            raise ReconcileError(str(exc), operation=operation, delay=self.settings.retry_delay_seconds) from exc


@contextlib.contextmanager
def judging(who: object) -> Iterator[None]:
    """Judge a policy inside: a failure of ours (a bug, not a bad field) becomes a PolicyError naming
    ``(object)``, logged with ``who``, so the policy goes Invalid once and the webhook refuses it: never a
    crash loop, never an answer of 500."""
    try:
        yield
    except PolicyError:
        raise
    except Exception as exc:
        log.exception("%s: the policy could not be judged", who)
        raise PolicyError([FieldError("(object)", f"the operator could not judge this policy: {exc!r}")]) from None


def judge_resolved(policy: KVOffloadPolicy) -> tuple[Dialect, dict[int, str]]:
    """What is left to judge of a parsed policy (``parse_policy``: the models and ``check_policy``)
    once its ``model.configMap`` is read: that it renders, its vLLM version, and that every level
    can be sized. Returns the metric dialect and the config hash of each ladder level (by index);
    raises PolicyError naming the fields. No I/O: the admission webhook runs it too."""
    problems = check_renderable(policy)
    if problems:
        raise PolicyError(problems)
    try:
        dialect = policy_dialect(policy.spec)
    except ValueError as exc:
        raise PolicyError([FieldError("spec.model.vllmVersion", str(exc))]) from None
    hashes: dict[int, str] = {}
    try:
        for level in build_ladder(policy.spec):
            hashes[level.index] = config_hash(policy, level)
            host_memory(policy.spec, level)
            tier_capacity_tokens(policy.spec, level)
    except SizingError as exc:
        raise PolicyError([FieldError(exc.path, str(exc).removeprefix(f"{exc.path}: "))]) from None
    return dialect, hashes


# --- observations --------------------------------------------------------------------------


def fleet_measurements(fleet: FleetObservation, namespace: str, measurements: Measurements) -> Measurements:
    """An observed fleet's measurements, or the reason there are none: no pod matches, or Prometheus holds no
    series of its pods (the team's scrape must label them ``namespace`` and ``pod``). Either is Inconclusive."""
    if measurements.error is not None:
        return measurements
    if not fleet.pods:
        error = f"observe-only: no pod in namespace {namespace} matches spec.rollout.observe.selector {fleet.selector}"
    elif not_scraped(measurements):
        error = (
            f"observe-only: Prometheus holds no vLLM series of the {len(fleet.pods)} pod(s) {fleet.selector} in "
            f"namespace {namespace}: is the fleet scraped, its series labelled namespace and pod?"
        )
    else:
        return measurements
    return Measurements(canary=None, stable=None, error=error)


def _deployment(owned: OwnedWorkloads, name: str) -> DeploymentState | None:
    return next((d for d in owned.deployments if d.name == name), None)


def _level_deployment(
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


def _observe_roles(
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
        found = _level_deployment(owned, policy, status.ladder[variant.level], variant.config_hash)
        return _observe(owned, found) if found is not None else VariantObservation()

    retiring = []
    for r in status.retiring:
        found = _level_deployment(owned, policy, r.level_name, r.config_hash)
        retiring.append(_observe(owned, found) if found is not None else VariantObservation())
    return role(status.stable), role(status.canary), tuple(retiring)


def _pod_observation(p: PodState, config_hash: str | None) -> PodObservation:
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
        _pod_observation(p, config_hash=p.config_hash)
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


# --- helpers ---------------------------------------------------------------------------------


@lru_cache(maxsize=32)
def _profile(gpu_class: str) -> Profile:
    return shipped_profile(gpu_class)


def restore_price(spec: KVOffloadPolicySpec, prompt_tokens: int) -> RestorePrice:
    """The preflight's price: recompute against restore of a ``prompt_tokens`` prompt, by ``economics.breakeven``
    on the shipped profile of the policy's GPU class and the KV bytes per token ``kvoffload plan`` prices with.

    A class without a profile, or a model without a prefill curve in it, gives the reason instead: the
    preflight then leaves that rule unjudged."""
    try:
        found = breakeven(_profile(spec.gpu.class_), spec.model.name, kv_bytes_per_token(spec), prompt_tokens)
    except (ProfileError, SizingError) as exc:
        return RestorePrice(prompt_tokens, error=str(exc))
    return RestorePrice(
        prompt_tokens,
        recompute_ms=found.recompute_ms,
        restore_ms=found.restore_ms,
        profile=found.profile,
        profile_kind=found.profile_kind,
    )


def forecast_saving(spec: KVOffloadPolicySpec) -> float | None:
    """The forecast saving of a restored token (µs) on the class's engine profile, for the live payoff's row: at
    the preflight's prompt when it names one, else the seed's 1,480 tokens."""
    preflight = spec.rollout.preflight
    tokens = preflight.prompt_tokens if preflight is not None and preflight.prompt_tokens else DEFAULT_PROMPT_TOKENS
    return saving_us_per_token(spec.gpu.class_, spec, tokens)


def with_digest(manifest: dict[str, Any], render_input: str | None = None) -> dict[str, Any]:
    """The manifest with ``kvoffload.io/applied-digest``, a hash of everything rendered, and with
    ``kvoffload.io/render-input`` when it is given."""
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    meta = manifest["metadata"]
    stamps = {ANNOTATION_APPLIED: digest} | ({ANNOTATION_RENDER_INPUT: render_input} if render_input else {})
    return {**manifest, "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}), **stamps}}}


def _up_to_date(current: DeploymentState, render_input: str, replicas: int) -> bool:
    return current.annotations.get(ANNOTATION_RENDER_INPUT) == render_input and current.replicas == replicas


def _host_memory(policy: KVOffloadPolicy, ladder: list[Level], variants: Variants) -> HostMemoryStatus:
    """Per replica, for the running level that needs the most (the canary's while it needs more)."""
    levels = [ladder[variants.stable.level]]
    if variants.canary is not None:
        levels.append(ladder[variants.canary.level])
    biggest = max((host_memory(policy.spec, level) for level in levels), key=lambda m: m.request)
    return HostMemoryStatus(
        pinned=to_quantity(biggest.pinned),
        shm=to_quantity(biggest.shm),
        request=to_quantity(biggest.request),
        limit=to_quantity(biggest.limit),
    )


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


def _stored_status(body: Mapping[str, Any]) -> KVOffloadPolicyStatus | None:
    raw = body.get("status")
    if not isinstance(raw, Mapping) or not raw:
        return None
    try:
        return KVOffloadPolicyStatus.model_validate(raw)
    except ValidationError as exc:  # someone wrote garbage: start over rather than crash every cycle
        log.warning("Ignoring an unreadable status: %s", exc)
        return None


def _dump(status: KVOffloadPolicyStatus) -> dict[str, Any]:
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


RESTING_MODES = frozenset({Mode.STABLE, Mode.ROLLED_BACK, Mode.HELD})
"""Modes that nothing moves out of on its own schedule: their status is refreshed, not rewritten every cycle."""


def _without_readings(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A dumped status without what every analysis reads afresh: its time and figures, the printer columns and
    messages that quote them. What is left (verdicts, counters, conditions' states, replicas, history) is what a
    write must never wait for."""
    out = {k: v for k, v in doc.items() if k not in ("message", "ttftP99", "externalShare")}
    out["conditions"] = [{k: v for k, v in c.items() if k != "message"} for c in doc.get("conditions", ())]
    analysis = doc.get("lastAnalysis")
    if analysis is not None:
        metrics = [  # threshold too: some are relative to the stable's reading
            {k: v for k, v in m.items() if k not in ("stable", "canary", "threshold", "message")}
            for m in analysis.get("metrics", ())
        ]
        kept = {k: v for k, v in analysis.items() if k not in ("time", "message")}
        out["lastAnalysis"] = {**kept, "metrics": metrics}
    return out


def _is_404(exc: GatewayError) -> bool:
    return isinstance(exc, ApiRejectedError) and exc.status == 404


def _bind(fn: Callable[[_Reconcile, Any], Awaitable[None]], ctx: _Reconcile, arg: Any) -> Callable[[], Awaitable[None]]:
    return lambda: fn(ctx, arg)


__all__ = [
    "ANNOTATION_APPLIED",
    "Controller",
    "ControllerSettings",
    "ReconcileError",
    "judge_resolved",
    "judging",
    "utc_now",
    "with_digest",
]
