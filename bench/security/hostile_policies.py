"""What 32 hostile policies cost the operator's Prometheus clients: peak RSS, threads and cycle time (issue 33).

Command (about a minute on 2 cores):

    .venv/bin/python bench/security/hostile_policies.py --json bench/security/results-hostile.json

Each policy names a Prometheus of its own (as ``spec.prometheus.url`` may, where the admin lets tenants choose), all
of them local stand-ins from ``tests/support/hostile.py``, four policies to each kind:

- ``huge``: a 100 MiB answer, chunked; ``declared``: one with a 100 MiB Content-Length;
- ``gzip``: 100 MiB of spaces, gzipped to about 100 kB;
- ``error``: a 100 MiB error answer (HTTP 500);
- ``tarpit``: headers at once, then a byte a second, for ever; ``header-tarpit``: a header a byte a second;
- ``series``: a valid answer of 500,000 tiny series (15 MB, some 180 MiB once decoded);
- ``churn``: an honest Prometheus whose URL the policy changes every cycle (a new path each time).

One honest policy beside them asks an honest stand-in and records how long its answer took.

The operator's own code runs them: ``MeasurementHub`` with the ``PrometheusProvider`` factory ``kvoffload run``
uses, ``assign``/``present_names``/``measure`` per policy as ``Controller._measure`` calls them, every policy of a
cycle at once. Before the first cycle and after each: VmRSS, the peak (VmHWM, ``ru_maxrss``), the thread count (and
its peak, sampled every 20 ms), the providers kept, and the cycle's wall time.

The query deadline is ``--deadline`` (2 s by default, the timeout of the issue's tarpit, which then held for 13 s);
the operator's own is 10 s. A cycle is bounded by about (tarpit queries / query threads) x deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import platform
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "operator"))

from tests.support.hostile import HostileServer, vm_hwm_kib, vm_rss_kib  # noqa: E402

from kvoffload.analysis import hub as hub_module  # noqa: E402
from kvoffload.analysis import promhttp  # noqa: E402
from kvoffload.analysis.hub import MeasurementHub, PrometheusSource  # noqa: E402
from kvoffload.analysis.prometheus import PrometheusProvider  # noqa: E402
from kvoffload.analysis.queries import Target  # noqa: E402
from kvoffload.controller.heap import fix_mmap_threshold, malloc_trim  # noqa: E402
from kvoffload.engines.vllm.dialect import NEWEST  # noqa: E402

KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "huge": ("huge", {}),
    "declared": ("declared", {}),
    "gzip": ("gzip", {}),
    "error": ("huge", {"status": 500}),
    "tarpit": ("tarpit", {"drip": 1.0}),
    "header-tarpit": ("header-tarpit", {"drip": 1.0}),
    "series": ("series", {"size": 500_000}),
    "churn": ("answer", {}),
}
PER_KIND = 4


class ThreadPeak:
    """Samples ``threading.active_count()`` (less its own thread) until stopped."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench thread sampler", daemon=True)

    def __enter__(self) -> ThreadPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, operator_threads())


def operator_threads() -> int:
    """Threads of the process but the sampler: what the operator would run (the stand-ins have a process of their
    own)."""
    return sum(1 for t in threading.enumerate() if not t.name.startswith("bench"))


def snapshot() -> dict[str, int]:
    return {
        "vm_rss_kib": vm_rss_kib(),
        "vm_hwm_kib": vm_hwm_kib(),
        "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "threads": operator_threads(),
    }


def serve(urls: Any, stop: Any) -> None:
    """The stand-ins, in a process of their own: their buffers must not count as the operator's memory."""
    servers = {kind: HostileServer(mode, **kwargs).start() for kind, (mode, kwargs) in KINDS.items()}
    servers["honest"] = HostileServer("answer").start()
    urls.put({kind: server.url for kind, server in servers.items()})
    stop.wait()
    for server in servers.values():
        server.close()


