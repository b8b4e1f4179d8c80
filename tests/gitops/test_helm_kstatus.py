"""Helm v4's kstatus watcher (``helm install --wait=watcher``) on a chart that holds a policy.

Two tiers, both with the real watcher from the Helm v4 SDK inside helm-python-sdk:

- against the lab's emulated API server alone, with each captured status written onto the
  policy the chart created, as the operator would: Stable is waited for and passes, RolledBack
  and Invalid fail at once, every other phase is still InProgress when the wait times out;
- end to end, with the operator, Prometheus and emulated engines under load: the install waits
  through the whole climb and returns when the policy is Stable, and fails when it rolls back.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest

from kvoffload.api.conventions import KIND, POLICY_API_VERSION
from kvoffload.api.crd import crd_manifest
from kvoffload.lab.cluster.kubeemu import KubeEmulator, serve, write_kubeconfig
from kvoffload.lab.cluster.localcluster import LocalCluster
from tests.support.cluster import OperatorProcess, load_on, status_of
from tests.support.helm_watch import install_and_wait
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
async def test_helm_waits_on_each_captured_phase_as_kstatus_reads_it(case: str, tmp_path: Path) -> None:
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
    await local_cluster.set_faults(
        "kvoffload.io/variant=canary,kvoffload.io/level=nvme", {"ttft_multiplier": 10}, sticky=True
    )
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
