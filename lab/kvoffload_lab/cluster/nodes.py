"""The lab's fake Nodes: one per GPU class, shaped as the catalog says a node of that class is.

Each Node carries what the real scheduler checks a rendered pod against: the class's host memory
(the whole node's, as the catalog gives it), its GPUs as the extended resource the device plugin
would advertise (``nvidia.com/gpu``, ``amd.com/gpu``), the labels the pods select on (the class's
node labels, plus any ``spec.gpu.nodeSelector`` of a policy on that class) and the taints the class's
tolerations answer. The catalog says nothing of CPUs or local disk: the node gets :data:`NODE_CPUS`
and :data:`NODE_EPHEMERAL_STORAGE`, more than any policy here asks for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvoffload.api.conventions import API_GROUP
from kvoffload.policy.catalog import GPUClass

NODE_PREFIX = "lab-"
LABEL_LAB_NODE = f"lab.{API_GROUP}/gpu-class"
"""On every fake Node: the GPU class it stands for. The kubelet stand-in runs the pods bound to these."""
NODE_CPUS = "256"
NODE_EPHEMERAL_STORAGE = "30Ti"
"""A DGX's local NVMe is about 30 TB; the filesystem tiers' scratch requests count against it."""
NODE_PODS = "110"
NODE_IP = "127.0.0.1"


def node_name(gpu_class: str) -> str:
    """The fake Node of a GPU class: ``lab-nvidia-l4``."""
    return f"{NODE_PREFIX}{gpu_class}"


def taints(gpu: GPUClass) -> list[dict[str, Any]]:
    """The taints a node of the class carries: one per toleration the class's pods get (GPU nodes are
    tainted so that only pods that ask for a GPU land there)."""
    out: list[dict[str, Any]] = []
    for toleration in gpu.tolerations:
        taint: dict[str, Any] = {"key": toleration.key, "effect": toleration.effect or "NoSchedule"}
        if toleration.operator == "Equal" and toleration.value:
            taint["value"] = toleration.value
        out.append(taint)
    return out


def node_manifest(gpu: GPUClass, extra_labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The Node, status included (a Node's status may be set when it is created, as a kubelet does)."""
    name = node_name(gpu.name)
    capacity = {
        "cpu": NODE_CPUS,
        "memory": str(gpu.host_ram_per_node_bytes),
        "pods": NODE_PODS,
        "ephemeral-storage": NODE_EPHEMERAL_STORAGE,
        gpu.resource: str(gpu.gpus_per_node),
    }
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        LABEL_LAB_NODE: gpu.name,
        **gpu.node_labels,
        **dict(extra_labels or {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints(gpu)},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "addresses": [{"type": "InternalIP", "address": NODE_IP}, {"type": "Hostname", "address": name}],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kvoffload's kubelet stand-in runs this node's pods as emulated engines",
                }
            ],
        },
    }


__all__ = ("LABEL_LAB_NODE", "NODE_PREFIX", "node_manifest", "node_name", "taints")
