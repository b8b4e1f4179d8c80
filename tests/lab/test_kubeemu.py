"""The emulated API server closes kmock 0.8's gaps: each one checked through the real kubernetes client over HTTP."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import aiohttp
import kubernetes.client
import kubernetes.watch
import pytest
from kubernetes.client import ApiException

from kvoffload.api.conventions import API_GROUP, API_VERSION, PLURAL
from tests.support.kube import EmulatedCluster, policy_manifest, wait_for

NS = "llm"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"


@pytest.fixture
def core(kube: EmulatedCluster) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(kube.api_client)


@pytest.fixture
def apps(kube: EmulatedCluster) -> kubernetes.client.AppsV1Api:
    return kubernetes.client.AppsV1Api(kube.api_client)


@pytest.fixture
def custom(kube: EmulatedCluster) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(kube.api_client)


def configmap(name: str, labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}, **meta}, "data": {"k": "v"}}


def owner_ref(owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def deployment(name: str, owners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    labels = {"app": name}
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if owners:
        meta["ownerReferences"] = [owner_ref(owner) for owner in owners]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "engine", "image": "vllm:1", "args": ["--a"]}]},
            },
        },
    }


async def create_policy(kube: EmulatedCluster, name: str, **meta: Any) -> dict[str, Any]:
    manifest = policy_manifest(name, NS, spec={"replicas": 1})
    manifest["metadata"].update(meta)
    return await kube.emulator.create_object(manifest)


# --- server-managed metadata ---------------------------------------------------------------


async def test_created_objects_get_uid_resource_version_timestamp_generation_and_kind(
    kube: EmulatedCluster, core: kubernetes.client.CoreV1Api, custom: kubernetes.client.CustomObjectsApi
) -> None:
    first = await kube.call(core.create_namespaced_config_map, NS, configmap("a"))
    second = await kube.call(
        custom.create_namespaced_custom_object, API_GROUP, API_VERSION, NS, PLURAL, {"metadata": {"name": "p"}}
    )

    assert first.metadata.uid
    assert first.metadata.creation_timestamp is not None
    assert first.metadata.generation == 1
    assert int(second["metadata"]["resourceVersion"]) > int(first.metadata.resource_version)
    assert second["metadata"]["uid"] != first.metadata.uid
    assert (second["apiVersion"], second["kind"]) == (f"{API_GROUP}/{API_VERSION}", "KVOffloadPolicy")
    stored = kube.emulator.read_object("v1", "ConfigMap", NS, "a")
    assert stored is not None
    assert (stored["apiVersion"], stored["kind"]) == ("v1", "ConfigMap")


async def test_generate_name_makes_a_unique_name_and_a_taken_name_is_409(
    kube: EmulatedCluster, core: kubernetes.client.CoreV1Api
) -> None:
    made = [await kube.call(core.create_namespaced_config_map, NS, {"metadata": {"generateName": "ev-"}}) for _ in "ab"]
    assert made[0].metadata.name.startswith("ev-")
    assert made[0].metadata.name != made[1].metadata.name

    await kube.call(core.create_namespaced_config_map, NS, configmap("taken"))
    with pytest.raises(ApiException) as exc:
        await kube.call(core.create_namespaced_config_map, NS, configmap("taken"))
    assert exc.value.status == 409
    assert "AlreadyExists" in exc.value.body


async def test_generation_bumps_on_spec_changes_only(
    kube: EmulatedCluster, custom: kubernetes.client.CustomObjectsApi
) -> None:
    await create_policy(kube, "p")
    args = (API_GROUP, API_VERSION, NS, PLURAL, "p")

    labelled = await kube.call(
        custom.patch_namespaced_custom_object, *args, {"metadata": {"labels": {"x": "1"}}}, _content_type=MERGE
    )
    status = await kube.call(
        custom.patch_namespaced_custom_object_status, *args, {"status": {"phase": "Canary"}}, _content_type=MERGE
    )
    respec = await kube.call(
        custom.patch_namespaced_custom_object, *args, {"spec": {"replicas": 4}}, _content_type=MERGE
    )

    assert [o["metadata"]["generation"] for o in (labelled, status, respec)] == [1, 1, 2]
    versions = [int(o["metadata"]["resourceVersion"]) for o in (labelled, status, respec)]
    assert versions == sorted(set(versions))


async def test_a_write_that_changes_nothing_keeps_the_resource_version(
    kube: EmulatedCluster, core: kubernetes.client.CoreV1Api
) -> None:
    created = await kube.call(core.create_namespaced_config_map, NS, configmap("a"))
    same = await kube.call(core.patch_namespaced_config_map, "a", NS, {"data": {"k": "v"}}, _content_type=MERGE)
    assert same.metadata.resource_version == created.metadata.resource_version


# --- list and watch ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("tier=cpu", ["cpu"]),
        ("tier==cpu,variant=canary", ["cpu"]),
        ("tier!=cpu", ["gpu", "nvme", "plain"]),
        ("tier in (cpu, nvme)", ["cpu", "nvme"]),
        ("tier notin (cpu)", ["gpu", "nvme", "plain"]),
        ("tier", ["cpu", "gpu", "nvme"]),
        ("!tier", ["plain"]),
    ],
)
async def test_list_honours_label_selectors(
    kube: EmulatedCluster, core: kubernetes.client.CoreV1Api, selector: str, expected: list[str]
) -> None:
    for name, labels in {
        "cpu": {"tier": "cpu", "variant": "canary"},
        "gpu": {"tier": "gpu"},
        "nvme": {"tier": "nvme"},
        "plain": {},
    }.items():
        await kube.call(core.create_namespaced_config_map, NS, configmap(name, labels))
    await kube.call(core.create_namespaced_config_map, "elsewhere", configmap("other", {"tier": "cpu"}))

    listed = await kube.call(core.list_namespaced_config_map, NS, label_selector=selector)

    assert sorted(item.metadata.name for item in listed.items) == expected
    assert listed.metadata.resource_version == str(kube.emulator.revision)


async def test_list_across_namespaces_and_by_field_selector(
    kube: EmulatedCluster, core: kubernetes.client.CoreV1Api
) -> None:
    await kube.call(core.create_namespaced_config_map, NS, configmap("a"))
    await kube.call(core.create_namespaced_config_map, "other", configmap("a"))
    await kube.call(core.create_namespaced_config_map, "other", configmap("b"))

    everywhere = await kube.call(core.list_config_map_for_all_namespaces)
    named_a = await kube.call(core.list_config_map_for_all_namespaces, field_selector="metadata.name=a")

    assert len(everywhere.items) == 3
    assert sorted(item.metadata.namespace for item in named_a.items) == [NS, "other"]


def watch_into(
    events: list[tuple[str, str, dict[str, Any]]], list_fn: Callable[..., Any], *args: Any, count: int, **kwargs: Any
) -> None:
    """Append ``count`` events from the kubernetes client's own watch (blocking; run it in a thread)."""
    watch = kubernetes.watch.Watch()
    for event in watch.stream(list_fn, *args, timeout_seconds=5, **kwargs):
        obj = event["raw_object"]
        events.append((event["type"], obj["metadata"]["name"], obj))
        if len(events) == count:
            watch.stop()


