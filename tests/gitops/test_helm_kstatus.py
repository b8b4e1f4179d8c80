"""Helm v4's kstatus watcher (``helm install --wait=watcher``) on a chart that holds a policy.

Three tiers, all with the real watcher from the Helm v4 SDK inside helm-python-sdk:

- against the real Kubernetes control plane (kube-apiserver v1.37.2, marker ``kube``) with the
  project's CRD and Helm's default options, each captured status written onto the policy the
  chart created, as the operator would: Stable is waited for and passes, RolledBack and Invalid
  fail at once, every other phase is still InProgress when the wait times out. The policy nobody
  has written a status for reads as the API server serves it, with the CRD's status default;
- the same against the lab's emulated API server;
- end to end on the lab, with the operator, Prometheus and emulated engines under load: the
  install waits through the whole climb and returns when the policy is Stable, and fails when it
  rolls back. (The real control plane has no kubelet, so no engine would ever run there.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import time
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes.client
import kubernetes.config
import pytest

from kvoffload.api.conventions import API_GROUP, API_VERSION, KIND, PLURAL, POLICY_API_VERSION
from kvoffload.api.crd import crd_manifest
from kvoffload_lab.cluster.kubeemu import KubeEmulator, serve, write_kubeconfig
from kvoffload_lab.cluster.localcluster import LocalCluster
from kvoffload_lab.controlplane import ControlPlane
from tests.support.cluster import OperatorProcess, load_on, status_of
from tests.support.helm_watch import POLICY_CHART, WaitResult, install_and_wait
from tests.support.status_fixtures import NAMES, load, policy

IN_PROGRESS_TIMEOUT = 3
"""Seconds Helm waits where the answer is InProgress: the wait must run out."""
SETTLED_TIMEOUT = 30
"""Seconds Helm may wait where the answer is Current or Failed: it must come back well before."""


def applied(obj: dict[str, Any]) -> dict[str, Any]:
    """What Git would hold: the object without server fields and status."""
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "metadata": {"name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"]},
        "spec": copy.deepcopy(obj["spec"]),
    }


def paused_at_the_top() -> dict[str, Any]:
    """The Stable capture as it reads after `kvoffload pause` at the top of the ladder."""
    obj = load("stable")
    obj["status"]["phase"] = "Paused"
    for c in obj["status"]["conditions"]:
        if c["type"] == "Paused":
            c["status"], c["reason"] = "True", "Paused"
    return obj


CASES: dict[str, tuple[dict[str, Any], str]] = {
    **{name: (load(name), "InProgress") for name in NAMES},
    "stable": (load("stable"), "Current"),
    "rolled-back": (load("rolled-back"), "Failed"),
    "invalid": (load("invalid"), "Failed"),
    "paused-at-the-top": (paused_at_the_top(), "Current"),
}


async def play_the_operator(emulator: KubeEmulator, captured: dict[str, Any]) -> None:
    """Once Helm has created the policy: bump its generation as the capture's spec edits did, write its status."""
    meta = captured["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while emulator.read_object(POLICY_API_VERSION, KIND, namespace, name) is None:
        assert loop.time() < deadline, "Helm never created the policy"
        await asyncio.sleep(0.02)  # poll: Helm creates it from another thread
    for bump in range(1, meta["generation"]):
        spec_edit = {"spec": {"model": {"extraArgs": [f"--seed={bump}"]}}}
        await emulator.patch_object(POLICY_API_VERSION, KIND, namespace, name, spec_edit)
    if captured["status"] != {"observedGeneration": 0}:  # "pending": the operator has written nothing
        await emulator.patch_object(
            POLICY_API_VERSION, KIND, namespace, name, {"status": captured["status"]}, subresource="status"
        )


@pytest.mark.parametrize("case", sorted(CASES))
async def test_helm_on_the_lab_api_server_waits_on_each_captured_phase_as_kstatus_reads_it(
    case: str, tmp_path: Path
) -> None:
    captured, expected = CASES[case]
    timeout = IN_PROGRESS_TIMEOUT if expected == "InProgress" else SETTLED_TIMEOUT
    async with serve() as (emulator, url):
        await emulator.create_object(crd_manifest())
        kubeconfig = write_kubeconfig(url, tmp_path / "kubeconfig")
        helm = asyncio.create_task(
            asyncio.to_thread(install_and_wait, kubeconfig, "p", {"policy": applied(captured)}, timeout=timeout)
        )
        await play_the_operator(emulator, captured)
        result = await helm
        stored = emulator.read_object(POLICY_API_VERSION, KIND, "default", captured["metadata"]["name"])

    assert stored is not None
    assert stored["metadata"]["generation"] == captured["metadata"]["generation"]
    assert result.kstatus == expected, result.message
    if expected != "InProgress":
        assert result.seconds < SETTLED_TIMEOUT / 2, "a settled status is seen at once, not at the deadline"


def test_the_cases_cover_every_capture_and_the_pause_at_the_top() -> None:
    assert set(CASES) == {*NAMES, "paused-at-the-top"}


# --- the real control plane --------------------------------------------------------------------------


def helm_install(kubeconfig: Path, namespace: str, policy_doc: dict[str, Any], timeout: int) -> WaitResult:
    """``helm install`` with Helm's own defaults (OpenAPI validation, its apply) and ``--wait=watcher``."""
    started = time.monotonic()
    with helm.Config(kubeconfig_path=str(kubeconfig), namespace=namespace) as config:
        try:
            config.install(
                str(POLICY_CHART), "p", {"policy": policy_doc}, wait="watcher", timeout=timeout, create_namespace=True
            )
        except helm.HelmError as exc:
            return WaitResult(False, time.monotonic() - started, str(exc))
    return WaitResult(True, time.monotonic() - started, "")


def write_as_the_operator(api: kubernetes.client.ApiClient, captured: dict[str, Any], namespace: str) -> dict[str, Any]:
    """Once Helm has created the policy: bump its generation as the capture's spec edits did, write its status."""
    objects = kubernetes.client.CustomObjectsApi(api)
    coordinates = (API_GROUP, API_VERSION, namespace, PLURAL, captured["metadata"]["name"])
    deadline = time.monotonic() + 30
    while True:
        try:
            objects.get_namespaced_custom_object(*coordinates)
            break
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
            assert time.monotonic() < deadline, "Helm never created the policy"
            time.sleep(0.05)  # poll: Helm creates it from another thread
    merge = {"_content_type": "application/merge-patch+json"}
    for bump in range(1, captured["metadata"]["generation"]):
        objects.patch_namespaced_custom_object(
            *coordinates, {"spec": {"model": {"extraArgs": [f"--seed={bump}"]}}}, **merge
        )
    if captured["status"] != {"observedGeneration": 0}:  # "pending": the operator has written nothing
        objects.patch_namespaced_custom_object_status(*coordinates, {"status": captured["status"]}, **merge)
    stored: dict[str, Any] = objects.get_namespaced_custom_object(*coordinates)
    return stored


@pytest.mark.kube
@pytest.mark.parametrize("case", sorted(CASES))
def test_helm_on_the_real_api_server_waits_on_each_captured_phase_as_kstatus_reads_it(
    case: str, real_cluster: ControlPlane
) -> None:
    captured, expected = CASES[case]
    namespace = f"case-{case}"
    doc = {**applied(captured), "metadata": {"name": captured["metadata"]["name"], "namespace": namespace}}
    timeout = IN_PROGRESS_TIMEOUT if expected == "InProgress" else SETTLED_TIMEOUT
    with (
        kubernetes.config.new_client_from_config(config_file=str(real_cluster.kubeconfig)) as api,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        helm_run = pool.submit(helm_install, real_cluster.kubeconfig, namespace, doc, timeout)
        stored = write_as_the_operator(api, captured, namespace)
        result = helm_run.result()

    assert stored["metadata"]["generation"] == captured["metadata"]["generation"]
    if case == "pending":
        assert stored["status"] == {"observedGeneration": 0}, "the API server serves the CRD's status default"
        assert "generation is 1, but latest observed generation is 0" in result.message
    assert result.kstatus == expected, result.message
    if expected != "InProgress":
        assert result.seconds < SETTLED_TIMEOUT / 2, "a settled status is seen at once, not at the deadline"


# --- end to end: the operator, Prometheus, engines under load ----------------------------------------


@pytest.mark.e2e
@pytest.mark.prometheus
@pytest.mark.timeout(240)
async def test_helm_waits_for_a_policy_through_its_whole_climb_until_it_is_stable(
    local_cluster: LocalCluster, operator: OperatorProcess
) -> None:
    doc = policy("chat", local_cluster.prometheus.url)
    async with load_on(local_cluster, "chat"):
        result = await asyncio.to_thread(
            install_and_wait, local_cluster.kubeconfig, "chat", {"policy": doc}, timeout=150
        )
    status = status_of(local_cluster, "chat")

    assert result.ok, result.message
    assert status["phase"] == "Stable", status.get("message")
    decisions = [h["decision"] for h in status["history"]]
    assert decisions[-1] == "LevelPromoted"
    assert "BaselineTaken" in decisions, "Helm waited through the baseline and every step"


@pytest.mark.e2e
@pytest.mark.prometheus
@pytest.mark.timeout(240)
async def test_helm_fails_the_install_when_the_policy_rolls_back(
    local_cluster: LocalCluster, operator: OperatorProcess
) -> None:
    await local_cluster.set_faults("kvoffload.io/level=nvme", {"ttft_multiplier": 10}, sticky=True)
    doc = policy("chat", local_cluster.prometheus.url)
    async with load_on(local_cluster, "chat"):
        result = await asyncio.to_thread(
            install_and_wait, local_cluster.kubeconfig, "chat", {"policy": doc}, timeout=150
        )
    status = status_of(local_cluster, "chat")

    assert not result.ok
    assert result.kstatus == "Failed", result.message
    assert status["phase"] == "RolledBack"
    assert "canary nvme removed" in result.message, "Helm's error carries the Stalled condition's message"
    assert result.seconds < 120, "it fails when the policy rolls back, not at the timeout"
