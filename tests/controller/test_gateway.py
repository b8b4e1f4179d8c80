"""The Kubernetes gateway against the emulated API: ownership, retries, status, Events, pod faults."""

from __future__ import annotations

import datetime
import socket
from typing import Any

import kubernetes.client
import pytest

from kvoffload.api.conventions import API_GROUP, API_VERSION, KIND, LABEL_POLICY, LABEL_VARIANT
from kvoffload.controller.apierrors import ApiRejectedError, ApiUnavailableError, MissingObjectError, NotOwnedError
from kvoffload.controller.gateway import KubernetesGateway, PolicyRef, RetryPolicy
from kvoffload.controller.kubestate import parse_pod
from tests.support.kube import EmulatedCluster, policy_manifest

NS = "llm"
POLICY_API = f"{API_GROUP}/{API_VERSION}"


async def make_policy(kube: EmulatedCluster, name: str) -> PolicyRef:
    return PolicyRef.from_body(await kube.emulator.create_object(policy_manifest(name, NS, spec={"replicas": 2})))


def engine(name: str, policy: str, *, replicas: int = 1, variant: str = "stable") -> dict[str, Any]:
    labels = {LABEL_POLICY: policy, LABEL_VARIANT: variant}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "vllm", "image": "vllm:0.32"}]},
            },
        },
    }


def requests_of(kube: EmulatedCluster, method: str, plural: str) -> int:
    return sum(
        1 for r in kube.emulator if r.method == method and r.resource is not None and r.resource.plural == plural
    )


@pytest.fixture
async def policy(kube: EmulatedCluster) -> PolicyRef:
    return await make_policy(kube, "chat")


@pytest.fixture
def gateway(kube: EmulatedCluster) -> KubernetesGateway:
    return kube.gateway()


# --- apply ---------------------------------------------------------------------------------


