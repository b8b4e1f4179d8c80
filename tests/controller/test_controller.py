"""The reconcile cycle against the emulated API server: what one Controller.reconcile writes, and when not.

There is no kubelet and no Deployment controller: the tests create the engine pods themselves,
labelled like the rendered pod template and owned by the Deployment, with the status they need.
Prometheus is replaced by a small MetricsProvider returning crafted figures; time by a clock the
test moves.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import kubernetes.client
import pytest

from kvoffload.analysis.hub import MeasurementHub, PrometheusSource
from kvoffload.analysis.measurements import Measurements, Percentiles, VariantSample, WorkloadSample
from kvoffload.analysis.queries import PolicyKey, Target
from kvoffload.api.conventions import (
    ANNOTATION_RENDER_INPUT,
    API_GROUP,
    API_VERSION,
    KIND,
    LABEL_CONFIG_HASH,
    LABEL_LEVEL,
    PLURAL,
    PODS_NOT_SCRAPED,
    PROMETHEUS_TOKEN_UNREADABLE,
    RETRY,
)
from kvoffload.api.quantity import parse_duration
from kvoffload.controller.apierrors import ApiRejectedError
from kvoffload.controller.cycle import ReconcileError
from kvoffload.controller.reconcile import Controller
from kvoffload.controller.settings import ControllerSettings, SecretLocation
from kvoffload.policy.tenancy import Tenancy
from tests.support.kube import EmulatedCluster, policy_manifest

pytestmark = pytest.mark.e2e

NS = "llm"
POLICY_API = f"{API_GROUP}/{API_VERSION}"
WRITES = ("POST", "PUT", "PATCH", "DELETE")


def chat_spec() -> dict[str, Any]:
    """Four replicas, ladder gpu-only -> cpu; a 10 s baseline and 20 s steps judged every second."""
    return {
        "model": {"name": "Qwen/Qwen3-0.6B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 4096},
        "gpu": {"class": "nvidia-l4", "count": 1},
        "replicas": 4,
        "resources": {"baseMemory": "4Gi", "headroom": "1Gi", "cpu": "2"},
        "offload": {"cpu": "1Gi"},
        "rollout": {
            "canaryReplicas": 1,
            "maxSurge": 0,
            "baselineDuration": "10s",
            "stepDuration": "20s",
            "promotionSteps": [50, 100],
            "progressDeadline": "60s",
        },
        "analysis": {
            "interval": "1s",
            "window": "10s",
            "ttftP99": "500ms",
            "itlP99": "50ms",
            "sustainedFor": "3s",
            "minRequests": 5,
        },
        "prometheus": {"url": "http://prometheus.test:9090"},
    }


class Clock:
    """The controller's now, moved by the test."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


HEALTHY = VariantSample(
    requests=100.0,
    request_rate=10.0,
    ttft_p99=0.12,
    itl_p99=0.02,
    external_share=0.3,
    tier_hits={"host": 5000.0},
    kv_usage=0.6,
)


class CraftedProvider:
    """Healthy figures for every variant that runs; records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[list[Target]] = []

    def measure(self, targets: Sequence[Target]) -> dict[PolicyKey, Measurements]:
        self.calls.append(list(targets))
        return {
            t.key: Measurements(canary=HEALTHY if t.canary_hash is not None else None, stable=HEALTHY) for t in targets
        }

    def present_metric_names(self, target: Target | None = None) -> frozenset[str]:
        return frozenset()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def provider() -> CraftedProvider:
    return CraftedProvider()


def new_controller(kube: EmulatedCluster, provider: CraftedProvider, clock: Clock) -> Controller:
    return Controller(kube.gateway(), MeasurementHub(provider, gather_window=0.0), clock=clock)


@pytest.fixture
def controller(kube: EmulatedCluster, provider: CraftedProvider, clock: Clock) -> Controller:
    return new_controller(kube, provider, clock)


# --- reading and playing the cluster --------------------------------------------------------


def policy_body(kube: EmulatedCluster, name: str = "chat") -> dict[str, Any]:
    body = kube.emulator.read_object(POLICY_API, KIND, NS, name)
    assert body is not None
    return body


def status_of(kube: EmulatedCluster, name: str = "chat") -> dict[str, Any]:
    return policy_body(kube, name).get("status") or {}


def deployment(kube: EmulatedCluster, name: str) -> dict[str, Any] | None:
    return kube.emulator.read_object("apps/v1", "Deployment", NS, name)


def writes(kube: EmulatedCluster, plural: str | None = None) -> list[tuple[str, str, str | None]]:
    """Every write request so far: (method, plural, name)."""
    return [
        (str(r.method.value), r.resource.plural or "", r.name)
        for r in kube.emulator
        if r.method in WRITES and r.resource is not None and (plural is None or r.resource.plural == plural)
    ]


async def create_policy(kube: EmulatedCluster, name: str = "chat", spec: dict[str, Any] | None = None) -> None:
    await kube.emulator.create_object(policy_manifest(name, NS, spec=spec if spec is not None else chat_spec()))


async def events(kube: EmulatedCluster) -> list[Any]:
    core = kubernetes.client.CoreV1Api(kube.api_client)
    listed = await kube.call(core.list_namespaced_event, NS)
    return list(listed.items)


async def run_pods(kube: EmulatedCluster, deployment_name: str, count: int, **status: Any) -> list[str]:
    """Play the Deployment controller and kubelet: ``count`` pods of the Deployment's template, Ready."""
    dep = deployment(kube, deployment_name)
    assert dep is not None, f"{deployment_name} does not exist"
    names = []
    for i in range(count):
        name = f"{deployment_name}-{dep['metadata']['labels'][LABEL_CONFIG_HASH][:6]}-{i}"
        await kube.emulator.create_object(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": NS,
                    "labels": dep["spec"]["template"]["metadata"]["labels"],
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "Deployment",
                            "name": deployment_name,
                            "uid": dep["metadata"]["uid"],
                            "controller": True,
                        }
                    ],
                },
                "spec": copy.deepcopy(dep["spec"]["template"]["spec"]),
            }
        )
        pod_status = {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "vllm", "ready": True, "restartCount": 0, "state": {"running": {}}}],
            **status,
        }
        await kube.emulator.patch_object("v1", "Pod", NS, name, {"status": pod_status}, subresource="status")
        names.append(name)
    return names


async def reconcile_until(
    controller: Controller, kube: EmulatedCluster, clock: Clock, done: Any, *, step: float = 1.0, limit: int = 60
) -> int:
    """Reconcile once per ``step`` seconds of the test clock until ``done()``; how many cycles it took."""
    for cycle in range(1, limit + 1):
        clock.advance(step)
        await controller.reconcile(policy_body(kube))
        if done():
            return cycle
    pytest.fail(f"not done after {limit} cycles: {status_of(kube).get('message')}")


@pytest.fixture
async def in_canary(kube: EmulatedCluster, controller: Controller, clock: Clock) -> dict[str, Any]:
    """A policy past its baseline, its canary started; returns the stable Deployment as it was before."""
    await create_policy(kube)
    await controller.reconcile(policy_body(kube))
    await run_pods(kube, "chat-gpu-only", 4)
    before = deployment(kube, "chat-gpu-only")
    await reconcile_until(controller, kube, clock, lambda: deployment(kube, "chat-cpu") is not None)
    assert before is not None
    return before


