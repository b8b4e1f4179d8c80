# ruff: noqa: F811  (the fixtures imported from test_controller are parameters of the tests by the same names)
"""The operator's per-policy metrics, read off its registry the way Prometheus scrapes them, while the real
Controller takes a policy through baseline, canary, a pause and an OOM rollback on the emulated API server.

The tier capacity it publishes is compared with what ``kvoffload plan`` prints for the same policy.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import re
import socket
from datetime import datetime
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import urllib3.exceptions
import yaml
from click.testing import CliRunner
from kubernetes.client.exceptions import ApiException
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvoffload import __version__
from kvoffload.analysis.hub import MeasurementHub
from kvoffload.api.conventions import PAUSE, Decision
from kvoffload.api.quantity import GIB
from kvoffload.api.status import Phase
from kvoffload.cli.main import main
from kvoffload.controller.apierrors import (
    ApiRejectedError,
    ApiUnavailableError,
    GatewayError,
    MissingObjectError,
    NotOwnedError,
)
from kvoffload.controller.cycle import ReconcileError
from kvoffload.controller.gateway import KubernetesGateway, RetryPolicy
from kvoffload.controller.metrics import (
    API_OPERATIONS,
    TARGET_LABELS,
    OperatorMetrics,
    PolicySeries,
    VariantSeries,
    api_error_code,
    build_info,
)
from kvoffload.controller.reconcile import Controller
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.loading import parse_policy
from kvoffload.policy.startup import progress_deadline_seconds
from tests.controller.test_controller import (  # the fixtures, and how those tests play the cluster
    NS,
    Clock,
    CraftedProvider,
    chat_spec,
    clock,  # noqa: F401
    controller,  # noqa: F401
    create_policy,
    deployment,
    in_canary,  # noqa: F401
    policy_body,
    provider,  # noqa: F401
    reconcile_until,
    run_pods,
    status_of,
)
from tests.support import paths
from tests.support.kube import EmulatedCluster, policy_manifest

pytestmark = pytest.mark.e2e

Labels = dict[str, str]


def samples(metrics: OperatorMetrics, name: str, **match: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of one family as Prometheus would scrape them: {sorted labels: value}, filtered by ``match``."""
    text = generate_latest(metrics.registry).decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and match.items() <= sample.labels.items():
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def by(metrics: OperatorMetrics, name: str, key: str, **match: str) -> dict[str, float]:
    """One family's values keyed by one label, for the policy ``chat``."""
    return {dict(labels)[key]: value for labels, value in samples(metrics, name, policy="chat", **match).items()}


def tiered_spec() -> dict[str, Any]:
    """chat_spec with a CPU pilot and an NVMe tier: ladder gpu-only -> cpu-pilot -> cpu -> nvme."""
    spec = chat_spec()
    spec["rollout"]["pilotCpu"] = "512Mi"
    spec["offload"]["secondaryTiers"] = [
        {"name": "nvme", "size": "16Gi", "path": "/mnt/kv", "volume": {"emptyDir": {"sizeLimit": "17Gi"}}}
    ]
    return spec


