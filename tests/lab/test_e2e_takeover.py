"""End to end on kube-apiserver: a policy takes over a Deployment the team already runs (``spec.workloadRef``,
issue 35), climbs to Stable at its top tier and gives the Deployment back when it is deleted.

The team's Deployment ``chat`` (3 replicas, ``app: chat``, its own ``vllm serve`` flags) is created first and
serves load. The real deployment, replicaset and garbage-collector controllers run it; the kubelet stand-in runs
every pod bound to the fake GPU Node, whoever made it. A census independent of the operator samples the Ready pods
that the team's Service would select (``app=chat``: theirs and the derived ones, which keep that label) every
0.2 s: it must never fall below 3 once the Deployment first served, through the takeover and the hand-back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from click.testing import CliRunner

from kvoffload.api.conventions import (
    ANNOTATION_ORIGINAL_REPLICAS,
    ANNOTATION_TAKEN_BY,
    HAND_BACK_FINALIZER,
    RELEASE,
)
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.cli.main import main
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.render import render_deployment
from kvoffload_lab.load import replay
from tests.lab.test_e2e import decisions, deployment, in_phase, policy_doc
from tests.support.cluster import (
    LOAD_SCALE,
    POLICY_API_VERSION,
    Cluster,
    OperatorProcess,
    either_cluster,
    eventually,
    policy_of,
    reuse_trace,
    status_of,
)

pytestmark = [pytest.mark.e2e, pytest.mark.prometheus, pytest.mark.kube, pytest.mark.timeout(300)]

APP = "app=chat"
DEPLOYMENTS = "/apis/apps/v1/namespaces/{}/deployments"
GPU_CLASS = "nvidia-l4"
IMAGE = "vllm/vllm-openai:v0.32.0"


@pytest_asyncio.fixture
async def local_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, cluster_engine_args: list[str]
) -> AsyncIterator[Cluster]:
    async with either_cluster("kube", request, tmp_path / "cluster", cluster_engine_args) as cluster:
        await cluster.kubelet.ensure_nodes({GPU_CLASS: {}})
        yield cluster


def team_deployment(cluster: Cluster, image: str = IMAGE) -> dict[str, Any]:
    """The team's own Deployment, as their chart would write it: their labels, probes and flags."""
    rendered = _gpu_only_pod(cluster)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "chat", "namespace": cluster.namespace, "labels": {"app": "chat", "team": "search"}},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "chat"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {"app": "chat", "team": "search"}, "annotations": {"team.example/owner": "ml"}},
                "spec": {
                    "nodeSelector": rendered["nodeSelector"],
                    "tolerations": rendered["tolerations"],
                    "containers": [
                        {
                            "name": "vllm",
                            "image": image,
                            "command": ["vllm", "serve"],
                            "args": [
                                "--model",
                                "Qwen/Qwen3-0.6B",
                                "--served-model-name",
                                "chat",
                                "--port",
                                "8000",
                                "--max-model-len",
                                "4096",
                            ],
                            "ports": [{"name": "http", "containerPort": 8000}],
                            "env": [{"name": "TEAM_SETTING", "value": "kept"}],
                            "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
                            "resources": rendered["containers"][0]["resources"],
                        }
                    ],
                },
            },
        },
    }


def _gpu_only_pod(cluster: Cluster) -> dict[str, Any]:
    """The scheduling and resources the fake GPU Node takes, as the operator renders them for this class."""
    policy = KVOffloadPolicy.model_validate(policy_doc("probe", cluster, gpu_class=GPU_CLASS))
    pod: dict[str, Any] = render_deployment(policy, build_ladder(policy.spec)[0], 1)["spec"]["template"]["spec"]
    return pod


def takeover_doc(cluster: Cluster) -> dict[str, Any]:
    """The e2e policy (gpu-only, cpu, nvme; seconds-long steps) on the team's Deployment instead of an image."""
    doc = policy_doc("chat", cluster, gpu_class=GPU_CLASS)
    spec = doc["spec"]
    del spec["model"]["image"]
    spec["model"].pop("servedModelName", None)
    spec["replicas"] = 3
    spec["workloadRef"] = {"name": "chat"}
    return doc