async def test_watch_from_a_resource_version_delivers_every_change_after_it(
    kube: EmulatedCluster, core: kubernetes.client.CoreV1Api
) -> None:
    await kube.call(core.create_namespaced_config_map, NS, configmap("a"))
    since = (await kube.call(core.list_namespaced_config_map, NS)).metadata.resource_version
    await kube.call(core.create_namespaced_config_map, NS, configmap("b"))
    await kube.call(core.patch_namespaced_config_map, "a", NS, {"data": {"k": "w"}}, _content_type=MERGE)
    await kube.call(core.delete_namespaced_config_map, "b", NS)

    events: list[tuple[str, str, dict[str, Any]]] = []
    await kube.call(watch_into, events, core.list_namespaced_config_map, NS, resource_version=since, count=3)

    assert [(kind, name) for kind, name, _ in events] == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
    assert events[1][2]["data"] == {"k": "w"}
    versions = [int(obj["metadata"]["resourceVersion"]) for _, _, obj in events]
    assert versions == sorted(versions)
    assert versions[0] > int(since)


async def test_a_live_watch_with_a_selector_sees_objects_enter_and_leave_it(
    kube: EmulatedCluster, core: kubernetes.client.CoreV1Api
) -> None:
    await kube.call(core.create_namespaced_config_map, NS, configmap("a", {"team": "x"}))
    events: list[tuple[str, str, dict[str, Any]]] = []
    watcher = threading.Thread(
        target=watch_into,
        args=(events, core.list_namespaced_config_map, NS),
        kwargs={"label_selector": "team=x", "count": 4},
    )
    watcher.start()
    try:
        await wait_for(lambda: events, "the watch's initial state")  # then it is following live changes
        await kube.call(core.create_namespaced_config_map, NS, configmap("ignored", {"team": "y"}))
        await kube.call(core.create_namespaced_config_map, NS, configmap("b", {"team": "x"}))
        await kube.call(
            core.patch_namespaced_config_map, "a", NS, {"metadata": {"labels": {"team": "y"}}}, _content_type=MERGE
        )
        await kube.call(
            core.patch_namespaced_config_map,
            "ignored",
            NS,
            {"metadata": {"labels": {"team": "x"}}},
            _content_type=MERGE,
        )
        await wait_for(lambda: len(events) == 4, "four events")
    finally:
        await kube.call(watcher.join, 10)

    assert [(kind, name) for kind, name, _ in events] == [
        ("ADDED", "a"),  # the initial state
        ("ADDED", "b"),
        ("DELETED", "a"),  # left the selector
        ("ADDED", "ignored"),  # entered it
    ]


