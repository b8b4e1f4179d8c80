"""The emulated API server's server-side apply, run side by side with the real kube-apiserver.

Each scenario is a sequence of HTTP requests, made with the official client, first against the
session's real control plane and then against kubeemu; both must answer with the same status
codes and end with the same fields. kubeemu's apply is minimal (``kubeemu.apply_configuration``):
it keeps no field ownership, so what only ownership decides is tested against the real server
alone (``test_only_the_real_server_reports_field_conflicts``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import kubernetes.client
import pytest

from tests.support.controlplane import Kube
from tests.support.kube import EmulatedCluster

pytestmark = pytest.mark.kube

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
ME = "kvoffload"
OTHER = "someone-else"

Call = Callable[..., tuple[int, dict[str, Any]]]


def caller(api: kubernetes.client.ApiClient) -> Call:
    """``call(method, path, body, content_type, **query) -> (status, body)``; errors are answers too."""

    def call(
        method: str, path: str, body: Any = None, content_type: str = "application/json", **query: str
    ) -> tuple[int, dict[str, Any]]:
        request = api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query.items()),
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = api.call_api(*request)
            response.read()  # type: ignore[no-untyped-call]
            return response.status, json.loads(response.data or b"{}")
        except kubernetes.client.ApiException as exc:
            return int(exc.status or 0), json.loads(exc.body or "{}")

    return call


def configmap(name: str, ns: str, **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}, **fields}


def engine_deployment(
    ns: str, *, env: dict[str, str], volumes: list[str], args: list[str], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    selector = {"app": "engine"}
    container: dict[str, Any] = {
        "name": "engine",
        "image": "registry.invalid/engine:1",
        "args": args,
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "volumeMounts": [{"name": v, "mountPath": f"/mnt/{v}"} for v in volumes],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "engine", "namespace": ns, "labels": labels or {}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": selector},
                "spec": {"containers": [container], "volumes": [{"name": v, "emptyDir": {}} for v in volumes]},
            },
        },
    }


def scenario_maps(call: Call, ns: str) -> list[Any]:
    """Apply, another manager adds and changes things, apply again without some of ours."""
    path = f"/api/v1/namespaces/{ns}/configmaps/cm"
    seen: list[Any] = []
    first = configmap("cm", ns, data={"a": "1", "b": "2"})
    first["metadata"].update(labels={"ours": "1", "gone": "x"}, annotations={"ours": "1"})
    status, body = call("PATCH", path, first, APPLY, fieldManager=ME)
    seen.append(("create", status, body["data"], body["metadata"].get("labels")))
    rv = body["metadata"]["resourceVersion"]
    status, again = call("PATCH", path, first, APPLY, fieldManager=ME)
    seen.append(("no-op keeps the resourceVersion", status, again["metadata"]["resourceVersion"] == rv))
    theirs = {"metadata": {"labels": {"theirs": "1"}, "annotations": {"theirs": "1"}}, "data": {"c": "3"}}
    call("PATCH", path, theirs, MERGE, fieldManager=OTHER)
    second = configmap("cm", ns, data={"a": "10"})
    second["metadata"].update(labels={"ours": "2"})
    status, body = call("PATCH", path, second, APPLY, fieldManager=ME)
    meta = body["metadata"]
    seen.append(("update", status, body["data"], meta.get("labels"), meta.get("annotations")))
    return seen


def scenario_keyed_lists(call: Call, ns: str) -> list[Any]:
    """Containers, env and volumes merge by name; a sidecar and an annotation someone else added stay."""
    path = f"/apis/apps/v1/namespaces/{ns}/deployments/engine"
    seen: list[Any] = []
    first = engine_deployment(ns, env={"A": "1", "B": "2"}, volumes=["shm", "tier"], args=["--x", "1"])
    status, _ = call("PATCH", path, first, APPLY, fieldManager=ME, force="true")
    seen.append(("create", status))
    sidecar = {
        "metadata": {"annotations": {"example.com/owner": "platform"}},
        "spec": {"template": {"spec": {"containers": [{"name": "sidecar", "image": "registry.invalid/side:1"}]}}},
    }
    status, _ = call("PATCH", path, sidecar, STRATEGIC, fieldManager=OTHER)
    seen.append(("sidecar", status))
    second = engine_deployment(ns, env={"A": "3"}, volumes=["shm"], args=["--y"], labels={"level": "cpu"})
    status, body = call("PATCH", path, second, APPLY, fieldManager=ME, force="true")
    pod = body["spec"]["template"]["spec"]
    engine = next(c for c in pod["containers"] if c["name"] == "engine")
    seen.append(
        (
            "update",
            status,
            sorted(c["name"] for c in pod["containers"]),
            engine.get("env"),
            engine["args"],
            [m["name"] for m in engine.get("volumeMounts", [])],
            [v["name"] for v in pod.get("volumes", [])],
            body["metadata"].get("annotations", {}).get("example.com/owner"),
            body["metadata"].get("labels"),
        )
    )
    return seen


def scenario_metadata_lists(call: Call, ns: str) -> list[Any]:
    """ownerReferences merge by uid and finalizers as a set: each writer's entries stay its own."""
    seen: list[Any] = []
    base = f"/api/v1/namespaces/{ns}/configmaps"
    owners = []
    for name in ("owner-a", "owner-b"):
        _, made = call("POST", base, configmap(name, ns), fieldManager=OTHER)
        owners.append({"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": made["metadata"]["uid"]})
    ours, theirs = {**owners[0], "controller": True}, {**owners[1], "controller": False}
    path = f"{base}/child"
    config = configmap("child", ns)
    config["metadata"].update(ownerReferences=[ours], finalizers=["kvoffload.io/test"])
    status, _ = call("PATCH", path, config, APPLY, fieldManager=ME)
    seen.append(("create", status))
    patch = [
        {"op": "add", "path": "/metadata/ownerReferences/-", "value": theirs},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "example.com/keep"},
    ]
    status, _ = call("PATCH", path, patch, "application/json-patch+json", fieldManager=OTHER)
    seen.append(("theirs added", status))
    config["metadata"].pop("finalizers")
    status, body = call("PATCH", path, config, APPLY, fieldManager=ME)
    meta = body["metadata"]
    seen.append(("finalizer dropped", status, meta.get("finalizers"), [r["name"] for r in meta["ownerReferences"]]))
    return seen