def ready_pods(cluster: Cluster) -> int:
    return sum(1 for engine in cluster.pods(APP) if engine.ready)


@contextlib.asynccontextmanager
async def census(cluster: Cluster, samples: list[int]) -> AsyncIterator[None]:
    """Ready ``app=chat`` pods, every 0.2 s, into ``samples``."""

    async def sample() -> None:
        while True:
            samples.append(ready_pods(cluster))
            await asyncio.sleep(0.2)

    task = asyncio.create_task(sample())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def team_load(cluster: Cluster) -> AsyncIterator[None]:
    """The team's traffic, to every Ready pod their Service selects."""
    urls: Callable[[], list[str]] = lambda: [e.url for e in cluster.pods(APP) if e.ready]  # noqa: E731
    task = asyncio.create_task(
        replay(urls, reuse_trace(rate=20.0), model="chat", speedup=1.0, duration=600.0, scale=LOAD_SCALE, max_tokens=4)
    )
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def annotations_of(cluster: Cluster) -> dict[str, str]:
    found = deployment(cluster, "chat") or {}
    return dict((found.get("metadata") or {}).get("annotations") or {})


async def team_serving(cluster: Cluster) -> None:
    await cluster.apply(team_deployment(cluster))
    await eventually(lambda: ready_pods(cluster) >= 3, "the team's 3 pods Ready", 90)


