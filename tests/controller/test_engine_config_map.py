"""The ConfigMap of a level's engine config files, written and removed with the level's Deployment.

On the emulated API server (the reconcile cycle, as tests/controller/test_controller.py plays it): the stable
level's ConfigMap is applied before its Deployment, the canary's with the canary, and a canary rolled back takes
its ConfigMap with it; a vLLM policy writes none and asks for none. On the real kube-apiserver (the session's
control plane): the ConfigMap is accepted, owned by the policy, applied by field manager kvoffload, mounted by
the Deployment, and follows a changed file. The engine is tests/support/files_engine.py's.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from kvoffload.analysis.hub import MeasurementHub
from kvoffload.api.conventions import COMPONENT, LABEL_CONFIG_HASH, PLURAL
from kvoffload.controller.gateway import PolicyRef
from kvoffload.controller.reconcile import Controller
from kvoffload.engines.engine import CONFIG_DIR
from kvoffload.policy.render import CONFIG_VOLUME
from tests.controller.test_controller import (
    NS,
    Clock,
    CraftedProvider,
    clock,
    controller,
    create_policy,
    deployment,
    in_canary,
    policy_body,
    provider,
    run_pods,
    writes,
)
from tests.controller.test_server_side_apply import create_policy as create_real_policy
from tests.controller.test_server_side_apply import gateway, managers
from tests.support.controlplane import Kube
from tests.support.files_engine import FILE, FilesEngine, files_engine
from tests.support.kube import EmulatedCluster

__all__ = ["clock", "controller", "files_engine", "in_canary", "provider"]  # fixtures, used by name


def config_map(kube: EmulatedCluster, name: str) -> dict[str, Any] | None:
    return kube.emulator.read_object("v1", "ConfigMap", NS, name)


def mounts_config(dep: dict[str, Any], name: str) -> bool:
    """Whether the Deployment's engine mounts ConfigMap ``name`` read-only at CONFIG_DIR (the real server adds the
    volume's defaultMode)."""
    pod = dep["spec"]["template"]["spec"]
    volume: dict[str, Any] = next((v for v in pod["volumes"] if v["name"] == CONFIG_VOLUME), {})
    mount = {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True}
    return volume.get("configMap", {}).get("name") == name and mount in pod["containers"][0]["volumeMounts"]


@pytest.mark.e2e
async def test_the_stable_levels_config_map_is_applied_before_its_deployment(
    kube: EmulatedCluster, controller: Controller, files_engine: FilesEngine
) -> None:
    await create_policy(kube)
    await controller.reconcile(policy_body(kube))

    dep = deployment(kube, "chat-gpu-only")
    files = config_map(kube, "chat-gpu-only")
    assert dep is not None
    assert files is not None
    assert files["data"] == {FILE: "# chat\nhost_cache_size: 0\nnote: first\n"}
    assert files["metadata"]["labels"][LABEL_CONFIG_HASH] == dep["metadata"]["labels"][LABEL_CONFIG_HASH]
    assert mounts_config(dep, "chat-gpu-only")
    applied = [w for w in writes(kube) if w[1] in ("configmaps", "deployments")]
    assert applied[:2] == [("PATCH", "configmaps", "chat-gpu-only"), ("PATCH", "deployments", "chat-gpu-only")]


@pytest.mark.e2e
async def test_a_canary_rolled_back_takes_its_config_map_with_it(
    kube: EmulatedCluster, controller: Controller, files_engine: FilesEngine, in_canary: dict[str, Any]
) -> None:
    canary = config_map(kube, "chat-cpu")
    assert canary is not None
    assert canary["data"][FILE].startswith("# chat\nhost_cache_size: 1073741824\n")
    oom = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
    await run_pods(
        kube,
        "chat-cpu",
        1,
        conditions=[{"type": "Ready", "status": "False"}],
        containerStatuses=[{"name": "vllm", "ready": False, "restartCount": 0, "lastState": oom, "state": oom}],
    )

    await controller.reconcile(policy_body(kube))

    assert deployment(kube, "chat-cpu") is None
    assert config_map(kube, "chat-cpu") is None
    assert config_map(kube, "chat-gpu-only") is not None  # the stable level keeps its own
    assert ("DELETE", "configmaps", "chat-cpu") in writes(kube)


