"""Manual control through annotations: `kvoffload promote|abort|retry|pause|resume` against the emulated API.

The command runs for real (click, the kubernetes client, a kubeconfig) against the
emulated API server; `rollout.decide` plays the operator's part, so each test shows
that a new annotation value is acted on once, and only once.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from kvoffload.api.conventions import PROMOTE, RELEASE
from kvoffload.api.status import KVOffloadPolicyStatus, Phase
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.cli.control import VERBS, new_annotation_value
from kvoffload.cli.main import main
from kvoffload.policy.sized import size_policy
from kvoffload.rollout.decide import decide
from kvoffload.rollout.observations import Observations, VariantObservation
from tests.support import paths
from tests.support.kube import EmulatedCluster

EXAMPLE = paths.EXAMPLES / "demo-two-tier.yaml"
T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def demo_policy() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return doc


async def kvoffload(kube: EmulatedCluster, *args: str) -> Result:
    """Run the CLI in a worker thread: its blocking client must not stall the emulator's loop."""
    runner = CliRunner()
    return await asyncio.to_thread(runner.invoke, main, [*args, "--kubeconfig", str(kube.kubeconfig)])


class Operator:
    """`decide` applied the way the handler applies it: read the object, decide, write the status."""

    def __init__(self, kube: EmulatedCluster, name: str) -> None:
        self.kube, self.name = kube, name

    def stored(self) -> dict[str, Any]:
        found = self.kube.emulator.read_object("kvoffload.io/v1alpha1", "KVOffloadPolicy", "default", self.name)
        assert found is not None
        return found

    async def cycle(self, now: datetime) -> KVOffloadPolicyStatus:
        obj = self.stored()
        policy = KVOffloadPolicy.model_validate({k: v for k, v in obj.items() if k != "status"})
        status = KVOffloadPolicyStatus.model_validate(obj["status"]) if obj.get("status") else None
        ready = VariantObservation(exists=True, config_hash=None, desired_replicas=0, ready_replicas=0)
        plan = decide(
            policy.spec,
            status,
            Observations(
                generation=obj["metadata"].get("generation"),
                sized=size_policy(policy),
                annotations=obj["metadata"].get("annotations") or {},
                stable=ready,
                canary=ready,
            ),
            now,
        )
        body = plan.status.model_dump(mode="json", by_alias=True)
        await self.kube.call(
            self.kube.api_client.call_api,
            *self.kube.api_client.param_serialize(
                method="PATCH",
                resource_path=f"/apis/kvoffload.io/v1alpha1/namespaces/default/kvoffloadpolicies/{self.name}/status",
                header_params={"Content-Type": "application/merge-patch+json", "Accept": "application/json"},
                body={"status": body},
            ),
        )
        return plan.status


@pytest.fixture
async def operator(kube: EmulatedCluster) -> Operator:
    await kube.emulator.create_object(demo_policy())
    op = Operator(kube, "demo")
    status = await op.cycle(T0)
    assert status.phase is Phase.BASELINE
    return op


async def test_promote_sets_a_new_annotation_value_each_call_and_decide_acts_on_each_once(
    kube: EmulatedCluster, operator: Operator
) -> None:
    result = await kvoffload(kube, "promote", "demo", "-n", "default")
    assert result.exit_code == 0, result.output
    assert "promote" in result.output
    assert "next cycle" in result.output
    first = operator.stored()["metadata"]["annotations"][PROMOTE]
    assert first in result.output

    # The operator's next cycle cuts the baseline short: the first canary starts.
    status = await operator.cycle(T0 + timedelta(seconds=2))
    assert status.phase is Phase.CANARY
    assert status.canary is not None
    assert status.stage is not None
    assert status.history[-1].reason == "ManualPromote"
    assert status.annotations_seen[PROMOTE] == first
    canary_stage = (status.stage.index, status.stage.step)

    # The same value again is not a new request: nothing moves.
    status = await operator.cycle(T0 + timedelta(seconds=3))
    assert status.stage is not None
    assert (status.stage.index, status.stage.step) == canary_stage
    assert [h.reason for h in status.history].count("ManualPromote") == 1

    # A second `promote` writes a different value, which is acted on once more.
    result = await kvoffload(kube, "promote", "demo")
    assert result.exit_code == 0, result.output
    second = operator.stored()["metadata"]["annotations"][PROMOTE]
    assert second != first
    status = await operator.cycle(T0 + timedelta(seconds=4))
    assert status.stage is not None
    assert (status.stage.index, status.stage.step) != canary_stage
    assert [h.reason for h in status.history].count("ManualPromote") == 2


async def test_pause_then_resume_through_the_command_line(kube: EmulatedCluster, operator: Operator) -> None:
    assert (await kvoffload(kube, "pause", "demo")).exit_code == 0
    status = await operator.cycle(T0 + timedelta(seconds=1))
    assert status.phase is Phase.PAUSED

    assert (await kvoffload(kube, "resume", "demo")).exit_code == 0
    status = await operator.cycle(T0 + timedelta(seconds=2))
    assert status.phase is Phase.BASELINE
    assert [h.decision for h in status.history][-2:] == ["Pause", "Resume"]


