"""Workloads: a cycle reads the engines from a watch of them (waiting for its first list), and lists only behind
the operator's own write (the ReplicaSet controller's expectations), after a failed list, or where nothing is
watched. Over HTTP against the emulated API server (its list and watch); ``tests/test_chart_rbac.py`` runs the same
on the real one, a refused watch included."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kvoffload.api.conventions import LABEL_POLICY
from kvoffload.controller.apierrors import ApiRejectedError
from kvoffload.controller.gateway import PolicyRef
from kvoffload.controller.metrics import OperatorMetrics
from kvoffload.controller.workloads import EXPECTATION_TTL, Workloads, index_deployment, index_pod
from tests.support.kube import EmulatedCluster, policy_manifest, wait_for

NS = "default"
OTHER = PolicyRef(namespace=NS, name="other", uid="uid-other")


async def make_policy(kube: EmulatedCluster) -> PolicyRef:
    """The policy "chat": the emulator's garbage collector removes whatever names an owner that does not exist."""
    return PolicyRef.from_body(await kube.emulator.create_object(policy_manifest("chat", NS)))


def deployment(name: str, *owners: str, label: bool = True) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {LABEL_POLICY: "chat"} if label else {},
            "ownerReferences": [
                {"apiVersion": "kvoffload.io/v1alpha1", "kind": "KVOffloadPolicy", "name": "chat", "uid": uid}
                for uid in owners
            ],
        },
        "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}}},
    }


def pod(name: str, policy: str | None = "chat") -> dict[str, Any]:
    labels = {LABEL_POLICY: policy} if policy else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
    }


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def reads(metrics: OperatorMetrics, source: str) -> float:
    return metrics.registry.get_sample_value("kvoffload_workload_reads_total", {"source": source}) or 0.0


Watched = tuple[Workloads, OperatorMetrics, Clock, PolicyRef]


@pytest.fixture
async def watched(kube: EmulatedCluster) -> AsyncIterator[Watched]:
    metrics, clock = OperatorMetrics(), Clock()
    workloads = Workloads(kube.gateway(), metrics, clock)
    policy = await make_policy(kube)
    for obj in (
        deployment("chat-gpu-only", policy.uid),
        deployment("bystander", policy.uid, label=False),
        pod("chat-gpu-only-0"),
    ):
        await kube.emulator.create_object(obj)
    workloads.watch(kube.api_client, None)
    try:
        await wait_for(lambda: read_from_the_watch(workloads, metrics, policy), "the watch's first list", 10)
        yield workloads, metrics, clock, policy
    finally:
        workloads.stop()


async def read_from_the_watch(workloads: Workloads, metrics: OperatorMetrics, policy: PolicyRef) -> bool:
    await workloads.owned(policy)
    return reads(metrics, "watch") > 0


def test_the_indexes_keep_only_the_engines_under_their_policy() -> None:
    assert index_deployment(deployment("bystander", "uid-chat", label=False)) == {}
    assert index_pod(pod("bystander-0", None)) == {}
    state = index_deployment(deployment("chat-cpu", "uid-chat", "uid-old"))
    assert set(state) == {"uid-chat", "uid-old"}
    assert set(index_pod(pod("chat-cpu-0"))) == {(NS, "chat")}


async def test_without_a_watch_every_read_is_a_list(kube: EmulatedCluster) -> None:
    metrics = OperatorMetrics()
    workloads = Workloads(kube.gateway(), metrics)
    policy = await make_policy(kube)
    await kube.emulator.create_object(deployment("chat-gpu-only", policy.uid))
    owned = await workloads.owned(policy)
    assert [d.name for d in owned.deployments] == ["chat-gpu-only"]
    assert (reads(metrics, "list"), reads(metrics, "watch")) == (1, 0)


async def test_a_read_before_the_watchs_first_list_waits_for_it_instead_of_listing(kube: EmulatedCluster) -> None:
    metrics = OperatorMetrics()
    workloads = Workloads(kube.gateway(), metrics)
    policy = await make_policy(kube)
    await kube.emulator.create_object(deployment("chat-gpu-only", policy.uid))
    await kube.emulator.create_object(pod("chat-gpu-only-0"))
    workloads.watch(kube.api_client, [NS])
    try:
        first, second = await asyncio.gather(workloads.owned(policy), workloads.owned(policy))
    finally:
        workloads.stop()
    for owned in (first, second):
        assert [d.name for d in owned.deployments] == ["chat-gpu-only"]
        assert [p.name for p in owned.pods] == ["chat-gpu-only-0"]
    assert (reads(metrics, "list"), reads(metrics, "watch")) == (0, 2)


async def test_namespace_patterns_are_not_watched(kube: EmulatedCluster) -> None:
    metrics = OperatorMetrics()
    workloads = Workloads(kube.gateway(), metrics)
    workloads.watch(kube.api_client, ["llm-*"])
    await workloads.owned(OTHER)
    assert reads(metrics, "list") == 1


