"""End to end: the operator (``kvoffload run``, kopf over HTTP) on the local cluster, on both APIs.

Each scenario runs twice. ``[kube]``: on the real control plane (kube-apiserver v1.37 with its
deployment, replicaset and garbage-collector controllers and the scheduler, marker ``kube``), with
fake GPU Nodes and the kubelet stand-in; ``[emulated]``: on kubeemu, where the kubelet stand-in also
plays the Deployment controller. Everything else is real on both: the operator process, Prometheus
scraping every second, the engines running the rendered arguments, the load generator. Only vLLM
is emulated. Durations are shrunk (analysis every 1 s, 6 s window, 4 s sustainedFor, 6 s steps) so
each scenario ends in about a minute; every wait is on the policy's status with a deadline.
"""

from __future__ import annotations

import copy
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kvoffload.api.conventions import LABEL_CONFIG_HASH, LABEL_LEVEL, LABEL_POLICY
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.policy.engine_config import config_hash
from kvoffload.policy.ladder import build_ladder
from kvoffload_lab.cluster.laboperator import stop_operator
from kvoffload_lab.promserver import free_port
from tests.support.cluster import (
    APIS,
    POLICY_API_VERSION,
    Cluster,
    OperatorProcess,
    either_cluster,
    eventually,
    load_on,
    status_of,
)

pytestmark = [pytest.mark.e2e, pytest.mark.prometheus, pytest.mark.timeout(240)]


@pytest_asyncio.fixture(params=APIS)
async def local_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, cluster_engine_args: list[str]
) -> AsyncIterator[Cluster]:
    """This module's scenarios on either API (the ``operator`` fixture runs against whichever it is)."""
    async with either_cluster(request.param, request, tmp_path / "cluster", cluster_engine_args) as cluster:
        yield cluster


KIND = "KVOffloadPolicy"
NVME_CANARY = "kvoffload.io/level=nvme"  # nvme engines are the canary until nvme is promoted
CLIMB = ["NewLadder", "BaselineTaken", "Promoted", "LevelPromoted", "Promoted", "LevelPromoted"]
"""The decisions of an undisturbed climb from gpu-only through cpu to nvme, with no pilot."""


def policy_doc(
    name: str,
    cluster: Cluster,
    *,
    pilot: bool = False,
    gpu_class: str = "nvidia-l4",
    max_inconclusive: int = 10,
    max_regression: float = 5.0,
) -> dict[str, Any]:
    """A two-tier policy (CPU 256Mi, then NVMe) with every duration shrunk to seconds.

    maxSurge 1 keeps a stable replica beside the canary at every promotion step, so
    canary/stable can always be compared (with maxSurge 0 the 100% step has no stable side).
    """
    rollout: dict[str, Any] = {
        "canaryReplicas": 1,
        "maxSurge": 1,
        "baselineDuration": "4s",
        "stepDuration": "6s",
        "promotionSteps": [100],
        "progressDeadline": "30s",
    }
    if pilot:
        rollout["pilotCpu"] = "128Mi"
    return {
        "apiVersion": POLICY_API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": cluster.namespace},
        "spec": {
            "model": {
                "name": "Qwen/Qwen3-0.6B",
                "servedModelName": name,
                "image": "vllm/vllm-openai:v0.32.0",
                "maxModelLen": 4096,
            },
            "gpu": {"class": gpu_class, "count": 1},
            "replicas": 2,
            "resources": {"baseMemory": "4Gi", "headroom": "1Gi", "cpu": "2"},
            "offload": {
                "backend": "native",
                "cpu": "256Mi",
                "secondaryTiers": [
                    {
                        "name": "nvme",
                        "size": "4Gi",
                        "path": "/mnt/kv-cache",
                        "volume": {"emptyDir": {"sizeLimit": "5Gi"}},
                    }
                ],
            },
            "rollout": rollout,
            "analysis": {
                "interval": "1s",
                "window": "6s",
                "ttftP99": "500ms",
                "itlP99": "200ms",
                # Under load the engine prices the nvme tier's restores: a healthy nvme canary's p99 came to 2.1×
                # the cpu stable's in a quiet run and 3.19× in a full CI run. The injected regressions (TTFT ×10,
                # ×20) stay far above 5, and these scenarios test the operator, not the tier's economics.
                "maxRegression": max_regression,
                "minExternalShare": 0.02,
                "sustainedFor": "4s",
                "minRequests": 3,
                "maxInconclusive": max_inconclusive,
                # At the lab's 256-token prefixes an nvme restore really costs 2-4 ms more than recomputing
                # (the live payoff says "does not pay"): reported here, gated in test_e2e_payoff.py.
                "payoff": "report",
            },
            "prometheus": {"url": cluster.prometheus.url},
        },
    }


