"""End to end, no fault injected: a CPU tier that makes TTFT worse on its own is rolled back (issue 11, part 3).

The engines are priced as the L40S (estimated profile, PCIe Gen4) serving Qwen3-0.6B, whose eager prefill is
launch-bound: a restored request still pays nearly a whole forward for its tail, plus its load and the step the
load lands in, while it holds its GPU blocks; slower requests overlap, and the decode steps then share their steps
with prefills. In virtual time at this load (10 requests/s an engine, 48 GPU blocks) the scheduler puts p99 TTFT at
54 ms without the tier and 82 ms with it, p99 ITL at 14 and 68 ms. The operator takes the tier away. Nothing is
injected: ``/emulator/faults`` stays untouched on every engine (checked).
"""

from __future__ import annotations

import json

import aiohttp
import pytest

from kvoffload.lab.cluster.localcluster import LocalCluster
from tests.lab.test_e2e import KIND, in_phase, level_index, policy_doc
from tests.support.cluster import POLICY_API_VERSION, OperatorProcess, eventually, load_on

pytestmark = [pytest.mark.e2e, pytest.mark.prometheus, pytest.mark.timeout(240)]

SLOW_LINK_CLASS = "nvidia-l40s"


@pytest.fixture
def cluster_engine_args() -> list[str]:
    """48 GPU blocks (about two prompts of the reuse trace) and the L40S's prices on every engine."""
    return ["--gpu-kv-blocks", "48", "--gpu-class", SLOW_LINK_CLASS]


def cpu_only(doc: dict[str, object]) -> dict[str, object]:
    spec = doc["spec"]
    assert isinstance(spec, dict)
    spec["offload"] = {"backend": "native", "cpu": "256Mi"}
    spec["gpu"] = {"class": SLOW_LINK_CLASS, "count": 1}
    spec["analysis"]["maxRegression"] = 1.5
    return doc


async def faults_of(cluster: LocalCluster) -> list[dict[str, object]]:
    out = []
    async with aiohttp.ClientSession() as session:
        for engine in cluster.pods("kvoffload.io/policy=chat"):
            try:
                async with session.get(f"{engine.url}/emulator/faults") as response:
                    out.append(json.loads(await response.text()))
            except aiohttp.ClientError:
                continue  # an engine on its way out (the canary just removed)
    return out


async def test_a_cpu_tier_that_slows_a_launch_bound_model_on_a_slow_link_is_rolled_back_with_no_fault(
    local_cluster: LocalCluster, operator: OperatorProcess
) -> None:
    doc = cpu_only(policy_doc("chat", local_cluster))
    await local_cluster.apply(doc)

    async with load_on(local_cluster, "chat"):
        status = await eventually(
            lambda: in_phase(local_cluster, "chat", "RolledBack", "Stable"), "RolledBack or Stable", 150
        )
        faults = await faults_of(local_cluster)

    assert status["phase"] == "RolledBack", status.get("message")
    last = status["history"][-1]
    assert last["decision"] == "Rollback"
    assert "ttft" in last["message"].lower(), last["message"]
    assert status["stable"]["level"] == level_index(doc, "gpu-only")
    untouched = {"added_latency": 0.0, "ttft_multiplier": 1.0, "itl_multiplier": 1.0, "in_outage": False}
    assert faults
    assert all(all(f[k] == v for k, v in untouched.items()) for f in faults), faults
    current = local_cluster.get(POLICY_API_VERSION, KIND, "default", "chat")
    assert current is not None
    assert current["spec"] == doc["spec"]