@pytest.mark.e2e
async def test_a_policy_whose_engine_reads_no_file_asks_nothing_of_configmaps(
    kube: EmulatedCluster, controller: Controller, in_canary: dict[str, Any]
) -> None:
    oom = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
    await run_pods(
        kube,
        "chat-cpu",
        1,
        conditions=[{"type": "Ready", "status": "False"}],
        containerStatuses=[{"name": "vllm", "ready": False, "restartCount": 0, "lastState": oom, "state": oom}],
    )
    await controller.reconcile(policy_body(kube))

    assert deployment(kube, "chat-cpu") is None
    assert [r for r in kube.emulator if r.resource is not None and r.resource.plural == "configmaps"] == []


# --- the real kube-apiserver ---------------------------------------------------------------------


@pytest.mark.kube
async def test_the_real_api_server_accepts_the_config_map_owned_by_the_policy_and_it_follows_the_file(
    kube_crd: Kube, files_engine: FilesEngine
) -> None:
    kube = kube_crd
    ns = await asyncio.to_thread(kube.namespace, "files")
    body = await asyncio.to_thread(create_real_policy, kube, ns)
    controller = Controller(gateway(kube), MeasurementHub(CraftedProvider(), gather_window=0.0), clock=Clock())

    await controller.reconcile(await asyncio.to_thread(kube.get, PLURAL, "-n", ns, "chat"))

    files = await asyncio.to_thread(kube.get, "configmap", "-n", ns, "chat-gpu-only", "--show-managed-fields")
    dep = await asyncio.to_thread(kube.get, "deployment", "-n", ns, "chat-gpu-only")
    assert files["metadata"]["ownerReferences"] == [PolicyRef.from_body(body).owner_reference()]
    assert set(managers(files)) == {(COMPONENT, "Apply")}
    assert files["data"] == {FILE: "# chat\nhost_cache_size: 0\nnote: first\n"}
    first_hash = dep["spec"]["template"]["metadata"]["labels"][LABEL_CONFIG_HASH]
    assert files["metadata"]["labels"][LABEL_CONFIG_HASH] == first_hash
    assert mounts_config(dep, "chat-gpu-only")

    # The file changes (with an edit of the spec, so the cycle renders again): the ConfigMap follows, and the pods'
    # config hash moves, so they roll.
    files_engine.note = "second"
    patch = {"spec": {"model": {"env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]}}}
    await asyncio.to_thread(kube.kubectl, "patch", PLURAL, "-n", ns, "chat", "--type=merge", "-p", json.dumps(patch))
    await controller.reconcile(await asyncio.to_thread(kube.get, PLURAL, "-n", ns, "chat"))

    files = await asyncio.to_thread(kube.get, "configmap", "-n", ns, "chat-gpu-only")
    dep = await asyncio.to_thread(kube.get, "deployment", "-n", ns, "chat-gpu-only")
    assert files["data"] == {FILE: "# chat\nhost_cache_size: 0\nnote: second\n"}
    second_hash = dep["spec"]["template"]["metadata"]["labels"][LABEL_CONFIG_HASH]
    assert second_hash != first_hash
    assert files["metadata"]["labels"][LABEL_CONFIG_HASH] == second_hash

    # Deleted only as the policy's own: the gateway takes it away on the real server.
    assert await gateway(kube).delete_owned("ConfigMap", "chat-gpu-only", PolicyRef.from_body(body))
    gone = await asyncio.to_thread(kube.run, "get", "configmap", "-n", ns, "chat-gpu-only", "--ignore-not-found")
    assert gone.stdout.strip() == ""