# --- the scenarios -----------------------------------------------------------------------------


async def test_a_new_policy_gets_its_stable_deployment_service_and_podmonitor_and_a_baseline(
    kube: EmulatedCluster, controller: Controller
) -> None:
    await create_policy(kube)
    body = policy_body(kube)

    plan = await controller.reconcile(body)

    children = [(method, plural) for method, plural, _ in writes(kube) if plural not in ("events", PLURAL)]
    assert sorted(children) == [("PATCH", "deployments"), ("PATCH", "podmonitors"), ("PATCH", "services")]
    applies = [r for r in kube.emulator if r.method == "PATCH" and r.resource and r.resource.plural != PLURAL]
    assert {r.headers["Content-Type"] for r in applies} == {"application/apply-patch+yaml"}  # server-side apply
    assert {r.params["fieldManager"] for r in applies} == {"kvoffload"}
    stable = deployment(kube, "chat-gpu-only")
    assert stable is not None
    assert deployment(kube, "chat-cpu") is None
    assert stable["spec"]["replicas"] == 4
    assert stable["spec"]["template"]["metadata"]["labels"][LABEL_LEVEL] == "gpu-only"
    assert stable["metadata"]["labels"][LABEL_CONFIG_HASH] == plan.status.stable.config_hash  # type: ignore[union-attr]
    for api_version, kind, name in (
        ("apps/v1", "Deployment", "chat-gpu-only"),
        ("v1", "Service", "chat"),
        ("monitoring.coreos.com/v1", "PodMonitor", "chat"),
    ):
        child = kube.emulator.read_object(api_version, kind, NS, name)
        assert child is not None, f"{kind} {name}"
        (owner,) = child["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            KIND,
            "chat",
            body["metadata"]["uid"],
            True,
        )
    status = status_of(kube)
    assert status["phase"] == "Baseline"
    assert status["stable"]["replicas"] == 4
    assert status["hostMemory"] == {"pinned": "0", "shm": "0", "request": "5Gi", "limit": "5Gi"}
    assert [e.reason for e in await events(kube)] == ["NewLadder"]
    assert policy_body(kube)["spec"] == chat_spec()  # spec is never written


async def test_after_a_passing_baseline_the_canary_starts_and_stable_shrinks_first(
    kube: EmulatedCluster, controller: Controller, clock: Clock, provider: CraftedProvider
) -> None:
    await create_policy(kube)
    await controller.reconcile(policy_body(kube))
    await run_pods(kube, "chat-gpu-only", 4)
    baseline_hash = status_of(kube)["stable"]["configHash"]

    cycles = await reconcile_until(controller, kube, clock, lambda: deployment(kube, "chat-cpu") is not None)

    assert cycles == 10  # baselineDuration 10s, one cycle per second
    canary, stable = deployment(kube, "chat-cpu"), deployment(kube, "chat-gpu-only")
    assert canary is not None
    assert stable is not None
    assert canary["spec"]["replicas"] == 1  # canaryReplicas
    assert stable["spec"]["replicas"] == 3  # maxSurge 0: a canary replaces a stable replica
    assert canary["spec"]["template"]["metadata"]["labels"][LABEL_LEVEL] == "cpu"
    assert stable["metadata"]["labels"][LABEL_CONFIG_HASH] == baseline_hash
    # the shrinking Deployment is written before the growing one: never 5 GPUs at once
    deployment_writes = [(m, n) for m, _, n in writes(kube, "deployments")]
    assert deployment_writes[-2:] == [("PATCH", "chat-gpu-only"), ("PATCH", "chat-cpu")]
    status = status_of(kube)
    assert status["phase"] == "Canary"
    assert status["canary"]["replicas"] == 1
    assert status["stable"]["replicas"] == 3
    assert status["baseline"]["ttftP99"] == HEALTHY.ttft_p99
    assert status["hostMemory"]["request"] == "6Gi"  # the canary's: base 4Gi + 1Gi pool + 1Gi headroom
    # analysis ran only once a stable fleet existed, each time through one batched provider call
    assert len(provider.calls) == 10
    assert all(len(call) == 1 and call[0].canary_hash is None for call in provider.calls)


async def test_an_oom_killed_canary_rolls_back_on_the_next_reconcile(
    kube: EmulatedCluster, controller: Controller, in_canary: dict[str, Any]
) -> None:
    spec_before = policy_body(kube)["spec"]
    stable_hash = in_canary["metadata"]["labels"][LABEL_CONFIG_HASH]
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
    stable = deployment(kube, "chat-gpu-only")
    assert stable is not None
    assert stable["metadata"]["labels"][LABEL_CONFIG_HASH] == stable_hash  # the stable level exactly as it was
    assert stable["spec"]["template"] == in_canary["spec"]["template"]
    assert stable["spec"]["replicas"] == 4
    warnings = [e for e in await events(kube) if e.type == "Warning"]
    assert [e.reason for e in warnings] == ["CanaryOOMKilled"]
    assert "OOMKilled" in warnings[0].message
    status = status_of(kube)
    assert status["phase"] == "RolledBack"
    assert "canary" not in status
    assert status["history"][-1]["decision"] == "Rollback"
    assert status["history"][-1]["reason"] == "CanaryOOMKilled"
    assert policy_body(kube)["spec"] == spec_before


class SwitchedProvider(CraftedProvider):
    """Crafted figures whose canary side the test sets (``canary``)."""

    def __init__(self) -> None:
        super().__init__()
        self.canary = HEALTHY

    def measure(self, targets: Sequence[Target]) -> dict[PolicyKey, Measurements]:
        self.calls.append(list(targets))
        return {
            t.key: Measurements(canary=self.canary if t.canary_hash is not None else None, stable=HEALTHY)
            for t in targets
        }


SLOW_CANARY = VariantSample(**{**HEALTHY.__dict__, "ttft_p99": 2.0})  # over the 500 ms TTFT budget


async def _failing_until_due(kube: EmulatedCluster, clock: Clock) -> tuple[Controller, SwitchedProvider]:
    """A Ready canary failing from a cycle on, judged 1 s later and again 1.8 s after that; ``sustainedFor`` (3 s)
    is then due 0.2 s on, which the last plan asks to come back for."""
    provider = SwitchedProvider()
    controller = new_controller(kube, provider, clock)
    spec = chat_spec()
    # Judged from the step start: the latency of a canary in its warm-up is not gated (tests/rollout/test_warmup.py).
    spec["analysis"]["warmup"] = {"enabled": False}
    await create_policy(kube, spec=spec)
    await controller.reconcile(policy_body(kube))
    await run_pods(kube, "chat-gpu-only", 4)
    await reconcile_until(controller, kube, clock, lambda: deployment(kube, "chat-cpu") is not None)
    await run_pods(kube, "chat-cpu", 1)
    provider.canary = SLOW_CANARY
    plan = None
    for step in (1.0, 1.0, 1.8):
        clock.advance(step)
        plan = await controller.reconcile(policy_body(kube))
    status = status_of(kube)
    assert status["phase"] == "Canary"
    assert status["lastAnalysis"]["consecutiveFailures"] == 3
    assert plan is not None
    assert plan.requeue_after == pytest.approx(0.2)
    return controller, provider


