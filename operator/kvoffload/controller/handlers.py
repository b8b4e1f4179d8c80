"""The kopf wiring: when to reconcile a policy. The cycle itself is ``Controller.reconcile``.

- A loop per policy: reconcile (at once when it starts: a new policy or an operator restart),
  then wait until ``spec.analysis.interval`` after that cycle began, or less when the plan says a
  decision falls due sooner (a step ends, a Fail run reaches ``sustainedFor``), or until the
  policy's input changes. It survives every error: it logs, counts and backs off,
  so one bad policy never stops the operator. It ends when the policy is deleted; Kubernetes'
  garbage collector removes the children through their ownerReferences.
- An ``on.event`` handler keeps each policy's newest body, packed (``controller/bodies.py``), and
  wakes its loop when the input changes: a new generation (an edited spec) or new annotations
  (manual control). kopf's change handlers (``on.create``/``update``/``resume``) are not used:
  for them kopf deep-copies every policy, status included, on every watch event, and writes its
  progress into the policy; at 1,000 policies that was a tenth of a restart's CPU. So the
  operator keeps no diff base (``_NoDiffBase``).
- The loops are the runtime's own tasks, started by a policy's first event: a kopf daemon would
  make kopf keep every policy's body decoded for it (some 45 kB a policy) and a finalizer on it.
  With kopf peering on, kopf daemons run them instead, since kopf pauses only its own daemons
  when a peer of higher priority appears.
- At most ``LoopSettings.max_concurrent`` cycles are in flight at once: each holds its policy's
  body, spec, status and children while it waits, and a start over 1,000 policies put all of
  them in flight together (most of the operator's peak memory).
- A loop's first cycle waits until no new policy has arrived for ``ARRIVALS_QUIET`` and until the
  engines of its namespace are listed (``Controller.synced``), as controller-runtime's workers wait
  for their caches: after a start, cycles begun while kopf was still handing over the listed
  policies, or while they waited for those lists, only slowed the rest.
- A per-policy ``asyncio.Lock`` keeps reconciles of one policy from overlapping.
- ``run_operator`` watches the engines' Deployments and pods beside kopf (``controller/workloads.py``),
  so a cycle reads them from memory instead of listing them, and every 30 s makes Python's full
  collection and hands freed heap back to the OS (``controller/heap.py``).
- Kubernetes API failures retry after the delay they ask for; a bad spec never raises (the
  policy goes Invalid).

``register(registry, controller)`` adds the handlers to a registry; ``run_operator(...)``
runs kopf with them in-process (``kvoffload run``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf

from kvoffload.analysis.hub import FULL_BATCH
from kvoffload.api.conventions import API_GROUP, API_VERSION, FINALIZER, HAND_BACK_FINALIZER, PEERING_NAME, PLURAL
from kvoffload.api.quantity import parse_duration
from kvoffload.controller.bodies import packed_body, plain_body
from kvoffload.controller.cycle import ReconcileError
from kvoffload.controller.gateway import PolicyRef
from kvoffload.controller.health import Health, Role
from kvoffload.controller.heap import full_collections_on_schedule, tend_heap
from kvoffload.controller.leadership import Leadership, LeaseSettings
from kvoffload.controller.metrics import OperatorMetrics
from kvoffload.controller.reconcile import HAND_BACK_SECONDS, Controller
from kvoffload.controller.settings import ControllerSettings
from kvoffload.controller.workloads import Workloads
from kvoffload.notify.config import NotificationsConfig
from kvoffload.notify.notifier import Notifier
from kvoffload.policy.tenancy import Tenancy
from kvoffload.rollout.plan import Plan

log = logging.getLogger(__name__)

RESOURCE = (API_GROUP, API_VERSION, PLURAL)
NOTICED = "noticed"
"""The id of the event handler that wakes a policy's daemon."""
DEFAULT_INTERVAL = 30.0
"""Seconds between cycles when spec.analysis.interval cannot be read (an invalid policy)."""
MIN_GAP = 0.5
"""A daemon that wakes within this many seconds of the last reconcile only re-reads its timing."""
ARRIVALS_QUIET = 0.25
"""A new loop's first cycle waits until no new policy has been seen for this many seconds (``FIRST_CYCLE_WAIT`` at
most): after a start kopf hands over the listed policies one event at a time, on the same event loop as the cycles,
and cycles begun among them slowed the rest of the handover by seconds (bench/operator). More than kopf's batch
window (0.1 s), for which it holds each object's first event back, and than a pause of the event loop while a list
of the engines is decoded."""
FIRST_CYCLE_WAIT = 5.0
"""The longest a new loop's first cycle waits for policies to stop arriving."""
REQUEUE_SLACK = 0.01
"""Seconds added to a plan's ``requeue_after``. It counts from the cycle's ``now``, which the cycle reads just after
the loop stamps the cycle's start; woken that much early, a cycle would find what it came for (a step's end, a
breach sustained) not yet due."""

