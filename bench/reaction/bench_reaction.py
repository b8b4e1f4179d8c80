"""Reaction time: from the first breaching sample to the rollback being applied.

Each run starts a fresh local cluster (emulated API, real Prometheus scraping every
second, emulated engines) and the operator (``kvoffload run``) as a subprocess, applies a
one-tier policy (gpu-only -> cpu) with a long canary step, waits until the cpu canary is
Ready and has served traffic, then makes the canary engine answer 10x slower
(``/emulator/faults``). The clock starts when the first slow request to the canary
completes (the first breaching observation an engine can export) and stops when the
canary Deployment is gone from the API (the rollback applied); the time the status turns
RolledBack is recorded too. The floor is what the rules allow at best:
``sustainedFor + scrape interval + analysis.interval``.

    .venv/bin/python bench/reaction/bench_reaction.py [--runs 5] [--sustained-for 4] [--interval 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from kvoffload.lab.cluster.localcluster import LocalCluster, start_operator, stop_operator
from kvoffload.lab.load import TraceRequest, prompt_tokens, replay
from kvoffload.lab.promserver import SCRAPE_INTERVAL_S

NAME = "bench"
API = "kvoffload.io/v1alpha1"
KIND = "KVOffloadPolicy"
TTFT_FACTOR = 10.0
SCALE = 0.5


def policy(prometheus_url: str, *, interval: float, sustained_for: float) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": KIND,
        "metadata": {"name": NAME, "namespace": "default"},
        "spec": {
            "model": {"name": "Qwen/Qwen3-0.6B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 4096},
            "gpu": {"class": "nvidia-l4", "count": 1},
            "replicas": 2,
            "resources": {"baseMemory": "4Gi", "headroom": "1Gi", "cpu": "2"},
            "offload": {"backend": "native", "cpu": "256Mi"},
            "rollout": {
                "canaryReplicas": 1,
                "maxSurge": 1,
                "baselineDuration": "4s",
                "stepDuration": "10m",  # the fault, not the step's end, must end the canary
                "promotionSteps": [100],
                "progressDeadline": "60s",
            },
            "analysis": {
                "interval": f"{interval:g}s",
                "window": "6s",
                "ttftP99": "500ms",
                "itlP99": "200ms",
                "maxRegression": 2.0,
                "minExternalShare": 0.0,
                "sustainedFor": f"{sustained_for:g}s",
                "minRequests": 3,
                "maxInconclusive": 30,
            },
            "prometheus": {"url": prometheus_url},
        },
    }


def trace(rate: float = 20.0, seconds: float = 600.0, prefixes: int = 16) -> list[TraceRequest]:
    rng = random.Random(11)
    return [
        TraceRequest(at=i / rate, input_length=544, output_length=4, hash_ids=(rng.randrange(prefixes), 10_000 + i))
        for i in range(int(rate * seconds))
    ]


async def wait_for(check: Any, what: str, timeout: float, poll: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(poll)  # poll interval of the condition above


async def one_run(
    workdir: Path, *, interval: float, sustained_for: float, phase_rng: random.Random
) -> dict[str, float]:
    async with LocalCluster(workdir, engine_args=["--gpu-kv-blocks", "24"]) as cluster:
        operator = start_operator(cluster)
        requests = trace()
        load = asyncio.create_task(
            replay(lambda: cluster.endpoints(NAME), requests, model=NAME, speedup=1.0, duration=600.0, scale=SCALE)
        )
        try:
            await cluster.apply(policy(cluster.prometheus.url, interval=interval, sustained_for=sustained_for))

            def canary_serving() -> bool:
                status = (cluster.get(API, KIND, "default", NAME) or {}).get("status") or {}
                analysis = status.get("lastAnalysis") or {}
                canary = status.get("canary") or {}
                return bool(canary.get("ready")) and analysis.get("verdict") == "Pass"

            await wait_for(canary_serving, "a Ready cpu canary with a Pass verdict", 90)
            (engine,) = cluster.pods(f"kvoffload.io/policy={NAME},kvoffload.io/level=cpu")  # the cpu canary
            # Inject at a random phase of the scrape and analysis cycles: waiting on a fresh
            # verdict above would otherwise always land just after an analysis.
            await asyncio.sleep(phase_rng.uniform(0.0, SCRAPE_INTERVAL_S + interval))
            injected = time.monotonic()
            await cluster.set_faults("kvoffload.io/level=cpu", {"ttft_multiplier": TTFT_FACTOR})
            # The first slow request: a probe straight to the canary engine.
            async with aiohttp.ClientSession() as session:
                body = {"model": NAME, "prompt": prompt_tokens(requests[0], SCALE), "max_tokens": 1}
                async with session.post(f"{engine.url}/v1/completions", json=body) as response:
                    await response.read()
            first_breach = time.monotonic()
            await wait_for(
                lambda: cluster.get("apps/v1", "Deployment", "default", f"{NAME}-canary") is None,
                "the canary Deployment to be deleted",
                60,
            )
            applied = time.monotonic()
            await wait_for(
                lambda: (
                    ((cluster.get(API, KIND, "default", NAME) or {}).get("status") or {}).get("phase") == "RolledBack"
                ),
                "status RolledBack",
                30,
            )
            rolled_back = time.monotonic()
        finally:
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await load
            await stop_operator(operator)
    return {
        "slow_request_s": first_breach - injected,
        "reaction_s": applied - first_breach,
        "status_s": rolled_back - first_breach,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--interval", type=float, default=1.0, help="analysis.interval, seconds")
    parser.add_argument("--sustained-for", type=float, default=4.0, help="analysis.sustainedFor, seconds")
    parser.add_argument("--seed", type=int, default=1, help="seed of the injection phases")
    parser.add_argument("--json", type=Path, default=None, help="write the runs and the summary here")
    args = parser.parse_args()
    floor = args.sustained_for + SCRAPE_INTERVAL_S + args.interval
    runs: list[dict[str, float]] = []
    phase_rng = random.Random(args.seed)
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="kvoffload-reaction-") as tmp:
            run = await one_run(
                Path(tmp), interval=args.interval, sustained_for=args.sustained_for, phase_rng=phase_rng
            )
        run["ratio"] = run["reaction_s"] / floor
        runs.append(run)
        print(
            f"run {i + 1}: rollback applied {run['reaction_s']:.2f}s after the first slow request "
            f"(status RolledBack {run['status_s']:.2f}s), floor {floor:.1f}s, ratio {run['ratio']:.2f}",
            flush=True,
        )
    ratios = [r["ratio"] for r in runs]
    summary = {
        "floor_s": floor,
        "sustained_for_s": args.sustained_for,
        "interval_s": args.interval,
        "scrape_interval_s": SCRAPE_INTERVAL_S,
        "median_reaction_s": statistics.median(r["reaction_s"] for r in runs),
        "worst_reaction_s": max(r["reaction_s"] for r in runs),
        "median_ratio": statistics.median(ratios),
        "worst_ratio": max(ratios),
    }
    print(
        f"reaction over {len(runs)} runs: median {summary['median_reaction_s']:.2f}s "
        f"(ratio {summary['median_ratio']:.2f}), worst {summary['worst_reaction_s']:.2f}s "
        f"(ratio {summary['worst_ratio']:.2f}); floor {floor:.1f}s"
    )
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "runs": runs}, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
