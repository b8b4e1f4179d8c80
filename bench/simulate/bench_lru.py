"""LRU hit ratios over the Mooncake traces: kvoffload's one-pass curve against libCacheSim, size by size.

Both sides get the same block stream (every ``hash_ids`` entry of every request, in file order).
kvoffload computes the reuse-distance profile once and reads the hit ratio at every size of the
sweep from it; libCacheSim (PyPI ``libcachesim``) runs its C LRU once per size over the same stream,
written as an oracleGeneral binary trace (object size 1, cache size in blocks). Runs alternate
between the two, so both see the same load on a shared machine. Parsing the JSONL is timed apart:
it is the same for any simulator fed from it.

    python -m venv /tmp/lcs-venv && /tmp/lcs-venv/bin/pip install libcachesim==0.3.5 numpy
    PYTHONPATH=operator nice -n 5 /tmp/lcs-venv/bin/python bench/simulate/bench_lru.py \\
        --runs 7 --sizes 32 --json bench/simulate/results.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import libcachesim as lcs
import numpy as np
import numpy.typing as npt

from kvoffload.economics.stackdist import ReuseProfile, reuse_profile
from kvoffload.economics.traces import read_mooncake

ROOT = Path(__file__).resolve().parents[2]
# The two Mooncake traces as the repository holds them (tests/support/traces.py names the same files).
TRACE_FILES = {
    "mooncake-conversation.jsonl": ROOT / "lab" / "kvoffload_lab" / "data" / "mooncake-conversation.jsonl.gz",
    "mooncake-synthetic.jsonl": ROOT / "tests" / "data" / "traces" / "mooncake-synthetic.jsonl.gz",
}
TRACES = ("mooncake-conversation.jsonl", "mooncake-synthetic.jsonl")
README_SIZES = (1_000, 4_000, 16_000, 64_000)
HASHPOWERS = (12, 14, 16, 18, 20)  # libCacheSim's default, 24, spends most of a run allocating 2^24 buckets

ORACLE_GENERAL = np.dtype([("time", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """``fn()``, its wall seconds and its CPU seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def write_oracle_general(blocks: npt.NDArray[np.int64], path: Path) -> None:
    """The stream as libCacheSim's oracleGeneral records: one access per record, size 1."""
    records = np.zeros(blocks.size, dtype=ORACLE_GENERAL)
    records["time"] = np.arange(blocks.size)
    records["id"] = blocks
    records["size"] = 1
    records["next"] = -1
    records.tofile(path)


def lcs_lru(reader: Any, blocks: int, hashpower: int) -> float:
    """libCacheSim's LRU of ``blocks`` blocks over the whole trace: its hit ratio."""
    miss_ratio, _ = lcs.LRU(blocks, hashpower=hashpower).process_trace(reader)
    return 1.0 - float(miss_ratio)


def ours(blocks: npt.NDArray[np.int64], sizes: list[int]) -> tuple[ReuseProfile, list[float]]:
    profile = reuse_profile(blocks)
    return profile, profile.hit_ratios(sizes)


def tune_hashpower(reader: Any, size: int) -> int:
    """The fastest initial hash-table size for this cache size (libCacheSim grows it as needed)."""
    cpu = {}
    for power in HASHPOWERS:
        cpu[power] = min(timed(lambda power=power: lcs_lru(reader, size, power))[2] for _ in range(2))
    return min(cpu, key=cpu.__getitem__)