async def run(cycles: int, deadline: float, urls: dict[str, str], default_threshold: bool) -> dict[str, Any]:
    made = 0

    def factory(source: PrometheusSource) -> PrometheusProvider:  # as controller/handlers.py's run_operator
        nonlocal made
        made += 1
        return PrometheusProvider(source.url, bearer_token=source.bearer_token, timeout=deadline)

    hub = MeasurementHub(factory)
    policies = [(f"{kind}-{i}", kind) for kind in KINDS for i in range(PER_KIND)]
    errors: dict[str, str] = {}

    async def one(uid: str, url: str) -> tuple[str, float, str | None]:
        started = time.monotonic()
        source = PrometheusSource(url)
        target = Target("tenant", uid, dialect=NEWEST)
        hub.assign(uid, source)
        await hub.present_names(source, time.time())
        result = await hub.measure(target, source)
        return uid, time.monotonic() - started, result.error

    before = snapshot()
    rows: list[dict[str, Any]] = []
    with ThreadPeak() as peak:
        for cycle in range(cycles):
            started = time.monotonic()
            jobs = [
                one(uid, f"{urls[kind]}/{uid}" + (f"/edit{cycle}" if kind == "churn" else "")) for uid, kind in policies
            ]
            jobs.append(one("honest", urls["honest"]))
            answers = await asyncio.gather(*jobs)
            took = time.monotonic() - started
            for uid, _, error in answers:
                kind = uid.rsplit("-", 1)[0]
                if error is not None:
                    errors.setdefault(kind, error)
            honest_s = next(seconds for uid, seconds, _ in answers if uid == "honest")
            longest_policy = max(seconds for _, seconds, _ in answers)
            rows.append(
                {
                    "cycle": cycle,
                    "seconds": round(took, 2),
                    "longest_policy_seconds": round(longest_policy, 2),
                    "honest_policy_seconds": round(honest_s, 2),
                    "providers_kept": hub.provider_count,
                    **snapshot(),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
        for uid, _ in policies:  # every policy deleted
            hub.forget(uid)
        hub.forget("honest")
    after = snapshot()
    trim = malloc_trim()  # as the operator's tend_heap does every few minutes: what is kept, not merely cached
    if trim is not None:
        trim()
    trimmed = snapshot()
    return {
        "policies": len(policies),
        "honest_policies": 1,
        "cycles": cycles,
        "deadline_seconds": deadline,
        "fixed_mmap_threshold": not default_threshold,
        "caps": {
            "answer_bytes": promhttp.MAX_ANSWER_BYTES,
            "answer_series": promhttp.MAX_ANSWER_SERIES,
            "error_bytes": promhttp.MAX_ERROR_BYTES,
            "query_threads": promhttp.QUERY_THREADS,
            "analysis_threads": hub_module.ANALYSIS_THREADS,
            "max_providers": hub_module.MAX_PROVIDERS,
        },
        "before": before,
        "after": after,
        "after_malloc_trim": trimmed,
        "peak_threads": peak.peak,
        "providers_made": made,
        "providers_kept_after_deletion": hub.provider_count,
        "longest_cycle_seconds": max(r["seconds"] for r in rows),
        "cycles_detail": rows,
        "errors_by_kind": errors,
        "machine": {"python": platform.python_version(), "cpus": len(__import__("os").sched_getaffinity(0))},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--deadline", type=float, default=2.0, help="each query's total deadline, seconds")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--glibc-default-mmap-threshold",
        action="store_true",
        help="leave glibc's dynamic mmap threshold (the operator fixes it at 1 MiB: controller/heap.py)",
    )
    args = parser.parse_args()
    if not args.glibc_default_mmap_threshold:
        fix_mmap_threshold()  # as kvoffload run does (tend_heap)
    urls: Any = multiprocessing.Queue()
    stop = multiprocessing.Event()
    servers = multiprocessing.Process(target=serve, args=(urls, stop), daemon=True)
    servers.start()
    try:
        results = asyncio.run(run(args.cycles, args.deadline, urls.get(timeout=60), args.glibc_default_mmap_threshold))
    finally:
        stop.set()
        servers.join(10)
    before, after = results["before"], results["after"]
    print(
        f"RSS {before['vm_rss_kib'] >> 10} -> {after['vm_rss_kib'] >> 10} MiB "
        f"({results['after_malloc_trim']['vm_rss_kib'] >> 10} MiB after malloc_trim), "
        f"peak {after['vm_hwm_kib'] >> 10} MiB (ru_maxrss {after['ru_maxrss_kib'] >> 10} MiB); "
        f"threads {before['threads']} -> {after['threads']}, peak {results['peak_threads']}; "
        f"providers made {results['providers_made']}, kept after deletion {results['providers_kept_after_deletion']}; "
        f"longest cycle {results['longest_cycle_seconds']} s"
    )
    for kind, error in sorted(results["errors_by_kind"].items()):
        print(f"  {kind}: {error}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