async def test_the_cycle_a_breach_falls_due_at_judges_afresh_and_rolls_back(
    kube: EmulatedCluster, clock: Clock
) -> None:
    controller, provider = await _failing_until_due(kube, clock)
    asked = len(provider.calls)

    clock.advance(0.2)  # within half an interval of the last verdict, which alone would not measure
    await controller.reconcile(policy_body(kube))

    assert len(provider.calls) == asked + 1
    status = status_of(kube)
    assert status["phase"] == "RolledBack"
    assert status["lastAnalysis"]["consecutiveFailures"] == 4
    assert deployment(kube, "chat-cpu") is None


async def test_a_breach_that_ended_by_the_time_it_fell_due_does_not_roll_back(
    kube: EmulatedCluster, clock: Clock
) -> None:
    controller, provider = await _failing_until_due(kube, clock)
    provider.canary = HEALTHY

    clock.advance(0.2)
    await controller.reconcile(policy_body(kube))

    status = status_of(kube)
    assert status["phase"] == "Canary"  # judged afresh: not rolled back on the verdict from 0.2 s before
    assert status["lastAnalysis"]["verdict"] == "Pass"
    assert deployment(kube, "chat-cpu") is not None


async def test_an_invalid_spec_goes_invalid_with_the_field_path_and_leaves_deployments_alone(
    kube: EmulatedCluster, controller: Controller, clock: Clock
) -> None:
    await create_policy(kube)
    await controller.reconcile(policy_body(kube))
    stable_before = deployment(kube, "chat-gpu-only")
    broken = chat_spec()
    broken["offload"]["cpu"] = "lots"
    broken["analysis"]["ttftP99"] = "soon"
    await kube.emulator.patch_object(POLICY_API, KIND, NS, "chat", {"spec": broken})
    clock.advance(1)

    plan = await controller.reconcile(policy_body(kube))

    assert plan.variants is None
    status = status_of(kube)
    assert status["phase"] == "Invalid"
    (condition,) = [c for c in status["conditions"] if c["type"] == "Invalid"]
    assert condition["status"] == "True"
    assert "spec.offload.cpu" in condition["message"]
    assert "spec.analysis.ttftP99" in condition["message"]
    assert status["observedGeneration"] == policy_body(kube)["metadata"]["generation"]
    assert [e.reason for e in await events(kube) if e.type == "Warning"] == ["SpecInvalid"]
    assert deployment(kube, "chat-gpu-only") == stable_before  # not written, not even touched

    writes_before = len(writes(kube))
    clock.advance(1)
    await controller.reconcile(policy_body(kube))
    assert len(writes(kube)) == writes_before  # the same bad spec again: no new status, no new Event


async def test_a_second_reconcile_with_nothing_new_writes_nothing(
    kube: EmulatedCluster, controller: Controller, in_canary: dict[str, Any]
) -> None:
    await run_pods(kube, "chat-cpu", 1)
    await controller.reconcile(policy_body(kube))  # sees the ready canary
    before = len(writes(kube))

    await controller.reconcile(policy_body(kube))  # same instant, same cluster

    assert writes(kube)[before:] == []


async def test_a_restarted_controller_resumes_the_step_without_a_second_canary(
    kube: EmulatedCluster, provider: CraftedProvider, clock: Clock, controller: Controller, in_canary: dict[str, Any]
) -> None:
    await run_pods(kube, "chat-cpu", 1)
    status_before = status_of(kube)
    canary_before = deployment(kube, "chat-cpu")
    before = len(writes(kube))

    restarted = new_controller(kube, provider, clock)
    clock.advance(1)
    await restarted.reconcile(policy_body(kube))

    assert [w for w in writes(kube)[before:] if w[1] == "deployments"] == []
    assert deployment(kube, "chat-cpu") == canary_before
    assert sorted(await list_deployments(kube)) == ["chat-cpu", "chat-gpu-only"]
    status = status_of(kube)
    assert status["phase"] == "Canary"
    assert status["stage"] == status_before["stage"]  # same step, same start
    assert status["canary"]["configHash"] == status_before["canary"]["configHash"]


async def test_a_cycle_whose_input_was_rendered_before_renders_nothing(
    kube: EmulatedCluster, controller: Controller, clock: Clock, in_canary: dict[str, Any], monkeypatch: Any
) -> None:
    import kvoffload.controller.children as children_module

    rendered: list[str] = []
    real = children_module.render_deployment

    def counting(policy: Any, level: Any, replicas: int) -> dict[str, Any]:
        rendered.append(level.level.name)
        return real(policy, level, replicas)

    monkeypatch.setattr(children_module, "render_deployment", counting)
    await run_pods(kube, "chat-cpu", 1)
    for _ in range(3):
        clock.advance(1)
        await controller.reconcile(policy_body(kube))
    assert rendered == []  # the same spec and replicas as the cycles that rendered them

    edited = policy_body(kube)
    edited["spec"]["resources"]["headroom"] = "2Gi"  # a new input: rendered again, from the new spec
    await controller.reconcile(edited)
    assert rendered


async def test_a_deployment_an_older_operator_wrote_gets_its_render_input_once_and_keeps_its_pod_template(
    kube: EmulatedCluster, controller: Controller, clock: Clock, in_canary: dict[str, Any]
) -> None:
    stripped = {"metadata": {"annotations": {ANNOTATION_RENDER_INPUT: None}}}
    await kube.emulator.patch_object("apps/v1", "Deployment", NS, "chat-gpu-only", stripped)
    template_before = (deployment(kube, "chat-gpu-only") or {})["spec"]["template"]
    before = len(writes(kube, "deployments"))

    for _ in range(2):
        clock.advance(1)
        await controller.reconcile(policy_body(kube))

    assert [n for _, _, n in writes(kube, "deployments")[before:]] == ["chat-gpu-only"]  # once, not every cycle
    after = deployment(kube, "chat-gpu-only") or {}
    assert after["metadata"]["annotations"][ANNOTATION_RENDER_INPUT]
    assert after["spec"]["template"] == template_before  # so its pods do not restart


async def test_a_restart_over_an_unchanged_fleet_resyncs_service_and_podmonitor_later_not_at_once(
    kube: EmulatedCluster, provider: CraftedProvider, clock: Clock, controller: Controller, in_canary: dict[str, Any]
) -> None:
    await run_pods(kube, "chat-cpu", 1)
    await controller.reconcile(policy_body(kube))
    before = len(writes(kube))
    now = [1000.0]
    restarted = Controller(
        kube.gateway(),
        MeasurementHub(provider, gather_window=0.0),
        settings=ControllerSettings(children_resync_seconds=300.0),
        clock=clock,
        monotonic=lambda: now[0],
    )

    clock.advance(1)
    await restarted.reconcile(policy_body(kube))
    children = ("services", "podmonitors", "deployments")
    assert [w for w in writes(kube)[before:] if w[1] in children] == []

    now[0] += 301.0  # past the resync period, whatever the random offset was
    clock.advance(1)
    await restarted.reconcile(policy_body(kube))
    assert sorted(w[1] for w in writes(kube)[before:] if w[1] in children) == ["podmonitors", "services"]


