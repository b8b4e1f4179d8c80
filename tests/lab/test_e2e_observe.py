"""End to end, on the real control plane: an observe-only policy climbs the whole ladder in status over a team's own
running fleet, and changes no Deployment (issue 24, item 5).

The team's fleet is a Deployment of emulated vLLM engines that kvoffload did not render (no kvoffload label, no
owner), scraped through a PodMonitor of the team's own, which the real Prometheus Operator turns into Prometheus'
configuration: its series carry ``namespace`` and ``pod``, nothing of kvoffload's. ``kvoffload run`` (kopf over
HTTPS, the real kube-apiserver v1.37 with its controllers and scheduler) analyses that fleet. The checks are on the
API server's own record: the team's Deployment keeps its generation and spec, no field manager ``kvoffload``
appears on any object of the namespace, no pod is replaced, and no object of the policy's is made.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kvoffload.api.types import KVOffloadPolicy
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.render import render_deployment
from kvoffload_lab.load import replay
from tests.lab.test_e2e import CLIMB, in_namespace, in_phase, policy_doc
from tests.support.cluster import LOAD_SCALE, Cluster, OperatorProcess, either_cluster, eventually, reuse_trace

pytestmark = [pytest.mark.e2e, pytest.mark.prometheus, pytest.mark.kube, pytest.mark.timeout(300)]

TEAM = {"app": "team-vllm"}
TEAM_SELECTOR = "app=team-vllm"
LAB_RELEASE = {"release": "kvoffload-lab"}  # what the lab's Prometheus selects PodMonitors on


@pytest_asyncio.fixture
async def local_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, cluster_engine_args: list[str]
) -> AsyncIterator[Cluster]:
    """The real control plane only: the point is what kube-apiserver records of every write."""
    async with either_cluster("kube", request, tmp_path / "cluster", cluster_engine_args) as cluster:
        yield cluster


def observe_doc(cluster: Cluster) -> dict[str, Any]:
    doc = policy_doc("chat", cluster, max_inconclusive=200)  # the fleet's first scrape comes after the first cycles
    doc["spec"]["rollout"] |= {"observeOnly": True, "observe": {"selector": {"matchLabels": TEAM}}}
    return doc


def team_fleet(doc: dict[str, Any], cluster: Cluster) -> list[dict[str, Any]]:
    """The team's own Deployment of engines (what a GPU-only vLLM fleet runs, its labels its own) and PodMonitor."""
    spec = {**doc["spec"], "rollout": {k: v for k, v in doc["spec"]["rollout"].items() if not k.startswith("observe")}}
    policy = KVOffloadPolicy.model_validate({**doc, "spec": spec})
    deployment = render_deployment(policy, build_ladder(policy.spec)[0], policy.spec.replicas)
    deployment["metadata"] = {"name": "team-vllm", "namespace": cluster.namespace, "labels": dict(TEAM)}
    deployment["spec"]["selector"] = {"matchLabels": dict(TEAM)}
    deployment["spec"]["template"]["metadata"] = {"labels": dict(TEAM)}
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "team-vllm", "namespace": cluster.namespace, "labels": dict(LAB_RELEASE)},
        "spec": {
            "selector": {"matchLabels": dict(TEAM)},
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "1s"}],
        },
    }
    return [deployment, monitor]


@contextlib.asynccontextmanager
async def load_on_team(cluster: Cluster) -> AsyncIterator[None]:
    """The team's traffic, to its Ready engines."""
    task = asyncio.create_task(
        replay(
            lambda: [engine.url for engine in cluster.kubelet.engines.matching(TEAM_SELECTOR, cluster.namespace)],
            reuse_trace(),
            model="chat",
            speedup=1.0,
            duration=600.0,
            scale=LOAD_SCALE,
            max_tokens=4,
        )
    )
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def managers(obj: dict[str, Any]) -> set[str]:
    return {entry.get("manager", "") for entry in obj["metadata"].get("managedFields") or []}


async def workload_record(cluster: Cluster) -> dict[str, Any]:
    """What the API server holds of the namespace's workloads: each object's name, uid and writers."""
    record: dict[str, Any] = {}
    for group_version, plural in (
        ("apps/v1", "deployments"),
        ("apps/v1", "replicasets"),
        ("v1", "pods"),
        ("v1", "services"),
        ("monitoring.coreos.com/v1", "podmonitors"),
    ):
        for obj in await cluster.list_items(in_namespace(cluster, group_version, plural)):
            meta = obj["metadata"]
            record[f"{plural}/{meta['name']}"] = (meta["uid"], sorted(managers(obj)))
    return record


async def test_an_observe_only_policy_climbs_the_whole_ladder_in_status_and_changes_no_deployment(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    cluster = local_cluster
    doc = observe_doc(cluster)
    for manifest in team_fleet(doc, cluster):
        await cluster.apply(manifest)
    await cluster.apply(doc)  # the kubelet stand-in makes the GPU Node of the policy's class; the pods land there
    await eventually(lambda: len(cluster.kubelet.engines.matching(TEAM_SELECTOR, cluster.namespace)) == 2, "team", 60)
    team_before = cluster.get("apps/v1", "Deployment", cluster.namespace, "team-vllm")
    assert team_before is not None
    before = await workload_record(cluster)

    async with load_on_team(cluster):
        status = await eventually(lambda: in_phase(cluster, "chat", "Stable", "RolledBack", "Held"), "Stable", 200)

    assert status["phase"] == "Stable", status.get("message")
    assert status["ladder"] == ["gpu-only", "cpu", "nvme"]
    assert [h["decision"] for h in status["history"]] == CLIMB
    assert status["stable"]["level"] == 2
    assert status["observe"]["selector"] == TEAM_SELECTOR
    assert (status["observe"]["pods"], status["observe"]["ready"]) == (2, 2)
    observing = next(c for c in status["conditions"] if c["type"] == "Observing")
    assert (observing["status"], observing["reason"]) == ("True", "ObserveOnly")
    # The fleet's own figures: a real baseline, and the offload gates set aside, not passed.
    assert status["baseline"]["ttftP99"] > 0
    metrics = {m["name"]: m for m in status["lastAnalysis"]["metrics"]}
    assert metrics["ttftP99"]["passed"] is True
    assert metrics["externalShare"]["message"].startswith("not judged in observe mode")
    assert "passed" not in metrics["externalShare"]  # null: not judged

    # Nothing was written but the policy's status and Events: no object of the policy's, no pod replaced, no
    # kvoffload field manager anywhere, and the team's Deployment at the generation and spec it had.
    after = await workload_record(cluster)
    assert after == before
    assert not any("kvoffload" in writers for _, writers in after.values()), after
    assert not [name for name in after if "chat" in name], after
    team = cluster.get("apps/v1", "Deployment", cluster.namespace, "team-vllm")
    assert team is not None
    assert team["metadata"]["generation"] == team_before["metadata"]["generation"] == 1
    assert team["spec"] == team_before["spec"]
    events = await cluster.list_items(in_namespace(cluster, "v1", "events"))
    told = [e["message"] for e in events if e.get("reason") == "WouldApply"]
    assert any("Deployment chat-nvme would run 2 replica(s)" in m for m in told), told
