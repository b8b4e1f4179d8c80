"""pytest fixtures: the local cluster (emulated API + real Prometheus + kubelet stand-in) and the operator.

``local_cluster`` is a running :class:`kvoffload.localcluster.LocalCluster` in the test's
event loop, with small GPU KV caches on its engines so offloading pays. :func:`either_cluster`
gives the same on the real control plane (:class:`kvoffload_lab.cluster.kubecluster.KubeCluster`
on the session's ``control_plane``, in a namespace of its own): a test module that overrides
``local_cluster`` with it, parametrized over :data:`APIS`, runs each test on both. ``operator`` starts
``kvoffload run -A --standalone`` against it as a subprocess (tests may SIGKILL it and call
``start_operator`` again); it is stopped at teardown, and its log is printed when a test fails.
Waits poll a condition with a deadline: :func:`eventually`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kvoffload.api.conventions import API_GROUP, API_VERSION, KIND
from kvoffload_lab.cluster.kubecluster import KubeCluster
from kvoffload_lab.cluster.labcluster import LabCluster
from kvoffload_lab.cluster.laboperator import start_operator, stop_operator
from kvoffload_lab.cluster.localcluster import LocalCluster
from kvoffload_lab.load import TraceRequest, replay
from tests.support.prometheus import require_prometheus

POLICY_API_VERSION = f"{API_GROUP}/{API_VERSION}"
# One prompt of reuse_trace(): the "GPU" keeps almost nothing, so the offload tiers are what serve reuse.
ENGINE_GPU_KV_BLOCKS = 24


async def eventually(check: Callable[[], Any], what: str, timeout: float = 30.0, poll: float = 0.2) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy; fail naming ``what`` at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if loop.time() >= deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last: {result!r})")
        await asyncio.sleep(poll)  # a poll interval; the loop keeps serving the emulator meanwhile


Cluster = LabCluster
"""Either local cluster: the emulated API or the real control plane, behind one interface."""

APIS = ("emulated", pytest.param("kube", marks=pytest.mark.kube))
"""``params`` for a fixture that runs on both APIs (the real one marked ``kube``)."""

_NAMESPACES = itertools.count(1)


def policy_of(cluster: Cluster, name: str, namespace: str | None = None) -> dict[str, Any] | None:
    return cluster.get(POLICY_API_VERSION, KIND, namespace or cluster.namespace, name)


def status_of(cluster: Cluster, name: str, namespace: str | None = None) -> dict[str, Any]:
    return (policy_of(cluster, name, namespace) or {}).get("status") or {}


@pytest.fixture
def cluster_engine_args() -> list[str]:
    """Extra ``kvoffload emulate`` arguments for every engine; override in a test module to change."""
    return ["--gpu-kv-blocks", str(ENGINE_GPU_KV_BLOCKS)]


@pytest_asyncio.fixture
async def local_cluster(tmp_path: Path, cluster_engine_args: list[str]) -> AsyncIterator[LocalCluster]:
    """A running local cluster for one test; every process it started is gone afterwards."""
    require_prometheus()
    async with LocalCluster(tmp_path / "cluster", engine_args=cluster_engine_args) as cluster:
        yield cluster
        assert not cluster.kubelet.errors, f"the kubelet stand-in failed: {cluster.kubelet.errors}"


@contextlib.asynccontextmanager
async def either_cluster(
    api: str, request: pytest.FixtureRequest, workdir: Path, engine_args: list[str]
) -> AsyncIterator[Cluster]:
    """A running local cluster on ``api`` (``emulated`` or ``kube``); every process it started is gone afterwards.

    On ``kube`` it shares the session's control plane, in a namespace of its own, and prices every
    engine as the emulated cluster does (the seed's laptop, not the Node's GPU class), so that the two
    runs of a scenario differ only in the API server and its controllers."""
    require_prometheus()
    cluster: Cluster
    if api == "emulated":
        async with LocalCluster(workdir, engine_args=engine_args) as cluster:
            yield cluster
    else:
        kube = request.getfixturevalue("control_plane")
        kube.sweep_workloads()
        plane = kube.plane
        namespace = f"e2e-{next(_NAMESPACES)}"
        async with KubeCluster(
            workdir, plane=plane, namespaces=[namespace], engine_args=engine_args, gpu_class_pricing=False
        ) as cluster:
            yield cluster
    assert not cluster.kubelet.errors, f"the kubelet stand-in failed: {cluster.kubelet.errors}"


class OperatorProcess:
    """The operator subprocess of a test: start, SIGKILL and restart it; the last one is stopped at teardown."""

    def __init__(
        self, cluster: Cluster, name: str = "operator", args: Sequence[str] = (), metrics_port: int = 0
    ) -> None:
        self.cluster = cluster
        self.name = name
        self.args = tuple(args)
        self.metrics_port = metrics_port
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.cluster.workdir / f"{self.name}.log"

    def start(self) -> subprocess.Popen[bytes]:
        """Start it; ``$POD_NAME`` is its name, as the chart's downward API gives a pod's."""
        self.process = start_operator(
            self.cluster,
            env={"POD_NAME": self.name},
            log_path=self.log_path,
            extra_args=self.args,
            metrics_port=self.metrics_port,
        )
        self.starts += 1
        return self.process

    def kill(self) -> None:
        """SIGKILL: no shutdown handlers run, as when a node dies."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 80) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    async def stop(self) -> None:
        if self.process is not None:
            await stop_operator(self.process)


