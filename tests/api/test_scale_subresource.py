"""The scale subresource, against the real kube-apiserver: HPA or KEDA set spec.replicas through /scale.

A policy mid-step (the cpu level at 50% of 4 replicas) is scaled to 10 with ``kubectl scale``; the
API server bumps the generation and changes nothing but replicas, /scale shows the operator's
status.replicas and status.selector, and decide() resizes the stable and canary shares by the
step's percentage without restarting the step or any pod.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvoffload.api.conventions import API_GROUP, API_VERSION, KIND, LABEL_POLICY, PLURAL
from kvoffload.policy.loading import parse_policy
from tests.rollout.test_rollout import World, at_stage
from tests.support.controlplane import Kube

pytestmark = pytest.mark.kube


def chat(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": {"name": "chat", "namespace": namespace},
        "spec": {
            "model": {"name": "Qwen/Qwen3-8B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 16384},
            "gpu": {"class": "nvidia-h100-80gb"},
            "replicas": 4,
            "resources": {"baseMemory": "24Gi"},
            "offload": {"cpu": "32Gi"},
            "rollout": {"maxSurge": 1, "promotionSteps": [50, 100]},
        },
    }


def stored(kube: Kube, namespace: str) -> dict[str, Any]:
    obj: dict[str, Any] = kube.get("kvop", "chat", "-n", namespace)
    return obj


def test_scaling_through_the_scale_subresource_mid_step_resizes_both_shares(kube_crd: Kube) -> None:
    ns = kube_crd.namespace("scale")
    kube_crd.kubectl("apply", "-f", "-", stdin=json.dumps(chat(ns)))
    body = stored(kube_crd, ns)
    policy = parse_policy({k: v for k, v in body.items() if k != "status"}, f"{ns}/chat")

    # Given the operator's status in the cpu level's 50% step (decide() driven to it), written as the operator does
    world = World.given(policy.spec)
    world.run_until(at_stage("cpu", 1))
    world.settle()
    assert world.fleet == (("gpu-only", 3), ("cpu", 2))
    status = world.st.model_dump(mode="json", by_alias=True, exclude_none=True)
    status["selector"] = f"{LABEL_POLICY}=chat"
    kube_crd.kubectl(
        "patch", "kvop", "chat", "-n", ns, "--subresource=status", "--type=merge", "-p", json.dumps({"status": status})
    )
    stage_before = world.st.stage

    # When an autoscaler sets 10 replicas through /scale
    kube_crd.kubectl("scale", "kvop/chat", "-n", ns, "--replicas=10")

    # Then /scale reads the spec and the operator's status, and only replicas changed in the spec
    scale = json.loads(
        kube_crd.kubectl("get", "--raw", f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{ns}/{PLURAL}/chat/scale")
    )
    assert scale["spec"]["replicas"] == 10
    assert scale["status"]["replicas"] == 5  # what runs now: 3 stable + 2 canary
    assert scale["status"]["selector"] == f"{LABEL_POLICY}=chat"  # every engine of the policy
    after = stored(kube_crd, ns)
    assert after["metadata"]["generation"] == body["metadata"]["generation"] + 1
    assert {**after["spec"], "replicas": 4} == body["spec"]
    # and decide() resizes the shares in place: 50% of 10 on cpu, the step neither restarted nor left
    world.spec = parse_policy({k: v for k, v in after.items() if k != "status"}, f"{ns}/chat").spec
    world.generation = after["metadata"]["generation"]
    world.tick()
    world.settle()
    assert world.st.stage == stage_before
    assert world.fleet == (("gpu-only", 6), ("cpu", 5))
    assert world.st.observed_generation == after["metadata"]["generation"]
    assert "SpecChanged" not in world.reasons()
    assert all(p.variants is not None and p.variants.total_replicas <= 10 + 1 for p in world.plans)  # the GPU bound


def test_an_autoscaler_cannot_scale_a_policy_to_zero_or_below_its_canary_through_scale(kube_crd: Kube) -> None:
    """KEDA's scale to zero is refused: a ladder with no engine has no traffic, so no baseline or canary could ever
    be judged, and the fleet is never meant to have none (docs/design.md, "Autoscalers"). With maxSurge 0 the
    floor is canaryReplicas + 1, as for any other write of spec.replicas."""
    ns = kube_crd.namespace("scale-zero")
    manifest = chat(ns)
    kube_crd.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    body = stored(kube_crd, ns)
    scale_path = f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{ns}/{PLURAL}/chat/scale"

    # As KEDA and the HPA do: a write of the Scale object, not of the policy
    scale = json.loads(kube_crd.kubectl("get", "--raw", scale_path))
    scale["spec"]["replicas"] = 0
    refused = kube_crd.run("replace", "--raw", scale_path, "-f", "-", stdin=json.dumps(scale))
    assert refused.returncode != 0
    assert "spec.replicas" in refused.stderr
    assert "should be greater than or equal to 1" in refused.stderr
    after = stored(kube_crd, ns)
    assert after["metadata"]["generation"] == body["metadata"]["generation"]
    assert after["spec"]["replicas"] == 4

    # With maxSurge 0, one replica would leave no stable engine beside the canary: CEL refuses it through /scale too
    kube_crd.kubectl(
        "patch", "kvop", "chat", "-n", ns, "--type=merge", "-p", json.dumps({"spec": {"rollout": {"maxSurge": 0}}})
    )
    refused = kube_crd.run("scale", "kvop/chat", "-n", ns, "--replicas=1")
    assert refused.returncode != 0
    assert "canaryReplicas must be fewer than replicas when maxSurge is 0" in refused.stderr
    assert stored(kube_crd, ns)["spec"]["replicas"] == 4
    kube_crd.kubectl("scale", "kvop/chat", "-n", ns, "--replicas=2")  # the floor there: canaryReplicas + 1
    assert stored(kube_crd, ns)["spec"]["replicas"] == 2
