"""Reaction time: from the first breaching sample to the rollback being applied.

Each run starts a fresh local cluster and the operator (``kvoffload run``) as a subprocess, applies a
one-tier policy (gpu-only -> cpu) with a long canary step, waits until the cpu canary is Ready and has
served traffic, then makes the canary engine answer 10x slower (``/emulator/faults``). The clock starts
when the first slow request to the canary completes (the first breaching observation an engine can
export) and stops when the canary level's Deployment (``bench-cpu``) is gone from the API (the rollback
applied); the time the status turns RolledBack is recorded too. The floor is what the rules allow at
best: ``sustainedFor + scrape interval + analysis.interval``.

``--api kube`` (the default) runs the real control plane (etcd, kube-apiserver and its controllers from
``.kube-bin``, with the Prometheus Operator writing the scrape configuration of Debian's Prometheus):
``KubeCluster``. ``--api emulated`` runs the emulated API (``LocalCluster``), as the 2026-11-29 figures
were taken. The API is watched, not polled, for the policy's status and the Deployments, and every run
records the chain in between (``timeline``): the fault, the first scrape that holds a slow request,
each analysis the operator wrote (its time, verdict and run of Fails), the decision, the Deployment's
deletion and the status; and the load average before and after the run.

    .venv/bin/python bench/reaction/bench_reaction.py [--api kube|emulated] [--runs 5] [--sustained-for 4] \
        [--interval 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from kvoffload_lab.cluster.apis import lab_cluster
from kvoffload_lab.cluster.kubeapi import KubeAPI, object_path
from kvoffload_lab.cluster.kubecluster import KubeCluster
from kvoffload_lab.cluster.labcluster import LabCluster
from kvoffload_lab.cluster.laboperator import start_operator, stop_operator
from kvoffload_lab.load import TraceRequest, prompt_tokens, replay
from kvoffload_lab.promserver import SCRAPE_INTERVAL_S

NAME = "bench"
NAMESPACE = "default"
API = "kvoffload.io/v1alpha1"
KIND = "KVOffloadPolicy"
CANARY_LEVEL = "cpu"
CANARY_DEPLOYMENT = f"{NAME}-{CANARY_LEVEL}"  # one Deployment per ladder level (<policy>-<level>) since 2026-12-01
TTFT_FACTOR = 10.0
SCALE = 0.5
SLOW_BUCKET = "0.1"
"""A TTFT bucket bound above the canary's normal TTFT and below its slowed one: a slow request is one over it."""


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
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(poll)  # poll interval of the condition above


def wall(monotonic: float) -> float:
    """A monotonic time of this process as wall-clock (epoch) seconds: the operator's status times are wall-clock."""
    return time.time() - (time.monotonic() - monotonic)


def epoch(stamp: str | None) -> float | None:
    """An RFC 3339 time of the status (``2026-12-05T19:03:01.123456Z``) as epoch seconds."""
    if not stamp:
        return None
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@contextlib.asynccontextmanager
async def api_client(cluster: LabCluster) -> AsyncIterator[KubeAPI]:
    """An aiohttp client of the cluster's API: the real one's (TLS, admin certificate) or one on the emulator."""
    if isinstance(cluster, KubeCluster):
        yield cluster.api
        return
    async with KubeAPI(cluster.url, None) as api:  # type: ignore[arg-type]  # plain HTTP on loopback
        yield api


class Watcher:
    """Watches the policy and the namespace's Deployments, stamping each event with this process's monotonic
    clock the moment it arrives: every analysis the operator writes, the phase, and the canary's deletion."""

    def __init__(self, api: KubeAPI) -> None:
        self.api = api
        self.analyses: list[dict[str, Any]] = []
        self.phases: list[tuple[float, str]] = []
        self.deleted: float | None = None
        self.history: list[dict[str, Any]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._seen_times: set[str] = set()

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._follow(object_path(API, KIND, NAMESPACE), self._policy)),
            asyncio.create_task(self._follow(object_path("apps/v1", "Deployment", NAMESPACE), self._deployment)),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _follow(self, path: str, handle: Any) -> None:
        while True:
            try:
                async for event in self.api.watch(path):
                    handle(time.monotonic(), event)
            except asyncio.CancelledError:
                raise
            except (
                Exception
            ):  # the API server is still starting (429, 404 before the CRD is served), or the stream broke
                pass
            await asyncio.sleep(0.1)  # the stream ended: watch again

    def _policy(self, at: float, event: dict[str, Any]) -> None:
        obj = event.get("object") or {}
        if (obj.get("metadata") or {}).get("name") != NAME:
            return
        status = obj.get("status") or {}
        phase = status.get("phase")
        if phase and (not self.phases or self.phases[-1][1] != phase):
            self.phases.append((at, phase))
        last = status.get("lastAnalysis") or {}
        if last.get("time") and last["time"] not in self._seen_times:
            self._seen_times.add(last["time"])
            metrics = {m.get("name"): m for m in last.get("metrics") or []}
            self.analyses.append(
                {
                    "seen": at,
                    "time": epoch(last["time"]),
                    "verdict": last.get("verdict"),
                    "consecutive_failures": last.get("consecutiveFailures", 0),
                    "failing_since": epoch(last.get("failingSince")),
                    # None once the step is over (the RolledBack status has no warm-up any more)
                    "warm": bool(status["warmup"].get("warmAt")) if status.get("warmup") else None,
                    "ttft_p99_canary": (metrics.get("ttftP99") or {}).get("canary"),
                    "ttft_p99_stable": (metrics.get("ttftP99") or {}).get("stable"),
                }
            )
        self.history = list(status.get("history") or [])

    def _deployment(self, at: float, event: dict[str, Any]) -> None:
        obj = event.get("object") or {}
        if event.get("type") == "DELETED" and (obj.get("metadata") or {}).get("name") == CANARY_DEPLOYMENT:
            self.deleted = self.deleted or at

    def phase_at(self, phase: str) -> float | None:
        return next((at for at, seen in self.phases if seen == phase), None)


