"""Workloads: a cycle reads the engines from the watch, and by a list until the watch shows the operator's own
write (the ReplicaSet controller's expectations)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from kvoffload.api.conventions import LABEL_POLICY
from kvoffload.controller.gateway import KubernetesGateway, OwnedWorkloads, PolicyRef
from kvoffload.controller.metrics import OperatorMetrics
from kvoffload.controller.workloads import EXPECTATION_TTL, Workloads, index_deployment, index_pod

POLICY = PolicyRef(namespace="team", name="chat", uid="uid-chat")


def deployment(
    name: str, version: int, *, owners: tuple[str, ...] = ("uid-chat",), label: bool = True
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team",
            "resourceVersion": str(version),
            "labels": {LABEL_POLICY: "chat"} if label else {},
            "ownerReferences": [{"uid": uid, "controller": True} for uid in owners],
        },
        "spec": {"replicas": 2},
        "status": {"readyReplicas": 1},
    }


def pod(name: str, policy: str | None = "chat") -> dict[str, Any]:
    labels = {LABEL_POLICY: policy} if policy else {}
    return {"metadata": {"name": name, "namespace": "team", "labels": labels}, "status": {"phase": "Running"}}


class Listing:
    """Stands in for the gateway's list: counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def list_owned(self, policy: PolicyRef) -> OwnedWorkloads:
        self.calls += 1
        return OwnedWorkloads(deployments=(), pods=())


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def indexes(*deployments: dict[str, Any]) -> tuple[dict[Any, list[Any]], dict[Any, list[Any]]]:
    """What kopf's indexes hold after these objects' events."""
    by_owner: dict[Any, list[Any]] = {}
    for body in deployments:
        for key, value in index_deployment(body).items():
            by_owner.setdefault(key, []).append(value)
    by_policy: dict[Any, list[Any]] = {}
    for body in (pod("chat-cpu-1"), pod("chat-cpu-0"), pod("other-0", "other")):
        for key, value in index_pod(body).items():
            by_policy.setdefault(key, []).append(value)
    return by_owner, by_policy


def workloads() -> tuple[Workloads, Listing, Clock, OperatorMetrics]:
    listing, clock, metrics = Listing(), Clock(), OperatorMetrics()
    return Workloads(cast(KubernetesGateway, listing), metrics, clock), listing, clock, metrics


def reads(metrics: OperatorMetrics, source: str) -> float:
    return metrics.registry.get_sample_value("kvoffload_workload_reads_total", {"source": source}) or 0.0


def test_the_indexes_keep_only_the_engines_under_their_policy() -> None:
    assert index_deployment(deployment("bystander", 1, label=False)) == {}
    assert index_pod(pod("bystander-0", None)) == {}
    state = index_deployment(deployment("chat-cpu", 7, owners=("uid-chat", "uid-old")))
    assert set(state) == {"uid-chat", "uid-old"}
    assert state["uid-chat"].resource_version == 7
    assert state["uid-chat"].ready_replicas == 1
    assert set(index_pod(pod("chat-cpu-0"))) == {("team", "chat")}


async def test_without_a_watch_every_read_is_a_list() -> None:
    reader, listing, _, metrics = workloads()
    await reader.owned(POLICY)
    await reader.owned(POLICY)
    assert listing.calls == 2
    assert (reads(metrics, "list"), reads(metrics, "watch")) == (2, 0)


async def test_with_a_watch_a_read_makes_no_call_and_is_sorted_by_name() -> None:
    reader, listing, _, metrics = workloads()
    reader.attach(*indexes(deployment("chat-gpu-only", 5), deployment("chat-cpu", 6)))
    owned = await reader.owned(POLICY)
    assert listing.calls == 0
    assert [d.name for d in owned.deployments] == ["chat-cpu", "chat-gpu-only"]
    assert [p.name for p in owned.pods] == ["chat-cpu-0", "chat-cpu-1"]  # not the other policy's
    assert reads(metrics, "watch") == 1


async def test_after_its_own_write_a_policy_lists_until_the_watch_shows_that_version() -> None:
    reader, listing, _, _ = workloads()
    deployments, pods = indexes(deployment("chat-cpu", 6))
    reader.attach(deployments, pods)
    reader.wrote(POLICY, "chat-cpu", 9)
    await reader.owned(POLICY)
    assert listing.calls == 1  # the watch still shows version 6
    deployments.update(indexes(deployment("chat-cpu", 10))[0])  # a later version than the write's: caught up
    await reader.owned(POLICY)
    await reader.owned(POLICY)
    assert listing.calls == 1
    # another policy is not held back by this one's write
    reader.wrote(POLICY, "chat-cpu", 11)
    await reader.owned(PolicyRef(namespace="team", name="other", uid="uid-other"))
    assert listing.calls == 1


async def test_after_a_delete_a_policy_lists_until_the_watch_shows_it_gone() -> None:
    reader, listing, _, _ = workloads()
    deployments, pods = indexes(deployment("chat-cpu", 6))
    reader.attach(deployments, pods)
    reader.deleted(POLICY, "chat-cpu")
    await reader.owned(POLICY)
    assert listing.calls == 1
    deployments.clear()
    owned = await reader.owned(POLICY)
    assert listing.calls == 1
    assert owned.deployments == ()


@pytest.mark.parametrize("forgotten", [False, True], ids=["expired", "forgotten"])
async def test_a_write_the_watch_never_shows_stops_holding_the_policy_back(forgotten: bool) -> None:
    reader, listing, clock, _ = workloads()
    reader.attach(*indexes(deployment("chat-cpu", 6)))
    reader.wrote(POLICY, "chat-cpu", 9)
    await reader.owned(POLICY)
    assert listing.calls == 1
    if forgotten:
        reader.forget(POLICY.uid)
    else:
        clock.now += EXPECTATION_TTL + 1
    await reader.owned(POLICY)
    assert listing.calls == 1