# --- reading the cluster ------------------------------------------------------------------


def phase(cluster: Cluster, name: str) -> str | None:
    return status_of(cluster, name).get("phase")


def in_phase(cluster: Cluster, name: str, *phases: str) -> dict[str, Any] | None:
    status = status_of(cluster, name)
    return status if status.get("phase") in phases else None


def decisions(cluster: Cluster, name: str) -> list[str]:
    return [entry["decision"] for entry in status_of(cluster, name).get("history") or []]


def analysed_after(cluster: Cluster, name: str, moment: datetime) -> dict[str, Any] | None:
    status = status_of(cluster, name)
    when = (status.get("lastAnalysis") or {}).get("time")
    return status if when and datetime.fromisoformat(when.replace("Z", "+00:00")) > moment else None


def level_index(doc: Mapping[str, Any], level_name: str) -> int:
    ladder = build_ladder(KVOffloadPolicy.model_validate(doc).spec)
    return next(level.index for level in ladder if level.name == level_name)


def level_hash(doc: Mapping[str, Any], level_name: str) -> str:
    policy = KVOffloadPolicy.model_validate(doc)
    return config_hash(policy, build_ladder(policy.spec)[level_index(doc, level_name)])


def canary_on(cluster: Cluster, name: str, level_name: str, *, ready: bool = True) -> dict[str, Any] | None:
    """The status while a canary of ``level_name`` runs (and is Ready, unless told otherwise)."""
    status = status_of(cluster, name)
    canary = status.get("canary") or {}
    ladder = status.get("ladder") or []
    if canary and ladder[canary["level"]] == level_name and (not ready or canary.get("ready", 0) >= 1):
        return status
    return None


async def names(cluster: Cluster, path: str, selector: str = "") -> set[str]:
    return {obj["metadata"]["name"] for obj in await cluster.list_items(path, selector)}


def in_namespace(cluster: Cluster, group_version: str, plural: str) -> str:
    """The collection path of ``plural`` in the cluster's namespace (``apps/v1`` or ``v1`` for the core group)."""
    base = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
    return f"{base}/namespaces/{cluster.namespace}/{plural}"


def deployment(cluster: Cluster, name: str) -> dict[str, Any] | None:
    return cluster.get("apps/v1", "Deployment", cluster.namespace, name)


def keeps_every_applied_field(stored: Any, applied: Any) -> bool:
    """Whether ``stored`` holds every field of ``applied`` as applied (the server may add schema defaults)."""
    if isinstance(applied, Mapping):
        return isinstance(stored, Mapping) and all(
            k in stored and keeps_every_applied_field(stored[k], v) for k, v in applied.items()
        )
    if isinstance(applied, list):  # list items get their schema defaults too (secondaryTiers[*])
        return (
            isinstance(stored, list)
            and len(stored) == len(applied)
            and all(keeps_every_applied_field(s, a) for s, a in zip(stored, applied, strict=True))
        )
    return bool(stored == applied)


