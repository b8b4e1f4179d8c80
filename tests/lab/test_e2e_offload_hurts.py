"""End to end, no fault injected: a CPU tier that slows an engine on its own is rolled back (issue 11, part 3).

Why the tier hurts, in the emulator's model (``kvoffload_lab.engine``), with no constant changed:

- The engines are priced as the L40S (estimated profile, PCIe Gen4) serving Qwen3-0.6B. Its eager prefill is
  launch-bound: a 4,000-token miss costs 56 ms, hardly more than the forward's fixed 53 ms. A prompt restored
  from the CPU tier still runs that forward for its 32-token tail, and first waits for its load (3,968 tokens,
  about 20 ms over the link in 64 KiB pages) and for the engine step the load lands in (one decode step, 14 ms). So
  a hit costs about 87 ms where the miss it replaces cost 56.
- The GPU KV cache holds one max-length sequence (256 blocks of 16 tokens, ``maxModelLen`` 4096), so an engine
  serves one request at a time, and a loading request holds its blocks while the GPU idles (as does a finished
  one until its stores land). The tier's extra latency is then lost service time: in virtual time the
  scheduler finishes 16.0 requests/s without the tier and 10.7 with it (``test_engine_load``).
- ``--max-num-batched-tokens 4096``: a whole prompt is one prefill chunk, so a miss pays the fixed cost once.
  (With vLLM's 2,048 default on a 48 GB class a miss takes two chunks, and the tier would save one of them.)
- The load: 8 shared 3,968-token prefixes (a CPU tier of 4 GiB holds them all; the GPU, one) and a unique
  32-token tail, 2 output tokens (an ITL sample each), 13 requests/s to every Ready engine, round-robin.
  Per engine, not in total: with ``maxSurge`` 1 the canary step runs three engines where the baseline ran two,
  and a fixed total rate would give each a third less than the baseline measured. At 13/s the gpu-only
  engines are 81% busy and keep up; the canary would need 121% of its time, so its queue and its TTFT grow for as
  long as it runs.

The policy keeps the e2e scenarios' budgets (p99 TTFT 500 ms, ITL 200 ms), its warm-up at the default (one
window), and a canary/stable maxRegression of 2. Nothing is injected: ``/emulator/faults`` stays at its defaults
on every engine (checked). Both tests run on the emulated API and on the real kube-apiserver.

The converse, the last test: the same engines, policy and load priced as the seed's laptop, where a miss is
compute and a restore saves it, climb to the CPU tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.lab.test_e2e import in_phase, level_index, policy_doc
from tests.support.cluster import APIS, Cluster, OperatorProcess, either_cluster, eventually

pytestmark = [pytest.mark.e2e, pytest.mark.prometheus, pytest.mark.timeout(300)]

SLOW_LINK_CLASS = "nvidia-l40s"
GPU_KV_BLOCKS = 256
"""One max-length sequence (4,096 tokens): an engine serves one request at a time."""
PREFIXES = 8
PREFIX_TOKENS = 3968
TAIL_TOKENS = 32
OUTPUT_TOKENS = 2
PER_ENGINE_RATE = 13.0
"""Requests/s to each Ready engine: between the tier's 10.7/s and gpu-only's 16.0/s (virtual time)."""
LAPTOP_RATE = 3.0
"""The converse's rate: the laptop's gpu-only engine serves 4.9/s of these prompts (61% busy at 3/s), with the
tier 20/s; a cold canary's first misses (one per prefix) then queue little."""
VOCAB = 32_000


ONE_SEQUENCE = ["--gpu-kv-blocks", str(GPU_KV_BLOCKS), "--max-num-batched-tokens", "4096"]
"""A GPU cache of one sequence and a prefill chunk of one whole prompt."""


@pytest.fixture
def cluster_engine_args() -> list[str]:
    """The L40S's prices and ``ONE_SEQUENCE`` on every engine."""
    return [*ONE_SEQUENCE, "--gpu-class", SLOW_LINK_CLASS]


@pytest_asyncio.fixture(params=APIS)
async def local_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, cluster_engine_args: list[str]
) -> AsyncIterator[Cluster]:
    async with either_cluster(request.param, request, tmp_path / "cluster", cluster_engine_args) as cluster:
        yield cluster


def cpu_only(doc: dict[str, Any], gpu_class: str = SLOW_LINK_CLASS) -> dict[str, Any]:
    """One CPU tier of 4 GiB; the rest as the e2e scenarios, maxRegression 2."""
    spec = doc["spec"]
    spec["offload"] = {"backend": "native", "cpu": "4Gi"}
    spec["gpu"] = {"class": gpu_class, "count": 1}
    spec["analysis"]["maxRegression"] = 2.0
    return doc


