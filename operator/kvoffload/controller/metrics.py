"""The operator's own Prometheus metrics, in a registry of their own.

``kvoffload run --metrics-port P`` serves them at ``/metrics``. They say what the
operator decided and how it is doing, not what the engines do (those come from vLLM):

- ``kvoffload_decisions_total{decision}``: history entries written (Rollback, Promoted...).
- ``kvoffload_verdicts_total{verdict}``: analysis verdicts (Pass, Fail, Inconclusive).
- ``kvoffload_cycle_seconds``: how long one reconcile of one policy took.
- ``kvoffload_api_errors_total{operation}``: Kubernetes API operations that failed.
- ``kvoffload_prometheus_queries_total``: PromQL queries sent (per cycle, constant in the policies).
- ``kvoffload_policies{phase}``: policies per phase.
- ``kvoffload_reconcile_errors_total``: reconciles that ended in an unexpected error.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from kvoffload.api.types import Phase


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
            "kvoffload_api_errors", "Kubernetes API operations that failed, by operation.", ["operation"], registry=r
        )
        self.prometheus_queries = Counter(
            "kvoffload_prometheus_queries", "PromQL queries sent to Prometheus.", registry=r
        )
        self.reconcile_errors = Counter(
            "kvoffload_reconcile_errors", "Reconciles that ended in an unexpected error.", registry=r
        )
        self.policies = Gauge("kvoffload_policies", "Policies per phase.", ["phase"], registry=r)
        self._phases: dict[str, str] = {}
        self._lock = threading.Lock()
        for phase in Phase:
            self.policies.labels(phase=phase.value).set(0)
        for verdict in ("Pass", "Fail", "Inconclusive"):
            self.verdicts.labels(verdict=verdict)

    def count_decisions(self, decisions: Iterable[str]) -> None:
        for decision in decisions:
            self.decisions.labels(decision=decision).inc()

    def set_phase(self, policy: str, phase: str) -> None:
        """Record the phase of one policy (by uid or namespace/name)."""
        with self._lock:
            self._phases[policy] = phase
            self._publish()

    def forget_policy(self, policy: str) -> None:
        """A policy is gone (deleted, or this operator stopped watching it)."""
        with self._lock:
            self._phases.pop(policy, None)
            self._publish()

    def _publish(self) -> None:
        counts = {phase.value: 0 for phase in Phase}
        for phase in self._phases.values():
            counts[phase] = counts.get(phase, 0) + 1
        for phase, count in counts.items():
            self.policies.labels(phase=phase).set(count)

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:  # scraped from inside the cluster
        """Serve /metrics on ``port`` in a daemon thread; returns the server (call ``shutdown()`` to stop)."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server