async def test_watch_from_a_pruned_resource_version_answers_410_gone(
    kube: EmulatedCluster, core: kubernetes.client.CoreV1Api
) -> None:
    kube.emulator.history_limit = 2
    first = await kube.call(core.create_namespaced_config_map, NS, configmap("a"))
    for name in "bcd":
        await kube.call(core.create_namespaced_config_map, NS, configmap(name))

    with pytest.raises(ApiException) as exc:
        await kube.call(
            watch_into,
            [],
            core.list_namespaced_config_map,
            NS,
            resource_version=first.metadata.resource_version,
            count=1,
        )
    assert exc.value.status == 410


# --- writes -----------------------------------------------------------------------------------


async def test_status_subresource_changes_only_status_and_the_main_resource_never_does(
    kube: EmulatedCluster, custom: kubernetes.client.CustomObjectsApi
) -> None:
    await create_policy(kube, "p")
    args = (API_GROUP, API_VERSION, NS, PLURAL, "p")

    await kube.call(
        custom.patch_namespaced_custom_object_status,
        *args,
        {"spec": {"replicas": 9}, "metadata": {"labels": {"sneaky": "yes"}}, "status": {"phase": "Canary"}},
        _content_type=MERGE,
    )
    await kube.call(
        custom.patch_namespaced_custom_object,
        *args,
        {"status": {"phase": "Stable"}, "spec": {"replicas": 2}},
        _content_type=MERGE,
    )

    stored = kube.emulator.read_object(f"{API_GROUP}/{API_VERSION}", "KVOffloadPolicy", NS, "p")
    assert stored is not None
    assert stored["status"] == {"phase": "Canary"}
    assert stored["spec"] == {"replicas": 2}
    assert "labels" not in stored["metadata"]