async def test_a_restart_over_a_changed_spec_writes_service_and_podmonitor_at_once(
    kube: EmulatedCluster, provider: CraftedProvider, clock: Clock, controller: Controller, in_canary: dict[str, Any]
) -> None:
    before = len(writes(kube))
    restarted = new_controller(kube, provider, clock)
    edited = policy_body(kube)
    edited["spec"]["resources"]["headroom"] = "2Gi"  # the Deployments it renders now differ from those running

    clock.advance(1)
    await restarted.reconcile(edited)
    assert {"podmonitors", "services"} <= {w[1] for w in writes(kube)[before:]}


async def test_a_body_older_than_the_status_just_written_is_judged_by_that_status(
    kube: EmulatedCluster, controller: Controller, clock: Clock
) -> None:
    """kopf can hand a cycle the body from before the operator's own status write (seen on kube-apiserver)."""
    await create_policy(kube)
    stale = policy_body(kube)  # no status yet
    await controller.reconcile(stale)
    written = status_of(kube)
    assert written["history"][-1]["decision"] == "NewLadder"

    clock.advance(1)
    await controller.reconcile(stale)

    assert [e["decision"] for e in status_of(kube)["history"]] == ["NewLadder"]  # not a second new ladder
    assert status_of(kube)["stage"] == written["stage"]


async def test_a_stale_body_is_told_by_its_resource_version_even_where_that_is_no_number(
    kube: EmulatedCluster, controller: Controller, clock: Clock
) -> None:
    """resourceVersions are opaque (the API conventions allow only equality): an aggregated server's need not count."""
    await create_policy(kube)
    stale = policy_body(kube)
    stale["metadata"]["resourceVersion"] = "opaque-b"
    await controller.reconcile(stale)
    clock.advance(1)
    await controller.reconcile(stale)
    assert [e["decision"] for e in status_of(kube)["history"]] == ["NewLadder"]

    fresh = policy_body(kube)
    fresh["metadata"]["resourceVersion"] = "opaque-a"  # another version, "smaller" as text: still the newer body
    fresh["status"]["history"] = []  # what this newer body says wins over the status the operator wrote
    status = controller._freshest_status(fresh["metadata"]["uid"], fresh)
    assert status is not None
    assert status.history == []


async def test_an_unserved_podmonitor_kind_is_asked_once_per_resync_period_and_told_once_per_policy(
    kube: EmulatedCluster, provider: CraftedProvider, clock: Clock
) -> None:
    now = [0.0]
    hub = MeasurementHub(provider, gather_window=0.0)
    controller = Controller(kube.gateway(), hub, clock=clock, monotonic=lambda: now[0])
    kube.emulator.fail_next(404, method="PATCH", plural="podmonitors", times=1_000, message="the server could not find")
    names = ("chat", "other", "third")
    for name in names:
        await create_policy(kube, name)

    async def sweep() -> None:
        for name in names:
            await controller.reconcile(policy_body(kube, name))

    def probes() -> int:
        return sum(1 for r in kube.emulator if r.resource is not None and r.resource.plural == "podmonitors")

    await sweep()
    assert probes() == 2  # the first policy's read (nothing there) and apply (the kind is not served)
    now[0] += controller.settings.children_resync_seconds + 1
    await sweep()
    assert probes() == 4  # asked again once in the next period, not once per policy
    told = [e for e in await events(kube) if e.reason == "PodMonitorUnavailable"]
    assert sorted((e.involved_object.name, e.count) for e in told) == [(name, 1) for name in sorted(names)]


async def test_a_deployment_someone_else_owns_is_not_taken_over(kube: EmulatedCluster, controller: Controller) -> None:
    await kube.emulator.create_object(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "chat-gpu-only", "namespace": NS, "labels": {"team": "other"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"team": "other"}}, "template": {}},
        }
    )
    await create_policy(kube)

    with pytest.raises(ReconcileError, match="will not adopt"):
        await controller.reconcile(policy_body(kube))

    theirs = deployment(kube, "chat-gpu-only")
    assert theirs is not None
    assert theirs["spec"]["replicas"] == 1
    assert "ownerReferences" not in theirs["metadata"]
    assert "NotOwned" in [e.reason for e in await events(kube)]
    assert (
        controller.metrics.registry.get_sample_value(
            "kvoffload_api_errors_total", {"operation": "apply", "code": "refused"}
        )
        == 1
    )


async def list_deployments(kube: EmulatedCluster) -> list[str]:
    apps = kubernetes.client.AppsV1Api(kube.api_client)
    # Raw JSON: the typed client model refuses integer GPU quantities, which the API server would accept.
    response: Any = await kube.call(apps.list_namespaced_deployment, NS, _preload_content=False)
    return [item["metadata"]["name"] for item in json.loads(response.data)["items"]]


async def test_a_model_configmap_is_read_through_the_api_and_its_absence_names_the_field(
    kube: EmulatedCluster, controller: Controller, clock: Clock
) -> None:
    spec = chat_spec()
    spec["model"] = {
        "name": "acme/private-llm",
        "image": "vllm/vllm-openai:v0.32.0",
        "maxModelLen": 4096,
        "configMap": {"name": "private-llm-config"},
    }
    await create_policy(kube, spec=spec)

    await controller.reconcile(policy_body(kube))

    assert status_of(kube)["phase"] == "Invalid"
    (condition,) = [c for c in status_of(kube)["conditions"] if c["type"] == "Invalid"]
    assert condition["message"].startswith("spec.model.configMap: ConfigMap llm/private-llm-config not found")
    assert deployment(kube, "chat-gpu-only") is None

    config = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128}
    await kube.emulator.create_object(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "private-llm-config", "namespace": NS},
            "data": {"config.json": json.dumps(config)},
        }
    )
    clock.advance(1)
    await controller.reconcile(policy_body(kube))

    assert status_of(kube)["phase"] == "Baseline"
    assert deployment(kube, "chat-gpu-only") is not None


async def test_the_bearer_token_secret_reaches_prometheus_and_its_absence_is_inconclusive(
    kube: EmulatedCluster, clock: Clock
) -> None:
    sources: list[PrometheusSource] = []

    def provider_for(source: PrometheusSource) -> CraftedProvider:
        sources.append(source)
        return CraftedProvider()

    controller = Controller(kube.gateway(), MeasurementHub(provider_for, gather_window=0.0), clock=clock)
    spec = chat_spec()
    spec["prometheus"]["bearerTokenSecret"] = {"name": "prom-token", "key": "token"}
    await create_policy(kube, spec=spec)
    await controller.reconcile(policy_body(kube))  # starts the ladder; the first analysis comes next
    clock.advance(1)

    await controller.reconcile(policy_body(kube))

    assert sources == []  # no Secret yet: nothing is sent without the token it asks for
    analysis = status_of(kube)["lastAnalysis"]
    assert analysis["verdict"] == "Inconclusive"
    assert "spec.prometheus.bearerTokenSecret: Secret llm/prom-token not found" in analysis["message"]

    await kube.emulator.create_object(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "prom-token", "namespace": NS},
            "data": {"token": base64.b64encode(b"s3cret\n").decode()},
        }
    )
    clock.advance(1)
    await controller.reconcile(policy_body(kube))

    assert sources == [PrometheusSource("http://prometheus.test:9090", "s3cret")]
    (token,) = [c for c in status_of(kube)["conditions"] if c["type"] == PROMETHEUS_TOKEN_UNREADABLE]
    assert (token["status"], token["reason"]) == ("False", "TokenRead"), "the condition clears once it is read"


