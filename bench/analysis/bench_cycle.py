"""One analysis cycle for 1, 100 and 1,000 policies (2 variants each) against the real Prometheus.

For each fleet size a fresh Prometheus scrapes one synthetic exporter
(tests/support/prometheus.py: ``SyntheticFleet``) that serves the vLLM series of
every (policy, variant) with its policy/variant/namespace/pod labels, as the
PodMonitor would give them. Once a whole window of samples is in, the provider
measures every policy at once, several times. Reported per size: the queries
per cycle, the median cycle latency, and the provider's memory (tracemalloc
peak inside a cycle, and the process RSS growth over the runs).

    .venv/bin/python bench/analysis/bench_cycle.py [--sizes 1,100,1000] [--runs 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import requests  # noqa: E402
from tests.support.prometheus import PrometheusServer, SyntheticEngine, SyntheticFleet, synthetic_target  # noqa: E402

from kvoffload.analysis.prometheus import PrometheusProvider  # noqa: E402
from kvoffload.analysis.queries import build_queries  # noqa: E402
from kvoffload.engines.vllm.dialect import NEWEST  # noqa: E402

WINDOW = "20s"
SCRAPE_INTERVAL_S = 2.0


def rss_bytes() -> int:
    """Resident set size of this process now (Linux)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096


def fleet_for(policies: int) -> list[SyntheticEngine]:
    engines: list[SyntheticEngine] = []
    for i in range(policies):
        name = f"policy-{i:04d}"
        engines.append(
            SyntheticEngine(
                name,
                "canary",
                requests_per_s=5 + i % 7,
                ttft_s=0.3,
                external_share=0.2,
                host_tokens_per_s=100,
                load_bytes_per_s=1e9,
                offloading_size="32.0",
            )
        )
        engines.append(SyntheticEngine(name, "stable", requests_per_s=15 + i % 5, ttft_s=0.2))
    return engines


def serve_fleet(policies: int, address: Any) -> None:
    """Child process: the exporter, kept out of the measured process's memory and CPU."""
    fleet = SyntheticFleet(fleet_for(policies))
    address.send((fleet.address, fleet.series))
    threading.Event().wait()


def prometheus_eval_seconds(url: str) -> float:
    """Prometheus's own evaluation time for one cycle's queries (its ``stats`` timings)."""
    total = 0.0
    for query in build_queries(WINDOW, NEWEST):
        answer = requests.get(f"{url}/api/v1/query", params={"query": query.expr, "stats": "all"}, timeout=60)
        total += float(answer.json()["data"]["stats"]["timings"]["evalTotalTime"])
    return total


def bench_size(policies: int, runs: int, workdir: Path, naive_max: int) -> dict[str, Any]:
    parent, child = multiprocessing.Pipe()
    exporter = multiprocessing.Process(target=serve_fleet, args=(policies, child), daemon=True)
    exporter.start()
    address, series = parent.recv()
    server = PrometheusServer(workdir / f"prometheus-{policies}", scrape_interval=SCRAPE_INTERVAL_S)
    server.workdir.mkdir()
    server.start()
    try:
        server.add_targets([(address, {})])
        # Wait until every policy has samples across the whole window (increase() would extrapolate otherwise).
        server.wait_for_series(
            f"count(count_over_time(vllm:time_to_first_token_seconds_count[{WINDOW}]) >= 10)",
            deadline=180,
            check=lambda r: float(r[0]["value"][1]) >= 2 * policies,
        )
        provider = PrometheusProvider(server.url, timeout=60)
        targets = [synthetic_target("llm", f"policy-{i:04d}", WINDOW) for i in range(policies)]

        provider.measure(targets)  # warm the connection and Prometheus's caches
        latencies: list[float] = []
        queries: list[int] = []
        rss_before = rss_bytes()
        for _ in range(runs):
            before = provider.queries
            start = time.perf_counter()
            result = provider.measure(targets)
            latencies.append(time.perf_counter() - start)
            queries.append(provider.queries - before)
            assert len(result) == policies
            bad = [k for k, m in result.items() if m.error or m.canary is None or m.canary.requests is None]
            assert not bad, f"{len(bad)} policies without data, e.g. {bad[:3]}"
        # tracemalloc slows allocation down: one separate cycle for the peak, outside the timings.
        tracemalloc.start()
        provider.measure(targets)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        rss_after = rss_bytes()

        # The same Prometheus, one policy asked for: the queries still cover the whole fleet.
        one_latencies = []
        for _ in range(runs):
            start = time.perf_counter()
            provider.measure(targets[:1])
            one_latencies.append(time.perf_counter() - start)
        # For comparison: one query set per policy (what this design avoids), through the same provider.
        naive: dict[str, Any] = {}
        if policies <= naive_max:
            per_policy = [
                synthetic_target("llm", t.policy, WINDOW, extra_matchers=f'kvoffload_io_policy="{t.policy}"')
                for t in targets
            ]
            before = provider.queries
            start = time.perf_counter()
            provider.measure(per_policy)
            naive = {"naive_cycle_s": time.perf_counter() - start, "naive_queries": provider.queries - before}
        eval_s = statistics.median(prometheus_eval_seconds(server.url) for _ in range(3))
        provider.close()
        return {
            "policies": policies,
            "series": series,
            "prometheus_eval_s": eval_s,
            **naive,
            "queries_per_cycle": sorted(set(queries)),
            "cycle_median_s": statistics.median(latencies),
            "cycle_runs_s": latencies,
            "one_target_median_s": statistics.median(one_latencies),
            "tracemalloc_peak_bytes": peak,
            "rss_delta_bytes": rss_after - rss_before,
        }
    finally:
        server.stop()
        exporter.terminate()
        exporter.join(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,100,1000")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--naive-max", type=int, default=100, help="Also time per-policy queries up to this size.")
    parser.add_argument("--json", type=Path, default=None, help="Also write the figures here.")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvoffload-bench-") as tmp:
        for size in sizes:
            row = bench_size(size, args.runs, Path(tmp), args.naive_max)
            rows.append(row)
            print(
                f"{size:>5} policies  {row['series']:>7} series  queries/cycle {row['queries_per_cycle']}  "
                f"cycle median {row['cycle_median_s'] * 1000:8.1f} ms  "
                f"(Prometheus eval {row['prometheus_eval_s'] * 1000:7.1f} ms; "
                f"1 target: {row['one_target_median_s'] * 1000:7.1f} ms)  "
                f"tracemalloc peak {row['tracemalloc_peak_bytes'] / 2**20:6.1f} MiB  "
                f"RSS delta {row['rss_delta_bytes'] / 2**20:6.1f} MiB",
                flush=True,
            )
            if "naive_cycle_s" in row:
                print(
                    f"{'':>5} per-policy queries instead: {row['naive_queries']} queries, "
                    f"{row['naive_cycle_s'] * 1000:.1f} ms",
                    flush=True,
                )
    if len(rows) > 1:
        ratio = rows[-1]["cycle_median_s"] / rows[0]["cycle_median_s"]
        print(f"cycle latency ratio {rows[-1]['policies']}/{rows[0]['policies']} policies: {ratio:.1f}x")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
