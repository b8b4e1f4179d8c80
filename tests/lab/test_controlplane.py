"""The real Kubernetes control plane (:mod:`kvoffload_lab.controlplane`), driven with a real kubectl.

The session's control plane (tests/support/controlplane.py): the API server reports the pinned
release, takes the project's CRD and the examples, and its controllers and scheduler do their part
for a Deployment: a ReplicaSet, a Pod, the Pod bound to the one fake Node that has a GPU, and the
garbage collector following the Deployment's deletion. No kubelet runs, so no Pod ever starts.

Without the binaries (``scripts/build-kube.sh``) these tests skip, except under ``$CI``, where they fail.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from tests.support import paths
from tests.support.controlplane import Kube, wait_for

pytestmark = pytest.mark.kube

REPO = paths.ROOT
GPU = "nvidia.com/gpu"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def pinned_kubernetes_version() -> str:
    """The k8s.io/kubernetes version that tools/kube/go.mod requires."""
    match = re.search(r"^require k8s\.io/kubernetes (v\S+)$", (REPO / "tools/kube/go.mod").read_text(), re.M)
    assert match, "tools/kube/go.mod requires no k8s.io/kubernetes"
    return match.group(1)


def owned_by(items: list[dict[str, Any]], kind: str, name: str) -> list[dict[str, Any]]:
    """The objects among ``items`` whose owner references name ``kind``/``name``."""
    return [
        item
        for item in items
        if any(ref["kind"] == kind and ref["name"] == name for ref in item["metadata"].get("ownerReferences", []))
    ]


def test_server_reports_the_pinned_release(control_plane: Kube) -> None:
    version = json.loads(control_plane.kubectl("get", "--raw", "/version"))
    print(f"\nserver gitVersion {version['gitVersion']} (major {version['major']}, minor {version['minor']})")
    assert version["gitVersion"] == pinned_kubernetes_version()
    assert (version["major"], version["minor"]) == tuple(pinned_kubernetes_version()[1:].split(".")[:2])


def test_crd_and_examples_apply(control_plane: Kube) -> None:
    # The real server refused two things kubeemu and the offline checks let through: a description on
    # metadata, and sign() called as a method (Kubernetes' CEL declares sign(quantity)).
    control_plane.apply_crd()
    for namespace in ("default", "llm"):  # the examples' namespaces
        control_plane.ensure_namespace(namespace)
    # The real API server checks each example against the CRD's schema and CEL rules.
    control_plane.kubectl("apply", "-f", str(REPO / "examples"))
    stored = control_plane.get("-f", str(REPO / "examples"))["items"]
    names = sorted(item["metadata"]["name"] for item in stored)
    print(f"\nKVOffloadPolicies stored: {names}")
    assert len(names) == len(list((REPO / "examples").glob("*.yaml")))


def node(name: str, gpus: int, pool: str) -> dict[str, Any]:
    """A Node as a kubelet would register it (status included: a Node's status may be set on create)."""
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110", **({GPU: str(gpus)} if gpus else {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "lab.kvoffload.io/pool": pool}},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def deployment(name: str, namespace: str, pool: str) -> dict[str, Any]:
    """One replica that needs a GPU, on the nodes of ``pool`` only (the control plane is shared); its
    image is never pulled (no kubelet)."""
    labels = {"app": name}
    container = {"name": "engine", "image": "registry.invalid/engine:0", "resources": {"limits": {GPU: "1"}}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [container], "nodeSelector": {"lab.kvoffload.io/pool": pool}},
            },
        },
    }


def test_deployment_gets_a_replicaset_and_its_pod_is_bound_to_the_gpu_node(control_plane: Kube) -> None:
    kube = control_plane
    namespace = kube.namespace("lab")
    cpu_node, gpu_node = f"{namespace}-cpu-node", f"{namespace}-gpu-node"
    for name, gpus in ((cpu_node, 0), (gpu_node, 2)):
        kube.kubectl("create", "-f", "-", stdin=json.dumps(node(name, gpus, namespace)))
        # The TaintNodesByCondition admission plugin taints a new Node not-ready; a kubelet's first
        # Ready status would make the node-lifecycle controller lift it. Neither runs here.
        taints = [taint["key"] for taint in kube.get("node", name)["spec"].get("taints", [])]
        assert NOT_READY_TAINT in taints
        kube.kubectl("taint", "node", name, f"{NOT_READY_TAINT}:NoSchedule-")

    began = time.monotonic()
    kube.kubectl("create", "-f", "-", stdin=json.dumps(deployment("engine", namespace, namespace)))
    replica_sets = wait_for(
        lambda: owned_by(kube.get("replicasets", "-n", namespace)["items"], "Deployment", "engine"),
        "the deployment controller to create a ReplicaSet",
    )
    assert len(replica_sets) == 1
    replica_set = replica_sets[0]["metadata"]["name"]
    created_rs = time.monotonic() - began
    pod = wait_for(
        lambda: next(
            iter(owned_by(kube.get("pods", "-n", namespace)["items"], "ReplicaSet", replica_set)),
            None,
        ),
        "the replicaset controller to create a Pod",
    )
    created_pod = time.monotonic() - began
    pod_name = pod["metadata"]["name"]
    bound = wait_for(
        lambda: kube.get("pod", "-n", namespace, pod_name)["spec"].get("nodeName"), "the scheduler to bind the Pod"
    )
    bound_at = time.monotonic() - began
    print(
        f"\nReplicaSet {replica_set} after {created_rs:.2f} s, Pod {pod_name} after {created_pod:.2f} s, "
        f"bound to {bound} after {bound_at:.2f} s"
    )
    assert bound == gpu_node
    pod = kube.get("pod", "-n", namespace, pod_name)
    scheduled = {c["type"]: c["status"] for c in pod["status"]["conditions"]}.get("PodScheduled")
    assert scheduled == "True"
    # The ServiceAccount admission plugin added the default ServiceAccount's token volume (the
    # serviceaccount controller created that account; without it the Pod is refused).
    assert pod["spec"]["serviceAccountName"] == "default"
    assert any(volume["name"].startswith("kube-api-access-") for volume in pod["spec"]["volumes"])

    # --use-service-account-credentials: each controller acts as its own ServiceAccount.
    accounts = {item["metadata"]["name"] for item in kube.get("serviceaccounts", "-n", "kube-system")["items"]}
    assert {"deployment-controller", "replicaset-controller", "generic-garbage-collector"} <= accounts

    # Background deletion: the garbage collector removes the ReplicaSet, then marks its Pod for
    # deletion; a bound Pod stays Terminating until its kubelet confirms, and there is none.
    kube.kubectl("delete", "deployment", "engine", "-n", namespace, "--wait=false")
    wait_for(
        lambda: not kube.get("replicasets", "-n", namespace)["items"] or None,
        "the garbage collector to delete the ReplicaSet",
    )
    wait_for(
        lambda: kube.get("pod", "-n", namespace, pod_name)["metadata"].get("deletionTimestamp"),
        "the garbage collector to delete the Pod",
    )
    for name in (cpu_node, gpu_node):
        kube.kubectl("delete", "node", name, "--wait=false")