async def test_a_stale_resource_version_is_a_409_conflict_on_put_and_patch(
    kube: EmulatedCluster, core: kubernetes.client.CoreV1Api
) -> None:
    old = await kube.call(core.create_namespaced_config_map, NS, configmap("a"))
    stale = old.metadata.resource_version
    await kube.call(core.patch_namespaced_config_map, "a", NS, {"data": {"k": "newer"}}, _content_type=MERGE)

    replacement = configmap("a", resourceVersion=stale)
    replacement["data"] = {"k": "put"}
    with pytest.raises(ApiException) as put:
        await kube.call(core.replace_namespaced_config_map, "a", NS, replacement)
    with pytest.raises(ApiException) as patch:
        await kube.call(
            core.patch_namespaced_config_map,
            "a",
            NS,
            {"metadata": {"resourceVersion": stale}, "data": {"k": "x"}},
            _content_type=MERGE,
        )
    assert (put.value.status, patch.value.status) == (409, 409)
    assert kube.emulator.read_object("v1", "ConfigMap", NS, "a")["data"] == {"k": "newer"}  # type: ignore[index]

    replacement["metadata"]["resourceVersion"] = kube.emulator.read_object("v1", "ConfigMap", NS, "a")["metadata"][
        "resourceVersion"
    ]  # type: ignore[index]
    impostor = {**replacement, "metadata": {**replacement["metadata"], "uid": "not-the-uid"}}
    with pytest.raises(ApiException) as wrong_uid:
        await kube.call(core.replace_namespaced_config_map, "a", NS, impostor)
    assert wrong_uid.value.status == 409
    replaced = await kube.call(core.replace_namespaced_config_map, "a", NS, replacement)
    assert replaced.data == {"k": "put"}
    assert replaced.metadata.uid == old.metadata.uid


async def test_a_failed_json_patch_test_is_422_and_changes_nothing(
    kube: EmulatedCluster, core: kubernetes.client.CoreV1Api
) -> None:
    created = await kube.call(core.create_namespaced_config_map, NS, configmap("a"))
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "999"},
        {"op": "add", "path": "/data/x", "value": "1"},
    ]
    with pytest.raises(ApiException) as exc:
        await kube.call(core.patch_namespaced_config_map, "a", NS, ops, _content_type=JSON_PATCH)
    assert exc.value.status == 422

    ops[0]["value"] = created.metadata.resource_version
    patched = await kube.call(core.patch_namespaced_config_map, "a", NS, ops, _content_type=JSON_PATCH)
    assert patched.data == {"k": "v", "x": "1"}


async def test_strategic_merge_patch_merges_containers_by_name(
    kube: EmulatedCluster, apps: kubernetes.client.AppsV1Api
) -> None:
    await kube.call(apps.create_namespaced_deployment, NS, deployment("d"))
    sidecar = {"spec": {"template": {"spec": {"containers": [{"name": "sidecar", "image": "busybox"}]}}}}
    patched = await kube.call(apps.patch_namespaced_deployment, "d", NS, sidecar, _content_type=STRATEGIC)
    assert [c.name for c in patched.spec.template.spec.containers] == ["engine", "sidecar"]
    assert patched.metadata.generation == 2


async def test_server_side_apply_upserts_merges_and_removes_what_the_manager_stopped_applying(
    kube: EmulatedCluster, apps: kubernetes.client.AppsV1Api
) -> None:
    """The same steps as tests/lab/test_kubeemu_apply.py runs against the real server too; here without it."""
    manifest = deployment("d")
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}, {"name": "B"}]
    manifest["metadata"]["labels"] = {"ours": "1"}

    def apply(body: dict[str, Any]) -> Any:
        return apps.patch_namespaced_deployment(
            "d", NS, body, field_manager="kvoffload", force=True, _content_type=APPLY
        )

    created = await kube.call(apply, manifest)
    assert created.metadata.generation == 1
    sidecar = {
        "metadata": {"labels": {"theirs": "1"}},
        "spec": {"template": {"spec": {"containers": [{"name": "sidecar", "image": "busybox"}]}}},
    }
    await kube.call(apps.patch_namespaced_deployment, "d", NS, sidecar, _content_type=STRATEGIC)
    del manifest["metadata"]["labels"]
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "A", "value": "2"}]

    updated = await kube.call(apply, manifest)

    assert updated.metadata.labels == {"theirs": "1"}
    containers = {c.name: c for c in updated.spec.template.spec.containers}
    assert sorted(containers) == ["engine", "sidecar"]
    assert [(e.name, e.value) for e in containers["engine"].env] == [("A", "2")]
    again = await kube.call(apply, manifest)
    assert again.metadata.resource_version == updated.metadata.resource_version  # a no-op writes nothing
    with pytest.raises(ApiException) as exc:
        await kube.call(apps.patch_namespaced_deployment, "d", NS, manifest, _content_type=APPLY)
    assert exc.value.status == 422  # no field manager