def prompts(seed: int = 11) -> Callable[[], list[int]]:
    """A maker of prompts: one of the shared prefixes at random, then a tail no other prompt has."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, VOCAB) for _ in range(PREFIX_TOKENS)] for _ in range(PREFIXES)]

    def make() -> list[int]:
        return prefixes[rng.randrange(PREFIXES)] + [rng.randrange(1, VOCAB) for _ in range(TAIL_TOKENS)]

    return make


@contextlib.asynccontextmanager
async def per_engine_load(
    endpoints: Callable[[], Sequence[str]], model: str, rate: float, max_in_flight: int = 400
) -> AsyncIterator[dict[str, int]]:
    """Send ``rate`` requests/s to each Ready engine (round-robin over ``endpoints()``) while inside."""
    counts = {"sent": 0, "ok": 0, "failed": 0, "skipped": 0}
    in_flight: set[asyncio.Task[None]] = set()
    make = prompts()

    async def one(session: aiohttp.ClientSession, url: str, tokens: list[int]) -> None:
        body = {"model": model, "prompt": tokens, "max_tokens": OUTPUT_TOKENS}
        try:
            async with session.post(f"{url}/v1/completions", json=body) as response:
                await response.read()
                counts["ok" if response.status == 200 else "failed"] += 1
        except (aiohttp.ClientError, TimeoutError):
            counts["failed"] += 1

    async def send() -> None:
        turn = 0
        due = time.monotonic()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            while True:
                urls = list(endpoints())
                if not urls:
                    await asyncio.sleep(0.2)
                    due = time.monotonic()
                    continue
                if len(in_flight) >= max_in_flight:
                    counts["skipped"] += 1
                else:
                    task = asyncio.create_task(one(session, urls[turn % len(urls)], make()))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
                    counts["sent"] += 1
                turn += 1
                # A host busy elsewhere delays sends; catch up, but never with more than half a second's burst.
                due = max(due + 1.0 / (rate * len(urls)), time.monotonic() - 0.5)
                await asyncio.sleep(max(0.0, due - time.monotonic()))

    sender = asyncio.create_task(send(), name=f"load on {model}")
    try:
        yield counts
    finally:
        sender.cancel()
        for task in list(in_flight):
            task.cancel()
        await asyncio.gather(sender, *in_flight, return_exceptions=True)


async def faults_of(cluster: Cluster) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as session:
        for engine in cluster.pods("kvoffload.io/policy=chat"):
            try:
                async with session.get(f"{engine.url}/emulator/faults") as response:
                    out.append(json.loads(await response.text()))
            except aiohttp.ClientError:
                continue  # an engine on its way out (the canary just removed)
    return out


async def test_a_cpu_tier_that_slows_a_launch_bound_model_on_a_slow_link_is_rolled_back_with_no_fault(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    doc = cpu_only(policy_doc("chat", local_cluster))
    await local_cluster.apply(doc)
    started = time.monotonic()

    async with per_engine_load(lambda: local_cluster.endpoints("chat"), "chat", PER_ENGINE_RATE) as counts:
        status = await eventually(
            lambda: in_phase(local_cluster, "chat", "RolledBack", "Stable"), "RolledBack or Stable", 200
        )
        faults = await faults_of(local_cluster)

    last = status["history"][-1]
    metrics = {m["name"]: m.get("canary") for m in (status.get("lastAnalysis") or {}).get("metrics") or []}
    print(
        f"\n{status['phase']} {time.monotonic() - started:.0f}s after apply; load {counts}; "
        f"canary/stable p99 TTFT {metrics.get('ttftP99Ratio')}, ITL {metrics.get('itlP99Ratio')}; {last['message']}"
    )
    assert status["phase"] == "RolledBack", status.get("message")
    assert last["decision"] == "Rollback"
    assert "ttft" in last["message"].lower(), last["message"]
    assert status["stable"]["level"] == level_index(doc, "gpu-only")
    untouched = {"added_latency": 0.0, "ttft_multiplier": 1.0, "itl_multiplier": 1.0, "in_outage": False}
    assert faults
    assert all(all(f[k] == v for k, v in untouched.items()) for f in faults), faults


@pytest.mark.parametrize("cluster_engine_args", [ONE_SEQUENCE], ids=["laptop"])  # no class: the seed laptop's prices
async def test_the_same_policy_and_load_climb_where_the_tier_pays(
    local_cluster: Cluster, operator: OperatorProcess
) -> None:
    """The converse: the same engines, policy and prompts, priced as the seed's laptop, whose miss of 4,000 tokens
    is compute (233 ms) and whose restore is not (60 ms): the cpu canary passes and the tier is promoted."""
    doc = cpu_only(policy_doc("chat", local_cluster), gpu_class="nvidia-l4")
    await local_cluster.apply(doc)
    started = time.monotonic()

    async with per_engine_load(lambda: local_cluster.endpoints("chat"), "chat", LAPTOP_RATE) as counts:
        status = await eventually(
            lambda: in_phase(local_cluster, "chat", "RolledBack", "Stable"), "RolledBack or Stable", 200
        )

    metrics = {m["name"]: m.get("canary") for m in (status.get("lastAnalysis") or {}).get("metrics") or []}
    print(f"\n{status['phase']} {time.monotonic() - started:.0f}s after apply; load {counts}; metrics {metrics}")
    assert status["phase"] == "Stable", status.get("message")
    assert [entry["decision"] for entry in status["history"]][-1] == "LevelPromoted"
    assert status["stable"]["level"] == level_index(doc, "cpu")
