"""kvoffload_sweep_seconds: one sweep lasts until every watched policy has finished a reconcile since it began."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, cast

from kvoffload.controller.handlers import PolicyRuntime
from kvoffload.controller.metrics import OperatorMetrics, SweepTimer
from kvoffload.controller.reconcile import Controller
from kvoffload.rollout.plan import Plan


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def sample(metrics: OperatorMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name)


def test_a_sweep_ends_when_every_watched_policy_has_finished_once() -> None:
    metrics = OperatorMetrics()
    clock = FakeClock()
    timer = SweepTimer(metrics.sweep_seconds, metrics.sweep_policies, clock)
    watched = {"a", "b", "c"}
    timer.started()
    clock.now += 0.5
    timer.started()  # a second reconcile starting does not restart the sweep
    timer.finished("a", watched)
    timer.finished("a", watched)  # the same policy again does not complete it
    clock.now += 1.0
    timer.finished("b", watched)
    assert sample(metrics, "kvoffload_sweep_seconds_count") == 0
    clock.now += 0.25
    timer.finished("c", watched)
    assert sample(metrics, "kvoffload_sweep_seconds_count") == 1
    assert sample(metrics, "kvoffload_sweep_seconds_sum") == 1.75
    assert sample(metrics, "kvoffload_sweep_policies") == 3

    # The next sweep starts with the next reconcile, not when the last one ended.
    clock.now += 10.0
    timer.finished("a", watched)  # finished with no sweep running: ignored
    timer.started()
    clock.now += 2.0
    for policy in ("c", "a"):
        timer.finished(policy, watched)
    timer.finished("b", {"a", "b"})  # "c" went away meanwhile
    assert sample(metrics, "kvoffload_sweep_seconds_count") == 2
    assert sample(metrics, "kvoffload_sweep_seconds_sum") == 3.75
    assert sample(metrics, "kvoffload_sweep_policies") == 2


def test_the_operator_metrics_time_sweeps_on_their_own_histogram() -> None:
    metrics = OperatorMetrics()
    metrics.sweeps.started()
    metrics.sweeps.finished("only", {"only"})
    assert sample(metrics, "kvoffload_sweep_seconds_count") == 1
    assert sample(metrics, "kvoffload_sweep_policies") == 1


class CountingController:
    """Stands in for the Controller: every reconcile plans nothing (a Plan with no requeue is all the runtime reads)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def reconcile(self, body: Mapping[str, Any]) -> Plan:
        self.calls.append(body["metadata"]["uid"])
        return cast(Plan, SimpleNamespace(requeue_after=None))


async def test_the_policy_runtime_times_a_sweep_over_the_policies_it_watches() -> None:
    metrics = OperatorMetrics()
    controller = CountingController()
    runtime = PolicyRuntime(lambda: cast(Controller, controller), metrics=metrics)
    bodies = [{"metadata": {"uid": uid, "namespace": "ns", "name": uid}} for uid in ("a", "b")]
    for body in bodies:
        runtime.slot(body["metadata"]["uid"])  # both watched, as their daemons would have made them
    await runtime.reconcile(bodies[0])
    assert sample(metrics, "kvoffload_sweep_seconds_count") == 0
    await runtime.reconcile(bodies[1])
    assert controller.calls == ["a", "b"]
    assert sample(metrics, "kvoffload_sweep_seconds_count") == 1
    assert sample(metrics, "kvoffload_sweep_policies") == 2
