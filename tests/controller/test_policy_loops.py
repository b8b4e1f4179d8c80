"""The loops the runtime owns (``PolicyRuntime(owns_loops=True)``): one per policy, started by its first watch event,
ended by its deletion or the operator's stop, fed the newest body, and never more cycles in flight than allowed."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, cast

from kvoffload.controller.bodies import unpacked_body
from kvoffload.controller.handlers import ARRIVALS_QUIET, LoopSettings, PolicyRuntime
from kvoffload.controller.metrics import OperatorMetrics
from kvoffload.controller.reconcile import Controller
from kvoffload.rollout.plan import Plan
from tests.support.kube import wait_for


class GatedController:
    """Stands in for the Controller: each reconcile waits at a gate, and the runtime reads only its requeue."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0
        self.seen: list[tuple[str, object]] = []
        self.forgotten: list[str] = []
        self.listed = asyncio.Event()
        self.listed.set()
        self.synced_at: list[float] = []

    async def reconcile(self, body: Mapping[str, Any] | bytes) -> Plan:
        if isinstance(body, bytes):
            body = unpacked_body(body)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.gate.wait()
        finally:
            self.in_flight -= 1
        self.seen.append((body["metadata"]["uid"], body["spec"]["replicas"]))
        return cast(Plan, SimpleNamespace(requeue_after=None))

    async def synced(self, namespace: str) -> None:
        self.synced_at.append(asyncio.get_running_loop().time())
        await self.listed.wait()

    def forget(self, uid: str) -> None:
        self.forgotten.append(uid)


def body(uid: str, replicas: int = 1, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "namespace": "llm", "name": uid, "generation": 1, **meta},
        "spec": {"replicas": replicas, "analysis": {"interval": "1h"}},
    }


async def test_no_more_cycles_are_in_flight_than_allowed_and_every_policy_gets_its_turn() -> None:
    controller = GatedController()
    runtime = PolicyRuntime(lambda: cast(Controller, controller), LoopSettings(max_concurrent=3), OperatorMetrics())
    await runtime.start()
    for i in range(10):
        runtime.noticed(body(f"p{i}"))
    await wait_for(lambda: controller.in_flight == 3, "three cycles in flight")
    await asyncio.sleep(0.1)
    assert controller.in_flight == 3  # the other seven wait for a turn, holding no cycle's state
    controller.gate.set()
    await wait_for(lambda: len(controller.seen) == 10, "every policy's cycle")
    assert controller.most_in_flight == 3
    assert sorted(uid for uid, _ in controller.seen) == sorted(f"p{i}" for i in range(10))
    await runtime.stop()


async def test_a_cycle_reads_the_newest_body_and_deletion_or_a_stop_ends_the_loops() -> None:
    controller = GatedController()
    runtime = PolicyRuntime(lambda: cast(Controller, controller), LoopSettings(max_concurrent=1), OperatorMetrics())
    await runtime.start()
    runtime.noticed(body("first"))
    await wait_for(lambda: controller.in_flight == 1, "the first cycle in flight")
    runtime.noticed(body("second", replicas=2))
    runtime.noticed(body("second", replicas=5))  # seen while it waited for its turn
    controller.gate.set()
    await wait_for(lambda: len(controller.seen) == 2, "both cycles")
    assert controller.seen == [("first", 1), ("second", 5)]

    runtime.noticed(body("first"), "DELETED")
    await wait_for(lambda: controller.forgotten == ["first"], "the deleted policy's loop to end")
    runtime.noticed(body("second", deletionTimestamp="2026-12-03T00:00:00Z"))  # going: the loop ends at once
    await wait_for(lambda: controller.forgotten == ["first", "second"], "the going policy's loop to end")

    runtime.noticed(body("third"))
    await wait_for(lambda: len(controller.seen) == 3, "the third policy's cycle")
    await runtime.stop()
    assert controller.forgotten == ["first", "second", "third"]
    runtime.noticed(body("fourth"))  # after the stop no loop starts
    await asyncio.sleep(0.05)
    assert len(controller.seen) == 3


