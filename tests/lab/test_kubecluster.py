"""The local cluster on the real control plane: fake GPU Nodes, the kubelet stand-in, and `kvoffload cluster`.

The Nodes are checked against what the renderer asks of them (pure); the rest runs on kube-apiserver
(marker ``kube``): the real scheduler leaving a canary that does not fit its Node Pending, with the
operator saying why, and `kvoffload cluster` as a person would use it, from the kubeconfig it
writes to the processes it leaves behind (none).
"""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from kvoffload.api.conventions import LABEL_LEVEL, LABEL_POLICY
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.policy.catalog import GPU_CLASSES, find_gpu_class
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.render import render_deployment
from kvoffload_lab.cluster.nodekubelet import gpu_classes_named
from kvoffload_lab.cluster.nodes import LABEL_LAB_NODE, node_manifest, node_name
from kvoffload_lab.promserver import free_port
from tests.support import paths
from tests.support.cluster import (
    ENGINE_GPU_KV_BLOCKS,
    POLICY_API_VERSION,
    Cluster,
    OperatorProcess,
    either_cluster,
    eventually,
    load_on,
    status_of,
)
from tests.support.controlplane import Kube, kubectl_binary, unavailable

EXAMPLE = paths.ROOT / "examples" / "demo-two-tier.yaml"
KVOFFLOAD = (sys.executable, "-c", "from kvoffload.cli.main import main; main()")


def example_policy(namespace: str, prometheus_url: str, **spec: Any) -> dict[str, Any]:
    doc: dict[str, Any] = next(d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d)
    doc = copy.deepcopy(doc)
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["prometheus"] = {"url": prometheus_url}
    doc["spec"].update(spec)
    return doc


# --- the Nodes, against the renderer --------------------------------------------------------------


@pytest.mark.parametrize("gpu", GPU_CLASSES, ids=lambda g: g.name)
def test_each_gpu_class_node_takes_the_pods_rendered_for_that_class(gpu: Any) -> None:
    doc = example_policy("llm", "http://127.0.0.1:9")
    doc["spec"]["gpu"] = {"class": gpu.name, "count": 1, "nodeSelector": {"pool": "inference"}}
    policy = KVOffloadPolicy.model_validate(doc)
    pod = render_deployment(policy, build_ladder(policy.spec)[-1], 1)["spec"]["template"]["spec"]
    node = node_manifest(gpu, gpu_classes_named([doc])[gpu.name])

    labels = node["metadata"]["labels"]
    assert {k: labels.get(k) for k in pod["nodeSelector"]} == pod["nodeSelector"]
    tolerated = {(t.get("key"), t.get("effect")) for t in pod["tolerations"] if t.get("operator") == "Exists"}
    assert node["spec"]["taints"], "GPU nodes are tainted, so only pods that tolerate it land there"
    assert all((t["key"], t["effect"]) in tolerated for t in node["spec"]["taints"])
    capacity = node["status"]["capacity"]
    assert int(capacity["memory"]) == gpu.host_ram_per_node_bytes
    assert capacity[gpu.resource] == str(gpu.gpus_per_node)
    assert labels[LABEL_LAB_NODE] == gpu.name
    assert node["metadata"]["name"] == node_name(gpu.name)


def test_nodes_are_made_only_for_classes_the_catalog_knows_with_every_policys_node_selector() -> None:
    policies = [
        {"spec": {"gpu": {"class": "nvidia-l4", "nodeSelector": {"pool": "a"}}}},
        {"spec": {"gpu": {"class": "nvidia-l4", "nodeSelector": {"zone": "z1"}}}},
        {"spec": {"gpu": {"class": "nvidia-imaginary-9000"}}},
        {"spec": {}},
    ]
    assert gpu_classes_named(policies) == {"nvidia-l4": {"pool": "a", "zone": "z1"}}
    assert find_gpu_class("nvidia-imaginary-9000") is None


# --- the real scheduler ---------------------------------------------------------------------------


@pytest_asyncio.fixture
async def kube_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with either_cluster(
        "kube", request, tmp_path / "cluster", ["--gpu-kv-blocks", str(ENGINE_GPU_KV_BLOCKS)]
    ) as c:
        yield c