async def test_apply_creates_a_child_owned_by_the_policy_then_updates_it(
    kube: EmulatedCluster, gateway: KubernetesGateway, policy: PolicyRef
) -> None:
    created = await gateway.apply(engine("chat-stable", "chat"), policy)
    assert created["metadata"]["ownerReferences"] == [
        {
            "apiVersion": POLICY_API,
            "kind": KIND,
            "name": "chat",
            "uid": policy.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]

    updated = await gateway.apply(engine("chat-stable", "chat", replicas=3), policy)

    assert updated["metadata"]["uid"] == created["metadata"]["uid"]
    assert updated["spec"]["replicas"] == 3
    assert updated["metadata"]["generation"] == 2
    assert updated["metadata"]["ownerReferences"] == created["metadata"]["ownerReferences"]


async def test_apply_keeps_what_others_added_to_the_metadata(
    kube: EmulatedCluster, gateway: KubernetesGateway, policy: PolicyRef
) -> None:
    await gateway.apply(engine("chat-stable", "chat"), policy)
    await kube.emulator.patch_object(
        "apps/v1",
        "Deployment",
        NS,
        "chat-stable",
        {"metadata": {"annotations": {"deployment.kubernetes.io/revision": "4"}, "finalizers": ["example.com/keep"]}},
    )

    updated = await gateway.apply(engine("chat-stable", "chat", replicas=2), policy)

    assert updated["metadata"]["annotations"] == {"deployment.kubernetes.io/revision": "4"}
    assert updated["metadata"]["finalizers"] == ["example.com/keep"]


async def test_applying_the_same_object_again_writes_nothing_new(
    kube: EmulatedCluster, gateway: KubernetesGateway, policy: PolicyRef
) -> None:
    first = await gateway.apply(engine("chat-stable", "chat"), policy)
    again = await gateway.apply(engine("chat-stable", "chat"), policy)
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


async def test_apply_refuses_an_object_of_the_same_name_owned_by_another_policy(
    kube: EmulatedCluster, gateway: KubernetesGateway, policy: PolicyRef
) -> None:
    other = await make_policy(kube, "other")
    theirs = await gateway.apply(engine("chat-stable", "other"), other)

    with pytest.raises(NotOwnedError, match=f"owned by {KIND} other"):
        await gateway.apply(engine("chat-stable", "chat", replicas=5), policy)

    unchanged = kube.emulator.read_object("apps/v1", "Deployment", NS, "chat-stable")
    assert unchanged is not None
    assert unchanged["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]


async def test_apply_does_not_adopt_an_object_nobody_owns(
    kube: EmulatedCluster, gateway: KubernetesGateway, policy: PolicyRef
) -> None:
    await kube.emulator.create_object(engine("chat-stable", "chat"))
    with pytest.raises(NotOwnedError, match="not owned by it"):
        await gateway.apply(engine("chat-stable", "chat"), policy)
    assert "ownerReferences" not in kube.emulator.read_object("apps/v1", "Deployment", NS, "chat-stable")["metadata"]  # type: ignore[index]


async def test_apply_refuses_kinds_the_operator_does_not_manage(gateway: KubernetesGateway, policy: PolicyRef) -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": NS}}
    with pytest.raises(Exception, match="does not manage"):
        await gateway.apply(secret, policy)


async def test_apply_retries_a_conflict_and_succeeds(
    kube: EmulatedCluster, gateway: KubernetesGateway, policy: PolicyRef
) -> None:
    await gateway.apply(engine("chat-stable", "chat"), policy)
    before = requests_of(kube, "PATCH", "deployments")
    kube.emulator.fail_next(409, method="PATCH", plural="deployments")

    updated = await gateway.apply(engine("chat-stable", "chat", replicas=4), policy)

    assert updated["spec"]["replicas"] == 4
    assert requests_of(kube, "PATCH", "deployments") - before == 2


async def test_apply_retries_a_real_stale_write(kube: EmulatedCluster, policy: PolicyRef) -> None:
    """Someone changes the object between the gateway's read and its apply: the precondition's resourceVersion
    is stale."""
    await kube.gateway().apply(engine("chat-stable", "chat"), policy)
    before = requests_of(kube, "PATCH", "deployments")
    meddled = False

    async def no_wait(_: float) -> None:
        return None

    class MeddlingGateway(KubernetesGateway):
        async def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
            nonlocal meddled
            if method == "PATCH" and not meddled:
                meddled = True
                await kube.emulator.patch_object(
                    "apps/v1", "Deployment", NS, "chat-stable", {"metadata": {"labels": {"x": "y"}}}
                )
            return await super()._call(method, path, **kwargs)

    gateway = MeddlingGateway(kube.api_client, retry=RetryPolicy(attempts=3), sleep=no_wait)
    updated = await gateway.apply(engine("chat-stable", "chat", replicas=6), policy)

    assert updated["spec"]["replicas"] == 6
    assert updated["metadata"]["labels"]["x"] == "y"  # the other writer's change survives
    assert requests_of(kube, "PATCH", "deployments") - before == 2


async def test_retries_are_bounded(kube: EmulatedCluster, policy: PolicyRef) -> None:
    gateway = kube.gateway(RetryPolicy(attempts=3, base_delay=0.001))
    kube.emulator.fail_next(503, method="PATCH", plural="deployments", times=10)
    with pytest.raises(ApiUnavailableError, match="gave up after 3 attempts"):
        await gateway.apply(engine("chat-stable", "chat"), policy)
    assert requests_of(kube, "PATCH", "deployments") == 3


async def test_backoff_grows_exponentially_with_full_jitter_and_a_cap(kube: EmulatedCluster, policy: PolicyRef) -> None:
    delays: list[float] = []

    async def record(delay: float) -> None:
        delays.append(delay)

    class Top:
        def uniform(self, low: float, high: float) -> float:
            return high

    retry = RetryPolicy(attempts=5, base_delay=0.1, max_delay=0.3)
    gateway = KubernetesGateway(kube.api_client, retry=retry, sleep=record, rng=Top())  # type: ignore[arg-type]
    kube.emulator.fail_next(500, method="PATCH", plural="kvoffloadpolicies", times=4)

    await gateway.patch_status(policy, {"phase": "Baseline"})

    assert delays == pytest.approx([0.1, 0.2, 0.3, 0.3])


async def test_a_rejected_request_is_not_retried(
    kube: EmulatedCluster, gateway: KubernetesGateway, policy: PolicyRef
) -> None:
    kube.emulator.fail_next(422, method="PATCH", plural="deployments", times=5)
    with pytest.raises(ApiRejectedError) as exc:
        await gateway.apply(engine("chat-stable", "chat"), policy)
    assert exc.value.status == 422
    assert requests_of(kube, "PATCH", "deployments") == 1


async def test_an_unreachable_api_server_is_reported_not_raised_raw(policy: PolicyRef) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    configuration = kubernetes.client.Configuration(host=dead)
    configuration.retries = 0
    gateway = KubernetesGateway(
        kubernetes.client.ApiClient(configuration), retry=RetryPolicy(attempts=2, base_delay=0.001)
    )
    with pytest.raises(ApiUnavailableError):
        await gateway.patch_status(policy, {"phase": "Baseline"})


# --- delete --------------------------------------------------------------------------------


async def test_delete_owned_deletes_ours_and_leaves_foreign_objects_alone(
    kube: EmulatedCluster, gateway: KubernetesGateway, policy: PolicyRef
) -> None:
    other = await make_policy(kube, "other")
    await gateway.apply(engine("chat-canary", "chat"), policy)
    await gateway.apply(engine("other-canary", "other"), other)

    assert await gateway.delete_owned("Deployment", "chat-canary", policy) is True
    with pytest.raises(NotOwnedError):
        await gateway.delete_owned("Deployment", "other-canary", policy)
    assert await gateway.delete_owned("Deployment", "never-existed", policy) is False

    assert kube.emulator.read_object("apps/v1", "Deployment", NS, "chat-canary") is None
    assert kube.emulator.read_object("apps/v1", "Deployment", NS, "other-canary") is not None


# --- the policy: status and Events ------------------------------------------------------------


async def test_patch_status_writes_the_status_subresource_only(
    kube: EmulatedCluster, gateway: KubernetesGateway, policy: PolicyRef
) -> None:
    await gateway.patch_status(policy, {"phase": "Canary", "stage": {"index": 1, "name": "cpu-pilot"}})
    stored = await gateway.patch_status(policy, {"stage": {"index": 2, "name": "cpu"}, "observedGeneration": 1})

    assert stored["status"] == {"phase": "Canary", "stage": {"index": 2, "name": "cpu"}, "observedGeneration": 1}
    assert stored["spec"] == {"replicas": 2}
    assert stored["metadata"]["generation"] == 1


async def test_emit_event_records_a_core_event_and_counts_repeats(
    kube: EmulatedCluster, gateway: KubernetesGateway, policy: PolicyRef
) -> None:
    assert await gateway.emit_event(policy, "Warning", "RolledBack", "p99 TTFT over budget for 2m")
    assert await gateway.emit_event(policy, "Warning", "RolledBack", "p99 TTFT over budget for 2m")
    assert await gateway.emit_event(policy, "Normal", "Promoted", "cpu at 50%")

    core = kubernetes.client.CoreV1Api(kube.api_client)
    events = (await kube.call(core.list_namespaced_event, NS, field_selector=f"involvedObject.uid={policy.uid}")).items
    by_reason = {event.reason: event for event in events}
    assert sorted(by_reason) == ["Promoted", "RolledBack"]
    rolled_back = by_reason["RolledBack"]
    assert (rolled_back.type, rolled_back.count, rolled_back.message) == ("Warning", 2, "p99 TTFT over budget for 2m")
    assert rolled_back.involved_object.kind == KIND
    assert rolled_back.involved_object.name == "chat"
    assert rolled_back.last_timestamp >= rolled_back.first_timestamp
    assert by_reason["Promoted"].count == 1


async def test_an_event_that_cannot_be_written_does_not_fail_the_caller(
    kube: EmulatedCluster, policy: PolicyRef
) -> None:
    gateway = kube.gateway(RetryPolicy(attempts=2, base_delay=0.001))
    kube.emulator.fail_next(503, method="POST", plural="events", times=2)
    assert await gateway.emit_event(policy, "Normal", "Started", "baseline") is False
    with pytest.raises(ValueError, match="Normal or Warning"):
        await gateway.emit_event(policy, "Error", "Started", "baseline")


async def test_read_configmap_names_what_is_missing(kube: EmulatedCluster, gateway: KubernetesGateway) -> None:
    await kube.emulator.create_object(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "qwen", "namespace": NS},
            "data": {"config.json": "{}"},
        }
    )
    assert await gateway.read_configmap(NS, "qwen", "config.json") == "{}"
    with pytest.raises(MissingObjectError, match=r"has no key 'other\.json'"):
        await gateway.read_configmap(NS, "qwen", "other.json")
    with pytest.raises(MissingObjectError, match=f"ConfigMap {NS}/absent not found"):
        await gateway.read_configmap(NS, "absent", "config.json")


