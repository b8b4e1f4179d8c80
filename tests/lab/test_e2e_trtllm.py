"""End to end on kube-apiserver: a TensorRT-LLM policy (``spec.engine: trtllm``) climbs its ladder to Stable, and
rolls back its newest tier on a TTFT breach (issue 34, item 2).

The climb of ``tests/lab/test_e2e.py`` (analysis every 1 s, 6 s window, 4 s sustainedFor), with the operator,
Prometheus, the Prometheus Operator and the load generator running for real. Each engine pod runs the rendered
``trtllm-serve`` command line with its ``--extra_llm_api_options`` file, which the kubelet stand-in reads from the
level's ConfigMap through the real API server; the emulator speaks TensorRT-LLM's ``trtllm_`` series at
``/prometheus/metrics``, the path the rendered PodMonitor names, and the operator reads them through the TensorRT-LLM
dialect. That dialect has no inter-token latency, so the ITL gate says "not judged" by name.
``host_cache_size`` is bytes per rank: a 256 MiB CPU tier on one rank is a 268,435,456-byte host cache.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from kvoffload.engines.trtllm.command import CONFIG_FILE, CONFIG_PATH
from kvoffload_lab.demo import TRTLLM_IMAGE
from tests.lab.test_e2e import canary_on, decisions, deployment, events_of, in_phase, level_hash, policy_doc
from tests.support.cluster import Cluster, OperatorProcess, either_cluster, eventually, load_on

pytestmark = [pytest.mark.e2e, pytest.mark.prometheus, pytest.mark.kube, pytest.mark.timeout(240)]

CPU_CANARY = "kvoffload.io/level=cpu"  # cpu engines are the canary until cpu is promoted
HOST_CACHE = 256 * 2**20


@pytest_asyncio.fixture
async def local_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, cluster_engine_args: list[str]
) -> AsyncIterator[Cluster]:
    async with either_cluster("kube", request, tmp_path / "cluster", cluster_engine_args) as cluster:
        yield cluster


def trtllm_doc(name: str, cluster: Cluster) -> dict[str, Any]:
    """The e2e policy on TensorRT-LLM: gpu-only, then a 256 MiB host cache."""
    doc = policy_doc(name, cluster)
    spec = doc["spec"]
    spec["engine"] = "trtllm"
    spec["model"]["image"] = TRTLLM_IMAGE
    spec["offload"] = {"cpu": "256Mi"}
    return doc


def metric(status: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(m for m in status["lastAnalysis"]["metrics"] if m["name"] == name)
    return found


def assert_itl_not_judged(status: dict[str, Any]) -> None:
    itl = metric(status, "itlP99")
    assert itl.get("passed") is None, itl
    assert itl["message"].startswith("not judged: "), itl
    assert "no inter-token latency" in itl["message"], itl


async def test_a_trtllm_policy_climbs_to_a_host_cache_level_and_ends_stable(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    doc = trtllm_doc("hostcache", local_cluster)
    await local_cluster.apply(doc)

    async with load_on(local_cluster, "hostcache"):
        status = await eventually(
            lambda: in_phase(local_cluster, "hostcache", "Stable", "RolledBack", "Paused"), "Stable", 150
        )

    assert status["phase"] == "Stable", status.get("message")
    assert status["ladder"] == ["gpu-only", "cpu"]
    assert status["stable"]["configHash"] == level_hash(doc, "cpu")
    assert decisions(local_cluster, "hostcache") == ["NewLadder", "BaselineTaken", "Promoted", "LevelPromoted"]
    assert_itl_not_judged(status)
    # Promoted past the offload-share gate, which reads trtllm_prompt_cache_hit_tokens_total{cache_tier="host"}.
    hits = [m for m in status["lastAnalysis"]["metrics"] if m["name"].startswith("tierHits.")]
    assert any(max(m.get("canary") or 0.0, m.get("stable") or 0.0) > 0 for m in hits), hits
    found = deployment(local_cluster, "hostcache-cpu")
    assert found is not None
    pod = found["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "trtllm"
    assert container["command"] == ["trtllm-serve"]
    assert container["args"][container["args"].index("--extra_llm_api_options") + 1] == CONFIG_PATH
    # The file the engines ran with is the level's ConfigMap, as the real API server holds it.
    config_map = local_cluster.get("v1", "ConfigMap", local_cluster.namespace, "hostcache-cpu")
    assert config_map is not None
    kv = yaml.safe_load(config_map["data"][CONFIG_FILE])["kv_cache_config"]
    assert kv["host_cache_size"] == HOST_CACHE


async def test_a_ttft_regression_on_a_trtllm_canary_rolls_back_to_gpu_only(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    doc = trtllm_doc("hostcache", local_cluster)
    # ×30, as for SGLang: a host-cache canary's hits make its TTFT small, so ×10 stays under both budgets.
    await local_cluster.set_faults(CPU_CANARY, {"ttft_multiplier": 30}, sticky=True)
    await local_cluster.apply(doc)

    async with load_on(local_cluster, "hostcache"):
        await eventually(lambda: canary_on(local_cluster, "hostcache", "cpu"), "the cpu canary", 90)
        status = await eventually(
            lambda: in_phase(local_cluster, "hostcache", "RolledBack", "Stable"), "RolledBack", 60
        )

    assert status["phase"] == "RolledBack", status.get("message")
    assert status["stable"]["configHash"] == level_hash(doc, "gpu-only")
    last = status["history"][-1]
    assert last["decision"] == "Rollback"
    assert "ttft" in last["message"].lower()
    assert metric(status, "ttftP99")["passed"] is False
    assert_itl_not_judged(status)
    warnings = [e for e in await events_of(local_cluster, "hostcache") if e["type"] == "Warning"]
    assert any("canary cpu removed" in e["message"] for e in warnings), warnings
    await eventually(lambda: deployment(local_cluster, "hostcache-cpu") is None, "the canary gone")
