"""The local cluster plays the kubelet and the Deployment controller for real engines and a real Prometheus."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import aiohttp
import pytest

from kvoffload.api.conventions import LABEL_CONFIG_HASH, LABEL_LEVEL
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.controller.kubestate import parse_deployment, parse_pod
from kvoffload.policy.engine_config import engine_args
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.loading import load_policy
from kvoffload.policy.render import render_deployment
from kvoffload_lab.cluster.deployments import rolling_limits
from kvoffload_lab.cluster.laboperator import LAB_TENANCY
from kvoffload_lab.cluster.localcluster import LocalCluster
from kvoffload_lab.cluster.podengine import ANNOTATION_PORT
from kvoffload_lab.cluster.speakers import emulate_options
from tests.support import paths
from tests.support.cluster import eventually

EXAMPLE = paths.EXAMPLES / "demo-two-tier.yaml"


@pytest.fixture
def policy() -> KVOffloadPolicy:
    return load_policy(EXAMPLE, LAB_TENANCY)


def deployment(policy: KVOffloadPolicy, level: int = 0, replicas: int = 2) -> dict[str, Any]:
    return render_deployment(policy, build_ladder(policy.spec)[level], replicas)


def status(cluster: LocalCluster, name: str = "demo-gpu-only") -> dict[str, Any]:
    return (cluster.get("apps/v1", "Deployment", "default", name) or {}).get("status") or {}


def pods(cluster: LocalCluster, selector: str = "kvoffload.io/policy=demo") -> list[dict[str, Any]]:
    return [
        pod
        for engine in cluster.pods(selector, "default")
        if (pod := cluster.get("v1", "Pod", "default", engine.pod)) is not None
    ]


def rolled_out(cluster: LocalCluster, replicas: int, name: str = "demo-gpu-only") -> bool:
    obj = cluster.get("apps/v1", "Deployment", "default", name)
    if obj is None:
        return False
    state = parse_deployment(obj)
    return (
        state.observed_generation == state.generation
        and state.ready_replicas == state.updated_replicas == replicas
        and status(cluster, name).get("replicas") == replicas
    )


async def health(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/health") as response:
        return response.status


# --- pure parts ------------------------------------------------------------------------


def test_the_engine_runs_exactly_the_rendered_vllm_serve_arguments(policy: KVOffloadPolicy) -> None:
    for level in build_ladder(policy.spec):
        container = render_deployment(policy, level, 1)["spec"]["template"]["spec"]["containers"][0]
        assert emulate_options(container)[1] == engine_args(policy, level)


def test_plain_vllm_serve_commands_are_understood_too() -> None:
    assert emulate_options({"args": ["--model", "m"]})[1] == ["--model", "m"]
    assert emulate_options({"command": ["vllm", "serve"], "args": ["m", "--port", "1"]})[1] == ["m", "--port", "1"]


def test_a_container_that_does_not_run_vllm_serve_is_refused() -> None:
    with pytest.raises(RuntimeError, match="vllm serve"):
        emulate_options({"command": ["python", "app.py"]})


def test_rolling_limits_follow_the_deployment_strategy(policy: KVOffloadPolicy) -> None:
    assert rolling_limits(deployment(policy, replicas=4)) == (0, 1)  # as rendered: maxSurge 0
    assert rolling_limits({"spec": {"replicas": 4}}) == (1, 1)  # Kubernetes' 25% defaults


# --- the running cluster ------------------------------------------------------------------


@pytest.mark.e2e
async def test_a_deployment_gets_ready_engines_that_prometheus_scrapes_with_the_podmonitor_labels(
    local_cluster: LocalCluster, policy: KVOffloadPolicy
) -> None:
    await local_cluster.apply(deployment(policy, replicas=2))

    await eventually(lambda: rolled_out(local_cluster, 2), "2 ready replicas")
    owner_uid = local_cluster.get("apps/v1", "Deployment", "default", "demo-gpu-only")["metadata"]["uid"]  # type: ignore[index]
    running = pods(local_cluster)
    assert len(running) == 2
    for pod in running:
        assert pod["metadata"]["name"].startswith("demo-gpu-only-")
        assert pod["metadata"]["ownerReferences"][0]["uid"] == owner_uid
        assert pod["metadata"]["labels"]["kvoffload.io/level"] == "gpu-only"
        assert pod["status"]["podIP"] == "127.0.0.1"
        assert parse_pod(pod).ready
        assert parse_pod(pod).phase == "Running"
        assert await health(f"http://127.0.0.1:{pod['metadata']['annotations'][ANNOTATION_PORT]}") == 200
    assert sorted(local_cluster.endpoints("demo")) == sorted(
        f"http://127.0.0.1:{pod['metadata']['annotations'][ANNOTATION_PORT]}" for pod in running
    )

    series = await asyncio.to_thread(
        local_cluster.prometheus.wait_for_series, 'up{kvoffload_io_policy="demo"} == 1', 30.0, 2
    )
    labels = sorted((s["metric"]["namespace"], s["metric"]["pod"], s["metric"]["kvoffload_io_level"]) for s in series)
    assert labels == sorted(("default", pod["metadata"]["name"], "gpu-only") for pod in running)
    config_hashes = {s["metric"]["kvoffload_io_config_hash"] for s in series}
    assert config_hashes == {running[0]["metadata"]["labels"][LABEL_CONFIG_HASH]}
    assert await asyncio.to_thread(
        local_cluster.prometheus.wait_for_series, 'vllm:cache_config_info{kvoffload_io_policy="demo"}', 30.0, 2
    )


@pytest.mark.e2e
async def test_scaling_down_stops_engines_and_prometheus_forgets_them(
    local_cluster: LocalCluster, policy: KVOffloadPolicy
) -> None:
    await local_cluster.apply(deployment(policy, replicas=2))
    await eventually(lambda: rolled_out(local_cluster, 2), "2 ready replicas")
    engines = {engine.pod: engine for engine in local_cluster.pods()}

    await local_cluster.apply(deployment(policy, replicas=1))

    await eventually(lambda: rolled_out(local_cluster, 1), "1 replica")
    kept = [pod["metadata"]["name"] for pod in pods(local_cluster)]
    assert len(kept) == 1
    (gone,) = set(engines) - set(kept)
    await eventually(lambda: not engines[gone].alive(), f"the engine of {gone} to exit")
    assert len(local_cluster.endpoints("demo")) == 1
    assert local_cluster.get("v1", "Pod", "default", gone) is None
    await asyncio.to_thread(
        local_cluster.prometheus.wait_for_series,
        'count(up{kvoffload_io_policy="demo"})',
        30.0,
        1,
        lambda result: result[0]["value"][1] == "1",
    )


@pytest.mark.e2e
async def test_a_template_change_rolls_the_pods_one_at_a_time(
    local_cluster: LocalCluster, policy: KVOffloadPolicy
) -> None:
    before = deployment(policy, level=0, replicas=2)
    await local_cluster.apply(before)
    await eventually(lambda: rolled_out(local_cluster, 2), "2 ready replicas on gpu-only")
    # The full CPU tier's engine in gpu-only's Deployment (its name and selector): a changed pod template.
    after = deployment(policy, level=2, replicas=2)
    after["metadata"]["name"] = before["metadata"]["name"]
    after["spec"]["selector"] = before["spec"]["selector"]
    after["spec"]["template"]["metadata"]["labels"][LABEL_LEVEL] = "gpu-only"
    new_hash = after["metadata"]["labels"][LABEL_CONFIG_HASH]
    assert new_hash != before["metadata"]["labels"][LABEL_CONFIG_HASH]

    await local_cluster.apply(after)
    fewest_ready = 2
    most_pods = 0

    def finished() -> bool:
        nonlocal fewest_ready, most_pods
        current = pods(local_cluster)
        fewest_ready = min(fewest_ready, sum(parse_pod(pod).ready for pod in current))
        most_pods = max(most_pods, len(current))
        return rolled_out(local_cluster, 2) and all(
            pod["metadata"]["labels"][LABEL_CONFIG_HASH] == new_hash for pod in current
        )

    await eventually(finished, "every pod on the new template", poll=0.05)
    assert fewest_ready >= 1, "maxUnavailable 1: at most one replica down at a time"
    assert most_pods <= 2, "maxSurge 0: never more pods than replicas"
    for engine in local_cluster.pods():
        assert "--kv-offloading-size" in engine.argv  # the new level's flags reached the engine


@pytest.mark.e2e
async def test_an_oom_kill_restarts_the_engine_and_the_pod_shows_oomkilled(
    local_cluster: LocalCluster, policy: KVOffloadPolicy
) -> None:
    await local_cluster.apply(deployment(policy, replicas=1))
    await eventually(lambda: rolled_out(local_cluster, 1), "1 ready replica")
    (pod,) = pods(local_cluster)
    name = pod["metadata"]["name"]
    old_pid = local_cluster.pods()[0].process.pid  # type: ignore[union-attr]

    await local_cluster.oom_kill(name)

    killed = parse_pod(local_cluster.get("v1", "Pod", "default", name))  # type: ignore[arg-type]
    assert killed.oom_killed
    assert killed.restarts == 1
    last = local_cluster.get("v1", "Pod", "default", name)["status"]["containerStatuses"][0]["lastState"]  # type: ignore[index]
    assert last["terminated"]["reason"] == "OOMKilled"
    assert last["terminated"]["exitCode"] == 137
    await eventually(lambda: rolled_out(local_cluster, 1), "the restarted engine to be ready again")
    engine = local_cluster.pods()[0]
    assert engine.pod == name
    assert engine.process is not None
    assert engine.process.pid != old_pid


@pytest.mark.e2e
async def test_deleting_a_deployment_collects_its_pods_and_stops_their_engines(
    local_cluster: LocalCluster, policy: KVOffloadPolicy
) -> None:
    await local_cluster.apply(deployment(policy, replicas=2))
    await local_cluster.apply(deployment(policy, level=1, replicas=1))
    await eventually(lambda: rolled_out(local_cluster, 2) and rolled_out(local_cluster, 1, "demo-cpu-pilot"), "both up")
    canary_engines = local_cluster.pods("kvoffload.io/level=cpu-pilot")

    await local_cluster.delete("apps/v1", "Deployment", "default", "demo-cpu-pilot")

    await eventually(lambda: not any(engine.alive() for engine in canary_engines), "the canary engine to exit")
    assert pods(local_cluster, "kvoffload.io/level=cpu-pilot") == []
    assert len(pods(local_cluster, "kvoffload.io/level=gpu-only")) == 2
    assert all(pod["metadata"]["labels"]["kvoffload.io/level"] == "gpu-only" for pod in pods(local_cluster))


@pytest.mark.e2e
async def test_sticky_faults_reach_an_engine_started_later(
    local_cluster: LocalCluster, policy: KVOffloadPolicy
) -> None:
    await local_cluster.set_faults("kvoffload.io/level=cpu-pilot", {"ttft_multiplier": 3}, sticky=True)
    await local_cluster.apply(deployment(policy, replicas=1))
    await local_cluster.apply(deployment(policy, level=1, replicas=1))
    await eventually(lambda: rolled_out(local_cluster, 1) and rolled_out(local_cluster, 1, "demo-cpu-pilot"), "both up")

    async def faults(level: str) -> dict[str, Any]:
        (url,) = local_cluster.endpoints("demo", level=level)
        async with aiohttp.ClientSession() as session, session.get(f"{url}/emulator/faults") as response:
            return copy.deepcopy(await response.json())

    assert (await faults("cpu-pilot"))["ttft_multiplier"] == 3
    assert (await faults("gpu-only"))["ttft_multiplier"] == 1
