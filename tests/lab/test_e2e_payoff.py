"""End to end: a secondary tier whose restores cost more than recomputing is rolled back on its live payoff (issue 38).

The climb of ``tests/lab/test_e2e.py`` (analysis every 1 s, 6 s window, 4 s sustainedFor; gpu-only, a CPU tier, then
the nvme tier), with 20 s steps so a step holds some ten 2 s sub-windows, on the real kube-apiserver with the
operator, Prometheus and the load running for real. Every engine of the nvme level has the emulator's
``restore_latency`` fault: 150 ms added to the first token of each request that restored prompt tokens from an
offload tier, where recomputing the 256-token prefix it restored costs about 20 ms. The latency gates are loosened
(p99 TTFT 2 s, canary/stable x20) so they cannot be what catches it: the nvme canary stays within both, and only the
payoff (``analysis.payoff`` auto gates a level with a secondary tier) can say that it does not pay. It says so with
the figures it fitted, and the nvme tier is rolled back to the CPU tier.

The controls, on two engines of their own with no cluster: the fit from each engine's own ``/metrics`` increments
passes a CPU tier that saves its recompute (1,480-token prefixes on the seed laptop: restored in about 35 ms, where
recomputing costs 77 ms), and says "does not pay" once the same engine has the ``restore_latency`` fault.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.analysis.assess import look_alpha_of
from kvoffload.analysis.payoff import SubWindow, payoff_row
from kvoffload.api.rollout import AnalysisSpec
from kvoffload.engines.dialect import SOURCE_EXTERNAL_KV_TRANSFER, SOURCE_LOCAL_CACHE_HIT, SOURCE_LOCAL_COMPUTE
from kvoffload.engines.vllm.dialect import NEWEST
from tests.lab.test_e2e import level_index, policy_doc
from tests.support.cluster import Cluster, OperatorProcess, either_cluster, load_on, status_of
from tests.support.engines import Engine, EngineFactory

RESTORE_LATENCY_S = 0.15


@pytest_asyncio.fixture
async def local_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, cluster_engine_args: list[str]
) -> AsyncIterator[Cluster]:
    async with either_cluster("kube", request, tmp_path / "cluster", cluster_engine_args) as cluster:
        yield cluster


def payoff_doc(cluster: Cluster) -> dict[str, Any]:
    """The e2e ladder (CPU 256Mi, then nvme) with 20 s steps and latency gates too loose to catch the fault."""
    doc = policy_doc("chat", cluster, max_regression=20.0)
    spec = doc["spec"]
    spec["rollout"]["stepDuration"] = "20s"
    spec["analysis"]["ttftP99"] = "2s"
    del spec["analysis"]["payoff"]  # the default, auto: a secondary tier must pay
    return doc


@pytest.mark.e2e
@pytest.mark.prometheus
@pytest.mark.kube
@pytest.mark.timeout(300)
async def test_a_secondary_tier_whose_restores_cost_more_than_recompute_is_rolled_back_on_its_payoff(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    doc = payoff_doc(local_cluster)
    await local_cluster.set_faults(
        "kvoffload.io/policy=chat,kvoffload.io/level=nvme", {"restore_latency": RESTORE_LATENCY_S}, sticky=True
    )
    await local_cluster.apply(doc)
    started = time.monotonic()

    # Every canary status's analysis rows, by the canary's level.
    seen: dict[str, list[dict[str, dict[str, Any]]]] = {"cpu": [], "nvme": []}
    async with load_on(local_cluster, "chat"):
        while True:
            status = status_of(local_cluster, "chat")
            if status.get("phase") in ("Stable", "RolledBack", "Paused"):
                break
            assert time.monotonic() < started + 240, f"neither Stable nor RolledBack: {status.get('message')}"
            canary, ladder = status.get("canary") or {}, status.get("ladder") or []
            metrics = {m["name"]: m for m in (status.get("lastAnalysis") or {}).get("metrics") or []}
            if canary and "payoff" in metrics and ladder[canary["level"]] in seen:
                seen[ladder[canary["level"]]].append(metrics)
            await asyncio.sleep(0.2)
    took = time.monotonic() - started

    last = status["history"][-1]
    rows = {level: [metrics["payoff"] for metrics in statuses] for level, statuses in seen.items()}
    failed = [metrics for metrics in seen["nvme"] if metrics["payoff"].get("passed") is False]
    print(
        f"\n{status['phase']} {took:.0f} s after apply; {last['decision']}: {last['message']}\n"
        f"cpu payoff (reported): {[r.get('canary') for r in rows['cpu']][-3:]}; "
        f"nvme payoff: {rows['nvme'][-1] if rows['nvme'] else None}"
    )
    assert status["phase"] == "RolledBack", status.get("message")
    assert last["decision"] == "Rollback"
    assert status["stable"]["level"] == level_index(doc, "cpu")
    # The payoff said it, beyond chance, with the figures it fitted; no latency gate did.
    assert "does not pay" in last["message"], last["message"]
    assert failed, rows["nvme"]
    row = failed[-1]["payoff"]
    assert row["canary"] < 0, row
    assert row["interval"][1] < 0, row
    assert row["pValue"] < row["alpha"], row
    figures = row["payoff"]
    assert figures["savingUsPerToken"] < 0, figures
    assert figures["restoredTokensPerRequest"] > 0, figures
    for words in ("a canary request saves", "µs/token", "restored tokens per canary request"):
        assert words in row["message"], row["message"]
    for metrics in failed:
        assert not [m for m in metrics.values() if m.get("passed") is False and m["name"] != "payoff"], metrics
    # The CPU tier is no secondary tier: its payoff was reported, never gated (auto), and it was promoted.
    assert all(r.get("passed") is None for r in rows["cpu"]), rows["cpu"]
    assert "LevelPromoted" in [entry["decision"] for entry in status["history"]]


# --- the controls: the fit on two engines' own counters ----------------------------------------------------------

SEED_SCENARIO = ["serve", "Qwen/Qwen3-0.6B", "--block-size", "16", "--gpu-kv-blocks", "184", "--max-model-len", "4096"]
"""The seed laptop's prices; the GPU cache holds two 1,480-token prompts."""
CPU_TIER = ["--kv-offloading-size", "1", "--kv-offloading-backend", "native", "--pinning-time-scale", "0"]
"""1 GiB holds the four prefixes (114,688 bytes a token)."""
PREFIXES = 4
SUB_WINDOWS = 8
REQUESTS_PER_SUB_WINDOW = 6