async def test_a_missing_token_secret_is_a_condition_naming_it_with_one_warning(
    kube: EmulatedCluster, controller: Controller, clock: Clock
) -> None:
    spec = chat_spec()
    spec["prometheus"]["bearerTokenSecret"] = {"name": "prom-token", "key": "token"}
    await create_policy(kube, spec=spec)
    for _ in range(3):
        await controller.reconcile(policy_body(kube))
        clock.advance(1)

    (token,) = [c for c in status_of(kube)["conditions"] if c["type"] == PROMETHEUS_TOKEN_UNREADABLE]
    assert (token["status"], token["reason"]) == ("True", "SecretNotFound")
    assert token["message"] == "spec.prometheus.bearerTokenSecret: Secret llm/prom-token not found"
    warnings = [e for e in await events(kube) if e.reason == "SecretNotFound"]
    assert len(warnings) == 1
    assert (warnings[0].count or 1) == 1, "one Warning when it goes missing, not one a cycle"


async def test_a_forbidden_token_secret_is_asked_for_again_only_after_the_retry_period_and_heals(
    kube: EmulatedCluster, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The emulator has no authorizer: its answer is the real one's (tests/test_chart_rbac.py sees it), here at will.
    gateway = kube.gateway()
    asked: list[str] = []
    allowed = False

    async def read_secret(namespace: str, name: str, key: str) -> str:
        asked.append(name)
        if not allowed:
            raise ApiRejectedError(f"read Secret {namespace}/{name}: 403 secrets {name!r} is forbidden", 403)
        return "s3cret"

    monkeypatch.setattr(gateway, "read_secret", read_secret)
    monotonic = [0.0]
    settings = ControllerSettings(forbidden_retry_seconds=300)
    controller = Controller(
        gateway,
        MeasurementHub(CraftedProvider(), gather_window=0.0),
        settings,
        clock=clock,
        monotonic=lambda: monotonic[0],
    )
    spec = chat_spec()
    spec["prometheus"]["bearerTokenSecret"] = {"name": "prom-token", "key": "token"}
    await create_policy(kube, spec=spec)

    def token_condition() -> dict[str, Any]:
        (found,) = [c for c in status_of(kube)["conditions"] if c["type"] == PROMETHEUS_TOKEN_UNREADABLE]
        return found

    for _ in range(5):  # a cycle a second for five seconds: asked once
        await controller.reconcile(policy_body(kube))
        clock.advance(1)
        monotonic[0] += 1
    assert asked == ["prom-token"]
    assert (token_condition()["status"], token_condition()["reason"]) == ("True", "SecretForbidden")
    assert "may not get Secret llm/prom-token" in token_condition()["message"]
    assert "prometheusAuth.policySecrets" in token_condition()["message"]

    allowed = True  # the Role is granted; the operator sees it at the next retry
    monotonic[0] += 300
    await controller.reconcile(policy_body(kube))
    assert asked == ["prom-token", "prom-token"]
    assert (token_condition()["status"], token_condition()["reason"]) == ("False", "TokenRead")
    assert [e.reason for e in await events(kube)].count("SecretForbidden") == 1


async def test_the_operators_own_token_is_sent_for_a_policy_that_names_none_and_a_policys_own_wins(
    kube: EmulatedCluster, clock: Clock
) -> None:
    sources: list[PrometheusSource] = []

    def provider_for(source: PrometheusSource) -> CraftedProvider:
        sources.append(source)
        return CraftedProvider()

    settings = ControllerSettings(
        prometheus_token=SecretLocation("kvoffload", "prom", "token"),
        tenancy=Tenancy(prometheus_url_prefixes=("http://prometheus.test:9090",)),
    )
    controller = Controller(kube.gateway(), MeasurementHub(provider_for, gather_window=0.0), settings, clock=clock)
    for namespace, name, value in (("kvoffload", "prom", b"operator"), (NS, "own", b"own")):
        await kube.emulator.create_object(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace},
                "data": {"token": base64.b64encode(value).decode()},
            }
        )
    await create_policy(kube)
    spec = chat_spec()
    spec["prometheus"]["bearerTokenSecret"] = {"name": "own", "key": "token"}
    await create_policy(kube, "mine", spec)
    for _ in range(2):
        await controller.reconcile(policy_body(kube))
        await controller.reconcile(policy_body(kube, "mine"))
        clock.advance(1)

    assert {source.bearer_token for source in sources} == {"operator", "own"}
    assert [c for c in status_of(kube)["conditions"] if c["type"] == PROMETHEUS_TOKEN_UNREADABLE] == []


async def test_the_dialect_is_confirmed_against_the_series_prometheus_holds(
    kube: EmulatedCluster, clock: Clock
) -> None:
    class OldEngineProvider(CraftedProvider):
        """The image tag says 0.32, but the engines export the pre-0.11 ITL histogram."""

        def present_metric_names(self, target: Target | None = None) -> frozenset[str]:
            return frozenset({"vllm:time_to_first_token_seconds_bucket", "vllm:time_per_output_token_seconds_bucket"})

    provider = OldEngineProvider()
    controller = Controller(kube.gateway(), MeasurementHub(provider, gather_window=0.0), clock=clock)
    await create_policy(kube)
    await controller.reconcile(policy_body(kube))
    clock.advance(1)

    await controller.reconcile(policy_body(kube))

    ((target,),) = provider.calls
    assert target.dialect.itl == "vllm:time_per_output_token_seconds"


# --- the preflight -----------------------------------------------------------------------------


def workload(*, kv_max: float, preemptions: float, hits: float) -> WorkloadSample:
    return WorkloadSample(
        prompt_tokens=Percentiles(1200.0, 2500.0, 3900.0),
        ttft=Percentiles(0.05, 0.10, 0.12),
        itl=Percentiles(0.010, 0.015, 0.02),
        e2e=Percentiles(0.8, 1.6, 2.0),
        running_requests=3.5,
        prefix_cache_hit_rate=hits,
        kv_usage_max=kv_max,
        preemptions_per_second=preemptions,
    )


class WorkloadProvider(CraftedProvider):
    """Healthy figures, and the given workload figures to every target that asks for them."""

    def __init__(self, figures: WorkloadSample) -> None:
        super().__init__()
        self.figures = figures

    def measure(self, targets: Sequence[Target]) -> dict[PolicyKey, Measurements]:
        self.calls.append(list(targets))
        out = {}
        for t in targets:
            stable = VariantSample(**{**HEALTHY.__dict__, "workload": self.figures if t.workload else None})
            out[t.key] = Measurements(canary=HEALTHY if t.canary_hash is not None else None, stable=stable)
        return out


def preflight_spec() -> dict[str, Any]:
    spec = chat_spec()
    spec["rollout"]["preflight"] = {}
    return spec


