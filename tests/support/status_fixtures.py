"""KVOffloadPolicy objects in every phase, captured from real runs of the operator, for the GitOps health tests.

Each fixture in ``tests/data/status/`` is a whole policy object as the emulated API server served it
(metadata, spec and the status the operator wrote) while the operator (``kvoffload run``, kopf inside)
drove the local lab: real Prometheus scraping emulated engines under load, the kubelet stand-in
running the rendered pods. Regenerate them all, from the repository root (a few minutes):

    python -m tests.support.status_fixtures [--only NAME ...]

:func:`load` reads one; :data:`CAPTURES` says how each was made (``tests/data/status/README.md``
repeats it).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvoffload.api.conventions import API_GROUP, API_VERSION, KIND
from kvoffload.cli import control
from kvoffload_lab.cluster.laboperator import start_operator, stop_operator
from kvoffload_lab.cluster.localcluster import LocalCluster
from tests.support.cluster import ENGINE_GPU_KV_BLOCKS, load_on
from tests.support.paths import DATA

STATUS_DIR = DATA / "status"
POLICY_API_VERSION = f"{API_GROUP}/{API_VERSION}"
NAMESPACE = "default"
Obj = dict[str, Any]


@dataclass(frozen=True)
class Capture:
    name: str
    """The file is ``tests/data/status/<name>.json``."""
    how: str


CAPTURES: tuple[Capture, ...] = (
    Capture("pending", "applied while the operator was stopped: only the CRD's status default, observedGeneration 0"),
    Capture("baseline", "the first status the operator wrote with phase Baseline (GPU-only fleet measured)"),
    Capture("canary", "phase Canary with the cpu canary Ready, under load"),
    Capture("promoting", "phase Promoting: the cpu level on 100% of the replicas, step 1"),
    Capture("stable", "phase Stable at the top level (nvme) after the whole climb, under load"),
    Capture(
        "generation-lag",
        "the Stable policy after its spec changed (analysis.ttftP99) while the operator was stopped: "
        "metadata.generation 2, status.observedGeneration 1",
    ),
    Capture(
        "paused-by-person", "`kvoffload pause` (kvoffload.io/pause) during the cpu canary: phase Paused, Paused True"
    ),
    Capture(
        "paused-inconclusive",
        "Prometheus stopped during the cpu canary (maxInconclusive 4): phase Paused, AnalysisInconclusive True",
    ),
    Capture("rolled-back", "every nvme canary engine 10x slower (a sticky fault): phase RolledBack, Stalled True"),
    Capture("invalid", "a policy naming an unknown GPU class (spec.gpu.class): phase Invalid, Stalled True"),
)
NAMES = tuple(c.name for c in CAPTURES)


def path_of(name: str) -> Path:
    return STATUS_DIR / f"{name}.json"


def load(name: str) -> Obj:
    """A captured policy object (a fresh copy)."""
    data: Obj = json.loads(path_of(name).read_text())
    return data


# --- the policy the runs use --------------------------------------------------------------


def policy(name: str, prometheus_url: str, *, gpu_class: str = "nvidia-l4", max_inconclusive: int = 10) -> Obj:
    """A two-tier policy (CPU 256Mi, then NVMe) with every duration shrunk to seconds, as in the e2e tests."""
    return {
        "apiVersion": POLICY_API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": {
                "name": "Qwen/Qwen3-0.6B",
                "servedModelName": name,
                "image": "vllm/vllm-openai:v0.32.0",
                "maxModelLen": 4096,
            },
            "gpu": {"class": gpu_class, "count": 1},
            "replicas": 2,
            "resources": {"baseMemory": "4Gi", "headroom": "1Gi", "cpu": "2"},
            "offload": {
                "backend": "native",
                "cpu": "256Mi",
                "secondaryTiers": [
                    {
                        "name": "nvme",
                        "size": "4Gi",
                        "path": "/mnt/kv-cache",
                        "volume": {"emptyDir": {"sizeLimit": "5Gi"}},
                    }
                ],
            },
            "rollout": {
                "canaryReplicas": 1,
                "maxSurge": 1,
                "baselineDuration": "4s",
                "stepDuration": "6s",
                "promotionSteps": [100],
                "progressDeadline": "30s",
            },
            "analysis": {
                "interval": "1s",
                "window": "6s",
                "ttftP99": "500ms",
                "itlP99": "200ms",
                # As in tests/lab/test_e2e.py: a healthy nvme canary's p99 reached 3.19× the cpu stable's under
                # a full CI run's load, and the injected regression (TTFT ×10) stays far above 5.
                "maxRegression": 5.0,
                "minExternalShare": 0.02,
                "sustainedFor": "4s",
                "minRequests": 3,
                "maxInconclusive": max_inconclusive,
                # As in tests/lab/test_e2e.py: at the lab's 256-token prefixes an nvme restore costs more than
                # recomputing, which the live payoff would gate; these scenarios test the operator.
                "payoff": "report",
            },
            "prometheus": {"url": prometheus_url},
        },
    }


# --- the runs ---------------------------------------------------------------------------


class CaptureFailed(RuntimeError):
    """A run did not reach the state a fixture needs (the message says where it went instead)."""


class Runner:
    """One local cluster and one operator process; each scenario captures into ``out``."""

    def __init__(self, cluster: LocalCluster, out: dict[str, Obj]) -> None:
        self.cluster = cluster
        self.out = out
        self.operator = start_operator(cluster)

    def read(self, name: str) -> Obj | None:
        return self.cluster.get(POLICY_API_VERSION, KIND, NAMESPACE, name)

    def status(self, name: str) -> Obj:
        return (self.read(name) or {}).get("status") or {}

    async def until(self, name: str, check: Callable[[Obj], bool], what: str, timeout: float = 120.0) -> Obj:
        """Poll the policy until ``check(obj)``; CaptureFailed naming the phase it was in at the deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            obj = self.read(name)
            if obj is not None and check(obj):
                return copy.deepcopy(obj)
            if loop.time() >= deadline:
                status = (obj or {}).get("status") or {}
                raise CaptureFailed(
                    f"{name}: no {what} in {timeout:.0f}s; phase {status.get('phase')}: {status.get('message', '')}"
                )
            await asyncio.sleep(0.1)  # a poll interval: the emulator serves from this loop meanwhile

    async def restart_operator(self, between: Callable[[], Awaitable[None]]) -> None:
        await stop_operator(self.operator)
        await between()
        self.operator = start_operator(self.cluster)

    async def close(self) -> None:
        await stop_operator(self.operator)

    async def remove(self, name: str) -> None:
        await self.cluster.delete(POLICY_API_VERSION, KIND, NAMESPACE, name)
        await self.until_gone(name)

    async def until_gone(self, name: str, timeout: float = 30.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.read(name) is not None:
            if loop.time() >= deadline:
                raise CaptureFailed(f"{name} was not deleted in {timeout:.0f}s")
            await asyncio.sleep(0.1)


def phase_is(*phases: str) -> Callable[[Obj], bool]:
    return lambda obj: (obj.get("status") or {}).get("phase") in phases


def condition_true(obj: Obj, type_: str) -> bool:
    return any(
        c.get("type") == type_ and c.get("status") == "True" for c in (obj.get("status") or {}).get("conditions", [])
    )


def canary_ready_on(level: str) -> Callable[[Obj], bool]:
    def check(obj: Obj) -> bool:
        status = obj.get("status") or {}
        canary, ladder = status.get("canary") or {}, status.get("ladder") or []
        return (
            status.get("phase") == "Canary"
            and bool(canary)
            and ladder[canary["level"]] == level
            and canary.get("ready", 0) >= 1
        )

    return check


async def climb(run: Runner) -> None:
    """pending, baseline, canary, promoting, stable, generation-lag: one policy's whole life."""
    name = "climb"
    doc = policy(name, run.cluster.prometheus.url)

    async def apply_unseen() -> None:
        await run.cluster.apply(doc)
        run.out["pending"] = copy.deepcopy(run.read(name) or {})

    # Applied while no operator runs: what a GitOps tool sees before the operator's first write.
    await run.restart_operator(apply_unseen)
    async with load_on(run.cluster, name):
        run.out["baseline"] = await run.until(name, phase_is("Baseline"), "Baseline")
        run.out["canary"] = await run.until(name, canary_ready_on("cpu"), "a Ready cpu canary")
        run.out["promoting"] = await run.until(name, phase_is("Promoting"), "Promoting")
        stable = await run.until(name, phase_is("Stable", "RolledBack"), "the end of the climb")
        if stable["status"]["phase"] != "Stable":
            raise CaptureFailed(f"{name} rolled back: {stable['status'].get('message')}")
        run.out["stable"] = stable

        async def change_spec() -> None:
            current = run.read(name)
            assert current is not None
            await run.cluster.emulator.patch_object(
                POLICY_API_VERSION, KIND, NAMESPACE, name, {"spec": {"analysis": {"ttftP99": "600ms"}}}
            )
            lagging = run.read(name) or {}
            if lagging["metadata"]["generation"] != current["metadata"]["generation"] + 1:
                raise CaptureFailed("the spec change did not bump metadata.generation")
            run.out["generation-lag"] = copy.deepcopy(lagging)

        await run.restart_operator(change_spec)
    await run.remove(name)


async def paused_by_person(run: Runner) -> None:
    name = "paused"
    await run.cluster.apply(policy(name, run.cluster.prometheus.url))
    async with load_on(run.cluster, name):
        await run.until(name, canary_ready_on("cpu"), "a Ready cpu canary")
        api = control.connect(run.cluster.kubeconfig)
        await asyncio.to_thread(control.request, api, NAMESPACE, name, "pause")  # as `kvoffload pause` does
        run.out["paused-by-person"] = await run.until(
            name, lambda obj: phase_is("Paused")(obj) and condition_true(obj, "Paused"), "a manual pause"
        )
    await run.remove(name)


async def rolled_back(run: Runner) -> None:
    name = "rollback"
    await run.cluster.set_faults(
        f"kvoffload.io/policy={name},kvoffload.io/level=nvme",
        {"ttft_multiplier": 10},
        sticky=True,
    )
    await run.cluster.apply(policy(name, run.cluster.prometheus.url))
    async with load_on(run.cluster, name):
        run.out["rolled-back"] = await run.until(name, phase_is("RolledBack"), "RolledBack")
    run.cluster.kubelet.engines.clear_sticky_faults()
    await run.remove(name)


async def invalid(run: Runner) -> None:
    name = "broken"
    await run.cluster.apply(policy(name, run.cluster.prometheus.url, gpu_class="nvidia-imaginary-9000"))
    run.out["invalid"] = await run.until(name, phase_is("Invalid"), "Invalid", timeout=30)
    await run.remove(name)


async def paused_inconclusive(run: Runner) -> None:
    """Last: it stops Prometheus for the whole cluster."""
    name = "blind"
    await run.cluster.apply(policy(name, run.cluster.prometheus.url, max_inconclusive=4))
    async with load_on(run.cluster, name):
        await run.until(name, canary_ready_on("cpu"), "a Ready cpu canary")
        await run.cluster.stop_prometheus()
        run.out["paused-inconclusive"] = await run.until(
            name,
            lambda obj: phase_is("Paused")(obj) and condition_true(obj, "AnalysisInconclusive"),
            "a pause on Inconclusive evidence",
        )


SCENARIOS: tuple[tuple[tuple[str, ...], Callable[[Runner], Awaitable[None]]], ...] = (
    (("invalid",), invalid),
    (("pending", "baseline", "canary", "promoting", "stable", "generation-lag"), climb),
    (("paused-by-person",), paused_by_person),
    (("rolled-back",), rolled_back),
    (("paused-inconclusive",), paused_inconclusive),
)


async def capture(only: set[str], attempts: int = 3) -> dict[str, Obj]:
    """Run the scenarios that make the fixtures in ``only``; a scenario that goes astray is run again."""
    out: dict[str, Obj] = {}
    for names, scenario in SCENARIOS:
        if not only & set(names):
            continue
        for attempt in range(1, attempts + 1):
            async with LocalCluster(engine_args=["--gpu-kv-blocks", str(ENGINE_GPU_KV_BLOCKS)]) as cluster:
                run = Runner(cluster, out)
                try:
                    await scenario(run)
                    break
                except CaptureFailed as exc:
                    print(f"attempt {attempt} of {scenario.__name__}: {exc}", file=sys.stderr)
                    if attempt == attempts:
                        raise
                finally:
                    await run.close()
    return out


def write(objects: dict[str, Obj]) -> list[Path]:
    STATUS_DIR.mkdir(parents=True, exist_ok=True)
    written = []
    for name, obj in objects.items():
        path = path_of(name)
        path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=NAMES, default=list(NAMES), help="fixtures to capture again")
    args = parser.parse_args(argv)
    objects = asyncio.run(capture(set(args.only)))
    for path in write({k: v for k, v in objects.items() if k in args.only}):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