async def test_abort_during_the_baseline_halts_the_ladder_and_retry_starts_it_again(
    kube: EmulatedCluster, operator: Operator
) -> None:
    assert (await kvoffload(kube, "abort", "demo")).exit_code == 0
    status = await operator.cycle(T0 + timedelta(seconds=1))
    assert status.phase is Phase.ROLLED_BACK

    assert (await kvoffload(kube, "retry", "demo")).exit_code == 0
    status = await operator.cycle(T0 + timedelta(seconds=2))
    assert status.phase is Phase.BASELINE
    assert status.history[-1].reason == "Retry"


async def test_every_verb_writes_only_its_own_annotation(kube: EmulatedCluster, operator: Operator) -> None:
    before = operator.stored()
    for verb in VERBS:
        assert (await kvoffload(kube, verb, "demo")).exit_code == 0
    after = operator.stored()
    assert set(after["metadata"]["annotations"]) - set(before["metadata"].get("annotations") or {}) == set(
        VERBS.values()
    )
    assert after["spec"] == before["spec"]  # GitOps owns spec
    assert after["metadata"]["generation"] == before["metadata"]["generation"]


@pytest.mark.parametrize("verb", [*VERBS, "status"])
async def test_a_missing_policy_is_a_clear_error_without_a_traceback(kube: EmulatedCluster, verb: str) -> None:
    result = await kvoffload(kube, verb, "nope", "-n", "llm")
    assert result.exit_code == 1
    assert "no KVOffloadPolicy 'nope' in namespace 'llm'" in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)


async def test_an_unreachable_api_server_is_a_clear_error(tmp_path: Path) -> None:
    from kvoffload_lab.cluster.kubeemu import write_kubeconfig

    kubeconfig = write_kubeconfig("http://127.0.0.1:9", tmp_path / "kubeconfig")  # discard port: refused
    result = await asyncio.to_thread(CliRunner().invoke, main, ["pause", "demo", "--kubeconfig", str(kubeconfig)])
    assert result.exit_code == 1
    assert "cannot reach the API server" in result.output
    assert isinstance(result.exception, SystemExit)


async def test_status_reads_the_policy_from_the_api_as_a_table_and_as_json(
    kube: EmulatedCluster, operator: Operator
) -> None:
    import json

    table = await kvoffload(kube, "status", "demo")
    assert table.exit_code == 0, table.output
    assert table.output.startswith("default/demo  phase Baseline")
    assert "Ladder: [gpu-only baseline] → cpu-pilot → cpu → nvme" in table.output

    as_json = await kvoffload(kube, "status", "demo", "-o", "json")
    assert as_json.exit_code == 0, as_json.output
    doc = json.loads(as_json.output)
    assert (doc["name"], doc["namespace"]) == ("demo", "default")
    assert doc["status"]["phase"] == "Baseline"
    assert doc["status"]["ladder"] == ["gpu-only", "cpu-pilot", "cpu", "nvme"]


@pytest.mark.parametrize(
    ("previous", "expected"),
    [
        (None, "2025-06-01T12:00:00.000000Z"),
        ("2025-05-31T09:00:00.000000Z", "2025-06-01T12:00:00.000000Z"),
        ("2025-06-01T12:00:00.000000Z", "2025-06-01T12:00:00.000000Z#2"),
        ("2025-06-01T12:00:00.000000Z#2", "2025-06-01T12:00:00.000000Z#3"),
    ],
)
def test_a_new_annotation_value_never_equals_the_previous_one(previous: str | None, expected: str) -> None:
    assert new_annotation_value(previous, T0) == expected


@pytest.mark.parametrize("value", ["prom-token", "/prom-token", "kvoffload/", "a/b/c"])
def test_run_refuses_an_operator_token_secret_that_is_not_namespace_slash_name(value: str) -> None:
    result = CliRunner().invoke(main, ["run", "-A", "--prometheus-token-secret", value])

    assert result.exit_code == 2
    assert "--prometheus-token-secret must be NAMESPACE/NAME" in result.output


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--prometheus-token-secret", "kvoffload/prom"], "an operator token needs --prometheus-url or"),
        (["--allowed-host-path", "/"], "--allowed-host-path '/': give an absolute node path below /"),
        (["--allowed-host-path", "/mnt/../etc"], "without '..'"),
        (["--prometheus-allowed-url", "prometheus:9090"], "must be http:// or https:// with a host"),
    ],
    ids=["token-anywhere", "host-root", "host-dotdot", "url-without-scheme"],
)
def test_run_refuses_admin_leave_that_would_be_unsafe(args: list[str], complaint: str) -> None:
    result = CliRunner().invoke(main, ["run", "-A", *args])

    assert result.exit_code == 2
    assert complaint in result.output


async def test_abort_release_writes_only_the_release_annotation(kube: EmulatedCluster, operator: Operator) -> None:
    before = operator.stored()
    result = await kvoffload(kube, "abort", "demo", "--release")
    assert result.exit_code == 0, result.output
    assert f"({RELEASE}=" in result.output
    assert "hand the Deployment back" in result.output
    after = operator.stored()
    added = set(after["metadata"]["annotations"]) - set(before["metadata"].get("annotations") or {})
    assert added == {RELEASE}  # not kvoffload.io/abort: the ladder is not rolled back, the Deployment is handed back
    assert after["spec"] == before["spec"]
