"""End to end on kube-apiserver: an SGLang policy (``spec.engine: sglang``) climbs its ladder to Stable, and rolls
back its newest tier on a TTFT breach (issue 25, item 7).

The climb of ``tests/lab/test_e2e.py`` (analysis every 1 s, 6 s window, 4 s sustainedFor), with the operator,
Prometheus and the load generator running for real. Each engine pod runs the rendered ``sglang.launch_server``
command line, translated into the emulator, which speaks SGLang 0.5.23's series (``sglang:`` families, cached tokens
by ``cache_source``): the operator reads them through the SGLang dialect. SGLang's HiCache takes whole gigabytes
(10^9 bytes) per TP rank, so the CPU tier is 1G.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kvoffload_lab.demo import SGLANG_IMAGE
from tests.lab.test_e2e import canary_on, decisions, deployment, events_of, in_phase, level_hash, policy_doc
from tests.support.cluster import Cluster, OperatorProcess, either_cluster, eventually, load_on

pytestmark = [pytest.mark.e2e, pytest.mark.prometheus, pytest.mark.kube, pytest.mark.timeout(240)]

CPU_CANARY = "kvoffload.io/level=cpu"  # cpu engines are the canary until cpu is promoted


@pytest_asyncio.fixture
async def local_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, cluster_engine_args: list[str]
) -> AsyncIterator[Cluster]:
    async with either_cluster("kube", request, tmp_path / "cluster", cluster_engine_args) as cluster:
        yield cluster


def sglang_doc(name: str, cluster: Cluster) -> dict[str, Any]:
    """The e2e policy on SGLang: gpu-only, then a 1 GB HiCache pool."""
    doc = policy_doc(name, cluster)
    spec = doc["spec"]
    spec["engine"] = "sglang"
    spec["model"]["image"] = SGLANG_IMAGE
    spec["offload"] = {"cpu": "1G"}
    return doc


def sglang_container(cluster: Cluster, name: str) -> dict[str, Any]:
    found = deployment(cluster, name)
    assert found is not None
    (container,) = found["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


async def test_an_sglang_policy_climbs_to_a_hicache_level_and_ends_stable(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    doc = sglang_doc("hicache", local_cluster)
    await local_cluster.apply(doc)

    async with load_on(local_cluster, "hicache"):
        status = await eventually(
            lambda: in_phase(local_cluster, "hicache", "Stable", "RolledBack", "Paused"), "Stable", 150
        )

    assert status["phase"] == "Stable", status.get("message")
    assert status["ladder"] == ["gpu-only", "cpu"]
    assert status["stable"]["configHash"] == level_hash(doc, "cpu")
    assert decisions(local_cluster, "hicache") == ["NewLadder", "BaselineTaken", "Promoted", "LevelPromoted"]
    # Promoted past the offload-share gate (minExternalShare 2%), which reads SGLang's
    # sglang:cached_tokens_total{cache_source="host"}; the last analysis still shows those hits.
    hits = next(m for m in status["lastAnalysis"]["metrics"] if m["name"] == "tierHits.host")
    assert max(hits.get("canary") or 0.0, hits.get("stable") or 0.0) > 0, hits
    container = sglang_container(local_cluster, "hicache-cpu")
    assert container["name"] == "sglang"
    assert container["command"] == ["python3", "-m", "sglang.launch_server"]
    args = container["args"]
    assert args[args.index("--hicache-size") + 1] == "1"


async def test_a_ttft_regression_on_an_sglang_canary_rolls_back_to_gpu_only(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    doc = sglang_doc("hicache", local_cluster)
    # ×30: a HiCache canary's hits make its TTFT small (about 40 ms here), so ×10 stays under both budgets.
    await local_cluster.set_faults(CPU_CANARY, {"ttft_multiplier": 30}, sticky=True)
    await local_cluster.apply(doc)

    async with load_on(local_cluster, "hicache"):
        await eventually(lambda: canary_on(local_cluster, "hicache", "cpu"), "the cpu canary", 90)
        status = await eventually(lambda: in_phase(local_cluster, "hicache", "RolledBack", "Stable"), "RolledBack", 60)

    assert status["phase"] == "RolledBack", status.get("message")
    assert status["stable"]["configHash"] == level_hash(doc, "gpu-only")
    last = status["history"][-1]
    assert last["decision"] == "Rollback"
    assert "ttft" in last["message"].lower()
    ttft = next(m for m in status["lastAnalysis"]["metrics"] if m["name"] == "ttftP99")
    assert ttft["passed"] is False
    warnings = [e for e in await events_of(local_cluster, "hicache") if e["type"] == "Warning"]
    assert any("canary cpu removed" in e["message"] for e in warnings), warnings
    await eventually(lambda: deployment(local_cluster, "hicache-cpu") is None, "the canary gone")
