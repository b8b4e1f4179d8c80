"""End to end: a cold canary over budget during its warm-up, healthy after, climbs to Stable (issue 37, part 3).

The climb of ``tests/lab/test_e2e.py`` (analysis every 1 s, 6 s window, 4 s sustainedFor, 6 s steps), one tier
(gpu-only, then a CPU tier), on the real kube-apiserver and on the emulated API, with the operator, Prometheus and
the load generator running for real. Every engine's GPU cache holds every shared prefix of the load (1,024 blocks),
so a warm engine hits each prefix and a fresh one misses each once, and every request that misses the GPU prefix
cache pays 1 s more to its first token (the emulator's ``miss_latency`` fault: a cold miss, the 500 ms TTFT budget
twice over). A fresh canary is then over the budget while its cache fills and its window holds those misses, and
healthy after. Before issue 37 this climb rolled back: the absolute budget acted during the warm-up, and with it
reported only, the first windows judged after the warm-up still held the cold misses. Now the canary's latency is
judged only from ``judgedFrom``: one window after its prefix-cache hit rate caught up with the stable's
(``cacheParity`` 0.9) with every canary replica Ready, and the climb reaches Stable.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.lab.test_e2e import decisions, events_of, level_index, policy_doc
from tests.support.cluster import APIS, Cluster, OperatorProcess, either_cluster, load_on, status_of
from tests.support.engines import EngineFactory

MISS_LATENCY_S = 1.0
GPU_KV_BLOCKS = 1024
"""16 prefixes of 16 blocks and the tails: a warm engine keeps every prefix (the default 24 keeps one prompt)."""


@pytest.fixture
def cluster_engine_args() -> list[str]:
    return ["--gpu-kv-blocks", str(GPU_KV_BLOCKS)]


@pytest_asyncio.fixture(params=APIS)
async def local_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, cluster_engine_args: list[str]
) -> AsyncIterator[Cluster]:
    async with either_cluster(request.param, request, tmp_path / "cluster", cluster_engine_args) as cluster:
        yield cluster


def cold_start_doc(cluster: Cluster) -> dict[str, Any]:
    """One CPU tier; no external-share floor (the GPU serves the prefixes); a warm-up of 12 s at least, 30 s at most.

    12 s, not the default one window (6 s): Prometheus sees a fresh pod's requests only from its second scrape, a
    few seconds after it is Ready, and the promotion step's fresh pod runs beside a warm one whose hits carry the
    variant's hit rate meanwhile. In minutes-long steps the window alone covers that; in 6 s steps it does not."""
    doc = policy_doc("chat", cluster)
    spec = doc["spec"]
    spec["offload"] = {"backend": "native", "cpu": "256Mi"}
    spec["analysis"]["minExternalShare"] = 0.0
    spec["analysis"]["warmup"] = {"duration": "12s", "maxDuration": "30s"}
    return doc


def ttft_row(status: dict[str, Any]) -> dict[str, Any]:
    metrics = (status.get("lastAnalysis") or {}).get("metrics") or []
    return next((m for m in metrics if m["name"] == "ttftP99"), {})


def at(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def before_judged(status: dict[str, Any]) -> bool:
    """Whether the status's last analysis came before its canary was judged (``judgedFrom``, unset while warming)."""
    judged = status["warmup"].get("judgedFrom")
    return judged is None or at(status["lastAnalysis"]["time"]) < at(judged)


@pytest.mark.e2e
@pytest.mark.prometheus
@pytest.mark.timeout(240)
async def test_a_cold_canary_over_budget_during_its_warm_up_and_healthy_after_climbs_to_stable(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    doc = cold_start_doc(local_cluster)
    await local_cluster.set_faults("kvoffload.io/policy=chat", {"miss_latency": MISS_LATENCY_S}, sticky=True)
    await local_cluster.apply(doc)
    started = time.monotonic()

    seen: list[dict[str, Any]] = []  # every status of a canary step
    async with load_on(local_cluster, "chat"):
        deadline = started + 180
        while True:
            status = status_of(local_cluster, "chat")
            if status.get("phase") in ("Stable", "RolledBack", "Paused"):
                break
            assert time.monotonic() < deadline, f"neither Stable nor RolledBack: {status.get('message')}"
            if status.get("canary") and status.get("warmup") and status.get("lastAnalysis"):
                seen.append(status)
            await asyncio.sleep(0.2)  # a poll interval; the loop keeps serving the engines meanwhile
    took = time.monotonic() - started

    warmed = [e["message"] for e in await events_of(local_cluster, "chat") if e.get("reason") == "WarmedUp"]
    over = [s for s in seen if (ttft_row(s).get("canary") or 0.0) > 0.5]
    cold = [s for s in over if before_judged(s)]
    print(
        f"\n{status['phase']} {took:.0f} s after apply; canary over the budget in {len(cold)} statuses before it was "
        f"judged, {len(over) - len(cold)} after; WarmedUp: {warmed}"
    )
    assert status["phase"] == "Stable", status.get("message")
    assert status["stable"]["level"] == level_index(doc, "cpu")
    assert "Rollback" not in decisions(local_cluster, "chat")
    # Over the 500 ms budget while it warmed: reported, not gated (the real API server drops the null passed).
    assert cold, "the canary was never seen over budget during its warm-up"
    assert all(ttft_row(s).get("passed") is None for s in cold), [ttft_row(s) for s in cold]
    assert all(s["lastAnalysis"]["verdict"] != "Fail" for s in cold), [s["lastAnalysis"] for s in cold]
    # Each step's warm-up ended (on cache parity, or at maxDuration) and its canary was judged a window later.
    assert len(warmed) == 2, warmed
    warmups = {s["warmup"]["since"]: s["warmup"] for s in seen}
    assert len(warmups) == 2, warmups
    for w in warmups.values():
        assert w.get("cacheParity") == 0.9, w
        assert (at(w["judgedFrom"]) - at(w["warmAt"])).total_seconds() == 6, w


def test_the_miss_latency_fault_slows_only_requests_that_miss_the_gpu_prefix_cache(
    engine_factory: EngineFactory,
) -> None:
    (engine,) = engine_factory(1, ["serve", "Qwen/Qwen3-0.6B", "--gpu-kv-blocks", str(GPU_KV_BLOCKS)])
    engine.set_faults(miss_latency=0.3)
    rng = random.Random(5)
    shared = [rng.randrange(1, 150_000) for _ in range(256)]

    def ask(tail: int) -> dict[str, Any]:
        answer = engine.complete([*shared, *range(1000 + tail, 1016 + tail)], max_tokens=1)
        extension: dict[str, Any] = answer["kvoffload"]
        return extension

    cold, warm = ask(0), ask(100)
    assert cold["local_cache_hit_tokens"] == 0
    assert warm["local_cache_hit_tokens"] == 256
    assert cold["measured_ttft_s"] >= 0.3
    assert warm["measured_ttft_s"] < 0.3
    assert cold["modelled_ttft_s"] - warm["modelled_ttft_s"] == pytest.approx(0.3, abs=0.05)