def plan_of(tmp_path: Path, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """`kvoffload plan FILE -o json` of the policy as it stands in the cluster."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(policy_manifest(name, NS, spec=spec)))
    result = CliRunner().invoke(main, ["plan", str(path), "-o", "json"])
    assert result.exit_code == 0, result.output
    plan: dict[str, Any] = json.loads(result.stdout)
    return plan


async def test_the_capacity_metric_gives_each_tier_of_each_level_the_tokens_kvoffload_plan_gives(
    kube: EmulatedCluster, controller: Controller, tmp_path: Path
) -> None:
    spec = tiered_spec()
    await create_policy(kube, spec=spec)

    await controller.reconcile(policy_body(kube))

    published = samples(controller.metrics, "kvoffload_tier_capacity_tokens", policy="chat")
    expected = {}
    for level in plan_of(tmp_path, "chat", spec)["levels"]:
        tiers = {"cpu": level["cpuTokens"]} if level["cpuTokens"] is not None else {}
        tiers |= {t["name"]: t["tokens"] for t in level["secondaryTiers"]}
        for tier, tokens in tiers.items():
            labels = {"policy_namespace": NS, "policy": "chat", "level": level["name"], "tier": tier}
            expected[tuple(sorted(labels.items()))] = float(tokens)
    assert published == expected
    # 114,688 B per Qwen3-0.6B token: the pilot's 512Mi, the 1Gi CPU tier, the 16Gi NVMe tier.
    assert sorted(published.values()) == [4681.0, 9362.0, 9362.0, 149796.0]
    assert 16 * GIB // 114_688 == 149_796


async def test_a_baseline_shows_its_phase_its_level_and_when_it_should_be_over(
    kube: EmulatedCluster, controller: Controller, clock: Clock
) -> None:
    await create_policy(kube)

    await controller.reconcile(policy_body(kube))

    metrics = controller.metrics
    phases = by(metrics, "kvoffload_policy_phase", "phase")
    assert phases == {p.value: 1.0 if p is Phase.BASELINE else 0.0 for p in Phase}
    assert by(metrics, "kvoffload_policy_condition", "condition", reason="BaselineRunning") == {"Progressing": 1.0}
    assert by(metrics, "kvoffload_policy_condition", "condition", condition="Degraded") == {"Degraded": 0.0}
    assert by(metrics, "kvoffload_variant_info", "variant") == {"stable": 1.0}
    assert by(metrics, "kvoffload_variant_info", "level") == {"gpu-only": 1.0}
    assert by(metrics, "kvoffload_variant_pinned_memory_bytes", "variant") == {"stable": 0.0}  # GPU-only: no pool
    started = datetime.fromisoformat(status_of(kube)["stage"]["startedAt"].replace("Z", "+00:00"))
    assert started == clock.now
    (deadline,) = samples(metrics, "kvoffload_policy_stage_deadline_timestamp_seconds", policy="chat").values()
    # 10 s baselineDuration + the GPU-only level's progress deadline (60 s, stretched to the startup budget)
    policy = parse_policy(policy_manifest("chat", NS, spec=chat_spec()), "chat")
    budget = 10 + progress_deadline_seconds(policy.spec, build_ladder(policy.spec)[0])
    assert deadline == pytest.approx(clock.now.timestamp() + budget)
    assert "NewLadder" in by(metrics, "kvoffload_policy_last_decision_timestamp_seconds", "decision")


async def test_a_canary_adds_its_level_and_pinned_pool_and_the_deadline_moves_to_its_step(
    kube: EmulatedCluster, controller: Controller, clock: Clock, in_canary: dict[str, Any]
) -> None:
    metrics = controller.metrics
    assert by(metrics, "kvoffload_policy_phase", "phase", phase="Canary") == {"Canary": 1.0}
    assert set(samples(metrics, "kvoffload_variant_info", policy="chat")) == {
        (("level", "gpu-only"), ("policy", "chat"), ("policy_namespace", NS), ("variant", "stable")),
        (("level", "cpu"), ("policy", "chat"), ("policy_namespace", NS), ("variant", "canary")),
    }
    # One canary replica with the 1Gi CPU tier (overhead factor 1.0): its pool, as status.hostMemory says.
    status = status_of(kube)
    assert status["hostMemory"]["pinned"] == "1Gi"
    assert by(metrics, "kvoffload_variant_pinned_memory_bytes", "variant") == {"stable": 0.0, "canary": float(GIB)}
    (deadline,) = samples(metrics, "kvoffload_policy_stage_deadline_timestamp_seconds", policy="chat").values()
    assert deadline > clock.now.timestamp() + 20  # stepDuration 20s, plus the cpu level's progress deadline
    # The baseline ended now, and led to the cpu stage (status.history names the stage a decision led to).
    assert by(metrics, "kvoffload_policy_last_decision_timestamp_seconds", "stage", decision="BaselineTaken") == {
        "cpu": clock.now.timestamp()
    }
    history = status["history"]
    assert set(by(metrics, "kvoffload_policy_last_decision_timestamp_seconds", "decision")) == {
        e["decision"] for e in history
    }


async def test_a_paused_step_has_no_deadline_of_its_own(
    kube: EmulatedCluster, controller: Controller, clock: Clock, in_canary: dict[str, Any]
) -> None:
    await kube.emulator.patch_object(
        "kvoffload.io/v1alpha1", "KVOffloadPolicy", NS, "chat", {"metadata": {"annotations": {PAUSE: "ops"}}}
    )
    clock.advance(1)

    await controller.reconcile(policy_body(kube))

    metrics = controller.metrics
    assert by(metrics, "kvoffload_policy_phase", "phase", phase="Paused") == {"Paused": 1.0}
    assert by(metrics, "kvoffload_policy_condition", "reason", condition="Paused") == {"Paused": 1.0}
    assert samples(metrics, "kvoffload_policy_stage_deadline_timestamp_seconds", policy="chat") == {}


async def test_a_step_awaiting_kvoffload_io_promote_has_no_deadline_either(
    kube: EmulatedCluster, controller: Controller, clock: Clock
) -> None:
    spec = chat_spec()
    spec["rollout"]["autoPromote"] = False
    await create_policy(kube, spec=spec)
    await controller.reconcile(policy_body(kube))
    await run_pods(kube, "chat-gpu-only", 4)
    await reconcile_until(controller, kube, clock, lambda: deployment(kube, "chat-cpu") is not None)
    await run_pods(kube, "chat-cpu", 1)

    def awaiting() -> bool:
        progressing = [c for c in status_of(kube).get("conditions", []) if c["type"] == "Progressing"]
        return bool(progressing) and progressing[0]["reason"] == "AwaitingPromotion"

    await reconcile_until(controller, kube, clock, awaiting)

    assert samples(controller.metrics, "kvoffload_policy_stage_deadline_timestamp_seconds", policy="chat") == {}
    assert by(controller.metrics, "kvoffload_policy_condition", "reason", condition="Progressing") == {
        "AwaitingPromotion": 1.0
    }


async def test_an_oom_killed_canary_shows_as_degraded_for_that_reason_and_its_series_go(
    kube: EmulatedCluster, controller: Controller, clock: Clock, in_canary: dict[str, Any]
) -> None:
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

    metrics = controller.metrics
    assert by(metrics, "kvoffload_policy_phase", "phase", phase="RolledBack") == {"RolledBack": 1.0}
    degraded = samples(metrics, "kvoffload_policy_condition", policy="chat", condition="Degraded")
    assert degraded == {
        (("condition", "Degraded"), ("policy", "chat"), ("policy_namespace", NS), ("reason", "CanaryOOMKilled")): 1.0
    }  # one series per condition: the AsExpected one is gone, not left at 0 beside it
    assert by(metrics, "kvoffload_variant_info", "variant") == {"stable": 1.0}
    assert samples(metrics, "kvoffload_policy_stage_deadline_timestamp_seconds", policy="chat") == {}
    # Rolled back to where the stable fleet stayed.
    assert by(metrics, "kvoffload_policy_last_decision_timestamp_seconds", "stage", decision="Rollback") == {
        "gpu-only": clock.now.timestamp()
    }


async def test_an_invalid_spec_publishes_its_phase_but_nothing_sized(
    kube: EmulatedCluster, controller: Controller
) -> None:
    spec = chat_spec()
    spec["gpu"]["class"] = "nvidia-b999"
    await create_policy(kube, spec=spec)

    await controller.reconcile(policy_body(kube))

    metrics = controller.metrics
    assert by(metrics, "kvoffload_policy_phase", "phase", phase="Invalid") == {"Invalid": 1.0}
    assert by(metrics, "kvoffload_policy_condition", "condition", condition="Invalid") == {"Invalid": 1.0}
    for family in ("kvoffload_tier_capacity_tokens", "kvoffload_variant_info"):
        assert samples(metrics, family, policy="chat") == {}


async def test_a_forgotten_policy_leaves_no_series_behind(
    kube: EmulatedCluster, controller: Controller, tmp_path: Path
) -> None:
    await create_policy(kube, spec=tiered_spec())
    await create_policy(kube, name="other")
    await controller.reconcile(policy_body(kube))
    await controller.reconcile(policy_body(kube, "other"))

    controller.forget(policy_body(kube)["metadata"]["uid"])

    text = generate_latest(controller.metrics.registry).decode()
    assert 'policy="chat"' not in text
    assert 'policy="other"' in text
    assert 'kvoffload_policies{phase="Baseline"} 1.0' in text


def test_the_policies_per_phase_follow_every_move_and_forget() -> None:
    metrics = OperatorMetrics()

    def counts() -> dict[str, float]:
        return {
            phase.value: metrics.registry.get_sample_value("kvoffload_policies", {"phase": phase.value}) or 0.0
            for phase in Phase
        }

    metrics.publish_policy("a", PolicySeries("ns", "a", Phase.BASELINE.value))
    metrics.publish_policy("b", PolicySeries("ns", "b", Phase.BASELINE.value))
    metrics.publish_policy("a", PolicySeries("ns", "a", Phase.BASELINE.value))  # the same again counts once
    assert counts()[Phase.BASELINE.value] == 2
    metrics.publish_policy("a", PolicySeries("ns", "a", Phase.STABLE.value))
    metrics.set_phase("c", Phase.INVALID.value)
    metrics.forget_policy("b")
    metrics.forget_policy("never-seen")
    expected = {phase.value: 0.0 for phase in Phase} | {Phase.STABLE.value: 1.0, Phase.INVALID.value: 1.0}
    assert counts() == expected


def test_the_families_are_described_even_before_any_policy() -> None:
    text = generate_latest(OperatorMetrics().registry).decode()
    for family in (
        "kvoffload_policy_phase",
        "kvoffload_policy_condition",
        "kvoffload_policy_stage_deadline_timestamp_seconds",
        "kvoffload_policy_last_decision_timestamp_seconds",
        "kvoffload_variant_info",
        "kvoffload_variant_pinned_memory_bytes",
        "kvoffload_tier_capacity_tokens",
    ):
        assert f"# TYPE {family} gauge" in text


def test_no_series_carries_a_label_prometheus_sets_on_the_target() -> None:
    # Scraped without honorLabels (a Prometheus with overrideHonorLabels), such a label would become exported_*.
    metrics = OperatorMetrics()
    metrics.publish_policy(
        "uid-chat",
        PolicySeries(
            NS,
            "chat",
            Phase.CANARY.value,
            conditions=(("Degraded", "AsExpected", False),),
            stage_deadline=1.0,
            last_decisions=(("Promoted", "cpu", 1.0),),
            variants=(VariantSeries("canary", "cpu", 1, GIB),),
            tier_capacity=(("cpu", "cpu", 9362),),
        ),
    )
    metrics.count_decisions(["Promoted"])
    metrics.count_api_error("patch_status", ApiRejectedError("patch the status: 422 invalid", 422))
    metrics.workload_reads.labels(source="watch").inc()
    metrics.cycle_seconds.observe(0.1)
    text = generate_latest(metrics.registry).decode()
    families = list(text_string_to_metric_families(text))
    labels = {label for family in families for sample in family.samples for label in sample.labels}
    assert {"policy_namespace", "policy", "variant", "tier", "operation", "code"} <= labels  # every family had samples
    assert labels.isdisjoint(TARGET_LABELS), labels & TARGET_LABELS
    (deadline,) = [f for f in families if f.name == "kvoffload_policy_stage_deadline_timestamp_seconds"]
    assert [s.labels for s in deadline.samples] == [{"policy_namespace": NS, "policy": "chat"}]


def test_every_api_operation_and_every_decision_has_its_count_from_the_start() -> None:
    # A dashboard's rate of API errors then reads 0 on a healthy operator instead of "no data", and increase()
    # counts a process's first Rollback (a counter first seen at 1 would count from there).
    # Every module of the controller: the cycle's API calls live in several (reconcile, children, statuswrite, ...).
    modules = sorted((paths.PACKAGE / "controller").glob("*.py"))
    calling = [path.name for path in modules if "self._api(" in path.read_text()]
    assert {"reconcile.py", "children.py"} <= set(calling)  # the search reaches the modules that call the gateway
    source = "\n".join(path.read_text() for path in modules)
    named = set(re.findall(r'_api\(\s*"(\w+)"', source)) | set(re.findall(r'count_api_error[(,]\s*"(\w+)"', source))
    assert named == set(API_OPERATIONS)
    registry = OperatorMetrics().registry
    for operation in API_OPERATIONS:  # under code "none", so that a sum by operation has every one
        assert registry.get_sample_value("kvoffload_api_errors_total", {"operation": operation, "code": "none"}) == 0.0
    for decision in Decision:
        assert registry.get_sample_value("kvoffload_decisions_total", {"decision": decision.value}) == 0.0


# --- the code of an API error, and what the build says ----------------------------------------------------------


def _raised(error: GatewayError, cause: BaseException | None) -> GatewayError:
    """``error`` as the gateway raises it: ``raise error from cause``."""
    try:
        raise error from cause
    except GatewayError as exc:
        return exc


@pytest.mark.parametrize(
    ("error", "code"),
    [
        pytest.param(ApiRejectedError("apply Deployment llm/chat-cpu: 403 forbidden", 403), "403", id="rejected"),
        pytest.param(
            _raised(ApiUnavailableError("gave up after 6 attempts"), ApiException(status=503)), "503", id="5xx"
        ),
        pytest.param(
            _raised(ApiUnavailableError("gave up after 6 attempts"), ApiException(status=409)), "409", id="conflict"
        ),
        pytest.param(
            _raised(
                ApiUnavailableError("gave up after 6 attempts"),
                urllib3.exceptions.MaxRetryError(None, "/apis", urllib3.exceptions.NewConnectionError(None, "refused")),
            ),
            "none",
            id="no-connection",
        ),
        pytest.param(
            _raised(
                ApiUnavailableError("gave up"), urllib3.exceptions.ReadTimeoutError(None, "/apis", "read timed out")
            ),
            "none",
            id="timeout",
        ),
        pytest.param(MissingObjectError("ConfigMap llm/model-config not found"), "404", id="missing"),
        pytest.param(MissingObjectError("ConfigMap llm/model-config has no key 'config.json'"), "404", id="no-key"),
        pytest.param(NotOwnedError("Deployment llm/chat-cpu already exists and is owned by X"), "refused", id="theirs"),
    ],
)
def test_an_api_error_is_counted_under_the_status_the_api_server_answered(error: GatewayError, code: str) -> None:
    assert api_error_code(error) == code


async def test_a_refusal_of_the_real_gateway_is_counted_with_its_status(
    kube: EmulatedCluster, controller: Controller
) -> None:
    kube.emulator.fail_next(403, method="PATCH", plural="deployments", times=10, message="denied by a test webhook")
    await create_policy(kube)
    with pytest.raises(ReconcileError):
        await controller.reconcile(policy_body(kube))
    errors = samples(controller.metrics, "kvoffload_api_errors_total", operation="apply")
    assert errors == {(("code", "403"), ("operation", "apply")): 1.0, (("code", "none"), ("operation", "apply")): 0.0}


async def test_an_api_server_that_does_not_answer_is_counted_as_none(kube: EmulatedCluster, clock: Clock) -> None:
    await create_policy(kube)
    body = policy_body(kube)
    with socket.socket() as held:  # a port bound and never listened on: every connection is refused
        held.bind(("127.0.0.1", 0))
        configuration = kubernetes.client.Configuration()
        configuration.host = f"http://127.0.0.1:{held.getsockname()[1]}"
        with kubernetes.client.ApiClient(configuration) as client:
            gateway = KubernetesGateway(client, retry=RetryPolicy(attempts=2, base_delay=0.01))
            offline = Controller(gateway, MeasurementHub(CraftedProvider(), gather_window=0.0), clock=clock)
            with pytest.raises(ReconcileError, match="gave up after 2 attempts"):
                await offline.reconcile(body)
    failed = {dict(k)["operation"]: v for k, v in samples(offline.metrics, "kvoffload_api_errors_total").items() if v}
    assert failed, "no API error was counted"
    assert set(samples(offline.metrics, "kvoffload_api_errors_total")) == {
        (("code", "none"), ("operation", operation)) for operation in API_OPERATIONS
    }  # every failure counted under "none", no other code


def test_build_info_names_the_version_python_and_kopf_at_1() -> None:
    metrics = OperatorMetrics()
    (family,) = [f for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
                 if f.name == "kvoffload_build_info"]  # fmt: skip
    (sample,) = family.samples
    assert sample.value == 1
    assert sample.labels == {
        "version": __version__,
        "commit": "unknown",  # an editable install from a directory records no commit
        "python": platform.python_version(),
        "kopf": importlib.metadata.version("kopf"),
    }
    assert sample.labels["version"] == main_version()


def main_version() -> str:
    """What ``kvoffload --version`` prints, for build_info to agree with."""
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0, result.output
    return result.output.split()[-1]


def test_build_info_reads_the_commit_pip_recorded_for_a_vcs_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A dist-info as pip writes it for `pip install git+https://...@<commit>` (PEP 610).
    commit = "1223a47c0ffee00000000000000000000000beef"
    info = tmp_path / "kvoffload_vcs-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvoffload-vcs\nVersion: 0.1.0\n")
    direct_url = {"url": "https://example.com/kvoffload.git", "vcs_info": {"vcs": "git", "commit_id": commit}}
    (info / "direct_url.json").write_text(json.dumps(direct_url))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert build_info("kvoffload-vcs")["commit"] == commit
    (info / "direct_url.json").write_text(json.dumps({"url": "file:///src", "dir_info": {}}))
    assert build_info("kvoffload-vcs")["commit"] == "unknown"
    (info / "direct_url.json").write_text("not json")
    assert build_info("kvoffload-vcs")["commit"] == "unknown"