# --- deletion -------------------------------------------------------------------------------


async def test_a_finalizer_holds_deletion_and_collection_until_it_is_removed(
    kube: EmulatedCluster, custom: kubernetes.client.CustomObjectsApi
) -> None:
    policy = await create_policy(kube, "p", finalizers=["kvoffload.io/finalizer"])
    await kube.emulator.create_object(deployment("engine", [policy]))
    args = (API_GROUP, API_VERSION, NS, PLURAL, "p")

    await kube.call(custom.delete_namespaced_custom_object, *args)
    held = await kube.call(custom.get_namespaced_custom_object, *args)
    assert held["metadata"]["deletionTimestamp"]
    assert kube.emulator.read_object("apps/v1", "Deployment", NS, "engine") is not None

    await kube.call(
        custom.patch_namespaced_custom_object, *args, {"metadata": {"finalizers": None}}, _content_type=MERGE
    )
    with pytest.raises(ApiException) as exc:
        await kube.call(custom.get_namespaced_custom_object, *args)
    assert exc.value.status == 404
    assert kube.emulator.read_object("apps/v1", "Deployment", NS, "engine") is None


async def test_deleting_an_owner_collects_its_dependents_and_nothing_else(
    kube: EmulatedCluster, custom: kubernetes.client.CustomObjectsApi
) -> None:
    mine, theirs = await create_policy(kube, "mine"), await create_policy(kube, "theirs")
    engine = await kube.emulator.create_object(deployment("engine", [mine]))
    pod = await kube.emulator.create_object(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "engine-1", "namespace": NS, "ownerReferences": [owner_ref(engine)]},
        }
    )
    shared = await kube.emulator.create_object(deployment("shared", [mine, theirs]))
    await kube.emulator.create_object(deployment("their-engine", [theirs]))
    await kube.emulator.create_object(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unowned", "namespace": NS}}
    )

    await kube.call(custom.delete_namespaced_custom_object, API_GROUP, API_VERSION, NS, PLURAL, "mine")

    assert kube.emulator.read_object("apps/v1", "Deployment", NS, "engine") is None
    assert (
        kube.emulator.read_object("v1", "Pod", NS, pod["metadata"]["name"]) is None
    )  # collected through its Deployment
    assert kube.emulator.read_object("apps/v1", "Deployment", NS, "their-engine") is not None
    assert kube.emulator.read_object("v1", "ConfigMap", NS, "unowned") is not None
    still_shared = kube.emulator.read_object("apps/v1", "Deployment", NS, "shared")
    assert still_shared is not None  # another owner remains: only the dangling reference goes
    assert [ref["uid"] for ref in still_shared["metadata"]["ownerReferences"]] == [theirs["metadata"]["uid"]]
    assert shared["metadata"]["uid"] == still_shared["metadata"]["uid"]


async def test_a_dependent_created_after_its_owner_was_deleted_is_collected(kube: EmulatedCluster) -> None:
    # A controller that read a Deployment just before it was deleted makes a pod for it anyway.
    owner = await create_policy(kube, "owner")
    engine = await kube.emulator.create_object(deployment("engine", [owner]))
    await kube.emulator.delete_object("apps/v1", "Deployment", NS, "engine")

    late = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "late", "namespace": NS}}
    late["metadata"]["ownerReferences"] = [owner_ref(engine)]
    await kube.emulator.create_object(late)

    assert kube.emulator.read_object("v1", "Pod", NS, "late") is None
    assert kube.emulator.read_object(f"{API_GROUP}/{API_VERSION}", "KVOffloadPolicy", NS, "owner") is not None


async def test_orphan_propagation_keeps_dependents_without_the_reference(
    kube: EmulatedCluster, custom: kubernetes.client.CustomObjectsApi
) -> None:
    owner = await create_policy(kube, "owner")
    await kube.emulator.create_object(deployment("engine", [owner]))

    await kube.call(
        custom.delete_namespaced_custom_object, API_GROUP, API_VERSION, NS, PLURAL, "owner", propagation_policy="Orphan"
    )

    orphan = kube.emulator.read_object("apps/v1", "Deployment", NS, "engine")
    assert orphan is not None
    assert "ownerReferences" not in orphan["metadata"]


