"""The operator under kopf, for real over HTTP against the emulated API server.

In-process (kopf in its own thread, the handlers of ``kvoffload.handlers``) and as the
``kvoffload run`` command in a subprocess that finds the emulator through $KUBECONFIG.
Prometheus is not needed here: in-process, a small provider returns healthy figures;
the subprocess points its policies at a Prometheus that is not there (Inconclusive).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

import kopf
import kubernetes.client
import pytest

from kvoffload.analysis.hub import MeasurementHub
from kvoffload.analysis.measurements import Measurements, VariantSample
from kvoffload.analysis.queries import PolicyKey, Target
from kvoffload.api.conventions import API_GROUP, API_VERSION, FINALIZER, KIND, PAUSE, PLURAL
from kvoffload.controller.bodies import unpacked_body
from kvoffload.controller.handlers import NOTICED, LoopSettings, configure_settings, register
from kvoffload.controller.reconcile import Controller
from kvoffload.controller.settings import ControllerSettings
from kvoffload.rollout.plan import Plan
from tests.support.kube import EmulatedCluster, kvoffload_run, policy_manifest, running_kopf, wait_for

pytestmark = pytest.mark.e2e

NS = "default"
POLICY_API = f"{API_GROUP}/{API_VERSION}"


def quick_spec(prometheus: str = "http://prometheus.test:9090") -> dict[str, Any]:
    """Two replicas, gpu-only -> cpu, a 2 s baseline, analysis every second."""
    return {
        "model": {"name": "Qwen/Qwen3-0.6B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 4096},
        "gpu": {"class": "nvidia-l4"},
        "replicas": 2,
        "resources": {"baseMemory": "4Gi", "headroom": "1Gi"},
        "offload": {"cpu": "1Gi"},
        "rollout": {"baselineDuration": "2s", "stepDuration": "30s", "progressDeadline": "60s"},
        "analysis": {"interval": "1s", "window": "10s", "ttftP99": "500ms", "itlP99": "50ms", "minRequests": 5},
        "prometheus": {"url": prometheus},
    }


BROKEN_SPEC = {"replicas": "many", "offload": {"cpu": "lots"}}


class HealthyProvider:
    def measure(self, targets: Sequence[Target]) -> dict[PolicyKey, Measurements]:
        sample = VariantSample(requests=100.0, ttft_p99=0.1, itl_p99=0.02, external_share=0.3, tier_hits={"host": 1.0})
        return {
            t.key: Measurements(canary=sample if t.canary_hash is not None else None, stable=sample) for t in targets
        }

    def present_metric_names(self, target: Target | None = None) -> frozenset[str]:
        return frozenset()


def read(kube: EmulatedCluster, api_version: str, kind: str, name: str) -> dict[str, Any] | None:
    return kube.emulator.read_object(api_version, kind, NS, name)


def phase_of(kube: EmulatedCluster, name: str) -> str | None:
    return ((read(kube, POLICY_API, KIND, name) or {}).get("status") or {}).get("phase")


def invalid_message(kube: EmulatedCluster, name: str) -> str:
    conditions = ((read(kube, POLICY_API, KIND, name) or {}).get("status") or {}).get("conditions") or []
    return next((c["message"] for c in conditions if c["type"] == "Invalid" and c["status"] == "True"), "")


async def delete_policy(kube: EmulatedCluster, name: str) -> None:
    custom = kubernetes.client.CustomObjectsApi(kube.api_client)
    await kube.call(custom.delete_namespaced_custom_object, API_GROUP, API_VERSION, NS, PLURAL, name)


def bystander() -> dict[str, Any]:
    labels = {"app": "bystander"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "bystander", "namespace": NS, "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}}},
    }


CHILDREN = (
    ("apps/v1", "Deployment", "chat-gpu-only"),
    ("apps/v1", "Deployment", "chat-cpu"),
    ("v1", "Service", "chat"),
    ("monitoring.coreos.com/v1", "PodMonitor", "chat"),
)


LOOP_OWNERS = pytest.mark.parametrize("own_loops", [True, False], ids=["own-loops", "kopf-daemons"])
"""Who runs each policy's loop: the runtime (standalone), or a kopf daemon (with kopf peering on)."""


