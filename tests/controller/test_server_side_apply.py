"""The gateway and the reconcile cycle against the real kube-apiserver: server-side apply as field manager kvoffload.

The session's control plane (tests/support/controlplane.py), reached with its admin credentials.
Other field managers are played by kubectl (``kubectl annotate``, ``kubectl scale``, ``kubectl
patch``), so the fields they set are recorded under kubectl's own manager names, as they would be
in a real cluster.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest

from kvoffload.analysis.hub import MeasurementHub
from kvoffload.api.conventions import ANNOTATION_APPLIED, API_GROUP, API_VERSION, COMPONENT, KIND, PLURAL
from kvoffload.controller.apierrors import FieldConflictError, NotOwnedError
from kvoffload.controller.gateway import KubernetesGateway, PolicyRef, RetryPolicy
from kvoffload.controller.reconcile import Controller
from tests.controller.test_controller import Clock, CraftedProvider, chat_spec
from tests.controller.test_gateway import engine
from tests.support.controlplane import Kube

pytestmark = pytest.mark.kube

POLICY_API = f"{API_GROUP}/{API_VERSION}"
OTHERS_ANNOTATION = "example.com/cost-center"


def gateway(kube: Kube) -> KubernetesGateway:
    return KubernetesGateway(kube.api_client, retry=RetryPolicy(attempts=4, base_delay=0.05))


def create_policy(kube: Kube, ns: str, name: str = "chat", spec: dict[str, Any] | None = None) -> dict[str, Any]:
    manifest = {
        "apiVersion": POLICY_API,
        "kind": KIND,
        "metadata": {"name": name, "namespace": ns},
        "spec": spec if spec is not None else chat_spec(),
    }
    kube.kubectl("create", "-f", "-", stdin=json.dumps(manifest))
    body: dict[str, Any] = kube.get(PLURAL, "-n", ns, name)
    return body


def in_namespace(manifest: dict[str, Any], ns: str) -> dict[str, Any]:
    out = copy.deepcopy(manifest)
    out["metadata"]["namespace"] = ns
    return out


def managers(obj: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """``metadata.managedFields`` by (manager, operation) (the status subresource's entries apart)."""
    return {
        (entry["manager"], entry["operation"]): entry["fieldsV1"]
        for entry in obj["metadata"].get("managedFields", [])
        if not entry.get("subresource")
    }


def applied_at(obj: dict[str, Any]) -> str:
    """When kvoffload's applied fields last changed."""
    return next(
        str(e["time"])
        for e in obj["metadata"]["managedFields"]
        if (e["manager"], e["operation"]) == (COMPONENT, "Apply")
    )


# --- the reconcile cycle --------------------------------------------------------------------------


async def test_another_managers_annotation_on_a_rendered_deployment_survives_a_reconcile(kube_crd: Kube) -> None:
    kube = kube_crd
    ns = await asyncio.to_thread(kube.namespace, "ssa")
    await asyncio.to_thread(create_policy, kube, ns)
    controller = Controller(gateway(kube), MeasurementHub(CraftedProvider(), gather_window=0.0), clock=Clock())

    await controller.reconcile(await asyncio.to_thread(kube.get, PLURAL, "-n", ns, "chat"))
    first = await asyncio.to_thread(kube.get, "deployment", "-n", ns, "chat-gpu-only", "--show-managed-fields")
    assert set(managers(first)) >= {(COMPONENT, "Apply")}
    # Someone else annotates and labels the Deployment, and scales it by hand.
    await asyncio.to_thread(kube.kubectl, "annotate", "-n", ns, "deployment/chat-gpu-only", f"{OTHERS_ANNOTATION}=llm")
    await asyncio.to_thread(kube.kubectl, "label", "-n", ns, "deployment/chat-gpu-only", "team=inference")
    await asyncio.to_thread(kube.kubectl, "scale", "-n", ns, "deployment/chat-gpu-only", "--replicas=7")
    # An edit of the spec changes the rendered engine, so the next cycle writes the Deployment.
    patch = {"spec": {"model": {"env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]}}}
    await asyncio.to_thread(kube.kubectl, "patch", PLURAL, "-n", ns, "chat", "--type=merge", "-p", json.dumps(patch))

    await controller.reconcile(await asyncio.to_thread(kube.get, PLURAL, "-n", ns, "chat"))

    after = await asyncio.to_thread(kube.get, "deployment", "-n", ns, "chat-gpu-only", "--show-managed-fields")
    assert after["metadata"]["annotations"][OTHERS_ANNOTATION] == "llm"
    assert after["metadata"]["labels"]["team"] == "inference"
    assert after["metadata"]["annotations"][ANNOTATION_APPLIED] != first["metadata"]["annotations"][ANNOTATION_APPLIED]
    env = {e["name"]: e.get("value") for e in after["spec"]["template"]["spec"]["containers"][0].get("env", [])}
    assert env["VLLM_LOGGING_LEVEL"] == "DEBUG"
    assert after["spec"]["replicas"] == first["spec"]["replicas"] == 4  # forced back: the ladder owns replicas
    owners = managers(after)
    assert f"f:{OTHERS_ANNOTATION}" in owners[("kubectl-annotate", "Update")]["f:metadata"]["f:annotations"]
    assert "f:team" in owners[("kubectl-label", "Update")]["f:metadata"]["f:labels"]
    assert "f:replicas" in owners[(COMPONENT, "Apply")]["f:spec"]
    assert "f:replicas" not in owners.get(("kubectl", "Update"), {}).get("f:spec", {})
    # The status subresource is written by kvoffload too.
    policy = await asyncio.to_thread(kube.get, PLURAL, "-n", ns, "chat", "--show-managed-fields")
    status_managers = {e["manager"] for e in policy["metadata"]["managedFields"] if e.get("subresource") == "status"}
    assert status_managers == {COMPONENT}


# --- the gateway ----------------------------------------------------------------------------------


async def test_apply_creates_then_changes_only_what_it_renders(kube_crd: Kube) -> None:
    kube = kube_crd
    ns = await asyncio.to_thread(kube.namespace, "ssa")
    owner = PolicyRef.from_body(await asyncio.to_thread(create_policy, kube, ns))
    api = gateway(kube)
    manifest = in_namespace(engine("chat-gpu-only", "chat"), ns)
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}, {"name": "B"}]

    created = await api.apply(manifest, owner)
    assert list(managers(created)) == [(COMPONENT, "Apply")]
    again = await api.apply(manifest, owner)
    # A no-op: the spec and kvoffload's entry are unchanged (the Deployment controller writes meanwhile).
    assert again["metadata"]["generation"] == created["metadata"]["generation"] == 1
    assert applied_at(again) == applied_at(created)

    await asyncio.to_thread(
        kube.kubectl,
        "patch",
        "-n",
        ns,
        "deployment/chat-gpu-only",
        "--type=merge",
        "-p",
        json.dumps({"metadata": {"annotations": {OTHERS_ANNOTATION: "llm"}, "finalizers": ["example.com/keep"]}}),
    )
    manifest["spec"]["replicas"] = 2
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "A", "value": "2"}]
    updated = await api.apply(manifest, owner)

    assert updated["spec"]["replicas"] == 2
    assert updated["spec"]["template"]["spec"]["containers"][0]["env"] == [{"name": "A", "value": "2"}]
    annotations = updated["metadata"]["annotations"]
    assert annotations[OTHERS_ANNOTATION] == "llm"
    assert set(annotations) <= {OTHERS_ANNOTATION, "deployment.kubernetes.io/revision"}  # the controller's
    assert updated["metadata"]["finalizers"] == ["example.com/keep"]
    assert updated["metadata"]["ownerReferences"] == [owner.owner_reference()]
    await asyncio.to_thread(
        kube.kubectl,
        "patch",
        "-n",
        ns,
        "deployment/chat-gpu-only",
        "--type=json",
        "-p",
        '[{"op":"remove","path":"/metadata/finalizers"}]',
    )


