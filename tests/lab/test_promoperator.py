"""The real Prometheus Operator in the lab: what it generates is what Prometheus runs, and its selector decides.

Pure: the pod discovery the lab serves in place of Debian's missing Kubernetes discovery gives a pod's targets
with the labels Prometheus' own would, and the adaptation of the generated configuration keeps every relabelling.
On kube-apiserver (marker ``kube``): with the operator started without ``--monitor-label``, a policy whose PodMonitor
carries ``release: kvoffload-lab`` (from ``spec.prometheus.monitorLabels``) is scraped under the lab Prometheus'
``podMonitorSelector``, and one without it is reported ``PodsNotScraped`` with the fix in the message.
"""

from __future__ import annotations

import base64
import gzip
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from kvoffload.api.conventions import PODS_NOT_SCRAPED, Reason
from kvoffload_lab import promoperator
from kvoffload_lab.cluster.laboperator import running_operator
from kvoffload_lab.promoperator import LAB_RELEASE, RELEASE_LABEL, adapt_config, decode_secret, pod_targets
from tests.lab.test_e2e import policy_doc
from tests.support.cluster import Cluster, either_cluster, eventually, load_on, status_of

POD: dict[str, Any] = {
    "metadata": {
        "name": "chat-cpu-7d9f-abcde",
        "namespace": "llm",
        "uid": "u-1",
        "labels": {"kvoffload.io/policy": "chat", "app.kubernetes.io/name": "vllm"},
        "annotations": {"kvoffload.io/tiers": "cpu"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": "chat-cpu-7d9f", "controller": True}],
    },
    "spec": {
        "nodeName": "lab-nvidia-l4",
        "containers": [
            {
                "name": "vllm",
                "image": "vllm/vllm-openai:v0.32.0",
                "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}, {"containerPort": 9000}],
            }
        ],
    },
    "status": {
        "phase": "Running",
        "podIP": "127.64.0.7",
        "hostIP": "127.0.0.1",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "vllm", "containerID": "emulated://42"}],
    },
}


def test_a_pods_targets_are_one_per_container_port_with_the_labels_kubernetes_discovery_gives() -> None:
    http, other = pod_targets(POD)
    assert http["targets"] == ["127.64.0.7:8000"]
    assert other["targets"] == ["127.64.0.7:9000"]
    labels = http["labels"]
    assert labels["__meta_kubernetes_namespace"] == "llm"
    assert labels["__meta_kubernetes_pod_name"] == "chat-cpu-7d9f-abcde"
    assert labels["__meta_kubernetes_pod_label_kvoffload_io_policy"] == "chat"
    assert labels["__meta_kubernetes_pod_labelpresent_kvoffload_io_policy"] == "true"
    assert labels["__meta_kubernetes_pod_annotation_kvoffload_io_tiers"] == "cpu"
    assert labels["__meta_kubernetes_pod_container_port_name"] == "http"
    assert labels["__meta_kubernetes_pod_container_port_number"] == "8000"
    assert labels["__meta_kubernetes_pod_ready"] == "true"
    assert labels["__meta_kubernetes_pod_phase"] == "Running"
    assert labels["__meta_kubernetes_pod_controller_kind"] == "ReplicaSet"
    assert labels["__meta_kubernetes_pod_container_id"] == "emulated://42"
    assert other["labels"]["__meta_kubernetes_pod_container_port_name"] == ""


def test_a_pod_without_an_ip_has_no_target_yet() -> None:
    pending = {**POD, "status": {"phase": "Pending"}}
    assert pod_targets(pending) == []


GENERATED: dict[str, Any] = {
    "global": {"scrape_interval": "1000ms", "external_labels": {}},
    "scrape_configs": [
        {
            "job_name": "podMonitor/llm/chat/0",
            "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": ["llm"]}}],
            "relabel_configs": [
                {"action": "keep", "regex": "http", "source_labels": ["__meta_kubernetes_pod_container_port_name"]},
                {"action": "keep", "regex": "$(SHARD);|.+;.+", "source_labels": ["__tmp_hash", "__tmp_disable"]},
            ],
        }
    ],
}