@LOOP_OWNERS
async def test_kopf_runs_the_ladder_keeps_a_broken_policy_invalid_and_deletion_collects_the_children(
    kube: EmulatedCluster, own_loops: bool
) -> None:
    registry = kopf.OperatorRegistry()
    controller = Controller(kube.gateway(), MeasurementHub(HealthyProvider(), gather_window=0.01))
    register(registry, controller, own_loops=own_loops)
    await kube.emulator.create_object(bystander())

    async with running_kopf(kube, registry=registry) as kopf_thread:
        chat = policy_manifest("chat", NS, spec=quick_spec())
        chat["metadata"]["finalizers"] = [FINALIZER]  # as an operator that ran kopf daemons left its policies
        await kube.emulator.create_object(chat)
        await kube.emulator.create_object(policy_manifest("broken", NS, spec=BROKEN_SPEC))

        await wait_for(lambda: read(kube, "apps/v1", "Deployment", "chat-gpu-only"), "the stable Deployment", 10)
        await wait_for(lambda: phase_of(kube, "broken") == "Invalid", "the broken policy to go Invalid", 10)
        message = invalid_message(kube, "broken")
        assert "spec.replicas" in message
        assert "spec.model" in message
        # the daemon moves the valid one on by itself: baseline (2 s), then the canary
        await wait_for(lambda: phase_of(kube, "chat") == "Canary", "the canary step", 15)
        canary = read(kube, "apps/v1", "Deployment", "chat-cpu")
        assert canary is not None
        assert canary["spec"]["replicas"] == 1
        assert read(kube, "apps/v1", "Deployment", "chat-gpu-only")["spec"]["replicas"] == 1  # type: ignore[index]
        # Its own loops hold no deletion back, so kopf takes its old finalizer away; a kopf daemon needs it.
        await wait_for(
            lambda: (
                (FINALIZER in (read(kube, POLICY_API, KIND, "chat") or {})["metadata"].get("finalizers", []))
                is not own_loops
            ),
            "the finalizer to go" if own_loops else "the finalizer to stay",
            10,
        )

        await delete_policy(kube, "chat")
        await wait_for(lambda: read(kube, POLICY_API, KIND, "chat") is None, "the policy to be deleted", 10)
        await wait_for(
            lambda: all(read(kube, *child) is None for child in CHILDREN), "the garbage collector to remove children"
        )
        assert read(kube, "apps/v1", "Deployment", "bystander") is not None
        assert phase_of(kube, "broken") == "Invalid"
        assert read(kube, "apps/v1", "Deployment", "broken-gpu-only") is None
        assert kopf_thread.is_alive()


async def test_under_kopf_a_cycle_reads_the_engines_from_the_watch_and_lists_only_behind_its_own_writes(
    kube: EmulatedCluster,
) -> None:
    registry = kopf.OperatorRegistry()
    controller = Controller(kube.gateway(), MeasurementHub(HealthyProvider(), gather_window=0.01))
    register(registry, controller)

    def reads(source: str) -> float:
        value = controller.metrics.registry.get_sample_value("kvoffload_workload_reads_total", {"source": source})
        return value or 0.0

    controller.workloads.watch(kube.api_client, None)  # as run_operator does
    try:
        async with running_kopf(kube, registry=registry):
            await kube.emulator.create_object(policy_manifest("chat", NS, spec=quick_spec()))
            await wait_for(lambda: phase_of(kube, "chat") == "Canary", "the canary step", 15)
            canary = read(kube, "apps/v1", "Deployment", "chat-cpu")
            assert canary is not None
            listed = reads("list")
            # Each Deployment write holds the next cycle to a list until the watch shows it; two writes (the
            # stable's and the canary's) and a baseline of cycles an interval apart read mostly from the watch.
            assert listed <= 4, (listed, reads("watch"))
            assert reads("watch") > listed

            # A pod of the canary turns Ready: the cycles see it through the watch alone.
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "chat-cpu-0",
                    "namespace": NS,
                    "labels": canary["spec"]["template"]["metadata"]["labels"],
                },
                "spec": canary["spec"]["template"]["spec"],
            }
            await kube.emulator.create_object(pod)
            ready = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
            await kube.emulator.patch_object("v1", "Pod", NS, "chat-cpu-0", {"status": ready}, subresource="status")

            def canary_ready() -> bool:
                status = (read(kube, POLICY_API, KIND, "chat") or {}).get("status") or {}
                return bool((status.get("canary") or {}).get("ready") == 1)

            await wait_for(canary_ready, "the canary's Ready pod in the status", 10)
            assert reads("list") == listed
    finally:
        controller.workloads.stop()