async def test_a_conflict_is_forced_by_default_and_reported_when_not(kube_crd: Kube) -> None:
    kube = kube_crd
    ns = await asyncio.to_thread(kube.namespace, "ssa")
    owner = PolicyRef.from_body(await asyncio.to_thread(create_policy, kube, ns))
    api = gateway(kube)
    manifest = in_namespace(engine("chat-gpu-only", "chat", replicas=2), ns)
    await api.apply(manifest, owner)
    await asyncio.to_thread(kube.kubectl, "scale", "-n", ns, "deployment/chat-gpu-only", "--replicas=5")

    manifest["spec"]["replicas"] = 3
    with pytest.raises(FieldConflictError, match=r'\.spec\.replicas \(conflict with "kubectl"'):
        await api.apply(manifest, owner, force=False)
    still = await asyncio.to_thread(kube.get, "deployment", "-n", ns, "chat-gpu-only", "--show-managed-fields")
    assert still["spec"]["replicas"] == 5

    forced = await api.apply(manifest, owner)
    assert forced["spec"]["replicas"] == 3


async def test_apply_neither_adopts_nor_changes_an_object_it_does_not_own(kube_crd: Kube) -> None:
    kube = kube_crd
    ns = await asyncio.to_thread(kube.namespace, "ssa")
    owner = PolicyRef.from_body(await asyncio.to_thread(create_policy, kube, ns))
    theirs = in_namespace(engine("chat-gpu-only", "chat"), ns)
    await asyncio.to_thread(kube.kubectl, "create", "-f", "-", stdin=json.dumps(theirs))
    before = await asyncio.to_thread(kube.get, "deployment", "-n", ns, "chat-gpu-only", "--show-managed-fields")

    with pytest.raises(NotOwnedError, match="not owned by it"):
        await gateway(kube).apply(in_namespace(engine("chat-gpu-only", "chat", replicas=3), ns), owner)

    after = await asyncio.to_thread(kube.get, "deployment", "-n", ns, "chat-gpu-only", "--show-managed-fields")
    # Not the resourceVersion: the real controller manager writes the Deployment's status meanwhile.
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"] == before["spec"]
    assert "kvoffload" not in {entry["manager"] for entry in after["metadata"]["managedFields"]}
    assert "ownerReferences" not in after["metadata"]