def scenario_refusals(call: Call, ns: str) -> list[Any]:
    """What an apply request is refused for: status codes (messages differ in detail)."""
    seen: list[Any] = []
    path = f"/api/v1/namespaces/{ns}/configmaps/r"
    seen.append(("no field manager", call("PATCH", path, configmap("r", ns), APPLY)[0]))
    seen.append(
        ("wrong kind", call("PATCH", path, {**configmap("r", ns), "kind": "Secret"}, APPLY, fieldManager=ME)[0])
    )
    seen.append(("wrong name", call("PATCH", path, configmap("other", ns), APPLY, fieldManager=ME)[0]))
    absent = configmap("r", ns)
    absent["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
    seen.append(("uid of an absent object", call("PATCH", path, absent, APPLY, fieldManager=ME)[0]))
    status, made = call("PATCH", path, configmap("r", ns, data={"a": "1"}), APPLY, fieldManager=ME)
    seen.append(("create", status))
    seen.append(("uid mismatch", call("PATCH", path, absent, APPLY, fieldManager=ME)[0]))
    stale = configmap("r", ns, data={"a": "2"})
    stale["metadata"]["resourceVersion"] = str(int(made["metadata"]["resourceVersion"]) - 1)
    seen.append(("stale resourceVersion", call("PATCH", path, stale, APPLY, fieldManager=ME)[0]))
    fresh = configmap("r", ns, data={"a": "3"})
    fresh["metadata"]["resourceVersion"] = made["metadata"]["resourceVersion"]
    status, body = call("PATCH", path, fresh, APPLY, fieldManager=ME)
    seen.append(("current resourceVersion", status, body.get("data")))
    seen.append(
        ("no status subresource", call("PATCH", f"{path}/status", configmap("r", ns), APPLY, fieldManager=ME)[0])
    )
    return seen


SCENARIOS = [scenario_maps, scenario_keyed_lists, scenario_metadata_lists, scenario_refusals]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__.removeprefix("scenario_"))
async def test_kubeemu_applies_as_the_real_server_does(
    scenario: Callable[[Call, str], list[Any]], control_plane: Kube, kube: EmulatedCluster
) -> None:
    namespace = await asyncio.to_thread(control_plane.namespace, "apply")
    real = await asyncio.to_thread(scenario, caller(control_plane.api_client), namespace)
    emulated = await asyncio.to_thread(scenario, caller(kube.api_client), namespace)
    print(f"\n{scenario.__name__}: {real}")
    assert emulated == real


def test_only_the_real_server_reports_field_conflicts(control_plane: Kube) -> None:
    """Field ownership is what kubeemu leaves out: the real server refuses a change to a field another
    manager took over, unless the apply forces it."""
    ns = control_plane.namespace("apply")
    call = caller(control_plane.api_client)
    path = f"/api/v1/namespaces/{ns}/configmaps/cm"
    call("PATCH", path, configmap("cm", ns, data={"a": "1"}), APPLY, fieldManager=ME)
    call("PATCH", path, {"data": {"a": "2"}}, MERGE, fieldManager=OTHER)
    status, body = call("PATCH", path, configmap("cm", ns, data={"a": "3"}), APPLY, fieldManager=ME)
    assert status == 409
    assert body["details"]["causes"][0]["reason"] == "FieldManagerConflict"
    assert f'conflict with "{OTHER}"' in body["message"]
    status, body = call("PATCH", path, configmap("cm", ns, data={"a": "3"}), APPLY, fieldManager=ME, force="true")
    assert (status, body["data"]) == (200, {"a": "3"})