ControllerFactory = Callable[[], Controller | Awaitable[Controller]]


@dataclass(frozen=True)
class LoopSettings:
    """How the per-policy loop paces itself."""

    min_interval: float = 0.1
    max_interval: float = 3600.0
    error_backoff: float = 1.0
    """First wait after an unexpected error; doubles per error in a row."""
    max_backoff: float = 300.0
    daemon_cancellation_timeout: float = 5.0
    max_concurrent: int = 2 * FULL_BATCH
    """Cycles in flight at once, fleet-wide, as controller-runtime's MaxConcurrentReconciles. A cycle holds its
    policy's body, spec, status and children while it waits for Prometheus and the API server; a start over 1,000
    policies put all of them in flight at once. Two full batches of the measurement hub: one at Prometheus while the
    next gathers."""


@dataclass
class _Slot:
    """One policy's runtime: its loop, the newest body seen, its lock, its wake-up and when its last cycle wants the
    next (not its whole Plan: a status held per policy for this would be most of what the operator keeps of a large
    fleet)."""

    body: bytes = b""
    """The newest body seen, as ``packed_body``: kept decoded, a policy is some 45 kB of Python objects."""
    namespace: str = ""
    interval: float = DEFAULT_INTERVAL
    """``spec.analysis.interval`` of that body."""
    loop: asyncio.Task[None] | None = None
    """The loop, where the runtime owns it (``PolicyRuntime.owns_loops``)."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    last_start: float | None = None
    """When the last cycle began (``time.monotonic``): the next analysis is due ``interval`` after it."""
    last_done: float | None = None
    requeue_at: float | None = None
    """When the last cycle's plan wants the next (``time.monotonic``), if it asked."""
    seen_input: tuple[object, ...] | None = None
    """The generation and annotations last noticed (``PolicyRuntime.noticed``)."""
    changed: bool = False
    """The input changed since the last cycle began: the next one must not be skipped as too recent."""
    failures: int = 0
    retry_after: float | None = None


