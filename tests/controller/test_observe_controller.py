"""An observe-only policy through the reconcile cycle: it climbs the whole ladder in status over a team's own
fleet, measured by its pods, and writes nothing but its own status and Events (docs/design.md, "Observe-only
policies").

The emulated API server records every request, so "nothing written" is checked on the wire: no create,
patch or delete of any workload, and the team's Deployment and pods exactly as they were.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import kubernetes.client
import pytest

from kvoffload.analysis.measurements import Measurements, VariantSample
from kvoffload.analysis.queries import PolicyKey, Target
from kvoffload.api.conventions import OBSERVING, PLURAL, Reason
from kvoffload.controller.reconcile import Controller
from tests.controller.test_controller import (
    NS,
    Clock,
    chat_spec,
    create_policy,
    events,
    new_controller,
    policy_body,
    reconcile_until,
    status_of,
    writes,
)
from tests.support.kube import EmulatedCluster

pytestmark = pytest.mark.e2e

TEAM_LABELS = {"app": "team-vllm"}

GPU_ONLY = VariantSample(requests=100.0, request_rate=10.0, ttft_p99=0.12, itl_p99=0.02, external_share=0.0)


class FleetProvider:
    """Prometheus for the team's fleet: GPU-only figures for a target that names its pods, none for the rest."""

    def __init__(self) -> None:
        self.calls: list[list[Target]] = []

    def measure(self, targets: Sequence[Target]) -> dict[PolicyKey, Measurements]:
        self.calls.append(list(targets))
        out = {}
        for t in targets:
            sample = GPU_ONLY if t.pods else VariantSample()
            out[t.key] = Measurements(canary=sample if t.canary_hash is not None else None, stable=sample)
        return out

    def present_metric_names(self, target: Target | None = None) -> frozenset[str]:
        return frozenset()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def observe_spec() -> dict[str, Any]:
    spec = chat_spec()
    spec["offload"] = {"cpu": "1Gi", "secondaryTiers": [{"name": "nvme", "size": "10Gi", "path": "/mnt/kv"}]}
    spec["rollout"] |= {"pilotCpu": "512Mi", "observeOnly": True, "observe": {"selector": {"matchLabels": TEAM_LABELS}}}
    return spec


async def team_fleet(kube: EmulatedCluster, replicas: int = 4) -> None:
    """The team's own vLLM Deployment and its Ready pods, made by nobody the operator knows."""
    template = {
        "metadata": {"labels": TEAM_LABELS},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.32.0"}]},
    }
    await kube.emulator.create_object(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "team-vllm", "namespace": NS, "labels": TEAM_LABELS},
            "spec": {"replicas": replicas, "selector": {"matchLabels": TEAM_LABELS}, "template": template},
        }
    )
    for i in range(replicas):
        name = f"team-vllm-{i}"
        await kube.emulator.create_object(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": NS, "labels": TEAM_LABELS},
                "spec": copy.deepcopy(template["spec"]),
            }
        )
        ready = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        await kube.emulator.patch_object("v1", "Pod", NS, name, {"status": ready}, subresource="status")


async def workloads(kube: EmulatedCluster) -> list[tuple[str, str, str, Any]]:
    """Every Deployment and pod of the namespace as the API serves it: kind, name, resourceVersion, spec."""
    apps, core = kubernetes.client.AppsV1Api(kube.api_client), kubernetes.client.CoreV1Api(kube.api_client)
    found = []
    for kind, lister in (("Deployment", apps.list_namespaced_deployment), ("Pod", core.list_namespaced_pod)):
        listed = await kube.call(lister, NS)
        found += [(kind, o.metadata.name, o.metadata.resource_version, o.spec.to_dict()) for o in listed.items]
    return sorted(found, key=lambda w: (w[0], w[1]))


async def test_an_observe_only_policy_climbs_the_whole_ladder_and_writes_no_workload(
    kube: EmulatedCluster, clock: Clock
) -> None:
    provider = FleetProvider()
    controller: Controller = new_controller(kube, provider, clock)  # type: ignore[arg-type]
    await team_fleet(kube)
    before = await workloads(kube)
    await create_policy(kube, spec=observe_spec())

    cycles = await reconcile_until(controller, kube, clock, lambda: status_of(kube).get("phase") == "Stable", limit=400)

    status = status_of(kube)
    assert status["stage"]["name"] == "nvme"
    decisions = [(h["stage"], h["decision"]) for h in status["history"]]
    assert decisions == [
        ("gpu-only", "NewLadder"),
        ("cpu-pilot", "BaselineTaken"),
        ("cpu", "PilotPassed"),
        ("cpu", "Promoted"),  # 50%
        ("cpu", "Promoted"),  # 100%
        ("nvme", "LevelPromoted"),
        ("nvme", "Promoted"),
        ("nvme", "Promoted"),
        ("nvme", "LevelPromoted"),
    ]
    assert status["observe"]["selector"] == "app=team-vllm"
    assert (status["observe"]["pods"], status["observe"]["ready"]) == (4, 4)
    observing = next(c for c in status["conditions"] if c["type"] == OBSERVING)
    assert (observing["status"], observing["reason"]) == ("True", Reason.OBSERVE_ONLY)
    # Nothing but the policy's own status and its Events was written, in every one of those cycles.
    written = {(method, plural) for method, plural, _ in writes(kube)}
    assert written <= {("PATCH", PLURAL), ("POST", "events"), ("PATCH", "events"), ("POST", PLURAL)}
    assert await workloads(kube) == before  # same objects, same resourceVersions
    # Measured by the team's pods, by name.
    measured = [t for call in provider.calls for t in call]
    assert measured
    assert {t.pods for t in measured} == {tuple(f"team-vllm-{i}" for i in range(4))}
    # Each change a real climb would have made was told, not made.
    told = [e.message for e in await events(kube) if e.reason == Reason.WOULD_APPLY]
    assert any("Deployment chat-gpu-only would run 4 replica(s)" in m for m in told)
    assert any("Deployment chat-nvme would run 4 replica(s)" in m for m in told)
    assert any("Deployment chat-cpu would be deleted" in m for m in told)
    assert cycles > 10


async def test_observe_only_with_no_matching_pod_is_inconclusive_and_says_why(
    kube: EmulatedCluster, clock: Clock
) -> None:
    controller = new_controller(kube, FleetProvider(), clock)  # type: ignore[arg-type]
    await create_policy(kube, spec=observe_spec())
    for _ in range(3):
        clock.advance(1.0)
        await controller.reconcile(policy_body(kube))
    status = status_of(kube)
    assert status["lastAnalysis"]["verdict"] == "Inconclusive"
    assert (
        "no pod in namespace llm matches spec.rollout.observe.selector app=team-vllm"
        in (status["lastAnalysis"]["message"])
    )
    assert (status["observe"]["pods"], status["observe"]["ready"]) == (0, 0)
    assert await workloads(kube) == []