# --- observing the workload -------------------------------------------------------------------


def pod(name: str, variant: str, status: dict[str, Any], policy: str = "chat") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {LABEL_POLICY: policy, LABEL_VARIANT: variant}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm:0.32"}]},
        "status": status,
    }


READY = {"conditions": [{"type": "Ready", "status": "True"}]}


async def test_list_owned_reads_readiness_restarts_oom_kills_and_crash_loops(
    kube: EmulatedCluster, gateway: KubernetesGateway, policy: PolicyRef
) -> None:
    other = await make_policy(kube, "other")
    await gateway.apply(engine("chat-stable", "chat", replicas=3), policy)
    await gateway.apply(engine("chat-canary", "chat", variant="canary"), policy)
    await kube.emulator.create_object(engine("chat-impostor", "chat"))  # has the label, but no ownerReference
    await gateway.apply(engine("other-stable", "other"), other)
    await kube.emulator.patch_object(
        "apps/v1",
        "Deployment",
        NS,
        "chat-stable",
        {"status": {"readyReplicas": 2, "observedGeneration": 1}},
        subresource="status",
    )
    started = "2025-06-01T12:00:00Z"
    statuses = {
        "healthy": (
            "stable",
            {
                **READY,
                "startTime": started,
                "phase": "Running",
                "containerStatuses": [{"name": "vllm", "restartCount": 0, "state": {"running": {}}}],
            },
        ),
        "oom": (
            "canary",
            {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "vllm",
                        "restartCount": 1,
                        "state": {"running": {}},
                        "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
                    }
                ],
            },
        ),
        "looping": (
            "canary",
            {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "vllm",
                        "restartCount": 4,
                        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                        "lastState": {"terminated": {"reason": "Error", "exitCode": 1}},
                    }
                ],
            },
        ),
        "pending": ("canary", {"phase": "Pending"}),
    }
    for name, (variant, status) in statuses.items():
        await kube.emulator.create_object(pod(name, variant, {}))
        await kube.emulator.patch_object("v1", "Pod", NS, name, {"status": status}, subresource="status")
    await kube.emulator.create_object(pod("stranger", "stable", {}, policy="other"))

    owned = await gateway.list_owned(policy)

    deployments = {d.name: d for d in owned.deployments}
    assert sorted(deployments) == ["chat-canary", "chat-stable"]
    assert (deployments["chat-stable"].replicas, deployments["chat-stable"].ready_replicas) == (3, 2)
    assert deployments["chat-canary"].variant == "canary"
    pods = {p.name: p for p in owned.pods}
    assert sorted(pods) == ["healthy", "looping", "oom", "pending"]
    healthy = pods["healthy"]
    assert (healthy.ready, healthy.restarts, healthy.oom_killed, healthy.crash_looping, healthy.variant) == (
        True,
        0,
        False,
        False,
        "stable",
    )
    assert healthy.started_at == datetime.datetime(2025, 6, 1, 12, 0, tzinfo=datetime.UTC)
    assert (pods["oom"].oom_killed, pods["oom"].restarts, pods["oom"].crash_looping) == (True, 1, False)
    assert (pods["looping"].crash_looping, pods["looping"].restarts, pods["looping"].oom_killed) == (True, 4, False)
    assert (pods["pending"].ready, pods["pending"].phase, pods["pending"].started_at) == (False, "Pending", None)


def test_an_oom_kill_in_the_current_state_counts_too() -> None:
    state = parse_pod(
        pod(
            "p",
            "canary",
            {
                "containerStatuses": [
                    {"name": "vllm", "restartCount": 0, "state": {"terminated": {"reason": "OOMKilled"}}}
                ]
            },
        )
    )
    assert state.oom_killed
    assert not state.ready
    assert state.phase == "Unknown"


def test_a_pod_the_scheduler_cannot_place_carries_the_schedulers_message() -> None:
    why = "0/1 nodes are available: 1 Insufficient memory. preemption: 0/1 nodes are available."
    pending = {
        "metadata": {"name": "chat-canary-x", "labels": {LABEL_VARIANT: "canary"}},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}],
        },
    }
    assert parse_pod(pending).unschedulable == why
    scheduled = {**pending, "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}}
    assert parse_pod(scheduled).unschedulable is None