@pytest_asyncio.fixture
async def operator(local_cluster: Cluster, request: pytest.FixtureRequest) -> AsyncIterator[OperatorProcess]:
    """``kvoffload run -A --standalone`` against the local cluster, started; stopped at teardown."""
    process = OperatorProcess(local_cluster)
    process.start()
    try:
        yield process
    finally:
        await process.stop()
        report = getattr(request.node, "rep_call", None)
        if report is None or report.failed:
            sys.stderr.write(f"--- operator log (tail) ---\n{process.log_tail()}\n")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the test item, so fixtures can tell whether the test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


__all__ = (
    "APIS",
    "ENGINE_GPU_KV_BLOCKS",
    "Cluster",
    "OperatorProcess",
    "cluster_engine_args",
    "either_cluster",
    "eventually",
    "load_on",
    "local_cluster",
    "operator",
    "policy_of",
    "reuse_trace",
    "status_of",
)


# --- load with prefix reuse the offload tiers can serve --------------------------------------

LOAD_SCALE = 0.5
"""Trace blocks of 256 tokens: a prompt is one shared 256-token prefix plus a 16-token unique tail."""


def reuse_trace(prefixes: int = 16, rate: float = 20.0, seconds: float = 600.0, seed: int = 7) -> list[TraceRequest]:
    """Requests at ``rate`` per second, each reusing one of ``prefixes`` shared prefixes at random.

    Sized for engines with a 24-block GPU cache (one prompt): the GPU keeps almost nothing,
    a 128Mi CPU tier about four prefixes, a 256Mi one about eight, and a filesystem tier all
    of them, so each tier of a two-tier ladder is hit within a few seconds.
    """
    rng = random.Random(seed)
    count = int(rate * seconds)
    return [
        TraceRequest(at=i / rate, input_length=544, output_length=4, hash_ids=(rng.randrange(prefixes), 10_000 + i))
        for i in range(count)
    ]


@contextlib.asynccontextmanager
async def load_on(cluster: Cluster, *policies: str, rate: float = 20.0) -> AsyncIterator[None]:
    """Replay :func:`reuse_trace` against each policy's ready engines (as its Service would) while inside."""
    tasks = [
        asyncio.create_task(
            replay(
                lambda name=name: cluster.endpoints(name),  # type: ignore[misc]
                reuse_trace(rate=rate),
                model=name,
                speedup=1.0,
                duration=600.0,
                scale=LOAD_SCALE,
                max_tokens=4,
            ),
            name=f"load on {name}",
        )
        for name in policies
    ]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