class PolicyRuntime:
    """The operator's state between handler calls: the Controller and one slot (and loop) per policy."""

    def __init__(
        self,
        controller: Controller | ControllerFactory,
        loop_settings: LoopSettings | None = None,
        metrics: OperatorMetrics | None = None,
        *,
        owns_loops: bool = True,
    ) -> None:
        self._source = controller
        self.owns_loops = owns_loops
        """The runtime starts and ends the loops itself; otherwise a kopf daemon per policy runs each (``register``)."""
        self.controller: Controller | None = controller if isinstance(controller, Controller) else None
        self.loop = loop_settings or LoopSettings()
        self._metrics = metrics
        self._slots: dict[str, _Slot] = {}
        self._in_flight = asyncio.Semaphore(self.loop.max_concurrent)
        self.settings = kopf.OperatorSettings()
        """kopf's settings (set at its startup), for the loops' object loggers: their warnings become Events."""
        self._stopping: asyncio.Event | None = None
        self._newest_arrival = 0.0
        """Loop time at which a policy was last seen for the first time."""
        self._handing_back: dict[str, asyncio.Task[None]] = {}
        """Deleted policies whose taken-over Deployment is being given back (``controller/takeover.py``)."""
        self._deleting: dict[str, dict[str, Any]] = {}
        """Their newest bodies."""

    @property
    def metrics(self) -> OperatorMetrics:
        if self._metrics is not None:
            return self._metrics
        return self.controller.metrics if self.controller is not None else OperatorMetrics()

    async def start(self) -> None:
        """Build the Controller (once) if a factory was given."""
        self._stopping = self._stopping or asyncio.Event()
        if self.controller is None:
            made = self._source()  # type: ignore[operator]
            self.controller = await made if inspect.isawaitable(made) else made

    async def stop(self) -> None:
        """End every loop: each may finish its cycle for ``daemon_cancellation_timeout`` seconds, then is cancelled."""
        if self._stopping is not None:
            self._stopping.set()
        for task in self._handing_back.values():  # the next leader picks the hand-back up from the finalizer
            task.cancel()
        loops = [slot.loop for slot in self._slots.values() if slot.loop is not None]
        if loops:
            _, pending = await asyncio.wait(loops, timeout=self.loop.daemon_cancellation_timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    def slot(self, uid: str) -> _Slot:
        if uid not in self._slots:
            self._slots[uid] = _Slot()
        return self._slots[uid]

    async def reconcile(self, body: Mapping[str, Any] | bytes, uid: str | None = None) -> Plan:
        """One cycle under the policy's lock. ``body``: the policy, or its ``packed_body`` with its ``uid``."""
        await self.start()
        assert self.controller is not None
        if uid is None:
            assert not isinstance(body, bytes), "a packed body comes with its uid"
            uid = _uid(body)
        slot = self.slot(uid)
        async with slot.lock:
            self.metrics.sweeps.started()
            slot.last_start = started = time.monotonic()
            try:
                plan = await self.controller.reconcile(body)
            finally:
                slot.last_done = time.monotonic()
                self.metrics.sweeps.finished(uid, self._slots.keys())
        requeue = plan.requeue_after
        slot.requeue_at = None if requeue is None else started + max(0.0, requeue) + REQUEUE_SLACK
        slot.failures, slot.retry_after = 0, None
        return plan

    def noticed(self, body: Mapping[str, Any], event_type: str | None = None) -> None:
        """A watch event of the policy: keep its body, wake its loop when its input changed (not for its status
        alone), and, when the runtime owns the loops, start one on the first event and end it when the policy goes."""
        meta = body.get("metadata") or {}
        uid = _uid(body)
        if event_type == "DELETED" or meta.get("deletionTimestamp"):  # the garbage collector takes the children
            gone = self._slots.get(uid)
            if gone is not None and gone.loop is not None:
                gone.loop.cancel()
            if event_type != "DELETED" and HAND_BACK_FINALIZER in (meta.get("finalizers") or ()):
                self._hand_back(uid, body)
            return
        if uid not in self._slots:
            self._newest_arrival = asyncio.get_running_loop().time()
        slot = self.slot(uid)
        slot.body = packed_body(body)
        slot.namespace = str(meta.get("namespace") or "")
        slot.interval = _interval(body)
        seen = (meta.get("generation"), tuple(sorted((meta.get("annotations") or {}).items())))
        previous, slot.seen_input = slot.seen_input, seen
        if previous is not None and previous != seen:  # the first sighting is the loop's first cycle
            slot.changed = True
            slot.wake.set()
        if self.owns_loops and slot.loop is None and not (self._stopping is not None and self._stopping.is_set()):
            logger = kopf.ObjectLogger(body=cast(kopf.Body, body), settings=self.settings)
            # Made from kopf's event handler, the task inherits the context kopf posts the logger's Events through.
            slot.loop = asyncio.create_task(
                self.run_loop(uid, slot, self._stopped(), logger),
                name=f"policy {meta.get('namespace')}/{meta.get('name')}",
            )

    def _hand_back(self, uid: str, body: Mapping[str, Any]) -> None:
        """Give a deleted policy's Deployment back, once per policy, until its finalizer is off; each step reads
        the newest body (its finalizers are tested when the last one is taken off)."""
        self._deleting[uid] = plain_body(body)
        running = self._handing_back.get(uid)
        if running is None or running.done():
            name = (body.get("metadata") or {}).get("name")
            self._handing_back[uid] = asyncio.create_task(self._handing(uid), name=f"hand back {name}")

    async def _handing(self, uid: str) -> None:
        await self.start()
        assert self.controller is not None
        told = None
        try:
            while True:
                body = self._deleting[uid]
                try:
                    waiting = await self.controller.hand_back(body)
                except ReconcileError as exc:
                    waiting = str(exc)
                if waiting is None:
                    return
                if waiting != told:
                    log.info("%s is being deleted: %s", PolicyRef.from_body(body), waiting)
                    told = waiting
                await asyncio.sleep(HAND_BACK_SECONDS)
        finally:
            self._handing_back.pop(uid, None)
            self._deleting.pop(uid, None)

    async def _stopped(self) -> None:
        await self.start()
        assert self._stopping is not None
        await self._stopping.wait()

    async def run_loop(self, uid: str, slot: _Slot, stop: Awaitable[Any], logger: Any) -> None:
        """The per-policy loop: reconcile, wait, repeat until ``stop`` (the operator stops, the policy goes)."""
        # One wait on the stop flag for the loop's life.
        stopping = asyncio.ensure_future(stop)
        try:
            while not stopping.done():
                changed, slot.changed = slot.changed, False
                now = time.monotonic()
                recent = slot.last_done is not None and now - slot.last_done < MIN_GAP
                asked = slot.requeue_at is not None and now >= slot.requeue_at and not slot.failures
                if changed or asked or not recent:
                    if slot.last_done is None:
                        await self._arrivals_quiet()
                    if self.controller is not None:  # as controller-runtime's workers wait for their caches' sync
                        await self.controller.synced(slot.namespace)
                    async with self._in_flight:  # the newest body, unpacked by the cycle itself
                        await self._loop_cycle(uid, slot, logger)
                if not slot.changed:  # a change noticed during the cycle was not in its body: go again at once
                    slot.wake.clear()
                await _wait(self._delay(slot), slot.wake, stopping)
        finally:
            stopping.cancel()
            if self._slots.get(uid) is slot:
                del self._slots[uid]
            if self.controller is not None:
                self.controller.forget(uid)

    async def _arrivals_quiet(self) -> None:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + FIRST_CYCLE_WAIT
        while (quiet := self._newest_arrival + ARRIVALS_QUIET - loop.time()) > 0 and loop.time() < give_up:
            await asyncio.sleep(quiet)

    async def _loop_cycle(self, uid: str, slot: _Slot, logger: Any) -> None:
        try:
            await self.reconcile(slot.body, uid)
        except ReconcileError as exc:
            slot.failures += 1
            slot.retry_after = exc.delay
            logger.warning("Kubernetes API error; retrying in %.0fs: %s", exc.delay, exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            slot.failures += 1
            slot.retry_after = min(self.loop.max_backoff, self.loop.error_backoff * 2 ** (slot.failures - 1))
            self.metrics.reconcile_errors.inc()
            logger.exception(
                "reconcile failed (%d in a row); retrying in %.1fs: %s", slot.failures, slot.retry_after, exc
            )

    def _delay(self, slot: _Slot) -> float:
        """Until the analysis interval of the newest body has passed since the last cycle began (so analyses come
        every ``interval``, not every ``interval`` plus a cycle), or until the plan's requeue if that is sooner; a
        retry's delay, after a failed cycle, from its end. Never under ``min_interval``: no loop spins."""
        now = time.monotonic()
        if slot.failures and slot.retry_after is not None:
            wake = (slot.last_done if slot.last_done is not None else now) + slot.retry_after
        else:
            wake = (slot.last_start if slot.last_start is not None else now) + slot.interval
            if slot.requeue_at is not None:
                wake = min(wake, slot.requeue_at)
        return min(self.loop.max_interval, max(self.loop.min_interval, wake - now))


@dataclass(frozen=True)
class WebhookSettings:
    """Where the validating admission webhook listens, and its TLS certificate and key (PEM files)."""

    port: int
    certfile: str
    keyfile: str
    address: str = "0.0.0.0"


class _NoDiffBase(kopf.DiffBaseStorage):
    """No diff base: kopf needs one only for change handlers, which the operator does not register, yet builds
    one for every watch event by deep-copying the whole object (status and managedFields included)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return kopf.BodyEssence()  # the same as built: no difference, so nothing resets a daemon's idling

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass


class _QuietNoticed(logging.Filter):
    """Drops kopf's "Handler 'noticed' succeeded." line: the event handler runs for every watch event, the
    operator's own status writes included, and the line would be most of the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and record.getMessage() == f"Handler {NOTICED!r} succeeded.")


def configure_settings(settings: kopf.OperatorSettings) -> None:
    """kopf settings of the operator: its own finalizer and annotation prefix, quiet Events, sane timeouts."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = _NoDiffBase()
    settings.posting.level = logging.WARNING  # kopf's own log lines become Events only at WARNING and above
    if not any(isinstance(f, _QuietNoticed) for f in logging.getLogger("kopf.objects").filters):
        logging.getLogger("kopf.objects").addFilter(_QuietNoticed())
    settings.posting.reporting_component = "kvoffload"
    settings.peering.name = PEERING_NAME
    settings.peering.mandatory = False
    # The server ends a watch before the client gives up on it; a dead connection is noticed in minutes.
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.watching.connect_timeout = 30


def register(
    registry: kopf.OperatorRegistry,
    controller: Controller | ControllerFactory,
    *,
    loop_settings: LoopSettings | None = None,
    metrics: OperatorMetrics | None = None,
    own_loops: bool = True,
) -> PolicyRuntime:
    """Add the operator's handlers to ``registry``; returns the runtime they share.

    ``own_loops``: the runtime runs each policy's loop itself. Where kopf peering is on, ``False``: a kopf daemon
    runs each loop instead, since kopf pauses only its own daemons for a peer of higher priority; it then keeps each
    policy's body decoded for its daemon, some 45 kB a policy.
    """
    runtime = PolicyRuntime(controller, loop_settings, metrics, owns_loops=own_loops)

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_settings(settings)
        runtime.settings = settings
        await runtime.start()

    @kopf.on.event(*RESOURCE, id=NOTICED, registry=registry)
    async def noticed(body: kopf.Body, type: str | None, **_: Any) -> None:
        runtime.noticed(body, type)

    @kopf.on.cleanup(registry=registry)
    async def stop_loops(**_: Any) -> None:
        await runtime.stop()

    if not own_loops:
        # After the event handler on every event (kopf's order): the slot holds the body the daemon starts from.
        @kopf.daemon(*RESOURCE, registry=registry, cancellation_timeout=runtime.loop.daemon_cancellation_timeout)
        async def policy_loop(body: kopf.Body, stopped: kopf.DaemonStopped, logger: Any, **_: Any) -> None:
            uid = _uid(body)
            await runtime.run_loop(uid, runtime.slot(uid), stopped.wait(), logger)

    return runtime


async def run_operator(
    *,
    namespaces: Collection[str] = (),
    clusterwide: bool = False,
    standalone: bool = False,
    metrics_port: int = 8080,
    controller_settings: ControllerSettings | None = None,
    policy_label: str = "kvoffload_io_policy",
    level_label: str = "kvoffload_io_level",
    config_hash_label: str = "kvoffload_io_config_hash",
    stop_flag: Any = None,
    ready_flag: Any = None,
    webhook: WebhookSettings | None = None,
    lease: LeaseSettings | None = None,
    notifications: NotificationsConfig | None = None,
) -> None:
    """Run the operator until stopped (SIGINT/SIGTERM, or ``stop_flag``): kopf, the Controller built
    from the in-cluster service account or $KUBECONFIG, the metrics and probe endpoint (0: none), and,
    with ``webhook``, the validating admission webhook (``controller/admission.py``).

    With ``lease``, this replica is one candidate of a leader election (``controller/leadership.py``):
    it reconciles only while it holds the Lease, and until then stands by, serving the webhook if any.
    A leader that loses the Lease exits the process at once (status 1), so it never writes beside the
    next one.

    With ``notifications``, the transitions each status write records are told to the sinks the policy
    chose (``notify``), each sink from its own thread, started once this replica leads.

    Raises ``kubernetes.config.ConfigException`` when there is no cluster configuration.
    """
    from kvoffload.analysis.hub import PATIENT_GATHER_WINDOW, MeasurementHub
    from kvoffload.analysis.prometheus import PrometheusProvider
    from kvoffload.analysis.queries import LabelNames
    from kvoffload.controller.gateway import KubernetesGateway, api_client_from_environment

    metrics = OperatorMetrics()
    labels = LabelNames(policy=policy_label, level=level_label, config_hash=config_hash_label)
    # Built before kopf starts, so a missing kubeconfig fails at once instead of in a retry loop.
    gateway = KubernetesGateway(api_client_from_environment())
    hub = MeasurementHub(
        lambda source: PrometheusProvider(
            source.url, bearer_token=source.bearer_token, connection=source.connection, labels=labels
        ),
        patient_window=PATIENT_GATHER_WINDOW,
        query_counter=metrics.prometheus_queries,
    )
    workloads = Workloads(gateway, metrics)
    notifier = None
    if notifications is not None and notifications.sinks:
        metrics.watch_sinks(notifications.names)
        notifier = Notifier(notifications, metrics.count_notification, metrics.count_notification_retry)
    controller = Controller(gateway, hub, controller_settings, metrics=metrics, workloads=workloads, notifier=notifier)

    registry = kopf.OperatorRegistry()
    # Where kopf peering is on, kopf daemons run the loops: its pause for a peer of higher priority reaches them.
    register(registry, controller, metrics=metrics, own_loops=standalone)
    admission_only = kopf.OperatorRegistry()  # what a standby serves
    for each in (registry, admission_only):
        # A registry of our own gets none of kopf's fallback logins: log in as the gateway does.
        kopf.on.login(registry=each)(kopf.login_via_client)
        if webhook is not None:
            _serve_admission(each, webhook, controller.settings.judged_tenancy)

    health = Health()
    beating = asyncio.create_task(health.beat())
    tending = asyncio.create_task(tend_heap())
    metrics_server = metrics.serve(metrics_port, health) if metrics_port else None
    leadership = None
    ready = asyncio.Event()
    readying = asyncio.create_task(_when_ready(ready, ready_flag, lambda: health.set(Role.LEADER, ready=True)))
    try:
        if lease is not None:
            leadership = Leadership(lease, api_client_from_environment(), on_lost=_exit_on_lost_lease)
            leadership.start()
            health.set(Role.STANDBY, ready=webhook is None)
            led = await _stand_by(
                leadership,
                admission_only if webhook is not None else None,
                on_serving=lambda: health.set(Role.STANDBY, ready=True),
                stop_flag=stop_flag,
                clusterwide=clusterwide,
                namespaces=namespaces,
            )
            if not led:
                return
        health.set(Role.LEADER, ready=False)
        metrics.leader.set(1)
        # Its own client: the watches hold their connections for minutes at a time.
        workloads.watch(api_client_from_environment(), None if clusterwide else list(namespaces))
        if notifier is not None:
            notifier.start()
        with full_collections_on_schedule():  # what is made so far lives as long as the process
            await kopf.operator(
                registry=registry,
                standalone=standalone,
                clusterwide=clusterwide,
                namespaces=list(namespaces),
                stop_flag=stop_flag,
                ready_flag=ready,
            )
    finally:
        workloads.stop()
        if notifier is not None:  # what is queued gets a few seconds to go out
            await asyncio.to_thread(notifier.close)
        for task in (readying, beating, tending):
            task.cancel()
        metrics.leader.set(0)
        if leadership is not None:
            # After kopf has stopped: the next leader starts on a quiet field.
            await asyncio.to_thread(leadership.release)
        if metrics_server is not None:
            metrics_server.shutdown()


def _serve_admission(registry: kopf.OperatorRegistry, webhook: WebhookSettings, tenancy: Tenancy) -> None:
    from kvoffload.controller import admission

    admission.register(registry, tenancy)

    @kopf.on.startup(registry=registry)
    def serve_admission(settings: kopf.OperatorSettings, **_: Any) -> None:
        # A server per kopf run: a standby's kopf stops before the leader's starts on the same port.
        settings.admission.server = admission.webhook_server(
            address=webhook.address, port=webhook.port, certfile=webhook.certfile, keyfile=webhook.keyfile
        )
        settings.admission.managed = None  # registered by the chart or `kvoffload cluster`, not by kopf


async def _stand_by(
    leadership: Leadership,
    admission_only: kopf.OperatorRegistry | None,
    *,
    on_serving: Callable[[], None],
    stop_flag: Any,
    clusterwide: bool,
    namespaces: Collection[str],
) -> bool:
    """Wait for the Lease, serving the webhook meanwhile when there is one; False when stopped first."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM) if threading.current_thread() is threading.main_thread() else ()
    for signum in signals:
        loop.add_signal_handler(signum, stopping.set)
    waits = [
        asyncio.create_task(leadership.wait_leading()),
        asyncio.create_task(stopping.wait()),
        asyncio.create_task(_flag_set(stop_flag)),
    ]
    try:
        if admission_only is None:
            on_serving()
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        else:
            done = asyncio.Event()
            for task in waits:
                task.add_done_callback(lambda _: done.set())
            standby_ready = asyncio.Event()
            serving = asyncio.create_task(_when_ready(standby_ready, None, on_serving))
            try:  # kopf takes SIGINT/SIGTERM while it runs: its return then means a stop, unless we lead
                await kopf.operator(
                    registry=admission_only,
                    standalone=True,
                    clusterwide=clusterwide,
                    namespaces=list(namespaces),
                    stop_flag=done,
                    ready_flag=standby_ready,
                )
            finally:
                serving.cancel()
    finally:
        for task in waits:
            task.cancel()
        for signum in signals:
            loop.remove_signal_handler(signum)
    return leadership.leading and not stopping.is_set() and not _is_set(stop_flag)


async def _when_ready(ready: asyncio.Event, flag: Any, then: Callable[[], None]) -> None:
    await ready.wait()
    then()
    if flag is not None:
        _set(flag)


async def _flag_set(flag: Any) -> None:
    """Wait for a kopf-style stop flag (an asyncio or threading Event, or a Future); never, for None."""
    while not _is_set(flag):
        await asyncio.sleep(0.2)


def _is_set(flag: Any) -> bool:
    if flag is None:
        return False
    if isinstance(flag, (asyncio.Future, concurrent.futures.Future)):
        return flag.done()
    return bool(flag.is_set())


def _set(flag: Any) -> None:
    if isinstance(flag, (asyncio.Future, concurrent.futures.Future)):
        if not flag.done():
            flag.set_result(None)
    else:
        flag.set()


def _exit_on_lost_lease() -> None:
    """Leave now, from the election's thread: a graceful stop could go on writing after the next leader
    starts. The kubelet restarts the container, which joins again as a candidate."""
    logging.shutdown()
    os._exit(1)


def _uid(body: Mapping[str, Any]) -> str:
    meta = body.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


def _interval(body: Mapping[str, Any]) -> float:
    try:
        return parse_duration(body["spec"]["analysis"]["interval"])
    except (KeyError, TypeError, ValueError):
        return DEFAULT_INTERVAL


async def _wait(delay: float, wake: asyncio.Event, stopping: asyncio.Future[Any]) -> None:
    """Sleep ``delay`` seconds, or less when woken or stopped."""
    woken = asyncio.ensure_future(wake.wait())
    try:
        await asyncio.wait((woken, stopping), timeout=delay, return_when=asyncio.FIRST_COMPLETED)
    finally:
        woken.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await woken
