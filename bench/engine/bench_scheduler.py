"""How fast the emulator's scheduler runs a workload in virtual time (the load tests and this bench use it).

Usage: ``.venv/bin/python bench/engine/bench_scheduler.py [--seconds 120] [--rate 10] [-o results.json]``

One engine, the conversation workload of ``tests/lab/test_engine_load.py`` (60 sessions, each turn the history plus
200 new tokens up to 1,600, Poisson arrivals), a 400-block GPU cache, with and without a 4 GiB CPU tier, on the
laptop and on the H200 profile. Reports wall time, requests and engine steps simulated per wall second, and the
modelled p50/p99 TTFT (so a speed change that changes the model shows).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from pathlib import Path

from kvoffload_lab.engine.flags import parse_argv
from kvoffload_lab.engine.kvengine import KVEngine
from kvoffload_lab.engine.scheduler import Scheduler, run_virtual


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 150_000) for _ in range(n)]


def workload(seconds: float, rate: float) -> list[tuple[float, list[int], int]]:
    rng = random.Random(5)
    history: dict[int, list[int]] = {}
    out: list[tuple[float, list[int], int]] = []
    t = 0.0
    while t < seconds:
        t += rng.expovariate(rate)
        sid = rng.randrange(60)
        h = history.setdefault(sid, [])
        if len(h) >= 1600:
            h.clear()
        h.extend(prompt(sid * 100_000 + len(h), 200))
        out.append((t, list(h), 8))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("-o", "--output", type=Path, default=None)
    args = ap.parse_args()
    work = workload(args.seconds, args.rate)
    rows = []
    for name, extra in (("laptop", []), ("nvidia-h200-141gb", ["--gpu-class", "nvidia-h200-141gb"])):
        for tier in ([], ["--kv-offloading-size", "4"]):
            argv = ["serve", "Qwen/Qwen3-0.6B", "--gpu-kv-blocks", "400", "--max-model-len", "2048", *extra, *tier]
            config, _, _ = parse_argv(argv)
            s = Scheduler(
                KVEngine(config),
                max_num_batched_tokens=config.max_num_batched_tokens,
                max_num_seqs=config.max_num_seqs,
            )
            start = time.perf_counter()
            reqs = run_virtual(s, work)
            wall = time.perf_counter() - start
            ttfts = sorted(r.ttft for r in reqs if r.ttft is not None)
            rows.append(
                {
                    "class": name,
                    "cpuTier": bool(tier),
                    "requests": len(reqs),
                    "steps": s.totals.steps,
                    "wallSeconds": round(wall, 3),
                    "requestsPerWallSecond": round(len(reqs) / wall),
                    "stepsPerWallSecond": round(s.totals.steps / wall),
                    "virtualSeconds": round(max(r.finished_at or 0.0 for r in reqs), 1),
                    "ttftP50Ms": round(ttfts[len(ttfts) // 2] * 1000, 1),
                    "ttftP99Ms": round(ttfts[int(0.99 * len(ttfts))] * 1000, 1),
                }
            )
            print(json.dumps(rows[-1]))
    doc = {"python": platform.python_version(), "machine": platform.machine(), "rows": rows}
    if args.output is not None:
        args.output.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
