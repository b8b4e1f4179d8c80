"""The operator's own Prometheus metrics, in a registry of their own.

``kvoffload run --metrics-port P`` serves them at ``/metrics``. They say what the
operator decided and how it is doing, not what the engines do (those come from vLLM):

- ``kvoffload_decisions_total{decision}``: history entries written (Rollback, Promoted...).
- ``kvoffload_verdicts_total{verdict}``: analysis verdicts (Pass, Fail, Inconclusive).
- ``kvoffload_cycle_seconds``: how long one reconcile of one policy took.
- ``kvoffload_sweep_seconds``: how long one sweep took: from the start of a reconcile when no sweep runs
  until every policy the operator watches has finished a reconcile since (:class:`SweepTimer`).
- ``kvoffload_sweep_policies``: how many policies the last sweep covered.
- ``kvoffload_api_errors_total{operation,code}``: Kubernetes API operations that failed, by the HTTP status the
  API server answered (``403``, ``409``, ``503``...; ``404`` also for a key missing in an object that is there),
  ``none`` when no answer came (a connection refused, reset or timed out), ``refused`` when the operator itself
  would not do it (an object of that name that another owner holds). :func:`api_error_code` reads it.
- ``kvoffload_build_info{version,commit,python,kopf}``: 1, naming what runs (:func:`build_info`).
- ``kvoffload_prometheus_queries_total``: PromQL queries sent (per cycle, constant in the policies).
- ``kvoffload_workload_reads_total{source}``: reads of a policy's Deployments and pods: ``watch`` from the
  operator's watch of them, ``list`` by two API calls (no watch yet, or one behind the operator's own write).
- ``kvoffload_policies{phase}``: policies per phase.
- ``kvoffload_reconcile_errors_total``: reconciles that ended in an unexpected error.
- ``kvoffload_notifications_total{sink,result}``: notifications by what became of them: ``delivered``,
  ``failed`` (refused, or out of attempts) or ``dropped`` (pushed out of a full queue, or queued at shutdown).
- ``kvoffload_notification_retries_total{sink}``: failed delivery attempts that were tried again.

Per policy (labels ``policy_namespace`` and ``policy``; alerts and the dashboard select on them):

- ``kvoffload_policy_phase{phase}``: 1 for the policy's phase, 0 for every other.
- ``kvoffload_policy_condition{condition,reason}``: 1 while a condition is True, 0 while False.
- ``kvoffload_policy_stage_deadline_timestamp_seconds``: when the running baseline or step should
  have ended on its own (:func:`stage_deadline`); absent at rest or while it waits for a person.
- ``kvoffload_policy_last_decision_timestamp_seconds{decision,stage}``: when each decision in
  ``status.history`` was last taken, and the level it led to (the history entry's stage).
- ``kvoffload_variant_info{variant,level}``: 1 for each variant that runs, naming its level (join
  the engines' series on it to split them by level).
- ``kvoffload_variant_pinned_memory_bytes{variant,level}``: pinned host memory a variant's pods
  request together (the pool per replica times the desired replicas).
- ``kvoffload_tier_capacity_tokens{level,tier}``: tokens each offload tier of each ladder level holds
  per pod, as ``kvoffload plan`` gives them (also on the pods: ``kvoffload.io/tier-capacity-tokens``).
- ``kvoffload_analysis_p_value{metric}`` and ``kvoffload_analysis_alpha{metric}``: how sure each built-in
  latency and error gate of the latest analysis is (a breach counts when the p-value is under alpha);
  ``kvoffload_analysis_interval_low{metric}`` and ``..._high``: the 95 % interval of its value, on the rows
  where that is in the value's unit (the canary/stable ratios, errorShare: analysis/confidence.py).
- ``kvoffload_payoff_saving_ms{level,source}``: the live payoff of the latest analysis, what a canary request of
  ``level`` saves by its restores against recomputing them (``source="measured"``, analysis/payoff.py), and the
  economics' forecast of it where one was given (``source="forecast"``); absent while none was fitted.

Their cardinality is bounded per policy, whatever the traffic: one series per phase, per condition
type (with its current reason only), per decision (with its latest stage only), per running variant
(two at most), per tier of each ladder level, and per built-in gate. Every label value comes from a
fixed enum or the policy's own ladder; none from requests, pods or time, so rolling pods or a long life
add nothing.

No label is one Prometheus sets on a target (``namespace``, ``pod``, ``job``, ``instance``, ``service``,
``container``, ``endpoint``): the policy's namespace is ``policy_namespace``, so the series mean the same
whether scraped with ``honorLabels`` or not (a Prometheus with ``overrideHonorLabels``, as multi-tenant setups
run, would turn a ``namespace`` of ours into ``exported_namespace``), and ``namespace`` stays the operator's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import urllib3.exceptions
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvoffload.analysis.confidence import shown_interval
from kvoffload.analysis.payoff import PAYOFF
from kvoffload.api.conventions import ANALYSIS_INCONCLUSIVE, PAUSED, PROGRESSING, Decision, Reason
from kvoffload.api.quantity import parse_duration
from kvoffload.api.status import KVOffloadPolicyStatus, Mode, Phase
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.controller.apierrors import ApiUnavailableError, MissingObjectError
from kvoffload.controller.health import Health, serve
from kvoffload.notify.sink import Result
from kvoffload.policy.sized import Sized

POLICY_LABELS = ("policy_namespace", "policy")
"""The labels naming a policy; none is a target label, which a scrape without honorLabels would rename."""
TARGET_LABELS = frozenset({"namespace", "pod", "job", "instance", "service", "container", "endpoint", "cluster"})
"""Labels a Prometheus (or the Prometheus Operator's ServiceMonitor, or a Thanos/Mimir external label) sets on the
operator's series itself: no series of ours may carry one."""
API_OPERATIONS = (
    "list",
    "list_pods",
    "read_configmap",
    "read_secret",
    "read_analysis_template",
    "apply",
    "scale",
    "delete",
    "patch_status",
    "read_deployment",
    "hand_over",
    "give_back",
    "finalizer",
    "hand_back",
)
"""The ``operation`` values of ``kvoffload_api_errors_total``: the Kubernetes API calls the reconcile makes."""
NO_ANSWER = "none"
"""The ``code`` of an API error for which no HTTP answer came: the connection failed or timed out."""
REFUSED = "refused"
"""The ``code`` of an operation the operator would not make (the object belongs to another owner)."""
UNKNOWN_COMMIT = "unknown"


def api_error_code(exc: BaseException) -> str:
    """The ``code`` label of a failed API operation: the HTTP status of the answer that failed it, read along the
    exception's causes (the gateway raises its own errors from the client's), :data:`NO_ANSWER` for a transport
    failure, :data:`REFUSED` for the operator's own refusal."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        status = getattr(cause, "status", None)  # ApiRejectedError's, and the client's ApiException's
        if isinstance(status, int) and status > 0:
            return str(status)
        if isinstance(cause, urllib3.exceptions.HTTPError | OSError):
            return NO_ANSWER
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, MissingObjectError):
        return "404"  # the object (or its key) is not there: the gateway turns a 404 into None, then into this
    if isinstance(exc, ApiUnavailableError):
        return NO_ANSWER  # retried to the end without an answer that said why
    return REFUSED


def build_info(distribution: str = "kvoffload") -> dict[str, str]:
    """The labels of ``kvoffload_build_info``: this package's version, the commit it was built from, and the
    Python and kopf that run it.

    The commit is the one pip recorded when it installed from a VCS URL (PEP 610 ``direct_url.json``,
    ``vcs_info.commit_id``), else :data:`UNKNOWN_COMMIT`; git is never run, as an image has none.
    """
    import importlib.metadata
    import json
    import platform

    from kvoffload import __version__

    commit = UNKNOWN_COMMIT
    try:
        recorded = importlib.metadata.distribution(distribution).read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        recorded = None
    if recorded:
        try:
            vcs = json.loads(recorded).get("vcs_info") or {}
        except (ValueError, AttributeError):
            vcs = {}
        if isinstance(vcs, dict) and isinstance(vcs.get("commit_id"), str) and vcs["commit_id"]:
            commit = vcs["commit_id"]
    try:
        kopf_version = importlib.metadata.version("kopf")
    except importlib.metadata.PackageNotFoundError:
        kopf_version = "unknown"
    return {"version": __version__, "commit": commit, "python": platform.python_version(), "kopf": kopf_version}


@dataclass(frozen=True)
class VariantSeries:
    """One running variant of a policy, as the per-policy metrics show it."""

    variant: str
    level: str
    replicas: int
    pinned_bytes_per_replica: int


@dataclass(frozen=True)
class PolicySeries:
    """Everything the per-policy metrics say about one policy, taken from one reconcile's result."""

    namespace: str
    name: str
    phase: str
    conditions: tuple[tuple[str, str, bool], ...] = ()
    """(type, reason, True?) of every condition in the status."""
    stage_deadline: float | None = None
    """Unix seconds; None at rest or while waiting for a person."""
    last_decisions: tuple[tuple[str, str, float], ...] = ()
    """(decision, stage, unix seconds) of the newest history entry of each decision."""
    variants: tuple[VariantSeries, ...] = ()
    tier_capacity: tuple[tuple[str, str, int], ...] = ()
    """(level, tier, tokens per pod) for every offload tier of every ladder level."""
    custom: tuple[tuple[str, str, str, float | None, bool | None], ...] = ()
    """Custom metrics of the latest analysis: (metric, gated or dryRun, template or "", canary value or None if
    absent, passed). The stable value goes apart: ``custom_stable``."""
    custom_stable: tuple[tuple[str, str, str, float], ...] = ()
    evidence: tuple[tuple[str, float | None, float | None, tuple[float, float] | None], ...] = ()
    """Built-in gates of the latest analysis that say how sure they are: (metric, p-value, alpha, 95 % interval
    where it is in the value's unit)."""
    payoff: tuple[tuple[str, str, float], ...] = ()
    """(level, measured or forecast, saving ms per canary request) of the latest analysis's payoff row."""

    @classmethod
    def of(
        cls,
        namespace: str,
        name: str,
        status: KVOffloadPolicyStatus,
        spec: KVOffloadPolicySpec | None = None,
        sized: Sized | None = None,
    ) -> PolicySeries:
        """The series of a policy after a cycle, its sized figures read from the cycle's sized plan; ``spec`` and
        ``sized`` are None when the spec is invalid (then nothing sized is published: no variants, capacity or
        deadline)."""
        newest: dict[str, tuple[str, float]] = {}
        for entry in status.history:  # oldest first: the newest of each decision wins
            newest[entry.decision] = (entry.stage, entry.time.timestamp())
        rows = status.last_analysis.metrics if status.last_analysis else []
        custom = [m for m in rows if m.dry_run is not None]
        # Built-in rows only: their names are a fixed set, so the metric label stays bounded.
        sure = [
            (m.name, m.p_value, m.alpha, shown_interval(m))
            for m in rows
            if m.dry_run is None and (m.p_value is not None or m.alpha is not None or shown_interval(m) is not None)
        ]
        series = cls(
            namespace=namespace,
            name=name,
            phase=status.phase.value,
            conditions=tuple((c.type, c.reason, c.status == "True") for c in status.conditions),
            last_decisions=tuple((decision, stage, when) for decision, (stage, when) in newest.items()),
            custom=tuple(
                (m.name, "dryRun" if m.dry_run else "gated", m.template or "", m.canary, m.passed) for m in custom
            ),
            custom_stable=tuple(
                (m.name, "dryRun" if m.dry_run else "gated", m.template or "", m.stable)
                for m in custom
                if m.stable is not None
            ),
            evidence=tuple(sure),
        )
        if spec is None or sized is None or not len(sized):
            return series
        ladder = sized.ladder
        payoff_row = next((m for m in rows if m.name == PAYOFF and m.dry_run is None), None)
        canary = status.canary
        if payoff_row is not None and canary is not None and 0 <= canary.level < len(ladder):
            level_name = ladder[canary.level].name
            readings = (("measured", payoff_row.canary), ("forecast", payoff_row.forecast_saving_ms))
            payoff = tuple((level_name, source, value) for source, value in readings if value is not None)
            series = replace(series, payoff=payoff)
        variants = []
        for variant, vs in (("stable", status.stable), ("canary", status.canary)):
            if vs is not None and 0 <= vs.level < len(ladder):
                level = sized[vs.level]
                variants.append(VariantSeries(variant, level.level.name, vs.replicas, level.memory.pinned))
        capacity = tuple((s.level.name, tier, tokens) for s in sized for tier, tokens in s.capacity.items())
        deadline = stage_deadline(spec, status, sized)
        return replace(series, variants=tuple(variants), tier_capacity=capacity, stage_deadline=deadline)


def stage_deadline(spec: KVOffloadPolicySpec, status: KVOffloadPolicyStatus, sized: Sized) -> float | None:
    """When the running baseline or step should have ended on its own, in Unix seconds; None when none runs.

    The stage's start, plus its planned length (``baselineDuration`` or ``stepDuration``), plus the
    progress deadline of the level it starts (``rollout.progressDeadline``, stretched to the startup
    budget of a big pinned pool): by then the pods are up and the evidence is in, so a stage still
    running has been held, by Inconclusive verdicts or by a breach that neither passes nor lasts.
    None while paused (by a person or on too many Inconclusive verdicts) or awaiting
    ``kvoffload.io/promote``: those stages end when a person acts, and say so in their own way.
    """
    stage = status.stage
    if status.mode not in (Mode.BASELINE, Mode.STEP) or stage is None or stage.started_at is None:
        return None
    conditions = {c.type: c for c in status.conditions}
    if any(conditions.get(t) is not None and conditions[t].status == "True" for t in (PAUSED, ANALYSIS_INCONCLUSIVE)):
        return None
    progressing = conditions.get(PROGRESSING)
    if progressing is not None and progressing.reason == Reason.AWAITING_PROMOTION:
        return None
    running = status.canary if status.canary is not None else status.stable
    if running is None or not 0 <= running.level < len(sized):
        return None
    planned = spec.rollout.baseline_duration if status.mode is Mode.BASELINE else spec.rollout.step_duration
    budget = parse_duration(planned) + sized[running.level].progress_deadline_seconds
    end: datetime = stage.started_at + timedelta(seconds=budget)
    return end.timestamp()


class _PolicyCollector(Collector):
    """Yields the per-policy families from the latest ``PolicySeries`` of each policy, at scrape time.

    A policy's series go with it (``forget``), and a changed reason or level replaces the old series
    instead of leaving a stale one behind: nothing is published that the last cycle did not say.
    """

    def __init__(self, policies: Mapping[str, PolicySeries], lock: threading.Lock) -> None:
        self.policies = policies
        self.lock = lock

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        with self.lock:
            snapshot = list(self.policies.values())
        return list(self._families(snapshot))

    @staticmethod
    def _families(policies: Sequence[PolicySeries] = ()) -> Iterator[Metric]:
        phase = GaugeMetricFamily(
            "kvoffload_policy_phase", "1 for the policy's phase, 0 for the others.", labels=[*POLICY_LABELS, "phase"]
        )
        condition = GaugeMetricFamily(
            "kvoffload_policy_condition",
            "1 while the policy's condition is True, 0 while False; reason as in status.conditions.",
            labels=[*POLICY_LABELS, "condition", "reason"],
        )
        deadline = GaugeMetricFamily(
            "kvoffload_policy_stage_deadline_timestamp_seconds",
            "When the running baseline or step should have ended on its own (start + planned length + progress "
            "deadline); absent at rest, paused, or awaiting kvoffload.io/promote.",
            labels=list(POLICY_LABELS),
        )
        decisions = GaugeMetricFamily(
            "kvoffload_policy_last_decision_timestamp_seconds",
            "When each decision in status.history was last taken, and the ladder level it led to.",
            labels=[*POLICY_LABELS, "decision", "stage"],
        )
        variant = GaugeMetricFamily(
            "kvoffload_variant_info",
            "1 for each variant (stable, canary) that runs, with the ladder level it runs.",
            labels=[*POLICY_LABELS, "variant", "level"],
        )
        pinned = GaugeMetricFamily(
            "kvoffload_variant_pinned_memory_bytes",
            "Pinned host memory the variant's pods request together: the pool per replica times the replicas.",
            labels=[*POLICY_LABELS, "variant", "level"],
        )
        capacity = GaugeMetricFamily(
            "kvoffload_tier_capacity_tokens",
            "Tokens each offload tier of each ladder level holds per pod (as kvoffload plan gives them).",
            labels=[*POLICY_LABELS, "level", "tier"],
        )
        custom_value = GaugeMetricFamily(
            "kvoffload_custom_metric_value",
            "Each custom metric's value at the latest analysis (spec.analysis.metrics and templates), per variant; "
            "mode is gated or dryRun, template is name@generation or empty.",
            labels=[*POLICY_LABELS, "metric", "variant", "mode", "template"],
        )
        custom_passed = GaugeMetricFamily(
            "kvoffload_custom_metric_passed",
            "1 when the custom metric passed at the latest analysis, 0 when it breached (a dry run only shows it); "
            "absent when it was not judged.",
            labels=[*POLICY_LABELS, "metric", "mode", "template"],
        )
        p_value = GaugeMetricFamily(
            "kvoffload_analysis_p_value",
            "One-sided p-value of each built-in latency and error gate at the latest analysis: a breach counts when "
            "it is under kvoffload_analysis_alpha; absent where the gate computed none.",
            labels=[*POLICY_LABELS, "metric"],
        )
        alpha = GaugeMetricFamily(
            "kvoffload_analysis_alpha",
            "The p-value a breach of each built-in gate must come under at the latest analysis "
            "(analysis.falseRollbackRate shared over the step's analyses and gates).",
            labels=[*POLICY_LABELS, "metric"],
        )
        low = GaugeMetricFamily(
            "kvoffload_analysis_interval_low",
            "Lower bound of the 95 % interval of the gate's value at the latest analysis, in its unit: "
            "ttftP99Ratio and itlP99Ratio the canary/stable latency ratio, errorShare the failed share.",
            labels=[*POLICY_LABELS, "metric"],
        )
        high = GaugeMetricFamily(
            "kvoffload_analysis_interval_high",
            "Upper bound of the 95 % interval of the gate's value at the latest analysis (as the lower one).",
            labels=[*POLICY_LABELS, "metric"],
        )
        payoff = GaugeMetricFamily(
            "kvoffload_payoff_saving_ms",
            "What a canary request of the level saves by its restores against recomputing them, ms, at the latest "
            "analysis: measured (fitted from both variants' sub-windows) or forecast (the economics'); below 0 the "
            "tier does not pay.",
            labels=[*POLICY_LABELS, "level", "source"],
        )
        for p in policies:
            who = [p.namespace, p.name]
            for value in Phase:
                phase.add_metric([*who, value.value], 1.0 if value.value == p.phase else 0.0)
            for type_, reason, true in p.conditions:
                condition.add_metric([*who, type_, reason], 1.0 if true else 0.0)
            if p.stage_deadline is not None:
                deadline.add_metric(who, p.stage_deadline)
            for decision, stage, when in p.last_decisions:
                decisions.add_metric([*who, decision, stage], when)
            for v in p.variants:
                variant.add_metric([*who, v.variant, v.level], 1.0)
                pinned.add_metric([*who, v.variant, v.level], float(v.pinned_bytes_per_replica * v.replicas))
            for level, tier, tokens in p.tier_capacity:
                capacity.add_metric([*who, level, tier], float(tokens))
            for metric, mode, template, reading, passed in p.custom:
                if reading is not None:
                    custom_value.add_metric([*who, metric, "canary", mode, template], reading)
                if passed is not None:
                    custom_passed.add_metric([*who, metric, mode, template], 1.0 if passed else 0.0)
            for metric, mode, template, stable_reading in p.custom_stable:
                custom_value.add_metric([*who, metric, "stable", mode, template], stable_reading)
            for metric, p_reading, alpha_reading, bounds in p.evidence:
                if p_reading is not None:
                    p_value.add_metric([*who, metric], p_reading)
                if alpha_reading is not None:
                    alpha.add_metric([*who, metric], alpha_reading)
                if bounds is not None:
                    low.add_metric([*who, metric], bounds[0])
                    high.add_metric([*who, metric], bounds[1])
            for level, source, saving in p.payoff:
                payoff.add_metric([*who, level, source], saving)
        yield from (phase, condition, deadline, decisions, variant, pinned, capacity, custom_value, custom_passed)
        yield from (p_value, alpha, low, high, payoff)


class SweepTimer:
    """Times sweeps over the fleet: one begins when a reconcile starts while none runs, and ends when every
    policy watched at that moment has finished a reconcile since it began (successful or not).

    Each policy has its own loop, so a sweep is the span in which the fleet was reconciled once: the
    cost of one cycle over every policy when their loops run together, and more when they have drifted
    apart (then it is bounded by the analysis interval). Right after a start the watched set is still
    growing, so the first sweeps cover fewer policies (``kvoffload_sweep_policies`` says how many).
    """

    def __init__(self, seconds: Histogram, policies: Gauge, clock: Callable[[], float] = time.monotonic) -> None:
        self._seconds = seconds
        self._policies = policies
        self._clock = clock
        self._since: float | None = None
        self._done: set[str] = set()

    def started(self) -> None:
        """A reconcile starts: it begins a sweep unless one runs."""
        if self._since is None:
            self._since = self._clock()

    def finished(self, policy: str, watched: Collection[str]) -> None:
        """``policy`` finished a reconcile; ``watched`` are the policies the operator watches now."""
        if self._since is None:
            return
        self._done.add(policy)
        if self._done.issuperset(watched):
            self._seconds.observe(self._clock() - self._since)
            self._policies.set(len(watched))
            self._since, self._done = None, set()


class OperatorMetrics:
    """The operator's metrics; each instance has its own registry, so tests never share counters."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.decisions = Counter(
            "kvoffload_decisions", "Decisions recorded in status.history, by decision.", ["decision"], registry=r
        )
        self.verdicts = Counter("kvoffload_verdicts", "Analysis verdicts, by verdict.", ["verdict"], registry=r)
        self.cycle_seconds = Histogram(
            "kvoffload_cycle_seconds",
            "Seconds one reconcile of one policy took.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.api_errors = Counter(
            "kvoffload_api_errors",
            "Kubernetes API operations that failed, by operation and HTTP status (none: no answer; refused: the "
            "operator's own refusal).",
            ["operation", "code"],
            registry=r,
        )
        self.build_info = Gauge(
            "kvoffload_build_info",
            "1, naming the operator's version, the commit it was built from, and the Python and kopf it runs on.",
            ["version", "commit", "python", "kopf"],
            registry=r,
        )
        self.build_info.labels(**build_info()).set(1)
        self.prometheus_queries = Counter(
            "kvoffload_prometheus_queries", "PromQL queries sent to Prometheus.", registry=r
        )
        self.workload_reads = Counter(
            "kvoffload_workload_reads",
            "Reads of a policy's Deployments and pods, by source (watch or list).",
            ["source"],
            registry=r,
        )
        self.reconcile_errors = Counter(
            "kvoffload_reconcile_errors", "Reconciles that ended in an unexpected error.", registry=r
        )
        self.policies = Gauge("kvoffload_policies", "Policies per phase.", ["phase"], registry=r)
        self.notifications = Counter(
            "kvoffload_notifications",
            "Notifications by sink and by what became of them (delivered, failed, dropped).",
            ["sink", "result"],
            registry=r,
        )
        self.notification_retries = Counter(
            "kvoffload_notification_retries",
            "Failed notification delivery attempts that were tried again, by sink.",
            ["sink"],
            registry=r,
        )
        self.leader = Gauge(
            "kvoffload_leader", "1 while this replica holds the leader Lease (or runs without election).", registry=r
        )
        self.sweep_seconds = Histogram(
            "kvoffload_sweep_seconds",
            "Seconds from the start of a sweep until every watched policy had finished a reconcile since.",
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.sweep_policies = Gauge("kvoffload_sweep_policies", "Policies the last sweep covered.", registry=r)
        self.sweeps = SweepTimer(self.sweep_seconds, self.sweep_policies)
        self._phases: dict[str, str] = {}
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._per_policy: dict[str, PolicySeries] = {}
        r.register(_PolicyCollector(self._per_policy, self._lock))
        for phase in Phase:
            self.policies.labels(phase=phase.value).set(0)
        for verdict in ("Pass", "Fail", "Inconclusive"):
            self.verdicts.labels(verdict=verdict)
        for decision in Decision:  # from 0, so that increase() counts the first Rollback of a process too
            self.decisions.labels(decision=decision.value)
        for operation in API_OPERATIONS:  # at 0 from the start: a rate of errors reads 0, not "no data"
            self.api_errors.labels(operation=operation, code=NO_ANSWER)

    def watch_sinks(self, sinks: Iterable[str]) -> None:
        """Start each sink's series at 0, so that a rate of failures reads 0 rather than "no data"."""
        for sink in sinks:
            for result in Result:
                self.notifications.labels(sink=sink, result=result.value)
            self.notification_retries.labels(sink=sink)

    def count_api_error(self, operation: str, exc: BaseException) -> None:
        """Count a failed API operation under its ``code`` (:func:`api_error_code`)."""
        self.api_errors.labels(operation=operation, code=api_error_code(exc)).inc()

    def count_notification(self, sink: str, result: str) -> None:
        self.notifications.labels(sink=sink, result=result).inc()

    def count_notification_retry(self, sink: str) -> None:
        self.notification_retries.labels(sink=sink).inc()

    def count_decisions(self, decisions: Iterable[str]) -> None:
        for decision in decisions:
            self.decisions.labels(decision=decision).inc()

    def set_phase(self, policy: str, phase: str) -> None:
        """Record the phase of one policy (by uid or namespace/name)."""
        with self._lock:
            self._move(policy, phase)

    def publish_policy(self, policy: str, series: PolicySeries) -> None:
        """Record one policy's state after a cycle (by uid): its phase and its per-policy series."""
        with self._lock:
            self._move(policy, series.phase)
            self._per_policy[policy] = series

    def forget_policy(self, policy: str) -> None:
        """A policy is gone (deleted, or this operator stopped watching it): its series go too."""
        with self._lock:
            self._move(policy, None)
            self._per_policy.pop(policy, None)

    def _move(self, policy: str, phase: str | None) -> None:
        """Count the policy under ``phase`` (None: under none) instead of its last one: one reconcile changes two
        counts at most, so it costs the same whatever the size of the fleet."""
        before = self._phases.pop(policy, None)
        if phase is not None:
            self._phases[policy] = phase
        if before == phase:
            return
        if before is not None:
            self._counts[before] -= 1
            self.policies.labels(phase=before).set(self._counts[before])
        if phase is not None:
            self._counts[phase] = self._counts.get(phase, 0) + 1
            self.policies.labels(phase=phase).set(self._counts[phase])

    def serve(self, port: int, health: Health | None = None, addr: str = "0.0.0.0") -> Any:  # in-cluster scrapes
        """Serve /metrics (and the probes of ``health``) on ``port`` in a daemon thread; returns the server
        (call ``shutdown()`` to stop)."""
        return serve(port, self.registry, health, addr)
