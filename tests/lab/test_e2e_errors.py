"""End to end: a canary that fails requests while its latency looks fine is rolled back by the error gate (issue 24,
item 2).

The climb of ``tests/lab/test_e2e.py`` (gpu-only, cpu, nvme; analysis every 1 s, 6 s window, 4 s sustainedFor), on
the real kube-apiserver and on the emulated API, with the operator, Prometheus and the load generator running for
real. Every nvme engine fails 5% of its requests from its first request on, as vLLM fails a request whose KV load
from an offload tier failed (``finished_reason="error"``, HTTP 500: the emulator's ``error_share`` fault); the
requests it serves keep their TTFT and ITL. The latency gates pass, the error gate does not, and the policy rolls
back to cpu, naming the gate in its history, its last analysis and its Warning Event.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kvoffload.analysis.errorgate import ERROR_SHARE, ERROR_SHARE_INCREASE
from tests.lab.test_e2e import NVME_CANARY, canary_on, deployment, events_of, in_phase, level_hash, policy_doc
from tests.support.cluster import APIS, Cluster, OperatorProcess, either_cluster, eventually, load_on

pytestmark = [pytest.mark.e2e, pytest.mark.prometheus, pytest.mark.timeout(240)]

ERROR_SHARE_FAULT = 0.05


@pytest_asyncio.fixture(params=APIS)
async def local_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, cluster_engine_args: list[str]
) -> AsyncIterator[Cluster]:
    async with either_cluster(request.param, request, tmp_path / "cluster", cluster_engine_args) as cluster:
        yield cluster


def metric(status: dict[str, Any], name: str) -> dict[str, Any]:
    found = [m for m in (status.get("lastAnalysis") or {}).get("metrics", []) if m["name"] == name]
    assert found, f"{name} not in lastAnalysis: {status.get('lastAnalysis')}"
    return found[0]


async def test_a_canary_failing_5_percent_of_requests_with_normal_ttft_is_rolled_back_by_the_error_gate(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    doc = policy_doc("chat", local_cluster)
    await local_cluster.set_faults(NVME_CANARY, {"error_share": ERROR_SHARE_FAULT}, sticky=True)
    await local_cluster.apply(doc)

    async with load_on(local_cluster, "chat"):
        await eventually(lambda: canary_on(local_cluster, "chat", "nvme"), "the nvme canary", 90)
        ready = time.monotonic()
        status = await eventually(lambda: in_phase(local_cluster, "chat", "RolledBack", "Stable"), "RolledBack", 60)
        took = time.monotonic() - ready

    assert status["phase"] == "RolledBack", status.get("message")
    assert status["stable"]["configHash"] == level_hash(doc, "cpu")
    last = status["history"][-1]
    assert last["decision"] == "Rollback"
    assert last["reason"] == "AnalysisFailed"
    assert last["stage"] == "cpu"
    assert "maxIncrease" in last["message"], last["message"]
    # The verdict that rolled it back: the error gate breached, the latency gates held.
    increase = metric(status, ERROR_SHARE_INCREASE)
    assert increase["passed"] is False
    assert increase["canary"] > 0.02  # over the default maxIncrease of 2 points
    share = metric(status, ERROR_SHARE)
    assert 0.02 < share["canary"] < 0.10  # about the injected 5%
    assert share["stable"] == 0.0
    # Both counts reached it through the real scrape: the engine's reasons and the API server's 500s.
    assert "finished requests failed" in share["message"], share["message"]
    assert "HTTP answers were 5xx" in share["message"], share["message"]
    for latency in ("ttftP99", "itlP99"):
        assert metric(status, latency).get("passed") is not False, metric(status, latency)
    warnings = [e for e in await events_of(local_cluster, "chat") if e["type"] == "Warning"]
    assert any("canary nvme removed" in e["message"] and "maxIncrease" in e["message"] for e in warnings), warnings
    await eventually(lambda: deployment(local_cluster, "chat-nvme") is None, "the canary gone")
    # For the record (pytest -s): how long from a Ready canary to the rollback, and what the gate saw.
    print(f"\nrolled back {took:.1f} s after the nvme canary was Ready: {share['message']}; {increase['message']}")