async def test_first_cycles_wait_until_the_listed_policies_stop_arriving() -> None:
    controller = GatedController()
    controller.gate.set()
    runtime = PolicyRuntime(lambda: cast(Controller, controller), LoopSettings(), OperatorMetrics())
    await runtime.start()
    for i in range(10):  # as kopf hands a list over, one event at a time
        runtime.noticed(body(f"p{i}"))
        await asyncio.sleep(0.02)
    last_arrival = asyncio.get_running_loop().time()
    await wait_for(lambda: len(controller.seen) == 10, "every policy's first cycle")
    assert min(controller.synced_at) >= last_arrival + ARRIVALS_QUIET - 0.05
    await runtime.stop()


async def test_first_cycles_wait_for_the_engines_first_lists() -> None:
    controller = GatedController()
    controller.gate.set()
    controller.listed.clear()
    runtime = PolicyRuntime(lambda: cast(Controller, controller), LoopSettings(max_concurrent=2), OperatorMetrics())
    await runtime.start()
    for i in range(5):
        runtime.noticed(body(f"p{i}"))
    await wait_for(lambda: len(controller.synced_at) == 5, "every loop waiting for the lists")  # none holds a turn
    assert controller.seen == []
    controller.listed.set()
    await wait_for(lambda: len(controller.seen) == 5, "every policy's first cycle")
    await runtime.stop()


class TimedController:
    """Stands in for the Controller: each cycle takes ``takes`` seconds and its plan asks to come back after
    ``requeue`` (None: not at all); records when each cycle began and ended (loop time)."""

    def __init__(self, takes: float, requeue: float | None) -> None:
        self.takes, self.requeue = takes, requeue
        self.began: list[float] = []
        self.ended: list[float] = []

    async def reconcile(self, body: Mapping[str, Any] | bytes) -> Plan:
        loop = asyncio.get_running_loop()
        self.began.append(loop.time())
        await asyncio.sleep(self.takes)
        self.ended.append(loop.time())
        return cast(Plan, SimpleNamespace(requeue_after=self.requeue))

    async def synced(self, namespace: str) -> None:
        return None

    def forget(self, uid: str) -> None:
        return None


async def _cycles(controller: TimedController, interval: str, count: int) -> list[float]:
    """Run one policy's loop for ``count`` cycles; the gaps between their starts."""
    runtime = PolicyRuntime(lambda: cast(Controller, controller), LoopSettings(), OperatorMetrics())
    await runtime.start()
    policy = body("timed")
    policy["spec"]["analysis"]["interval"] = interval
    runtime.noticed(policy)
    await wait_for(lambda: len(controller.began) >= count, f"{count} cycles", timeout=20)
    await runtime.stop()
    return [b - a for a, b in zip(controller.began, controller.began[1:], strict=False)][: count - 1]


async def test_analyses_come_every_interval_from_cycle_start_to_cycle_start_not_an_interval_after_each_ends() -> None:
    gaps = await _cycles(TimedController(takes=0.4, requeue=None), "1s", 3)
    assert all(0.99 <= gap < 1.25 for gap in gaps), gaps  # not 1.4 s: the cycle's own time is not added


async def test_a_plans_requeue_counts_from_the_cycles_start_even_within_the_min_gap_of_its_end() -> None:
    # The plan says the next decision is due 0.3 s after this one began (a breach sustained then): the loop comes back
    # then, though that is within MIN_GAP (0.5 s) of the cycle's end (0.2 s in), and not 0.3 s after its end.
    gaps = await _cycles(TimedController(takes=0.2, requeue=0.3), "1h", 3)
    assert all(0.3 <= gap < 0.5 for gap in gaps), gaps  # 0.7 s before: MIN_GAP after the end


async def test_a_requeue_later_than_the_interval_waits_only_the_interval() -> None:
    gaps = await _cycles(TimedController(takes=0.05, requeue=5.0), "1s", 2)
    assert all(0.99 <= gap < 1.25 for gap in gaps), gaps


async def test_a_requeue_of_zero_never_spins_the_loop() -> None:
    controller = TimedController(takes=0.05, requeue=0.0)
    await _cycles(controller, "1h", 4)
    rests = [b - e for e, b in zip(controller.ended, controller.began[1:], strict=False)]
    assert all(rest >= LoopSettings().min_interval - 0.01 for rest in rests), rests