@pytest.mark.kube
@pytest.mark.e2e
@pytest.mark.prometheus
@pytest.mark.timeout(180)
async def test_a_canary_too_big_for_what_is_left_of_its_node_stays_pending_and_the_operator_says_why(
    kube_cluster: Cluster, request: pytest.FixtureRequest
) -> None:
    # Each fits an L4 node (768 GiB) alone, so the policy is valid; together they do not: two stable
    # replicas of 301 GiB, and a canary of 501 GiB with its 200 GiB CPU tier.
    namespace = kube_cluster.namespace
    doc = example_policy(
        namespace,
        kube_cluster.prometheus.url,
        resources={"baseMemory": "300Gi", "headroom": "1Gi", "cpu": "2"},
        offload={"backend": "native", "cpu": "200Gi"},
        rollout={"canaryReplicas": 1, "maxSurge": 1, "baselineDuration": "4s", "stepDuration": "6s"},
        analysis={"interval": "1s", "window": "6s", "sustainedFor": "4s", "minRequests": 3, "ttftP99": "2s"},
    )
    name = doc["metadata"]["name"]
    operator = OperatorProcess(kube_cluster)
    operator.start()
    try:
        await kube_cluster.apply(doc)
        async with load_on(kube_cluster, name):

            def stuck() -> dict[str, Any] | None:
                status = status_of(kube_cluster, name)
                return status if "Insufficient memory" in (status.get("message") or "") else None

            status = await eventually(stuck, "the status to say the canary cannot be scheduled", 120)
    finally:
        await operator.stop()
        if getattr(request.node, "rep_call", None) is None or request.node.rep_call.failed:
            sys.stderr.write(f"--- operator log (tail) ---\n{operator.log_tail()}\n")
    print(f"\nstatus message: {status['message']}")
    assert status["phase"] == "Canary"
    assert status["stable"]["ready"] == 2
    pods = await kube_cluster.list_items(
        f"/api/v1/namespaces/{namespace}/pods",
        f"{LABEL_POLICY}={name},{LABEL_LEVEL}={status['ladder'][status['canary']['level']]}",
    )
    (pod,) = pods
    assert pod["status"]["phase"] == "Pending"
    assert "nodeName" not in pod["spec"]
    scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    assert f"pod {pod['metadata']['name']} cannot be scheduled: {scheduled['message']}" in status["message"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert any("Insufficient memory" in (c.get("message") or "") for c in conditions.values()), conditions


# --- `kvoffload cluster` --------------------------------------------------------------------------


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` now, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    binary = kubectl_binary()
    assert binary is not None
    return subprocess.run(
        [binary, f"--kubeconfig={kubeconfig}", *args], input=stdin, capture_output=True, text=True, timeout=60
    )


def wait(check: Any, what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.25)  # polling other processes
    return result


@pytest.mark.kube
@pytest.mark.e2e
@pytest.mark.prometheus
@pytest.mark.timeout(240)
def test_kvoffload_cluster_serves_kubectl_and_the_operator_and_leaves_nothing_running(
    control_plane: Kube, tmp_path: Path
) -> None:
    # control_plane: the binaries are there (it skips or fails otherwise); this test starts a plane of its own.
    if kubectl_binary() is None:
        unavailable("no kubectl")
    kubeconfig = tmp_path / "lab" / "kubeconfig"
    workdir = tmp_path / "work"
    prometheus_port, webhook_port = free_port(), free_port()
    log = (tmp_path / "cluster.log").open("w")
    cluster = subprocess.Popen(
        [
            *KVOFFLOAD,
            "cluster",
            "--kubeconfig",
            str(kubeconfig),
            "--prometheus-port",
            str(prometheus_port),
            "--webhook-port",
            str(webhook_port),
            "--workdir",
            str(workdir),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    operator: subprocess.Popen[bytes] | None = None
    try:
        wait(lambda: kubeconfig.exists() or cluster.poll() is not None, "the kubeconfig", 120)
        assert cluster.poll() is None, (tmp_path / "cluster.log").read_text()
        # Written only once the API answers: the first call through it succeeds.
        version = kubectl(kubeconfig, "version", "-o", "json")
        assert version.returncode == 0, version.stderr
        print(f"\nserver {json.loads(version.stdout)['serverVersion']['gitVersion']}")
        crds = kubectl(kubeconfig, "get", "crd", "-o", "name").stdout.split()
        assert {"customresourcedefinition.apiextensions.k8s.io/kvoffloadpolicies.kvoffload.io"} <= set(crds)
        assert "customresourcedefinition.apiextensions.k8s.io/podmonitors.monitoring.coreos.com" in crds

        # As the cluster's own instructions say, with the webhook it registered.
        (run_line,) = [
            line for line in (tmp_path / "cluster.log").read_text().splitlines() if " kvoffload run " in line
        ]
        webhook = run_line.split("--standalone", 1)[1].split()
        assert webhook[:2] == ["--webhook-port", str(webhook_port)], run_line
        operator = subprocess.Popen(
            [*KVOFFLOAD, "run", "-A", "--prometheus-allow-private", "--standalone", "--metrics-port", "0", *webhook],
            stdout=(tmp_path / "operator.log").open("wb"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"},
        )
        wait(lambda: port_open(webhook_port) or operator.poll() is not None, "the operator's webhook", 60)
        doc = example_policy("default", f"http://127.0.0.1:{prometheus_port}")
        bad = copy.deepcopy(doc)
        bad["metadata"]["name"] = "imaginary"
        bad["spec"]["gpu"]["class"] = "nvidia-imaginary-9000"
        refused = kubectl(kubeconfig, "apply", "-f", "-", stdin=json.dumps(bad))
        assert refused.returncode != 0
        assert 'admission webhook "policies.kvoffload.io" denied the request' in refused.stderr, refused.stderr
        assert "spec.gpu.class" in refused.stderr
        applied = kubectl(kubeconfig, "apply", "-f", "-", stdin=json.dumps(doc))
        assert applied.returncode == 0, applied.stderr

        def node() -> dict[str, Any] | None:
            got = kubectl(kubeconfig, "get", "node", node_name("nvidia-l4"), "-o", "json")
            return json.loads(got.stdout) if got.returncode == 0 else None

        made = wait(node, "the nvidia-l4 Node", 30)
        gpu = find_gpu_class("nvidia-l4")
        assert gpu is not None
        assert made["status"]["capacity"]["memory"] == str(gpu.host_ram_per_node_bytes)
        assert made["status"]["allocatable"]["nvidia.com/gpu"] == "8"

        def stable_ready() -> list[dict[str, Any]] | None:
            got = kubectl(kubeconfig, "get", "pods", "-n", "default", "-l", f"{LABEL_POLICY}=demo", "-o", "json")
            pods = json.loads(got.stdout)["items"] if got.returncode == 0 else []
            ready = [
                p
                for p in pods
                if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
            ]
            return ready if len(ready) == doc["spec"]["replicas"] else None

        pods = wait(stable_ready, "the demo policy's stable pods Ready", 120)
        assert {p["spec"]["nodeName"] for p in pods} == {node_name("nvidia-l4")}

        def reported() -> dict[str, Any] | None:
            got = kubectl(kubeconfig, "get", "kvop", "demo", "-n", "default", "-o", "json")
            policy: dict[str, Any] = json.loads(got.stdout) if got.returncode == 0 else {}
            stable = (policy.get("status") or {}).get("stable") or {}
            return policy if stable.get("ready") == doc["spec"]["replicas"] else None

        policy = wait(reported, "the operator to report both stable replicas Ready", 60)  # its next cycle
        assert policy["apiVersion"] == POLICY_API_VERSION

        operator.terminate()
        operator.wait(30)
        below = descendants(cluster.pid)
        # etcd, kube-apiserver, kube-controller-manager, kube-scheduler, Prometheus and two engines at least.
        assert len(below) >= 7, below
        cluster.send_signal(signal.SIGTERM)
        assert cluster.wait(60) == 0, (tmp_path / "cluster.log").read_text()[-3000:]
        left = {pid for pid in below if alive(pid)}
        assert not left, f"still running after kvoffload cluster stopped: {left}"
        assert not kubeconfig.exists()
    finally:
        # SIGTERM first: a SIGKILLed `kvoffload cluster` could not stop the control plane it started.
        for process in (operator, cluster):
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        log.close()