def bench_trace(path: Path, sweep: int, runs: int, workdir: Path) -> dict[str, Any]:
    trace, parse_wall, _ = timed(lambda: read_mooncake(path))
    blocks = trace.blocks
    unique = int(np.unique(blocks).size)
    sizes = sorted({round(float(s)) for s in np.geomspace(100, unique, sweep)})
    binary = workdir / (path.stem + ".oracleGeneral.bin")
    write_oracle_general(blocks, binary)
    reader = lcs.TraceReader(str(binary), lcs.TraceType.ORACLE_GENERAL_TRACE)
    print(f"{path.name}: {blocks.size:,} accesses, {unique:,} unique, {len(sizes)} sizes; tuning", file=sys.stderr)
    hashpower = {size: tune_hashpower(reader, size) for size in sizes}

    ours_wall, ours_cpu = [], []
    lcs_wall: list[list[float]] = []
    lcs_cpu: list[list[float]] = []
    lcs_hits: list[float] = []
    for run in range(runs):
        (profile, our_hits), wall, cpu = timed(lambda: ours(blocks, sizes))
        ours_wall.append(wall)
        ours_cpu.append(cpu)
        walls, cpus, hits = [], [], []
        for size in sizes:
            ratio, wall, cpu = timed(lambda size=size: lcs_lru(reader, size, hashpower[size]))
            walls.append(wall)
            cpus.append(cpu)
            hits.append(ratio)
        lcs_wall.append(walls)
        lcs_cpu.append(cpus)
        lcs_hits = hits
        print(
            f"  run {run + 1}: ours {ours_wall[-1] * 1e3:.1f} ms, libCacheSim {sum(walls) * 1e3:.0f} ms",
            file=sys.stderr,
        )

    n = blocks.size
    agree = all(profile.hits(size) == round(ratio * n) for size, ratio in zip(sizes, lcs_hits, strict=True))
    per_size_wall = [statistics.median(run[i] for run in lcs_wall) for i in range(len(sizes))]
    per_size_cpu = [statistics.median(run[i] for run in lcs_cpu) for i in range(len(sizes))]
    sweep_wall = statistics.median(sum(run) for run in lcs_wall)
    sweep_cpu = statistics.median(sum(run) for run in lcs_cpu)
    readme = [
        {"blocks": size, "ours": profile.hit_ratio(size), "libcachesim": lcs_lru(reader, size, 18)}
        for size in README_SIZES
    ]
    return {
        "trace": path.name,
        "accesses": int(n),
        "unique": unique,
        "parse_wall_s": parse_wall,
        "infinite": profile.hit_ratio(),
        "readme_sizes": readme,
        "sizes": sizes,
        "hashpower": [hashpower[size] for size in sizes],
        "ours_hit_ratio": our_hits,
        "libcachesim_hit_ratio": lcs_hits,
        "hits_agree_exactly": agree,
        "ours_wall_s": {"median": statistics.median(ours_wall), "runs": ours_wall},
        "ours_cpu_s": {"median": statistics.median(ours_cpu), "runs": ours_cpu},
        "libcachesim_sweep_wall_s": {"median": sweep_wall, "runs": [sum(run) for run in lcs_wall]},
        "libcachesim_sweep_cpu_s": {"median": sweep_cpu, "runs": [sum(run) for run in lcs_cpu]},
        "libcachesim_per_size_wall_s": per_size_wall,
        "libcachesim_per_size_cpu_s": per_size_cpu,
        "sweep_ratio_wall": sweep_wall / statistics.median(ours_wall),
        "sweep_ratio_cpu": sweep_cpu / statistics.median(ours_cpu),
    }


def report(result: dict[str, Any]) -> str:
    """Markdown: timings, then the hit ratios side by side."""
    ours_ms = result["ours_wall_s"]["median"] * 1e3
    ours_cpu_ms = result["ours_cpu_s"]["median"] * 1e3
    per_size = result["libcachesim_per_size_wall_s"]
    lines = [
        f"### {result['trace']}: {result['accesses']:,} accesses, {result['unique']:,} unique blocks",
        "",
        "| | wall, median | CPU, median |",
        "|---|---:|---:|",
        f"| kvoffload, one pass, all {len(result['sizes'])} sizes | {ours_ms:.1f} ms | {ours_cpu_ms:.1f} ms |",
        f"| libCacheSim LRU, the {len(result['sizes'])} sizes one by one "
        f"| {result['libcachesim_sweep_wall_s']['median'] * 1e3:.0f} ms "
        f"| {result['libcachesim_sweep_cpu_s']['median'] * 1e3:.0f} ms |",
        f"| ratio (libCacheSim / kvoffload) | {result['sweep_ratio_wall']:.1f}× | {result['sweep_ratio_cpu']:.1f}× |",
        f"| libCacheSim, one size: fastest / slowest | {min(per_size) * 1e3:.1f} / {max(per_size) * 1e3:.1f} ms | "
        f"{min(result['libcachesim_per_size_cpu_s']) * 1e3:.1f} / "
        f"{max(result['libcachesim_per_size_cpu_s']) * 1e3:.1f} ms |",
        f"| JSONL parse (kvoffload reader, once) | {result['parse_wall_s'] * 1e3:.0f} ms | |",
        "",
        f"Hit counts agree exactly at every size: **{'yes' if result['hits_agree_exactly'] else 'NO'}**.",
        "",
        "| blocks | kvoffload | libCacheSim | libCacheSim wall, median |",
        "|---:|---:|---:|---:|",
    ]
    for size, mine, theirs, wall in zip(
        result["sizes"], result["ours_hit_ratio"], result["libcachesim_hit_ratio"], per_size, strict=True
    ):
        lines.append(f"| {size:,} | {100 * mine:.2f}% | {100 * theirs:.2f}% | {wall * 1e3:.1f} ms |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--sizes", type=int, default=32, help="sizes in the sweep, 100 blocks to the unique count")
    parser.add_argument(
        "--traces", type=Path, default=None, help="a folder holding the traces, plain; default: the repository's"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as workdir:
        for name in TRACES:
            path = args.traces / name if args.traces else TRACE_FILES[name]
            results.append(bench_trace(path, args.sizes, args.runs, Path(workdir)))
    for result in results:
        print(report(result), end="\n\n")
    if args.json:
        meta = {
            "runs": args.runs,
            "python": platform.python_version(),
            "numpy": np.__version__,
            "libcachesim": importlib.metadata.version("libcachesim"),
            "machine": platform.machine(),
        }
        args.json.write_text(json.dumps({"meta": meta, "traces": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