async def test_OffloadWillNotPay_holds_the_fleet_on_gpu_only_through_the_controller(
    kube: EmulatedCluster, clock: Clock
) -> None:
    # Given a policy with a preflight, and a fleet whose GPU KV cache never comes near full
    provider = WorkloadProvider(workload(kv_max=0.45, preemptions=0.0, hits=0.4))
    controller = new_controller(kube, provider, clock)  # type: ignore[arg-type]
    await create_policy(kube, spec=preflight_spec())
    await controller.reconcile(policy_body(kube))
    await run_pods(kube, "chat-gpu-only", 4)

    # When the 10 s baseline has run, and 20 more cycles after it
    await reconcile_until(controller, kube, clock, lambda: status_of(kube).get("phase") == "Held")
    for _ in range(20):
        clock.advance(1)
        await controller.reconcile(policy_body(kube))

    # Then no canary was ever created, and every replica stays on GPU-only
    assert deployment(kube, "chat-cpu") is None
    assert [n for _, _, n in writes(kube, "deployments") if n == "chat-cpu"] == []
    stable = deployment(kube, "chat-gpu-only")
    assert stable is not None
    assert stable["spec"]["replicas"] == 4
    assert stable["spec"]["template"]["metadata"]["labels"][LABEL_LEVEL] == "gpu-only"
    status = status_of(kube)
    assert status["phase"] == "Held"
    assert status["mode"] == "Held"
    conditions = {c["type"]: c for c in status["conditions"]}
    will_not_pay = conditions["OffloadWillNotPay"]
    assert (will_not_pay["status"], will_not_pay["reason"]) == ("True", "GPUMemoryNotConstrained")
    # the figures: L4's estimated profile prices Qwen3-0.6B at the baseline's p50 prompt (1,200 tokens)
    assert "for a 1,200-token prompt (estimated profile nvidia-l4)" in will_not_pay["message"]
    assert "max GPU KV usage 45% (kvPressure 90%); preemptions 0/s" in will_not_pay["message"]
    assert "prefix-cache hit rate 40.0%" in will_not_pay["message"]
    assert (conditions["Stalled"]["status"], conditions["Reconciling"]["status"]) == ("True", "False")
    preflight = status["preflight"]
    assert preflight["pays"] is False
    assert preflight["promptTokens"] == 1200
    assert preflight["ratio"] > 1  # restoring would be faster: it is memory that does not need it
    assert preflight["profile"] == "nvidia-l4 (estimated)"
    baseline = status["baseline"]
    assert baseline["promptTokens"] == {"p50": 1200.0, "p95": 2500.0, "p99": 3900.0}
    assert baseline["e2eLatency"]["p99"] == 2.0
    assert baseline["concurrency"] == 3.5
    assert (baseline["gpuKvUsageMax"], baseline["preemptionRate"], baseline["prefixCacheHitRate"]) == (0.45, 0.0, 0.4)
    assert [h["decision"] for h in status["history"]] == ["NewLadder", "OffloadWillNotPay"]
    warnings = [e for e in await events(kube) if e.type == "Warning"]
    assert [e.reason for e in warnings] == ["OffloadWillNotPay"]
    assert "max GPU KV usage 45%" in warnings[0].message
    # the workload was asked for during the baseline only
    asked = [call[0].workload for call in provider.calls]
    assert asked[:10] == [True] * 10
    assert not any(asked[10:])

    # And a retry takes a new baseline; under memory pressure now, the canary starts
    provider.figures = workload(kv_max=0.97, preemptions=0.3, hits=0.4)
    await kube.emulator.patch_object(POLICY_API, KIND, NS, "chat", {"metadata": {"annotations": {RETRY: "1"}}})
    await reconcile_until(controller, kube, clock, lambda: deployment(kube, "chat-cpu") is not None)
    status = status_of(kube)
    assert status["phase"] == "Canary"
    will_not_pay = next(c for c in status["conditions"] if c["type"] == "OffloadWillNotPay")
    assert (will_not_pay["status"], will_not_pay["reason"]) == ("False", "OffloadMayPay")
    taken = [e for e in await events(kube) if e.reason == "BaselineTaken"]
    assert "preflight: offload may pay" in taken[-1].message
    assert "max GPU KV usage 97%" in taken[-1].message


# --- roles, not pods (issue 9) --------------------------------------------------------------


async def sync_pods(kube: EmulatedCluster, names: Sequence[str], made: dict[str, int]) -> None:
    """Play the ReplicaSet controller for scale-ups: Ready pods of each Deployment's template up to its replicas."""
    for name in names:
        dep = deployment(kube, name)
        if dep is None:
            continue
        missing = dep["spec"]["replicas"] - made.get(name, 0)
        for _ in range(max(0, missing)):
            suffix = f"{made.get(name, 0)}"
            made[name] = made.get(name, 0) + 1
            await _ready_pod(kube, name, dep, suffix)


async def _ready_pod(kube: EmulatedCluster, deployment_name: str, dep: dict[str, Any], suffix: str) -> None:
    name = f"{deployment_name}-p{suffix}"
    await kube.emulator.create_object(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": NS,
                "labels": dep["spec"]["template"]["metadata"]["labels"],
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": deployment_name,
                        "uid": dep["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": copy.deepcopy(dep["spec"]["template"]["spec"]),
        }
    )
    ready = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "vllm", "ready": True, "restartCount": 0, "state": {"running": {}}}],
    }
    await kube.emulator.patch_object("v1", "Pod", NS, name, {"status": ready}, subresource="status")


async def test_at_100_percent_the_canary_levels_deployment_becomes_stable_and_keeps_its_pods(
    kube: EmulatedCluster, controller: Controller, clock: Clock
) -> None:
    await create_policy(kube)
    made: dict[str, int] = {}
    await controller.reconcile(policy_body(kube))
    await sync_pods(kube, ["chat-gpu-only"], made)
    await reconcile_until(controller, kube, clock, lambda: deployment(kube, "chat-cpu") is not None)
    cpu = deployment(kube, "chat-cpu")
    assert cpu is not None

    def done() -> bool:
        return status_of(kube).get("phase") == "Stable" and deployment(kube, "chat-gpu-only") is None

    for _ in range(200):
        await sync_pods(kube, ["chat-gpu-only", "chat-cpu"], made)
        clock.advance(1)
        await controller.reconcile(policy_body(kube))
        now = deployment(kube, "chat-cpu")
        assert now is not None
        assert now["metadata"]["uid"] == cpu["metadata"]["uid"]  # the same Deployment throughout
        assert now["spec"]["template"] == cpu["spec"]["template"]  # never re-rendered: no pod restarts
        if done():
            break
    assert done(), status_of(kube).get("message")
    final = deployment(kube, "chat-cpu")
    assert final is not None
    assert final["spec"]["replicas"] == 4
    assert made["chat-cpu"] == 4  # 4 engines started on cpu in all: the canary's first one was kept
    status = status_of(kube)
    assert status["stable"]["level"] == 1
    assert status["stable"]["replicas"] == 4
    assert status.get("retiring", []) == []


def legacy_deployment(kube: EmulatedCluster, role: str, level_index: int, replicas: int) -> dict[str, Any]:
    """A Deployment as the operator rendered it before issue 9: ``chat-<role>``, selected by a role label."""
    from kvoffload.api.conventions import LABEL_VARIANT
    from kvoffload.policy.ladder import build_ladder
    from kvoffload.policy.loading import parse_policy
    from kvoffload.policy.render import render_deployment

    body = policy_body(kube)
    policy = parse_policy({k: v for k, v in body.items() if k != "status"}, "llm/chat")
    manifest = render_deployment(policy, build_ladder(policy.spec)[level_index], replicas)
    manifest["metadata"]["name"] = f"chat-{role}"
    manifest["metadata"]["labels"][LABEL_VARIANT] = role
    manifest["metadata"]["ownerReferences"] = [
        {"apiVersion": POLICY_API, "kind": KIND, "name": "chat", "uid": body["metadata"]["uid"], "controller": True}
    ]
    manifest["spec"]["selector"]["matchLabels"] = {"kvoffload.io/policy": "chat", LABEL_VARIANT: role}
    manifest["spec"]["template"]["metadata"]["labels"][LABEL_VARIANT] = role
    return manifest