async def test_status_goes_through_the_status_subresource_by_merge_patch(kube_crd: Kube) -> None:
    kube = kube_crd
    ns = await asyncio.to_thread(kube.namespace, "ssa")
    owner = PolicyRef.from_body(await asyncio.to_thread(create_policy, kube, ns))
    api = gateway(kube)

    await api.patch_status(owner, {"phase": "Canary", "observedGeneration": 1, "message": "x"})
    stored = await api.patch_status(owner, {"phase": "Baseline", "message": None})

    assert stored["status"] == {"phase": "Baseline", "observedGeneration": 1}
    assert stored["metadata"]["generation"] == 1  # the spec was not written
    entries = [e for e in stored["metadata"]["managedFields"] if e.get("subresource") == "status"]
    assert [(e["manager"], e["operation"]) for e in entries] == [(COMPONENT, "Update")]


async def test_apply_carries_characters_past_the_basic_plane_and_control_characters(kube_crd: Kube) -> None:
    # The fuzz test's servedModelNames '\x12I*\U00094dfc...' and '...\x98\x1ca...': JSON's \ud8xx\udcxx pairs are no
    # YAML escape, YAML takes no raw C1 control or BOM, and it folds a raw NEL or line separator.
    kube = kube_crd
    ns = await asyncio.to_thread(kube.namespace, "ssa-utf8")
    owner = PolicyRef.from_body(await asyncio.to_thread(create_policy, kube, ns))
    manifest = in_namespace(engine("chat-gpu-only", "chat"), ns)
    value = "\x12I*\U00094dfc\U000919a9\x98\x1c\ufeff\x85\u2028 llm"
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "SERVED", "value": value}]
    created = await gateway(kube).apply(manifest, owner)
    assert created["spec"]["template"]["spec"]["containers"][0]["env"] == [{"name": "SERVED", "value": value}]