class CursedController(Controller):
    """Fails with a bug, not an API error, for the policy named "cursed"."""

    async def reconcile(self, body: Mapping[str, Any] | bytes) -> Plan:
        if (unpacked_body(body) if isinstance(body, bytes) else body)["metadata"]["name"] == "cursed":
            raise RuntimeError("a bug that only this policy triggers")
        return await super().reconcile(body)


class CountingController(Controller):
    """Counts its cycles."""

    cycles = 0

    async def reconcile(self, body: Mapping[str, Any] | bytes) -> Plan:
        self.cycles += 1
        return await super().reconcile(body)


async def test_an_edited_spec_or_a_new_annotation_wakes_a_policy_at_once_and_its_own_status_writes_do_not(
    kube: EmulatedCluster,
) -> None:
    registry = kopf.OperatorRegistry()
    controller = CountingController(kube.gateway(), MeasurementHub(HealthyProvider(), gather_window=0.01))
    register(registry, controller)
    spec = quick_spec()
    spec["analysis"]["interval"] = spec["rollout"]["baselineDuration"] = "1h"  # nothing falls due on its own
    custom = kubernetes.client.CustomObjectsApi(kube.api_client)

    async def patch(body: dict[str, Any]) -> None:
        await kube.call(
            custom.patch_namespaced_custom_object, API_GROUP, API_VERSION, NS, PLURAL, "chat", body,
            _content_type="application/merge-patch+json",
        )  # fmt: skip

    def stable_replicas() -> int | None:
        return ((read(kube, "apps/v1", "Deployment", "chat-gpu-only") or {}).get("spec") or {}).get("replicas")

    async with running_kopf(kube, registry=registry):
        await kube.emulator.create_object(policy_manifest("chat", NS, spec=spec))
        await wait_for(lambda: phase_of(kube, "chat") == "Baseline", "the first cycle's status", 10)
        await asyncio.sleep(1.5)  # the watch events of its own writes (status, finalizer) have come and gone
        settled = controller.cycles
        await asyncio.sleep(1.5)
        assert controller.cycles == settled, "a status write woke the policy"

        await patch({"spec": {"replicas": 3}})
        await wait_for(lambda: stable_replicas() == 3, "the edited spec within seconds, not the hour", 10)

        edited = controller.cycles
        await patch({"metadata": {"annotations": {PAUSE: "1"}}})
        await wait_for(lambda: controller.cycles > edited, "a cycle for the new annotation", 10)


def test_kopfs_line_for_every_noticed_event_is_dropped_and_its_other_lines_are_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    configure_settings(kopf.OperatorSettings())
    objects = logging.getLogger("kopf.objects")
    with caplog.at_level(logging.INFO, logger="kopf.objects"):
        objects.info("Handler %r succeeded.", NOTICED)
        objects.info("Daemon 'policy_loop' succeeded.")
        objects.error("Handler %r failed with an exception. Will ignore.", NOTICED)
    assert [r.getMessage() for r in caplog.records] == [
        "Daemon 'policy_loop' succeeded.",
        "Handler 'noticed' failed with an exception. Will ignore.",
    ]


@LOOP_OWNERS
async def test_one_policy_that_breaks_the_controller_does_not_stop_the_others(
    kube: EmulatedCluster, own_loops: bool, caplog: pytest.LogCaptureFixture
) -> None:
    registry = kopf.OperatorRegistry()
    controller = CursedController(kube.gateway(), MeasurementHub(HealthyProvider(), gather_window=0.01))
    register(registry, controller, loop_settings=LoopSettings(error_backoff=0.05, max_backoff=0.2), own_loops=own_loops)

    async with running_kopf(kube, registry=registry) as kopf_thread:
        await kube.emulator.create_object(policy_manifest("cursed", NS, spec=quick_spec()))
        await kube.emulator.create_object(policy_manifest("chat", NS, spec=quick_spec()))

        await wait_for(lambda: phase_of(kube, "chat") == "Canary", "the healthy policy to reach its canary", 15)
        errors = controller.metrics.registry.get_sample_value("kvoffload_reconcile_errors_total")
        assert errors is not None
        assert errors >= 2  # the cursed one was retried with backoff, and is still being retried
        assert kopf_thread.is_alive()
        assert read(kube, "apps/v1", "Deployment", "cursed-gpu-only") is None
        # Whoever runs the loop, its errors are logged on the policy's own logger (kopf's, which also posts Events).
        assert any(
            r.name == "kopf.objects" and "reconcile failed" in r.getMessage() and r.k8s_ref["name"] == "cursed"  # type: ignore[attr-defined]
            for r in caplog.records
        )