def test_the_generated_configuration_keeps_its_relabelling_and_discovers_pods_from_a_file(tmp_path: Path) -> None:
    config, discoveries = adapt_config(GENERATED, sd_dir=tmp_path, lab_sd_files=str(tmp_path / "sd" / "*.json"))
    job = config["scrape_configs"][0]
    assert "kubernetes_sd_configs" not in job
    assert job["file_sd_configs"] == [{"files": [str(tmp_path / "job-0.json")], "refresh_interval": "1s"}]
    # The config reloader's substitution, as in the Prometheus pod of shard 0; every other rule as generated.
    assert job["relabel_configs"][1]["regex"] == "0;|.+;.+"
    assert job["relabel_configs"][0] == GENERATED["scrape_configs"][0]["relabel_configs"][0]
    assert [d.namespaces for d in discoveries] == [("llm",)]
    assert config["scrape_configs"][1]["job_name"] == "lab"
    assert GENERATED["scrape_configs"][0]["relabel_configs"][1]["regex"].startswith("$(SHARD)")  # not mutated


def test_a_discovery_role_the_lab_cannot_serve_is_refused(tmp_path: Path) -> None:
    endpoints = {"scrape_configs": [{"job_name": "x", "kubernetes_sd_configs": [{"role": "endpoints"}]}]}
    with pytest.raises(promoperator.PrometheusOperatorError, match="pods only"):
        adapt_config(endpoints, sd_dir=tmp_path, lab_sd_files=None)


def test_the_secret_holds_the_configuration_gzipped() -> None:
    data = base64.b64encode(gzip.compress(yaml.safe_dump(GENERATED).encode())).decode()
    assert decode_secret({"data": {promoperator.CONFIG_KEY: data}}) == GENERATED
    assert decode_secret({"data": {}}) is None


# --- on kube-apiserver ------------------------------------------------------------------------


@pytest_asyncio.fixture
async def kube_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with either_cluster("kube", request, tmp_path / "cluster", ["--gpu-kv-blocks", "24"]) as cluster:
        yield cluster


def _podmonitor_labels(cluster: Cluster, name: str) -> dict[str, str]:
    found = cluster.get("monitoring.coreos.com/v1", "PodMonitor", cluster.namespace, name) or {}
    return dict((found.get("metadata") or {}).get("labels") or {})


def _condition(cluster: Cluster, name: str, type_: str) -> dict[str, Any] | None:
    return next((c for c in status_of(cluster, name).get("conditions") or [] if c["type"] == type_), None)


@pytest.mark.kube
@pytest.mark.e2e
@pytest.mark.prometheus
@pytest.mark.timeout(240)
async def test_only_the_podmonitor_with_the_release_label_is_scraped_and_the_other_policy_says_why(
    kube_cluster: Cluster,
) -> None:
    cluster = kube_cluster
    seen, unseen = policy_doc("seen", cluster), policy_doc("unseen", cluster, max_inconclusive=4)
    seen["spec"]["prometheus"]["monitorLabels"] = {RELEASE_LABEL: LAB_RELEASE}
    # No --monitor-label: only the policy's own monitorLabels can make its PodMonitor selected.
    async with running_operator(cluster, monitor_labels={}):
        await cluster.apply(seen)
        await cluster.apply(unseen)
        async with load_on(cluster, "seen", "unseen"):
            not_scraped = await eventually(
                lambda: (c := _condition(cluster, "unseen", PODS_NOT_SCRAPED)) and c["status"] == "True" and c,
                "PodsNotScraped on the policy whose PodMonitor lacks the release label",
                120,
            )
            # The selected one is scraped: Prometheus holds the up series of its two engines, and none of the other.
            up = cluster.prometheus.wait_for_series('up{kvoffload_io_policy="seen"} == 1', 60, count=2)
    assert {s["metric"]["namespace"] for s in up} == {cluster.namespace}
    assert cluster.prometheus.query('up{kvoffload_io_policy="unseen"}') == []
    assert _podmonitor_labels(cluster, "seen").get(RELEASE_LABEL) == LAB_RELEASE
    assert RELEASE_LABEL not in _podmonitor_labels(cluster, "unseen")

    assert not_scraped["reason"] == Reason.NOT_SCRAPED
    message = not_scraped["message"]
    for part in ("PodMonitor unseen", "podMonitorSelector", "--monitor-label", "spec.prometheus.monitorLabels"):
        assert part in message, message
    assert status_of(cluster, "unseen")["phase"] == "Paused"
    assert "no Prometheus scrapes" in status_of(cluster, "unseen").get("message", "")
    assert _condition(cluster, "seen", PODS_NOT_SCRAPED) is None