async def test_a_dependent_with_a_finalizer_is_marked_for_deletion_not_removed(kube: EmulatedCluster) -> None:
    owner = await create_policy(kube, "owner")
    guarded = deployment("engine", [owner])
    guarded["metadata"]["finalizers"] = ["example.com/guard"]
    await kube.emulator.create_object(guarded)

    await kube.emulator.delete_object(f"{API_GROUP}/{API_VERSION}", "KVOffloadPolicy", NS, "owner")

    terminating = kube.emulator.read_object("apps/v1", "Deployment", NS, "engine")
    assert terminating is not None
    assert terminating["metadata"]["deletionTimestamp"]


async def test_delete_preconditions_protect_a_changed_object(
    kube: EmulatedCluster, core: kubernetes.client.CoreV1Api
) -> None:
    created = await kube.call(core.create_namespaced_config_map, NS, configmap("a"))
    await kube.call(core.patch_namespaced_config_map, "a", NS, {"data": {"k": "w"}}, _content_type=MERGE)
    stale = {"preconditions": {"resourceVersion": created.metadata.resource_version}}
    with pytest.raises(ApiException) as exc:
        await kube.call(core.delete_namespaced_config_map, "a", NS, body=stale)
    assert exc.value.status == 409
    assert kube.emulator.read_object("v1", "ConfigMap", NS, "a") is not None


# --- resources ------------------------------------------------------------------------------


async def test_posting_a_crd_serves_its_resource(
    kube: EmulatedCluster, custom: kubernetes.client.CustomObjectsApi
) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                }
            ],
        },
    }
    extensions = kubernetes.client.ApiextensionsV1Api(kube.api_client)
    await kube.call(extensions.create_custom_resource_definition, crd)

    widget = await kube.call(
        custom.create_namespaced_custom_object, "example.com", "v1", NS, "widgets", {"metadata": {"name": "w"}}
    )
    resources = await kube.call(
        kubernetes.client.CustomObjectsApi(kube.api_client).get_api_resources, "example.com", "v1"
    )

    assert widget["kind"] == "Widget"
    assert {r.name for r in resources.resources} == {"widgets", "widgets/status"}


async def test_core_discovery_names_its_group_version_v1_as_go_clients_key_it(kube: EmulatedCluster) -> None:
    # client-go's REST mapper files each APIResourceList under its groupVersion; "/v1" maps no ConfigMap.
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{kube.url}/api/v1") as response:
            core_list = await response.json()
        async with session.get(f"{kube.url}/apis/apps/v1") as response:
            apps_list = await response.json()

    assert core_list["groupVersion"] == "v1"
    assert "configmaps" in {r["name"] for r in core_list["resources"]}
    assert apps_list["groupVersion"] == "apps/v1"


async def test_a_watch_is_served_as_json_as_client_go_requires(kube: EmulatedCluster) -> None:
    # client-go picks the watch decoder by Content-Type; application/octet-stream fails every watch.
    params = {"watch": "true", "timeoutSeconds": "1"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{kube.url}/api/v1/namespaces/{NS}/configmaps", params=params) as response,
    ):
        assert response.status == 200
        assert response.content_type == "application/json"


def example_crd(plural: str, kind: str, status_schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {"status": status_schema}}},
                }
            ],
        },
    }


async def test_a_crd_status_default_is_what_a_new_object_reads_until_its_status_is_written(
    kube: EmulatedCluster, custom: kubernetes.client.CustomObjectsApi
) -> None:
    extensions = kubernetes.client.ApiextensionsV1Api(kube.api_client)
    defaulted = example_crd("gadgets", "Gadget", {"type": "object", "default": {"observedGeneration": 0}})
    plain = example_crd("gizmos", "Gizmo", {"type": "object"})
    for crd in (defaulted, plain):
        await kube.call(extensions.create_custom_resource_definition, crd)
    gadgets = ("example.com", "v1", NS, "gadgets")

    # A status in the create request is dropped (status subresource); the default stands in for it.
    created = await kube.call(
        custom.create_namespaced_custom_object,
        *gadgets,
        {"metadata": {"name": "g"}, "status": {"observedGeneration": 7}},
    )
    written = await kube.call(
        custom.patch_namespaced_custom_object_status, *gadgets, "g", {"status": {"observedGeneration": 1}}
    )
    gizmo = await kube.call(
        custom.create_namespaced_custom_object, "example.com", "v1", NS, "gizmos", {"metadata": {"name": "z"}}
    )

    assert created["status"] == {"observedGeneration": 0}
    assert written["status"] == {"observedGeneration": 1}
    assert "status" not in gizmo  # no default in its schema: no status until one is written