async def test_a_policy_running_under_the_old_naming_is_adopted_without_restarting_a_pod(
    kube: EmulatedCluster, controller: Controller, clock: Clock
) -> None:
    await create_policy(kube)
    old_stable, old_canary = legacy_deployment(kube, "stable", 0, 3), legacy_deployment(kube, "canary", 1, 1)
    for manifest in (old_stable, old_canary):
        await kube.emulator.create_object(manifest)
    made: dict[str, int] = {}
    await sync_pods(kube, ["chat-stable", "chat-canary"], made)
    hashes = [m["metadata"]["labels"][LABEL_CONFIG_HASH] for m in (old_stable, old_canary)]
    generation = policy_body(kube)["metadata"]["generation"]
    started = clock.now.isoformat()
    legacy_status = {  # what the operator wrote mid-canary before roles moved into status
        "phase": "Canary",
        "mode": "Step",
        "observedGeneration": generation,
        "ladder": ["gpu-only", "cpu"],
        "stage": {"index": 1, "name": "cpu", "tiers": ["cpu"], "step": 0, "startedAt": started},
        "stable": {"configHash": hashes[0], "level": 0, "tiers": [], "replicas": 3, "ready": 3},
        "canary": {"configHash": hashes[1], "level": 1, "tiers": ["cpu"], "replicas": 1, "ready": 1},
    }
    await kube.emulator.patch_object(POLICY_API, KIND, NS, "chat", {"status": legacy_status}, subresource="status")
    canary_before = deployment(kube, "chat-canary")
    assert canary_before is not None

    def done() -> bool:
        return status_of(kube).get("phase") == "Stable" and deployment(kube, "chat-stable") is None

    for _ in range(200):
        await sync_pods(kube, ["chat-canary"], made)
        clock.advance(1)
        await controller.reconcile(policy_body(kube))
        adopted = deployment(kube, "chat-canary")
        assert adopted is not None
        assert adopted["metadata"]["uid"] == canary_before["metadata"]["uid"]
        assert adopted["spec"]["template"] == canary_before["spec"]["template"]  # its pods never restart
        if done():
            break
    assert done(), status_of(kube).get("message")
    # No per-level Deployment was ever created beside the adopted ones, and none rendered over them.
    written = {name for _, _, name in writes(kube, "deployments")}
    assert "chat-cpu" not in written
    assert "chat-gpu-only" not in written
    adopted = deployment(kube, "chat-canary")
    assert adopted is not None
    assert adopted["spec"]["replicas"] == 4
    assert status_of(kube)["stable"] == {**status_of(kube)["stable"], "level": 1, "configHash": hashes[1]}
    # the first canary pod was never replaced: it is still there, as Kubernetes would keep it
    assert kube.emulator.read_object("v1", "Pod", NS, "chat-canary-p0") is not None


# --- at rest: readings are refreshed, not rewritten every cycle ----------------------------------


class DriftingProvider(CraftedProvider):
    """Healthy figures whose p99 TTFT drifts by a millisecond a call, as real readings do; ``verdict_breaks``
    makes the next calls breach the 500 ms budget."""

    def __init__(self) -> None:
        super().__init__()
        self.breach = False

    def measure(self, targets: Sequence[Target]) -> dict[PolicyKey, Measurements]:
        self.calls.append(list(targets))
        ttft = 0.9 if self.breach else 0.12 + 0.001 * len(self.calls)
        sample = VariantSample(**{**HEALTHY.__dict__, "ttft_p99": ttft})
        return {t.key: Measurements(canary=sample if t.canary_hash else None, stable=sample) for t in targets}


async def climb_to_stable(kube: EmulatedCluster, controller: Controller, clock: Clock) -> None:
    made: dict[str, int] = {}
    await create_policy(kube)
    for _ in range(200):
        await sync_pods(kube, ["chat-gpu-only", "chat-cpu"], made)
        clock.advance(1)
        await controller.reconcile(policy_body(kube))
        if status_of(kube).get("phase") == "Stable" and deployment(kube, "chat-gpu-only") is None:
            return
    pytest.fail(f"not Stable: {status_of(kube).get('message')}")


def status_writes(kube: EmulatedCluster) -> int:
    return sum(1 for method, plural, _ in writes(kube, PLURAL) if method == "PATCH" and plural == PLURAL)


async def test_at_rest_fresh_readings_are_written_once_per_refresh_period_and_a_climb_writes_every_cycle(
    kube: EmulatedCluster, clock: Clock
) -> None:
    provider = DriftingProvider()
    settings = ControllerSettings(resting_refresh_seconds=30.0)
    controller = Controller(kube.gateway(), MeasurementHub(provider, gather_window=0.0), settings, clock=clock)
    calls_before_climb = len(provider.calls)
    await climb_to_stable(kube, controller, clock)
    climbing = len(provider.calls) - calls_before_climb
    assert status_writes(kube) >= climbing - 2  # the climb: its readings were written as they came

    before, analysed = status_writes(kube), len(provider.calls)
    stamps = {status_of(kube)["lastAnalysis"]["time"]}
    for _ in range(60):  # a minute at rest, analysed every second
        clock.advance(1)
        await controller.reconcile(policy_body(kube))
        stamps.add(status_of(kube)["lastAnalysis"]["time"])
    assert len(provider.calls) - analysed == 60  # analysed every cycle all the same
    assert status_writes(kube) - before == 2  # at 30 s and 60 s, not 60 writes
    assert len(stamps) == 3
    assert status_of(kube)["phase"] == "Stable"


class PatienceHub(MeasurementHub):
    """Notes, for each request, the mode the policy was in and how long the request could wait for others."""

    def __init__(self, provider: DriftingProvider, kube: EmulatedCluster) -> None:
        super().__init__(provider, gather_window=0.0)
        self.kube = kube
        self.asked: list[tuple[str, float]] = []

    async def measure(
        self, target: Target, source: PrometheusSource | None = None, *, patience: float = 0.0
    ) -> Measurements:
        self.asked.append((status_of(self.kube)["mode"], patience))
        return await super().measure(target, source, patience=patience)


async def test_a_policy_at_rest_asks_patiently_and_one_that_climbs_does_not(
    kube: EmulatedCluster, clock: Clock
) -> None:
    hub = PatienceHub(DriftingProvider(), kube)
    controller = Controller(kube.gateway(), hub, clock=clock)
    await climb_to_stable(kube, controller, clock)
    for _ in range(3):
        clock.advance(15)
        await controller.reconcile(policy_body(kube))

    interval = parse_duration(chat_spec()["analysis"]["interval"])
    climbing = {patience for mode, patience in hub.asked if mode != "Stable"}
    resting = {patience for mode, patience in hub.asked if mode == "Stable"}
    assert (climbing, resting) == ({0.0}, {interval / 4})  # a quarter of its interval: its analyses stay as often