async def test_the_watch_follows_adds_changes_relabels_and_deletes_without_a_list(
    kube: EmulatedCluster, watched: Watched
) -> None:
    workloads, metrics, _, policy = watched
    listed = reads(metrics, "list")
    owned = await workloads.owned(policy)
    assert [d.name for d in owned.deployments] == ["chat-gpu-only"]  # not the bystander
    assert [p.name for p in owned.pods] == ["chat-gpu-only-0"]

    await kube.emulator.create_object(deployment("chat-cpu", policy.uid))
    await kube.emulator.create_object(pod("chat-cpu-0"))
    await kube.emulator.create_object(pod("other-0", "other"))
    ready = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    await kube.emulator.patch_object("v1", "Pod", NS, "chat-cpu-0", {"status": ready}, subresource="status")

    async def seen() -> bool:
        owned = await workloads.owned(policy)
        return [d.name for d in owned.deployments] == ["chat-cpu", "chat-gpu-only"] and [
            (p.name, p.ready) for p in owned.pods
        ] == [("chat-cpu-0", True), ("chat-gpu-only-0", False)]

    await wait_for(seen, "the new Deployment and the Ready pod", 10)

    await kube.emulator.delete_object("apps/v1", "Deployment", NS, "chat-gpu-only")
    await kube.emulator.patch_object("v1", "Pod", NS, "chat-gpu-only-0", {"metadata": {"labels": {LABEL_POLICY: None}}})

    async def gone() -> bool:
        owned = await workloads.owned(policy)
        return [d.name for d in owned.deployments] == ["chat-cpu"] and [p.name for p in owned.pods] == ["chat-cpu-0"]

    await wait_for(gone, "the deleted Deployment and the pod that lost its label gone", 10)
    assert reads(metrics, "list") == listed


async def test_after_its_own_write_a_policy_lists_until_the_watch_shows_that_version(
    kube: EmulatedCluster, watched: Watched
) -> None:
    workloads, metrics, clock, policy = watched
    stored = await kube.gateway().apply(deployment("chat-cpu"), policy)
    version = stored["metadata"]["resourceVersion"]
    workloads.wrote(policy, "chat-cpu", f"{version}-never")  # a version the watch never delivers
    listed = reads(metrics, "list")
    owned = await workloads.owned(policy)
    assert reads(metrics, "list") == listed + 1
    assert "chat-cpu" in [d.name for d in owned.deployments]  # the list is read-after-write
    # another policy is not held back by this one's write
    await workloads.owned(OTHER)
    assert reads(metrics, "list") == listed + 1
    clock.now += EXPECTATION_TTL + 1  # a write the watch never shows stops holding the policy back
    await workloads.owned(policy)
    assert reads(metrics, "list") == listed + 1

    workloads.wrote(policy, "chat-cpu", version)  # the real one: the watch shows it at once or soon after

    async def from_the_watch() -> bool:
        before = reads(metrics, "list")
        owned = await workloads.owned(policy)
        return reads(metrics, "list") == before and "chat-cpu" in [d.name for d in owned.deployments]

    await wait_for(from_the_watch, "the watch to show the write", 10)


async def test_a_write_followed_by_other_changes_counts_as_delivered_by_its_own_version(
    kube: EmulatedCluster, watched: Watched
) -> None:
    """resourceVersions are compared for equality only: the watch remembers the versions it delivered, so a write
    that the Deployment controller has since changed again (a status update) still reads as shown."""
    workloads, metrics, _, policy = watched
    stored = await kube.gateway().apply(deployment("chat-cpu"), policy)
    written = stored["metadata"]["resourceVersion"]
    for ready in (1, 2):
        await kube.emulator.patch_object(
            "apps/v1", "Deployment", NS, "chat-cpu", {"status": {"readyReplicas": ready}}, subresource="status"
        )
    workloads.wrote(policy, "chat-cpu", written)

    async def from_the_watch() -> bool:
        before = reads(metrics, "list")
        owned = await workloads.owned(policy)
        ready = [d.ready_replicas for d in owned.deployments if d.name == "chat-cpu"]
        return reads(metrics, "list") == before and ready == [2]

    await wait_for(from_the_watch, "the watch to show the write and the changes after it", 10)


async def test_after_a_delete_a_policy_lists_until_the_watch_shows_it_gone(
    kube: EmulatedCluster, watched: Watched
) -> None:
    workloads, metrics, _, policy = watched
    workloads.deleted(policy, "chat-gpu-only")  # not deleted yet: the watch still shows it
    listed = reads(metrics, "list")
    await workloads.owned(policy)
    assert reads(metrics, "list") == listed + 1
    await kube.gateway().delete_owned("Deployment", "chat-gpu-only", policy)

    async def from_the_watch() -> bool:
        before = reads(metrics, "list")
        owned = await workloads.owned(policy)
        return reads(metrics, "list") == before and owned.deployments == ()

    await wait_for(from_the_watch, "the watch to show the delete", 10)


async def test_a_refused_watch_fails_the_read_with_the_api_servers_message(kube: EmulatedCluster) -> None:
    workloads = Workloads(kube.gateway(), OperatorMetrics())
    policy = await make_policy(kube)
    kube.emulator.fail_next(403, method="GET", plural="pods", times=1_000, message='cannot watch resource "pods"')
    workloads.watch(kube.api_client, [NS])
    try:

        async def refused() -> bool:
            try:
                await workloads.owned(policy)
            except ApiRejectedError as exc:
                return 'cannot watch resource "pods"' in str(exc) and exc.status == 403
            return False

        await wait_for(refused, "the refusal", 10)
    finally:
        workloads.stop()