async def test_both_event_apis_are_served(kube: EmulatedCluster, core: kubernetes.client.CoreV1Api) -> None:
    involved = {"apiVersion": "v1", "kind": "ConfigMap", "name": "a", "namespace": NS}
    await kube.call(
        core.create_namespaced_event,
        NS,
        {
            "metadata": {"generateName": "a."},
            "involvedObject": involved,
            "reason": "Tested",
            "message": "core",
            "type": "Normal",
        },
    )
    events_v1 = kubernetes.client.EventsV1Api(kube.api_client)
    await kube.call(
        events_v1.create_namespaced_event,
        NS,
        {
            "metadata": {"generateName": "a."},
            "regarding": involved,
            "reason": "Tested",
            "note": "events.k8s.io",
            "type": "Normal",
            "eventTime": "2025-01-01T00:00:00.000000Z",
            "action": "Test",
            "reportingController": "test",
            "reportingInstance": "test",
        },
    )
    assert len((await kube.call(core.list_namespaced_event, NS)).items) == 1
    assert len((await kube.call(events_v1.list_namespaced_event, NS)).items) == 1


async def test_an_injected_fault_answers_once_and_changes_nothing(
    kube: EmulatedCluster, core: kubernetes.client.CoreV1Api
) -> None:
    await kube.call(core.create_namespaced_config_map, NS, configmap("a"))
    kube.emulator.fail_next(409, method="PATCH", plural="configmaps", name="a")

    with pytest.raises(ApiException) as exc:
        await kube.call(core.patch_namespaced_config_map, "a", NS, {"data": {"k": "x"}}, _content_type=MERGE)
    assert exc.value.status == 409
    assert kube.emulator.read_object("v1", "ConfigMap", NS, "a")["data"] == {"k": "v"}  # type: ignore[index]

    patched = await kube.call(core.patch_namespaced_config_map, "a", NS, {"data": {"k": "x"}}, _content_type=MERGE)
    assert patched.data == {"k": "x"}


async def test_a_watch_cancelled_while_it_retakes_the_lock_leaves_the_emulator_writable(kube: EmulatedCluster) -> None:
    # Issue 39: the client of a waiting watch goes away (aiohttp cancels its handler) just as the lock the watch
    # is waiting to take back is handed over. Under asyncio.wait_for on 3.11, the handler released a lock it did not
    # hold and an orphaned Condition.wait then kept it: every later write, and the loop's teardown, waited for ever.
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{kube.url}/api/v1/namespaces/{NS}/configmaps", params={"watch": "true"}) as response,
    ):
        assert response.status == 200
        await asyncio.sleep(0.05)  # the watch waits for a change, half a second at a time
        # aiohttp runs each connection's requests in one task; the watch's connection is the only one open.
        (handler,) = [t for t in asyncio.all_tasks() if "RequestHandler.start" in t.get_coro().__qualname__]
        lock = kube.emulator._cond  # a second party holds the lock as the watch's half second ends
        await lock.acquire()
        await asyncio.sleep(0.6)  # the watch now waits to take the lock back
        handler.cancel()  # the client goes away ...
        lock.release()  # ... as the lock is handed over
        await asyncio.sleep(0.1)
    async with asyncio.timeout(5):
        created = await kube.emulator.create_object(
            {"apiVersion": "v1", "kind": "ConfigMap", **configmap("after", namespace=NS)}
        )
    assert created["metadata"]["name"] == "after"
    assert not lock.locked()