async def slow_scrapes(cluster: LabCluster) -> list[tuple[float, float]]:
    """The canary's raw TTFT samples of the last two minutes: (scrape time, requests over ``SLOW_BUCKET``)."""
    selector = f'kvoffload_io_policy="{NAME}",kvoffload_io_level="{CANARY_LEVEL}"'
    count = await asyncio.to_thread(
        cluster.prometheus.query, f"vllm:time_to_first_token_seconds_count{{{selector}}}[2m]"
    )
    fast = await asyncio.to_thread(
        cluster.prometheus.query, f'vllm:time_to_first_token_seconds_bucket{{{selector},le="{SLOW_BUCKET}"}}[2m]'
    )
    if len(count) != 1 or len(fast) != 1:
        return []
    fast_at = {float(t): float(v) for t, v in fast[0]["values"]}
    return [(float(t), float(v) - fast_at[float(t)]) for t, v in count[0]["values"] if float(t) in fast_at]


@contextlib.asynccontextmanager
async def fresh_cluster(api: str, workdir: Path) -> AsyncIterator[LabCluster]:
    # On kube, engines priced as on the emulated cluster (the seed's laptop, not the Node's GPU class), so the
    # two APIs' runs differ only in the API server and its controllers, as in the end-to-end tests.
    async with lab_cluster(
        api, workdir, engine_args=["--gpu-kv-blocks", "24"], kube={"gpu_class_pricing": False}
    ) as cluster:
        yield cluster


async def one_run(
    workdir: Path, *, api: str, interval: float, sustained_for: float, phase_rng: random.Random
) -> dict[str, Any]:
    load_before = os.getloadavg()
    async with fresh_cluster(api, workdir) as cluster, api_client(cluster) as client:
        operator = start_operator(cluster)
        watcher = Watcher(client)
        watcher.start()
        requests = trace()
        load = asyncio.create_task(
            replay(lambda: cluster.endpoints(NAME), requests, model=NAME, speedup=1.0, duration=600.0, scale=SCALE)
        )
        try:
            await cluster.apply(policy(cluster.prometheus.url, interval=interval, sustained_for=sustained_for))

            async def canary_serving() -> bool:
                found = await client.get(object_path(API, KIND, NAMESPACE, NAME))
                status = (found or {}).get("status") or {}
                analysis = status.get("lastAnalysis") or {}
                canary = status.get("canary") or {}
                # Warm (status.warmup.warmAt, since 2026-12-01): until then the canary/stable ratio is reported,
                # not gated, and a fault injected during the warm-up waits for its end, which is no reaction time.
                warm = bool((status.get("warmup") or {}).get("warmAt"))
                return bool(canary.get("ready")) and warm and analysis.get("verdict") == "Pass"

            await wait_for(canary_serving, "a Ready, warm cpu canary with a Pass verdict", 180, poll=0.2)
            (engine,) = cluster.pods(f"kvoffload.io/policy={NAME},kvoffload.io/level={CANARY_LEVEL}")
            # Inject at a random phase of the scrape and analysis cycles: waiting on a fresh
            # verdict above would otherwise always land just after an analysis.
            await asyncio.sleep(phase_rng.uniform(0.0, SCRAPE_INTERVAL_S + interval))
            injected = time.monotonic()
            await cluster.set_faults(f"kvoffload.io/level={CANARY_LEVEL}", {"ttft_multiplier": TTFT_FACTOR})
            # The first slow request: a probe straight to the canary engine.
            async with aiohttp.ClientSession() as session:
                body = {"model": NAME, "prompt": prompt_tokens(requests[0], SCALE), "max_tokens": 1}
                async with session.post(f"{engine.url}/v1/completions", json=body) as response:
                    await response.read()
            first_breach = time.monotonic()
            await wait_for(
                lambda: watcher.deleted is not None, f"the canary Deployment {CANARY_DEPLOYMENT} deleted", 60
            )
            applied = watcher.deleted
            assert applied is not None
            await wait_for(lambda: watcher.phase_at("RolledBack") is not None, "status RolledBack", 30)
            rolled_back = watcher.phase_at("RolledBack")
            assert rolled_back is not None
            scrapes = await slow_scrapes(cluster)
        finally:
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await load
            await watcher.stop()
            await stop_operator(operator)
    load_after = os.getloadavg()
    return {
        "slow_request_s": first_breach - injected,
        "reaction_s": applied - first_breach,
        "status_s": rolled_back - first_breach,
        "load_before": list(load_before),
        "load_after": list(load_after),
        "timeline": timeline(
            wall(injected), wall(first_breach), wall(applied), wall(rolled_back), scrapes, watcher, injected
        ),
    }


