"""The reconcile cycle tells what its status write decided, against the emulated API server and a real local
HTTP receiver: once per transition, not again after a restart, nothing for a write that failed, never at the
cost of a decision when the receiver is down, and an invalid spec too (an unknown sink among its faults)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kvoffload.analysis.hub import MeasurementHub
from kvoffload.api.conventions import KIND, PAUSE, PROMOTE
from kvoffload.controller.apierrors import ApiRejectedError
from kvoffload.controller.cycle import ReconcileError
from kvoffload.controller.metrics import OperatorMetrics
from kvoffload.controller.reconcile import Controller
from kvoffload.controller.settings import ControllerSettings
from kvoffload.notify.config import NotificationsConfig
from kvoffload.notify.notifier import Notifier
from kvoffload.policy.tenancy import SinkGrant, Tenancy
from tests.controller.test_controller import (
    NS,
    POLICY_API,
    Clock,
    CraftedProvider,
    chat_spec,
    create_policy,
    deployment,
    policy_body,
    reconcile_until,
    run_pods,
    status_of,
)
from tests.support.kube import EmulatedCluster
from tests.support.receiver import Receiver, free_port

pytestmark = pytest.mark.e2e

SETTINGS = ControllerSettings(tenancy=Tenancy(notification_sinks=(SinkGrant("team"),)))


def told_spec(**notifications: Any) -> dict[str, Any]:
    return {**chat_spec(), "notifications": {"sinks": ["team"], **notifications}}


def operator(
    kube: EmulatedCluster, url: str, clock: Clock, metrics: OperatorMetrics | None = None, **sink: Any
) -> tuple[Controller, Notifier]:
    """A Controller with a notifier whose one sink, team, posts to ``url``; the notifier started."""
    metrics = metrics or OperatorMetrics()
    config = NotificationsConfig.model_validate(
        {"sinks": [{"name": "team", "url": url, "backoffSeconds": 0.05, "maxBackoffSeconds": 0.1, **sink}]}
    )
    metrics.watch_sinks(config.names)
    notifier = Notifier(config, metrics.count_notification, metrics.count_notification_retry)
    notifier.start()
    hub = MeasurementHub(CraftedProvider(), gather_window=0.0)
    return Controller(kube.gateway(), hub, SETTINGS, clock=clock, metrics=metrics, notifier=notifier), notifier


async def cycles(controller: Controller, kube: EmulatedCluster, clock: Clock, count: int) -> None:
    for _ in range(count):
        clock.advance(1.0)
        await controller.reconcile(policy_body(kube))


async def pause(kube: EmulatedCluster) -> None:
    await kube.emulator.patch_object(POLICY_API, KIND, NS, "chat", {"metadata": {"annotations": {PAUSE: "1"}}})


async def test_a_pause_is_told_once_and_a_restarted_operator_does_not_tell_it_again(kube: EmulatedCluster) -> None:
    clock = Clock()
    with Receiver() as receiver:
        controller, notifier = operator(kube, receiver.url, clock)
        await create_policy(kube, spec=told_spec())
        await cycles(controller, kube, clock, 2)  # a new ladder and its baseline: nothing to tell
        await pause(kube)
        await cycles(controller, kube, clock, 5)
        notifier.close()  # every queued notification delivered (or counted)

        restarted, again = operator(kube, receiver.url, clock)
        await cycles(restarted, kube, clock, 3)
        again.close()
    assert status_of(kube)["phase"] == "Paused"
    (paused,) = receiver.bodies
    assert (paused["event"], paused["reason"], paused["policy"]) == (
        "Paused",
        "Paused",
        {"namespace": NS, "name": "chat"},
    )
    assert paused["level"] == "gpu-only"


async def test_a_receiver_that_is_down_costs_no_decision_and_is_counted_when_given_up(kube: EmulatedCluster) -> None:
    clock = Clock()
    metrics = OperatorMetrics()
    controller, notifier = operator(kube, f"http://127.0.0.1:{free_port()}/hook", clock, metrics, maxAttempts=3)
    await create_policy(kube, spec=told_spec())
    await cycles(controller, kube, clock, 2)
    await pause(kube)
    await cycles(controller, kube, clock, 1)
    assert status_of(kube)["phase"] == "Paused"  # decided and written while the notification waits
    assert [h["decision"] for h in status_of(kube)["history"]][-1] == "Pause"

    def failed() -> float:
        return (
            metrics.registry.get_sample_value("kvoffload_notifications_total", {"sink": "team", "result": "failed"})
            or 0
        )

    deadline = time.monotonic() + 10
    while failed() < 1:
        assert time.monotonic() < deadline, "the notification was not given up"
        await cycles(controller, kube, clock, 1)  # the operator goes on meanwhile
    notifier.close()
    retries = metrics.registry.get_sample_value("kvoffload_notification_retries_total", {"sink": "team"})
    assert (failed(), retries) == (1, 2)


async def test_a_status_write_that_fails_tells_nothing_and_the_next_one_tells_once(kube: EmulatedCluster) -> None:
    clock = Clock()
    with Receiver() as receiver:
        controller, notifier = operator(kube, receiver.url, clock)
        await create_policy(kube, spec=told_spec())
        await cycles(controller, kube, clock, 2)
        await pause(kube)
        real = controller.gateway.patch_status

        async def refused(*args: Any, **kwargs: Any) -> Any:
            raise ApiRejectedError("patch status: 500 etcd timed out", 500)

        controller.gateway.patch_status = refused  # type: ignore[method-assign]
        with pytest.raises(ReconcileError):
            await cycles(controller, kube, clock, 1)
        controller.gateway.patch_status = real  # type: ignore[method-assign]
        await cycles(controller, kube, clock, 3)
        notifier.close()
    assert [b["event"] for b in receiver.bodies] == ["Paused"]


async def test_an_invalid_spec_is_told_and_an_unknown_sink_is_one_of_its_faults(kube: EmulatedCluster) -> None:
    clock = Clock()
    with Receiver() as receiver:
        controller, notifier = operator(kube, receiver.url, clock)
        spec = {**told_spec(), "notifications": {"sinks": ["team", "nowhere"]}}
        await create_policy(kube, spec=spec)
        await cycles(controller, kube, clock, 3)
        notifier.close()
    status = status_of(kube)
    assert status["phase"] == "Invalid"
    (invalid,) = receiver.bodies  # to the sink it may name; "nowhere" is no address at all
    assert invalid["event"] == "Invalid"
    assert (
        "spec.notifications.sinks[1]: nowhere is not a notification sink this operator has "
        "(namespace llm may name: team)" in invalid["message"]
    )


def awaiting_promotion(kube: EmulatedCluster) -> bool:
    conditions = status_of(kube).get("conditions") or []
    return any(c["type"] == "Progressing" and c["reason"] == "AwaitingPromotion" for c in conditions)


async def test_a_step_awaiting_a_person_and_its_promotion_are_told_through_the_cycle(kube: EmulatedCluster) -> None:
    clock = Clock()
    spec = told_spec()
    spec["rollout"] = {**spec["rollout"], "autoPromote": False}
    with Receiver() as receiver:
        controller, notifier = operator(kube, receiver.url, clock)
        await create_policy(kube, spec=spec)
        await cycles(controller, kube, clock, 1)
        await run_pods(kube, "chat-gpu-only", 4)
        await reconcile_until(controller, kube, clock, lambda: deployment(kube, "chat-cpu") is not None)
        await run_pods(kube, "chat-cpu", 1)
        await reconcile_until(controller, kube, clock, lambda: awaiting_promotion(kube), limit=120)
        receiver.wait_for(1)
        await cycles(controller, kube, clock, 10)  # it waits, cycle after cycle
        await kube.emulator.patch_object(POLICY_API, KIND, NS, "chat", {"metadata": {"annotations": {PROMOTE: "1"}}})
        await cycles(controller, kube, clock, 2)
        notifier.close()
    awaiting, promoted = receiver.bodies
    assert (awaiting["event"], awaiting["level"], awaiting["step"], awaiting["canary"]) == (
        "AwaitingPromotion",
        "cpu",
        0,
        "cpu",
    )
    assert PROMOTE in awaiting["message"]
    assert (promoted["event"], promoted["decision"], promoted["level"]) == ("Promoted", "ManualPromote", "cpu")