async def test_api_errors_are_retried_until_the_deployment_is_written(kube: EmulatedCluster) -> None:
    registry = kopf.OperatorRegistry()
    settings = ControllerSettings(retry_delay_seconds=0.2)
    controller = Controller(kube.gateway(), MeasurementHub(HealthyProvider(), gather_window=0.01), settings)
    register(registry, controller)
    kube.emulator.fail_next(403, method="PATCH", plural="deployments", times=2, message="denied by a test webhook")

    async with running_kopf(kube, registry=registry):
        await kube.emulator.create_object(policy_manifest("chat", NS, spec=quick_spec()))

        await wait_for(lambda: read(kube, "apps/v1", "Deployment", "chat-gpu-only"), "the stable Deployment", 15)
        failed = controller.metrics.registry.get_sample_value(
            "kvoffload_api_errors_total", {"operation": "apply", "code": "403"}
        )
        assert failed == 2
        core = kubernetes.client.CoreV1Api(kube.api_client)
        warnings = [e for e in (await kube.call(core.list_namespaced_event, NS)).items if e.type == "Warning"]
        assert [e.reason for e in warnings] == ["Rejected"]  # one Event, its count raised on the repeat
        assert "denied by a test webhook" in warnings[0].message
        assert warnings[0].count == 2
        await wait_for(lambda: phase_of(kube, "chat") == "Baseline", "the status after the retry")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        return str(response.read().decode())


async def test_kvoffload_run_as_a_process_reconciles_policies_and_serves_its_metrics(kube: EmulatedCluster) -> None:
    port = free_port()
    # Nothing listens on port 9: Prometheus unreachable, so the baseline is Inconclusive and holds.
    spec = quick_spec(prometheus="http://127.0.0.1:9")
    async with kvoffload_run(
        kube, "-A", "--standalone", "--metrics-port", str(port), "--prometheus-allow-private"
    ) as process:
        await kube.emulator.create_object(policy_manifest("chat", NS, spec=spec))
        await kube.emulator.create_object(policy_manifest("broken", NS, spec=BROKEN_SPEC))

        await wait_for(lambda: read(kube, "apps/v1", "Deployment", "chat-gpu-only"), "the stable Deployment", 30)
        await wait_for(lambda: phase_of(kube, "chat") == "Baseline", "the baseline", 10)
        await wait_for(lambda: phase_of(kube, "broken") == "Invalid", "the broken policy to go Invalid", 10)

        async def verdicts_counted() -> bool:
            text = await asyncio.to_thread(scrape, port)
            return 'kvoffload_verdicts_total{verdict="Inconclusive"}' in text and (
                'kvoffload_verdicts_total{verdict="Inconclusive"} 0.0' not in text
            )

        await wait_for(verdicts_counted, "an Inconclusive verdict in the operator's metrics", 15)  # type: ignore[arg-type]
        metrics = await asyncio.to_thread(scrape, port)
        assert 'kvoffload_policies{phase="Baseline"} 1.0' in metrics
        assert 'kvoffload_policies{phase="Invalid"} 1.0' in metrics
        assert process.returncode is None  # still running

        def last_analysis() -> dict[str, Any]:
            return ((read(kube, POLICY_API, KIND, "chat") or {}).get("status") or {}).get("lastAnalysis") or {}

        last = await wait_for(last_analysis, "the verdict in the policy's status", 10)
        assert last["verdict"] == "Inconclusive"
        assert "Prometheus unreachable" in last["message"]


async def test_kvoffload_run_refuses_to_guess_its_namespaces(kube: EmulatedCluster) -> None:
    async with kvoffload_run(kube, "--standalone", "--metrics-port", "0") as process:
        assert await asyncio.wait_for(process.wait(), timeout=30) == 2