async def test_a_policy_takes_over_a_running_deployment_climbs_to_stable_and_hands_it_back(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    cluster = local_cluster
    await team_serving(cluster)
    samples: list[int] = []
    async with census(cluster, samples), team_load(cluster):
        await cluster.apply(takeover_doc(cluster))
        status = await eventually(lambda: in_phase(cluster, "chat", "Stable", "RolledBack", "Paused"), "Stable", 200)
        assert status["phase"] == "Stable", status.get("message")
        assert status["ladder"] == ["gpu-only", "cpu", "nvme"]
        assert status["stage"]["name"] == "nvme"
        await eventually(lambda: (deployment(cluster, "chat") or {})["spec"]["replicas"] == 0, "chat at 0", 30)
        status = status_of(cluster, "chat")
        assert status["workload"]["name"] == "chat"
        assert status["workload"]["originalReplicas"] == 3
        assert status["workload"]["replicas"] == 0
        assert annotations_of(cluster)[ANNOTATION_ORIGINAL_REPLICAS] == "3"
        assert annotations_of(cluster)[ANNOTATION_TAKEN_BY] == "chat"
        assert HAND_BACK_FINALIZER in policy_of(cluster, "chat")["metadata"]["finalizers"]
        # The derived stable pods keep the team's labels, env and probes, and add the offload flags.
        stable = deployment(cluster, "chat-nvme")
        assert stable is not None
        template = stable["spec"]["template"]
        assert template["metadata"]["labels"]["app"] == "chat"
        assert template["metadata"]["labels"]["team"] == "search"
        (container,) = template["spec"]["containers"]
        assert {"name": "TEAM_SETTING", "value": "kept"} in container["env"]
        assert "--kv-offloading-size" in container["args"]
        assert container["readinessProbe"]["httpGet"]["path"] == "/health"
        taken = len(samples)

        await cluster.delete(POLICY_API_VERSION, "KVOffloadPolicy", cluster.namespace, "chat")
        # The team's Deployment is back at 3 and Ready before the operator's engines go.
        await eventually(lambda: (deployment(cluster, "chat") or {})["spec"]["replicas"] == 3, "chat back at 3", 30)
        await eventually(lambda: policy_of(cluster, "chat") is None, "the policy gone", 120)
        await eventually(lambda: deployment(cluster, "chat-nvme") is None, "the operator's Deployments gone", 60)
        await asyncio.sleep(1.0)

    first_full = next(i for i, n in enumerate(samples) if n >= 3)
    assert min(samples[first_full:]) >= 3, f"Ready dipped to {min(samples[first_full:])}"
    assert len(samples) > taken > first_full  # the census ran through both the takeover and the hand-back
    assert ANNOTATION_TAKEN_BY not in annotations_of(cluster)
    assert ANNOTATION_ORIGINAL_REPLICAS not in annotations_of(cluster)
    assert (deployment(cluster, "chat") or {})["spec"]["replicas"] == 3


async def test_a_new_image_in_the_team_deployment_starts_a_new_ladder_from_gpu_only(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    cluster = local_cluster
    await team_serving(cluster)
    async with team_load(cluster):
        await cluster.apply(takeover_doc(cluster))
        await eventually(
            lambda: (status_of(cluster, "chat").get("stage") or {}).get("name") in ("cpu", "nvme"), "past gpu-only", 120
        )
        before = status_of(cluster, "chat")
        await cluster.apply(team_deployment(cluster, image="vllm/vllm-openai:v0.32.1"))

        def restarted() -> dict[str, Any] | None:
            status = status_of(cluster, "chat")  # one read: a second could see a newer status than this one
            return status if any(e["decision"] == "WorkloadChanged" for e in status.get("history") or []) else None

        status = await eventually(restarted, "a WorkloadChanged ladder", 60)

    entry = next(e for e in status["history"] if e["decision"] == "WorkloadChanged")
    assert entry["stage"] == "gpu-only", entry
    assert "Deployment chat's pod template changed" in entry["message"]
    assert status["workload"]["templateDigest"] != before["workload"]["templateDigest"]
    stable = deployment(cluster, "chat-gpu-only")
    assert stable is not None
    (container,) = stable["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "vllm/vllm-openai:v0.32.1"


async def test_abort_release_hands_the_deployment_back_then_removing_it_takes_over_again(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    cluster = local_cluster
    await team_serving(cluster)
    samples: list[int] = []
    async with census(cluster, samples), team_load(cluster):
        await cluster.apply(takeover_doc(cluster))
        await eventually(lambda: (deployment(cluster, "chat") or {})["spec"]["replicas"] < 3, "chat scaled down", 120)
        runner = CliRunner()
        args = ["abort", "chat", "--release", "-n", cluster.namespace, "--kubeconfig", str(cluster.kubeconfig)]
        result = await asyncio.to_thread(runner.invoke, main, args)
        assert result.exit_code == 0, result.output

        def released() -> dict[str, Any] | None:
            status = status_of(cluster, "chat")
            return status if status.get("message", "").startswith("released by") else None

        status = await eventually(released, "released", 90)
        assert status["phase"] == "Paused"
        assert (deployment(cluster, "chat") or {})["spec"]["replicas"] == 3
        assert ready_pods(cluster) >= 3
        assert not [
            d
            for d in await cluster.list_items(DEPLOYMENTS.format(cluster.namespace))
            if d["metadata"]["name"] != "chat"
        ]
        assert ANNOTATION_TAKEN_BY not in annotations_of(cluster)
        assert HAND_BACK_FINALIZER not in (policy_of(cluster, "chat") or {})["metadata"].get("finalizers", [])

        path = f"/apis/{POLICY_API_VERSION}/namespaces/{cluster.namespace}/kvoffloadpolicies/chat"
        await cluster.api.merge_patch(path, {"metadata": {"annotations": {RELEASE: None}}})
        await eventually(lambda: decisions(cluster, "chat").count("NewLadder") == 2, "a new ladder", 60)
        await eventually(lambda: (deployment(cluster, "chat") or {})["spec"]["replicas"] < 3, "taken over again", 90)

    first_full = next(i for i, n in enumerate(samples) if n >= 3)
    assert min(samples[first_full:]) >= 3, f"Ready dipped to {min(samples[first_full:])}"