async def test_at_rest_a_changed_verdict_is_written_at_once(kube: EmulatedCluster, clock: Clock) -> None:
    provider = DriftingProvider()
    settings = ControllerSettings(resting_refresh_seconds=300.0)
    controller = Controller(kube.gateway(), MeasurementHub(provider, gather_window=0.0), settings, clock=clock)
    await climb_to_stable(kube, controller, clock)
    clock.advance(1)
    await controller.reconcile(policy_body(kube))
    before = status_writes(kube)

    provider.breach = True
    clock.advance(1)
    await controller.reconcile(policy_body(kube))

    assert status_writes(kube) == before + 1
    analysis = status_of(kube)["lastAnalysis"]
    assert analysis["verdict"] == "Fail"
    assert analysis["consecutiveFailures"] == 1


async def test_the_operators_token_never_goes_to_a_prometheus_the_admin_did_not_allow(
    kube: EmulatedCluster, clock: Clock
) -> None:
    """A tenant names their own host as spec.prometheus.url: the policy goes Invalid at that path, and no query,
    with or without the operator's token, is ever sent there."""
    sources: list[PrometheusSource] = []

    def provider_for(source: PrometheusSource) -> CraftedProvider:
        sources.append(source)
        return CraftedProvider()

    settings = ControllerSettings(
        prometheus_token=SecretLocation("kvoffload", "prom", "token"),
        tenancy=Tenancy(prometheus_url_prefixes=("http://prometheus.test:9090",)),
    )
    controller = Controller(kube.gateway(), MeasurementHub(provider_for, gather_window=0.0), settings, clock=clock)
    spec = chat_spec()
    spec["prometheus"]["url"] = "https://collector.attacker.test/"
    await create_policy(kube, spec=spec)
    for _ in range(2):
        await controller.reconcile(policy_body(kube))
        clock.advance(1)

    assert sources == []
    (condition,) = [c for c in status_of(kube)["conditions"] if c["type"] == "Invalid"]
    assert condition["message"].startswith("spec.prometheus.url: is not under a Prometheus URL this cluster allows")
    assert deployment(kube, "chat-gpu-only") is None


@pytest.mark.parametrize(
    ("field", "value"),
    [("cpu", "1e999999999"), ("cpu", float("inf")), ("cpu", 10.0**300)],
    ids=["decimal-overflow", "float-infinity", "float-huge"],
)
async def test_a_policy_past_every_bound_goes_invalid_once_and_is_never_retried_as_an_error(
    kube: EmulatedCluster, controller: Controller, clock: Clock, field: str, value: Any
) -> None:
    """What got past the API server (no webhook, an older CRD) must not crash the cycle: Invalid with the path,
    one Warning, and no further writes on the cycles after."""
    spec = chat_spec()
    spec["offload"][field] = value
    await create_policy(kube, spec=spec)

    await controller.reconcile(policy_body(kube))
    written = policy_body(kube)["metadata"]["resourceVersion"]
    for _ in range(3):
        clock.advance(30)
        await controller.reconcile(policy_body(kube))

    assert status_of(kube)["phase"] == "Invalid"
    (condition,) = [c for c in status_of(kube)["conditions"] if c["type"] == "Invalid"]
    assert condition["message"].startswith(f"spec.offload.{field}: ")
    assert policy_body(kube)["metadata"]["resourceVersion"] == written
    assert [e.reason for e in await events(kube) if e.type == "Warning"] == ["SpecInvalid"]


class UnscrapedProvider(CraftedProvider):
    """A Prometheus that answers, and holds no series of any of the policy's pods."""

    def measure(self, targets: Sequence[Target]) -> dict[PolicyKey, Measurements]:
        self.calls.append(list(targets))
        return {t.key: Measurements(canary=None, stable=None) for t in targets}


async def test_pods_no_prometheus_scrapes_are_reported_naming_the_podmonitors_labels_the_operator_gave(
    kube: EmulatedCluster, clock: Clock
) -> None:
    settings = ControllerSettings(monitor_labels={"release": "kvoffload-lab"})
    controller = Controller(
        kube.gateway(), MeasurementHub(UnscrapedProvider(), gather_window=0.0), settings=settings, clock=clock
    )
    await create_policy(kube)
    await controller.reconcile(policy_body(kube))
    await run_pods(kube, "chat-gpu-only", 4)

    def reported() -> bool:
        return any(c["type"] == PODS_NOT_SCRAPED for c in status_of(kube).get("conditions", []))

    await reconcile_until(controller, kube, clock, reported)
    (condition,) = [c for c in status_of(kube)["conditions"] if c["type"] == PODS_NOT_SCRAPED]
    assert condition["status"] == "True"
    assert "its PodMonitor chat (labels: " in condition["message"]
    assert "release=kvoffload-lab" in condition["message"]  # the operator's --monitor-label, as rendered
    monitor = kube.emulator.read_object("monitoring.coreos.com/v1", "PodMonitor", NS, "chat")
    assert monitor is not None
    assert monitor["metadata"]["labels"]["release"] == "kvoffload-lab"


async def test_a_template_the_operator_may_not_read_leaves_the_cycle_to_decide_and_a_hard_failure_rolls_back(
    kube: EmulatedCluster, controller: Controller, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The emulator has no authorizer: a 403 on the template (its ClusterRole missing) is played here at will.
    forbidden = False
    shared = {
        "apiVersion": POLICY_API,
        "kind": "KVOffloadAnalysisTemplate",
        "metadata": {"name": "platform-gates", "generation": 1},
        "spec": {"metrics": [{"name": "queue", "query": "max(q{ {{ selector }} })", "max": 5, "dryRun": True}]},
    }

    async def read_analysis_template(name: str) -> dict[str, Any] | None:
        if forbidden:
            raise ApiRejectedError(f"read KVOffloadAnalysisTemplate {name}: 403 forbidden", 403)
        return copy.deepcopy(shared)

    monkeypatch.setattr(controller.gateway, "read_analysis_template", read_analysis_template)
    spec = chat_spec()
    spec["analysis"]["templates"] = [{"name": "platform-gates"}]
    await create_policy(kube, spec=spec)
    await controller.reconcile(policy_body(kube))
    await run_pods(kube, "chat-gpu-only", 4)
    await reconcile_until(controller, kube, clock, lambda: deployment(kube, "chat-cpu") is not None)

    forbidden = True
    clock.advance(1)
    await controller.reconcile(policy_body(kube))  # no ReconcileError: the cycle goes on
    analysis = status_of(kube)["lastAnalysis"]
    assert analysis["verdict"] == "Inconclusive"
    (row,) = [m for m in analysis["metrics"] if m["name"] == "template/platform-gates"]
    assert "could not be read" in row["message"]
    assert "403 forbidden" in row["message"]
    errors = {"operation": "read_analysis_template", "code": "403"}
    assert controller.metrics.registry.get_sample_value("kvoffload_api_errors_total", errors) == 1

    oom = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
    await run_pods(
        kube,
        "chat-cpu",
        1,
        conditions=[{"type": "Ready", "status": "False"}],
        containerStatuses=[{"name": "vllm", "ready": False, "restartCount": 0, "lastState": oom, "state": oom}],
    )
    clock.advance(1)
    await controller.reconcile(policy_body(kube))
    assert deployment(kube, "chat-cpu") is None
    status = status_of(kube)
    assert status["phase"] == "RolledBack"
    assert status["history"][-1]["reason"] == "CanaryOOMKilled"