def counters(engine: Engine) -> dict[str, float]:
    """What the payoff's range query reads of one engine, now: the TTFT histogram's count and sum, and the prompt
    tokens by source (summed over label sets)."""
    found = dict.fromkeys(("requests", "ttft_seconds", "computed", "local_hit", "external"), 0.0)
    names = {
        f"{NEWEST.ttft}_count": "requests",
        f"{NEWEST.ttft}_sum": "ttft_seconds",
    }
    sources = {
        SOURCE_LOCAL_COMPUTE: "computed",
        SOURCE_LOCAL_CACHE_HIT: "local_hit",
        SOURCE_EXTERNAL_KV_TRANSFER: "external",
    }
    for family in text_string_to_metric_families(engine.get("/metrics")):
        for sample in family.samples:
            if sample.name in names:
                found[names[sample.name]] += sample.value
            elif sample.name == NEWEST.prompt_tokens_by_source:
                found[sources[sample.labels["source"]]] += sample.value
    return found


def sub_windows(engine: Engine, prefixes: list[list[int]], rng: random.Random) -> list[SubWindow]:
    """``SUB_WINDOWS`` sub-windows of ``REQUESTS_PER_SUB_WINDOW`` requests, each one of the prefixes in turn (the GPU
    holds two, so each comes from the CPU tier or is recomputed) with a unique tail; the increments of each."""
    out = []
    turn = 0
    for _ in range(SUB_WINDOWS):
        before = counters(engine)
        for _ in range(REQUESTS_PER_SUB_WINDOW):
            engine.complete([*prefixes[turn % PREFIXES], *(rng.randrange(1, 150_000) for _ in range(16))], 1)
            turn += 1
        after = counters(engine)
        delta = {k: after[k] - before[k] for k in after}
        out.append(
            SubWindow(
                delta["requests"], delta["ttft_seconds"], delta["computed"], delta["local_hit"], delta["external"]
            )
        )
    return out


def both(canary: Engine, stable: Engine, prefixes: list[list[int]]) -> tuple[list[SubWindow], list[SubWindow]]:
    """The canary's and the stable's sub-windows, served side by side as a step serves them."""
    got: dict[str, list[SubWindow]] = {}
    threads = [
        threading.Thread(target=lambda e=e, k=k: got.__setitem__(k, sub_windows(e, prefixes, random.Random(k))))
        for e, k in ((canary, "canary"), (stable, "stable"))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return got["canary"], got["stable"]


@pytest.mark.timeout(120)
def test_the_payoff_passes_a_cpu_tier_that_saves_its_recompute_and_fails_it_with_slow_restores(
    engine_factory: EngineFactory,
) -> None:
    canary, stable = engine_factory([[*SEED_SCENARIO, *CPU_TIER], SEED_SCENARIO])
    rng = random.Random(38)
    prefixes = [[rng.randrange(1, 150_000) for _ in range(rng.randint(1200, 1480))] for _ in range(PREFIXES)]
    for prefix in prefixes:  # stored in the canary's CPU tier
        canary.complete([*prefix, 7], 1)
    alpha = look_alpha_of(AnalysisSpec(), payoff=True)

    def judged() -> Any:
        rows = both(canary, stable, prefixes)
        return payoff_row(*rows, gate=True, gate_text="", judging=True, min_requests=20, alpha=alpha).result

    paying = judged()
    canary.set_faults(restore_latency=0.1)
    slow = judged()
    print(f"\nno fault: {paying.message}\nrestore_latency 0.1 s: {slow.message}")
    assert paying.passed is True, paying.message
    assert paying.canary is not None
    assert paying.canary > 20  # ms: a 1,200-1,480-token recompute of 60-77 ms against a restore of about 35
    assert slow.passed is False, slow.message
    assert slow.canary is not None
    assert slow.canary < 0
    assert slow.message.startswith("does not pay")
    # The fault costs each restoring request 100 ms: the saving drops by about that much.
    assert paying.canary - slow.canary == pytest.approx(100, abs=25)