async def events_of(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return [
        event
        for event in await cluster.list_items(in_namespace(cluster, "v1", "events"))
        if event.get("involvedObject", {}).get("name") == name and event.get("involvedObject", {}).get("kind") == KIND
    ]


def pod_levels(cluster: Cluster, name: str) -> list[str]:
    return [engine.labels.get(LABEL_LEVEL, "") for engine in cluster.pods(f"{LABEL_POLICY}={name}")]


# --- the scenarios --------------------------------------------------------------------------


async def test_a_two_tier_policy_climbs_from_baseline_through_the_pilot_to_nvme_and_ends_stable(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    doc = policy_doc("chat", local_cluster, pilot=True)
    await local_cluster.apply(doc)

    async with load_on(local_cluster, "chat"):
        status = await eventually(
            lambda: in_phase(local_cluster, "chat", "Stable", "RolledBack", "Paused"), "Stable", 150
        )

    assert status["phase"] == "Stable", status.get("message")
    assert status["ladder"] == ["gpu-only", "cpu-pilot", "cpu", "nvme"]
    assert status["stable"]["level"] == level_index(doc, "nvme")
    assert status["stable"]["configHash"] == level_hash(doc, "nvme")
    assert status.get("canary") is None
    assert decisions(local_cluster, "chat") == [
        "NewLadder",
        "BaselineTaken",
        "PilotPassed",
        "Promoted",
        "LevelPromoted",
        "Promoted",
        "LevelPromoted",
    ]
    await eventually(lambda: deployment(local_cluster, "chat-cpu") is None, "cpu drained")
    stable = deployment(local_cluster, "chat-nvme")  # the canary's, kept
    assert stable is not None
    assert stable["spec"]["replicas"] == 2
    assert stable["metadata"]["labels"][LABEL_CONFIG_HASH] == level_hash(doc, "nvme")
    await eventually(lambda: sorted(pod_levels(local_cluster, "chat")) == ["nvme", "nvme"], "both pods on nvme")


async def test_a_ttft_regression_on_the_nvme_canary_rolls_back_to_the_cpu_level(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    doc = policy_doc("chat", local_cluster)
    # Every nvme canary engine answers 10x slower from its first request on.
    await local_cluster.set_faults(NVME_CANARY, {"ttft_multiplier": 10}, sticky=True)
    await local_cluster.apply(doc)

    async with load_on(local_cluster, "chat"):
        await eventually(lambda: canary_on(local_cluster, "chat", "nvme"), "the nvme canary", 90)
        status = await eventually(lambda: in_phase(local_cluster, "chat", "RolledBack", "Stable"), "RolledBack", 60)

    assert status["phase"] == "RolledBack", status.get("message")
    assert status["stable"]["level"] == level_index(doc, "cpu")
    assert status["stable"]["configHash"] == level_hash(doc, "cpu")
    assert status.get("canary") is None
    last = status["history"][-1]
    assert last["decision"] == "Rollback"
    assert last["stage"] == "cpu"
    assert "ttft" in last["message"].lower()
    warnings = [e for e in await events_of(local_cluster, "chat") if e["type"] == "Warning"]
    assert any("canary nvme removed" in e["message"] for e in warnings), warnings
    await eventually(lambda: deployment(local_cluster, "chat-nvme") is None, "the canary gone")
    current = local_cluster.get(POLICY_API_VERSION, KIND, local_cluster.namespace, "chat")
    assert current is not None
    # The operator never writes spec: every applied field is as applied (kube-apiserver adds the schema's
    # defaults to the stored spec, kubeemu does not) and the generation never moved.
    assert keeps_every_applied_field(current["spec"], doc["spec"]), current["spec"]
    assert current["metadata"]["generation"] == 1


async def test_a_sustained_breach_in_the_stable_guard_takes_away_the_newest_tier(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    doc = policy_doc("chat", local_cluster)
    await local_cluster.apply(doc)

    async with load_on(local_cluster, "chat"):
        status = await eventually(
            lambda: in_phase(local_cluster, "chat", "Stable", "RolledBack", "Paused"), "Stable", 90
        )
        assert status["phase"] == "Stable", status.get("message")
        # Now every nvme engine (the whole fleet) turns 20x slower: p99 TTFT goes far over the 500ms budget.
        await local_cluster.set_faults("kvoffload.io/level=nvme", {"ttft_multiplier": 20}, sticky=True)
        status = await eventually(lambda: in_phase(local_cluster, "chat", "RolledBack"), "RolledBack", 60)

    assert status["stable"]["level"] == level_index(doc, "cpu")
    assert status["stable"]["configHash"] == level_hash(doc, "cpu")
    last = status["history"][-1]
    assert last["decision"] == "Rollback"
    assert "took away nvme" in last["message"]
    await eventually(lambda: sorted(pod_levels(local_cluster, "chat")) == ["cpu", "cpu"], "the fleet back on cpu", 30)


async def test_an_oomkilled_canary_pod_rolls_back_at_once(local_cluster: Cluster, operator: OperatorProcess) -> None:
    doc = policy_doc("chat", local_cluster)
    await local_cluster.apply(doc)

    async with load_on(local_cluster, "chat"):
        await eventually(lambda: canary_on(local_cluster, "chat", "cpu"), "the cpu canary", 60)
        (canary,) = local_cluster.pods("kvoffload.io/policy=chat,kvoffload.io/level=cpu")
        failures_before = (status_of(local_cluster, "chat").get("lastAnalysis") or {}).get("consecutiveFailures", 0)
        await local_cluster.oom_kill(canary.pod, local_cluster.namespace)
        status = await eventually(lambda: in_phase(local_cluster, "chat", "RolledBack"), "RolledBack", 30)

    assert failures_before == 0
    last = status["history"][-1]
    assert last["decision"] == "Rollback"
    assert last["reason"] == "CanaryOOMKilled"
    assert canary.pod in last["message"]
    assert status["stable"]["level"] == level_index(doc, "gpu-only")
    await eventually(lambda: deployment(local_cluster, "chat-cpu") is None, "the canary gone")


async def test_the_operator_killed_during_a_canary_continues_where_it_was_after_a_restart(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    doc = policy_doc("chat", local_cluster)
    await local_cluster.apply(doc)

    async with load_on(local_cluster, "chat"):
        await eventually(lambda: canary_on(local_cluster, "chat", "cpu"), "the cpu canary", 60)
        canary_uid = deployment(local_cluster, "chat-cpu")["metadata"]["uid"]  # type: ignore[index]
        operator.kill()
        killed_at = datetime.now(UTC)
        assert await names(local_cluster, in_namespace(local_cluster, "apps/v1", "deployments")) == {
            "chat-gpu-only",
            "chat-cpu",
        }
        operator.start()
        resumed = await eventually(
            lambda: analysed_after(local_cluster, "chat", killed_at), "the restarted operator to analyse", 30
        )
        if resumed.get("canary") and resumed["stage"]["name"] == "cpu":
            # Still the cpu canary: the one the first operator made, adopted rather than made again.
            current = deployment(local_cluster, "chat-cpu")
            assert current is not None
            assert current["metadata"]["uid"] == canary_uid
        status = await eventually(
            lambda: in_phase(local_cluster, "chat", "Stable", "RolledBack", "Paused"), "the ladder to finish", 90
        )

    assert status["phase"] == "Stable", status.get("message")
    assert decisions(local_cluster, "chat") == CLIMB
    await eventually(lambda: deployment(local_cluster, "chat-cpu") is None, "cpu drained", 30)
    assert await names(local_cluster, in_namespace(local_cluster, "apps/v1", "deployments")) == {"chat-nvme"}
    assert operator.starts == 2


def lease_holder(cluster: Cluster, lease: str) -> str:
    obj = cluster.get("coordination.k8s.io/v1", "Lease", cluster.namespace, lease) or {}
    return str((obj.get("spec") or {}).get("holderIdentity") or "")


def probe(operator: OperatorProcess, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}{path}", timeout=2) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


@pytest_asyncio.fixture
async def replicas(local_cluster: Cluster, request: pytest.FixtureRequest) -> AsyncIterator[list[OperatorProcess]]:
    """Two ``kvoffload run --leader-elect`` replicas on one Lease in the test's namespace, not yet started."""
    args = ["--leader-elect", "--lease", f"{local_cluster.namespace}/{LEASE}"]
    pair = [OperatorProcess(local_cluster, name, args, metrics_port=free_port()) for name in ("op-a", "op-b")]
    try:
        yield pair
    finally:
        for each in pair:
            await each.stop()
        report = getattr(request.node, "rep_call", None)
        if report is None or report.failed:
            for each in pair:
                sys.stderr.write(f"--- {each.name} log (tail) ---\n{each.log_tail()}\n")


LEASE = "kvoffload-leader"


async def leader_then_standby(cluster: Cluster, replicas: list[OperatorProcess]) -> list[OperatorProcess]:
    """Start op-a, and op-b once op-a holds the Lease, so which one leads is known; returns them, op-b ready."""
    leader, standby = replicas
    leader.start()
    await eventually(lambda: lease_holder(cluster, LEASE).startswith("op-a_"), "op-a to hold the Lease", 30)
    standby.start()
    await eventually(lambda: probe(standby, "/readyz")[0] == 200, "the standby ready", 30)
    return replicas


# Leader election is judged on the real API server only: on kubeemu the Lease is served by the test's own event
# loop, where one full CI run saw the leader's kopf stall after login (the kube variant has not).
ON_KUBE = pytest.mark.parametrize("local_cluster", [pytest.param("kube", marks=pytest.mark.kube)], indirect=True)


@ON_KUBE
async def test_the_standby_replica_takes_over_within_15_s_of_the_leader_being_killed_mid_canary(
    local_cluster: Cluster, replicas: list[OperatorProcess], record_property: Callable[[str, object], None]
) -> None:
    leader, standby = await leader_then_standby(local_cluster, replicas)
    assert probe(standby, "/readyz") == (200, "standby: ready\n")
    assert probe(standby, "/healthz")[0] == 200
    # The takeover's burst of work (a new kopf, its caches primed) shares 2 cores with the engines: in a full CI
    # run the healthy nvme canary's p99 in a 6 s window came to 5.6x the stable's (222 ms against 39.8 ms) and
    # was rolled back. This test is about the takeover, not the tier's latency: the scenarios that test a
    # regression keep the 5x gate (issue 37 measures how often such windows mislead).
    doc = policy_doc("chat", local_cluster, max_regression=10.0)
    await local_cluster.apply(doc)

    async with load_on(local_cluster, "chat"):
        await eventually(lambda: canary_on(local_cluster, "chat", "cpu"), "the cpu canary", 60)
        assert probe(leader, "/readyz") == (200, "leader: ready\n")
        canary_uid = deployment(local_cluster, "chat-cpu")["metadata"]["uid"]  # type: ignore[index]
        leader.kill()
        killed_at, killed = datetime.now(UTC), time.monotonic()
        await eventually(lambda: lease_holder(local_cluster, LEASE).startswith("op-b_"), "op-b to take the Lease", 20)
        lease_taken = time.monotonic() - killed
        resumed = await eventually(
            lambda: analysed_after(local_cluster, "chat", killed_at), "the new leader to analyse", 30
        )
        first_analysis = time.monotonic() - killed
        assert probe(standby, "/readyz") == (200, "leader: ready\n")
        if resumed.get("canary") and resumed["stage"]["name"] == "cpu":
            current = deployment(local_cluster, "chat-cpu")  # adopted, not made again
            assert current is not None
            assert current["metadata"]["uid"] == canary_uid
        status = await eventually(
            lambda: in_phase(local_cluster, "chat", "Stable", "RolledBack", "Paused"), "the ladder to finish", 90
        )

    record_property("lease_taken_s", round(lease_taken, 2))
    record_property("first_analysis_s", round(first_analysis, 2))
    print(f"takeover: Lease taken {lease_taken:.1f} s, first analysis {first_analysis:.1f} s after SIGKILL")
    assert first_analysis < 15, f"the standby took {first_analysis:.1f} s to analyse after the leader died"
    assert status["phase"] == "Stable", status.get("message")
    assert decisions(local_cluster, "chat") == CLIMB  # nothing done twice, nothing lost
    assert standby.starts == 1
    assert standby.alive()


@ON_KUBE
async def test_a_leader_stopped_cleanly_hands_the_lease_over_at_once(
    local_cluster: Cluster, replicas: list[OperatorProcess]
) -> None:
    leader, standby = await leader_then_standby(local_cluster, replicas)
    stopped = time.monotonic()
    assert await stop_operator(leader.process) == 0  # type: ignore[arg-type]
    await eventually(lambda: lease_holder(local_cluster, LEASE).startswith("op-b_"), "op-b to take the Lease", 8)
    # Far under the 8 s a killed leader's Lease holds: handed back, not expired.
    assert time.monotonic() - stopped < 6
    await eventually(lambda: probe(standby, "/readyz") == (200, "leader: ready\n"), "op-b leading", 10)


async def test_prometheus_stopped_mid_step_pauses_the_policy_and_promotes_nothing(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    doc = policy_doc("chat", local_cluster, max_inconclusive=4)
    await local_cluster.apply(doc)

    async with load_on(local_cluster, "chat"):
        before = await eventually(lambda: canary_on(local_cluster, "chat", "cpu"), "the cpu canary", 60)
        await local_cluster.stop_prometheus()
        status = await eventually(lambda: in_phase(local_cluster, "chat", "Paused"), "Paused", 60)

    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["AnalysisInconclusive"]["status"] == "True"
    assert status["lastAnalysis"]["verdict"] == "Inconclusive"
    assert status["stable"]["level"] == before["stable"]["level"] == level_index(doc, "gpu-only")
    assert status["canary"]["level"] == level_index(doc, "cpu")
    assert status["stage"]["step"] == before["stage"]["step"] == 0
    after = decisions(local_cluster, "chat")[len(before["history"]) :]
    assert not {"Promoted", "LevelPromoted", "PilotPassed"} & set(after), after


async def test_an_invalid_policy_ends_invalid_naming_the_field_while_a_valid_one_beside_it_proceeds(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    await local_cluster.apply(policy_doc("broken", local_cluster, gpu_class="nvidia-imaginary-9000"))
    good = policy_doc("chat", local_cluster)
    await local_cluster.apply(good)

    async with load_on(local_cluster, "chat"):
        broken = await eventually(lambda: in_phase(local_cluster, "broken", "Invalid"), "broken Invalid", 30)
        await eventually(lambda: canary_on(local_cluster, "chat", "cpu"), "the valid policy's canary", 60)

    invalid = next(c for c in broken["conditions"] if c["type"] == "Invalid")
    assert invalid["status"] == "True"
    assert "spec.gpu.class" in invalid["message"]
    assert (
        await names(local_cluster, in_namespace(local_cluster, "apps/v1", "deployments"), f"{LABEL_POLICY}=broken")
        == set()
    )
    assert await names(
        local_cluster, in_namespace(local_cluster, "apps/v1", "deployments"), f"{LABEL_POLICY}=chat"
    ) == {
        "chat-gpu-only",
        "chat-cpu",
    }


async def test_deleting_a_policy_removes_its_owned_objects_and_nothing_else(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    await local_cluster.apply(policy_doc("chat", local_cluster))
    await local_cluster.apply(policy_doc("code", local_cluster))
    namespace = local_cluster.namespace
    bystander = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "chat-notes", "namespace": namespace}}
    await local_cluster.apply(copy.deepcopy(bystander))

    def running(name: str) -> bool:
        status = status_of(local_cluster, name)
        return bool(status.get("stable")) and len(local_cluster.endpoints(name)) == 2

    await eventually(lambda: running("chat") and running("code"), "both policies running", 60)
    chat_engines = local_cluster.pods(f"{LABEL_POLICY}=chat")
    services = in_namespace(local_cluster, "v1", "services")
    podmonitors = in_namespace(local_cluster, "monitoring.coreos.com/v1", "podmonitors")
    owned_paths = (in_namespace(local_cluster, "apps/v1", "deployments"), services, podmonitors)
    owned_paths += (in_namespace(local_cluster, "v1", "pods"),)
    before = {path: await names(local_cluster, path, f"{LABEL_POLICY}=code") for path in owned_paths}
    assert before[services] == {"code"}
    assert before[podmonitors] == {"code"}

    await local_cluster.delete(POLICY_API_VERSION, KIND, namespace, "chat")

    async def chat_gone() -> bool:
        leftovers = [await names(local_cluster, path, f"{LABEL_POLICY}=chat") for path in owned_paths]
        return policy_of_gone(local_cluster) and not any(leftovers)

    await eventually(chat_gone, "the chat policy and everything it owned gone", 30)
    await eventually(lambda: not any(engine.alive() for engine in chat_engines), "the chat engines stopped")
    after = {path: await names(local_cluster, path, f"{LABEL_POLICY}=code") for path in owned_paths}
    assert after == before
    assert local_cluster.get("v1", "ConfigMap", namespace, "chat-notes") is not None
    assert phase(local_cluster, "code") is not None


def policy_of_gone(cluster: Cluster) -> bool:
    return cluster.get(POLICY_API_VERSION, KIND, cluster.namespace, "chat") is None
