"""kopf runs for real over HTTP against the emulated API: create, update and delete handlers."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import kopf
import kubernetes.client
import pytest

from kvoffload.api.conventions import API_GROUP, API_VERSION, KIND, PLURAL
from tests.support.kube import (
    POLICY_API_VERSION,
    EmulatedCluster,
    kopf_subprocess,
    policy_manifest,
    running_kopf,
    wait_for,
)

pytestmark = pytest.mark.e2e


def policy_in(cluster: EmulatedCluster, name: str) -> dict[str, Any] | None:
    return cluster.emulator.read_object(POLICY_API_VERSION, KIND, "default", name)


def status_of(cluster: EmulatedCluster, name: str) -> dict[str, Any]:
    return (policy_in(cluster, name) or {}).get("status", {})


@pytest.fixture
def handled() -> list[tuple[str, str]]:
    return []


@pytest.fixture
def registry(handled: list[tuple[str, str]]) -> kopf.OperatorRegistry:
    """A tiny operator: each handler records itself and writes the spec's size into status."""
    registry = kopf.OperatorRegistry()

    @kopf.on.create(API_GROUP, API_VERSION, PLURAL, registry=registry)
    async def created(name: str, spec: kopf.Spec, patch: kopf.Patch, **_: Any) -> None:
        handled.append(("create", name))
        patch.status["observed"] = {"event": "create", "replicas": spec.get("replicas")}

    @kopf.on.update(API_GROUP, API_VERSION, PLURAL, registry=registry)
    async def updated(name: str, spec: kopf.Spec, patch: kopf.Patch, **_: Any) -> None:
        handled.append(("update", name))
        patch.status["observed"] = {"event": "update", "replicas": spec.get("replicas")}

    @kopf.on.delete(API_GROUP, API_VERSION, PLURAL, registry=registry)
    async def deleted(name: str, **_: Any) -> None:
        handled.append(("delete", name))

    return registry


async def test_create_update_delete_run_their_handlers_through_kopf(
    kube: EmulatedCluster, registry: kopf.OperatorRegistry, handled: list[tuple[str, str]]
) -> None:
    custom = kubernetes.client.CustomObjectsApi(kube.api_client)
    async with running_kopf(kube, registry=registry):
        await kube.call(
            custom.create_namespaced_custom_object,
            API_GROUP,
            API_VERSION,
            "default",
            PLURAL,
            policy_manifest("chat", spec={"replicas": 2}),
        )
        await wait_for(lambda: status_of(kube, "chat").get("observed", {}).get("event") == "create", "create handler")
        assert status_of(kube, "chat")["observed"] == {"event": "create", "replicas": 2}
        assert f"{API_GROUP}/finalizer" in policy_in(kube, "chat")["metadata"]["finalizers"]  # type: ignore[index]

        await kube.call(
            custom.patch_namespaced_custom_object,
            API_GROUP,
            API_VERSION,
            "default",
            PLURAL,
            "chat",
            {"spec": {"replicas": 3}},
            _content_type="application/merge-patch+json",
        )
        await wait_for(lambda: status_of(kube, "chat").get("observed", {}).get("event") == "update", "update handler")
        assert status_of(kube, "chat")["observed"] == {"event": "update", "replicas": 3}
        assert policy_in(kube, "chat")["metadata"]["generation"] == 2  # type: ignore[index]

        await kube.call(custom.delete_namespaced_custom_object, API_GROUP, API_VERSION, "default", PLURAL, "chat")
        await wait_for(lambda: policy_in(kube, "chat") is None, "the finalizer to be removed and the policy gone")

    assert handled == [("create", "chat"), ("update", "chat"), ("delete", "chat")]


async def test_kopf_sees_objects_that_existed_before_it_started(
    kube: EmulatedCluster, registry: kopf.OperatorRegistry, handled: list[tuple[str, str]]
) -> None:
    await kube.emulator.create_object(policy_manifest("early", spec={"replicas": 1}))
    async with running_kopf(kube, registry=registry):
        await wait_for(lambda: status_of(kube, "early").get("observed"), "create handler for a listed object")
    assert handled == [("create", "early")]


HANDLERS = textwrap.dedent(
    f"""
    import kopf

    @kopf.on.create({API_GROUP!r}, {API_VERSION!r}, {PLURAL!r})
    def created(spec, patch, **_):
        patch.status["observed"] = {{"event": "create", "replicas": spec.get("replicas")}}
    """
)


async def test_kopf_run_subprocess_finds_the_emulator_through_kubeconfig(kube: EmulatedCluster, tmp_path: Path) -> None:
    handlers = tmp_path / "handlers.py"
    handlers.write_text(HANDLERS)
    async with kopf_subprocess(kube, str(handlers)) as process:
        await kube.emulator.create_object(policy_manifest("remote", spec={"replicas": 5}))
        await wait_for(
            lambda: status_of(kube, "remote").get("observed") or process.returncode is not None,
            "the create handler in the kopf subprocess",
            timeout=20,
        )
        assert process.returncode is None, "kopf run exited early"
        assert status_of(kube, "remote")["observed"] == {"event": "create", "replicas": 5}