def timeline(
    injected: float,
    first_breach: float,
    applied: float,
    rolled_back: float,
    scrapes: list[tuple[float, float]],
    watcher: Watcher,
    injected_monotonic: float,
) -> dict[str, Any]:
    """The chain from the fault to the rollback, in seconds after the first slow request completed."""

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - first_breach, 3)

    before = [slow for at, slow in scrapes if at <= injected]
    baseline = before[-1] if before else 0.0
    series = next((at for at, slow in scrapes if at > injected and slow > baseline), None)
    after = [a for a in watcher.analyses if a["seen"] >= injected_monotonic - 2 * SCRAPE_INTERVAL_S]
    fails = [a for a in after if a["verdict"] == "Fail"]
    first_fail = fails[0]["failing_since"] if fails else None
    decision = next((epoch(h.get("time")) for h in reversed(watcher.history) if h.get("decision") == "Rollback"), None)
    return {
        "first_slow_request_epoch": round(first_breach, 3),
        "injected": rel(injected),
        "series_in_prometheus": rel(series),
        "first_fail_verdict": rel(first_fail),
        "decision": rel(decision),
        "deployment_deleted": rel(applied),
        "status_rolled_back": rel(rolled_back),
        "analyses": [
            {
                "time": rel(a["time"]),
                "seen": rel(wall(a["seen"])),
                "verdict": a["verdict"],
                "consecutive_failures": a["consecutive_failures"],
                "warm": a["warm"],
                "ttft_p99_canary": a["ttft_p99_canary"],
                "ttft_p99_stable": a["ttft_p99_stable"],
            }
            for a in after
        ],
    }


def describe(timeline: dict[str, Any]) -> str:
    def fmt(key: str) -> str:
        value = timeline.get(key)
        return "-" if value is None else f"{value:+.2f}"

    cycles = " ".join(
        f"{a['time']:+.2f}{(a['verdict'] or '?')[0]}{'(warming)' if a['warm'] is False else ''}"
        for a in timeline["analyses"]
        if a["time"] is not None
    )
    return (
        f"    injected {fmt('injected')}, in Prometheus {fmt('series_in_prometheus')}, first Fail "
        f"{fmt('first_fail_verdict')}, decided {fmt('decision')}, Deployment deleted {fmt('deployment_deleted')}, "
        f"RolledBack {fmt('status_rolled_back')}\n    analyses: {cycles}"
    )


STAGES = (
    ("scrape", "first slow request -> first scrape holding it", None, "series_in_prometheus"),
    ("first_fail", "that scrape -> first Fail verdict", "series_in_prometheus", "first_fail_verdict"),
    ("sustained", "first Fail -> the analysis that decided the rollback", "first_fail_verdict", "decision"),
    ("apply", "that analysis began -> canary Deployment deleted", "decision", "deployment_deleted"),
    ("status", "Deployment deleted -> status RolledBack", "deployment_deleted", "status_rolled_back"),
)
"""The chain from the first slow request to the status, as stages of a run's ``timeline``."""


def stages(timeline: dict[str, Any]) -> dict[str, float | None]:
    """Each stage's seconds, and ``period``: the mean time between the analyses after the fault."""
    out: dict[str, float | None] = {}
    for name, _, start, end in STAGES:
        begun = 0.0 if start is None else timeline.get(start)
        ended = timeline.get(end)
        out[name] = None if begun is None or ended is None else round(ended - begun, 3)
    times = [a["time"] for a in timeline["analyses"] if a["time"] is not None and a["time"] >= 0]
    out["period"] = round((times[-1] - times[0]) / (len(times) - 1), 3) if len(times) > 1 else None
    return out


def breakdown(paths: list[Path]) -> None:
    """Print each results file's runs stage by stage, with the median and the largest of each stage."""
    for path in paths:
        data = json.loads(path.read_text())
        summary = data["summary"]
        print(f"{path}: api {summary.get('api', 'emulated')}, floor {summary['floor_s']:g}s")
        rows = [stages(run["timeline"]) | {"reaction": run["reaction_s"]} for run in data["runs"] if "timeline" in run]
        if not rows:
            print("  (no timelines: runs from before 2026-12-05)")
            continue
        names = [*(name for name, *_ in STAGES), "period", "reaction"]
        print("  run " + " ".join(f"{name:>10}" for name in names))
        for i, row in enumerate(rows, 1):
            print(f"  {i:3} " + " ".join("         -" if row[n] is None else f"{row[n]:10.3f}" for n in names))
        for label, pick in (("med", statistics.median), ("max", max)):
            values = [pick([r[n] for r in rows if r[n] is not None] or [0.0]) for n in names]
            print(f"  {label} " + " ".join(f"{v:10.3f}" for v in values))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--api", choices=("kube", "emulated"), default="kube", help="the real API server or the emulated one"
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--interval", type=float, default=1.0, help="analysis.interval, seconds")
    parser.add_argument("--sustained-for", type=float, default=4.0, help="analysis.sustainedFor, seconds")
    parser.add_argument("--seed", type=int, default=1, help="seed of the injection phases")
    parser.add_argument("--json", type=Path, default=None, help="write the runs and the summary here")
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep each run's logs (operator, engines) under DIR/run-N"
    )
    parser.add_argument(
        "--breakdown", type=Path, nargs="+", default=None, help="print the stages of these results files, run nothing"
    )
    args = parser.parse_args()
    if args.breakdown:
        breakdown(args.breakdown)
        return
    floor = args.sustained_for + SCRAPE_INTERVAL_S + args.interval
    runs: list[dict[str, Any]] = []
    phase_rng = random.Random(args.seed)
    started = datetime.now().astimezone().isoformat(timespec="seconds")
    load_start = os.getloadavg()
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="kvoffload-reaction-") as tmp:
            workdir = args.keep / f"run-{i + 1}" if args.keep else Path(tmp)
            run = await one_run(
                workdir, api=args.api, interval=args.interval, sustained_for=args.sustained_for, phase_rng=phase_rng
            )
        run["ratio"] = run["reaction_s"] / floor
        runs.append(run)
        print(
            f"run {i + 1}: rollback applied {run['reaction_s']:.2f}s after the first slow request "
            f"(status RolledBack {run['status_s']:.2f}s), floor {floor:.1f}s, ratio {run['ratio']:.2f}; "
            f"load {run['load_before'][0]:.2f} -> {run['load_after'][0]:.2f}",
            flush=True,
        )
        run["stages"] = stages(run["timeline"])
        print(describe(run["timeline"]), flush=True)
        if args.json:  # every run as it ends: a bench stopped midway keeps what it measured
            write(args.json, args, floor, runs, started, load_start)
    summary = write(args.json, args, floor, runs, started, load_start)
    print(
        f"reaction over {len(runs)} runs: median {summary['median_reaction_s']:.2f}s "
        f"(ratio {summary['median_ratio']:.2f}), worst {summary['worst_reaction_s']:.2f}s "
        f"(ratio {summary['worst_ratio']:.2f}); floor {floor:.1f}s"
    )


def write(
    path: Path | None,
    args: argparse.Namespace,
    floor: float,
    runs: list[dict[str, Any]],
    started: str,
    load_start: tuple[float, float, float],
) -> dict[str, Any]:
    ratios = [r["ratio"] for r in runs]
    summary = {
        "api": args.api,
        "started": started,
        "command": " ".join(sys.argv),
        "floor_s": floor,
        "sustained_for_s": args.sustained_for,
        "interval_s": args.interval,
        "scrape_interval_s": SCRAPE_INTERVAL_S,
        "median_reaction_s": statistics.median(r["reaction_s"] for r in runs),
        "worst_reaction_s": max(r["reaction_s"] for r in runs),
        "median_ratio": statistics.median(ratios),
        "worst_ratio": max(ratios),
        "median_status_s": statistics.median(r["status_s"] for r in runs),
        "load_start": list(load_start),
        "load_end": list(os.getloadavg()),
    }
    if path is not None:
        path.write_text(json.dumps({"summary": summary, "runs": runs}, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
