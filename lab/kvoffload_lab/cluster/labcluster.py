"""The lab's cluster, whichever API serves it: what the tests and the demo drive.

:class:`LabCluster` is what both APIs share: the settings, the lifecycle (one async context manager
whose exit stops everything it started, a failed start included), the real Prometheus, the kubelet
stand-in that keeps the engines (:class:`LabKubelet`), and the engines' and Prometheus's controls.
Its two subclasses are the API:

- :class:`~kvoffload_lab.cluster.localcluster.LocalCluster`: the emulated API (kmock's, ``kubeemu``)
  in the caller's event loop;
- :class:`~kvoffload_lab.cluster.kubecluster.KubeCluster`: kube-apiserver and its controllers.

:func:`kvoffload_lab.cluster.apis.lab_cluster` picks one by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self, TypedDict

from kvoffload_lab.cluster.census import Census
from kvoffload_lab.cluster.engines import DEFAULT_TARGET_LABELS, Engines
from kvoffload_lab.cluster.kubeapi import Obj
from kvoffload_lab.cluster.podengine import LocalClusterError, PodEngine
from kvoffload_lab.promserver import SCRAPE_INTERVAL_S, PrometheusServer


class LabKubelet(Protocol):
    """The kubelet stand-in of either API: it runs each pod as an emulated engine and reports its status."""

    @property
    def engines(self) -> Engines: ...

    @property
    def census(self) -> Census: ...

    @property
    def errors(self) -> list[str]:
        """What went wrong in its loop (empty while all is well)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None:
        """Stop its loop and every engine."""
        ...

    def poke(self) -> None:
        """Reconcile now rather than at the next tick."""
        ...

    async def oom_kill(self, namespace: str, pod: str) -> None: ...


class ClusterSettings(TypedDict, total=False):
    """:class:`LabCluster`'s settings by keyword, for a constructor or factory that hands them on."""

    engine_args: Sequence[str]
    engine_env: Mapping[str, str] | None
    namespaces: Sequence[str]
    scrape_interval: float
    prometheus: bool
    target_labels: Sequence[str]


class LabCluster(ABC):
    """A lab cluster, as one async context manager: an API server, a real Prometheus and the kubelet stand-in.

    ``async with`` a subclass, then ``cluster.kubeconfig`` for the operator
    (:func:`~kvoffload_lab.cluster.laboperator.start_operator`), ``cluster.prometheus.url`` for the policy's
    ``spec.prometheus.url``, and ``cluster.endpoints(policy)`` for load. Everything it started is stopped on
    exit; the work directory (a temporary one, removed on exit, unless given) holds the Prometheus data and
    every engine's log. Each engine runs ``engine_args`` with ``engine_env``; the cluster's objects go in the
    first of ``namespaces``; Prometheus (unless ``prometheus`` is false) scrapes every ``scrape_interval``
    seconds, and ``target_labels`` are the pod labels each engine's series carry.
    """

    workdir_prefix: ClassVar[str] = "kvoffload-cluster-"
    """The name a temporary work directory starts with."""

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        engine_args: Sequence[str] = (),
        engine_env: Mapping[str, str] | None = None,
        namespaces: Sequence[str] = ("default",),
        scrape_interval: float = SCRAPE_INTERVAL_S,
        prometheus: bool = True,
        target_labels: Sequence[str] = DEFAULT_TARGET_LABELS,
    ) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix=self.workdir_prefix)) if workdir is None else workdir
        self.engine_args = list(engine_args)
        self.engine_env = dict(engine_env or {})
        self.namespaces = list(namespaces)
        self.scrape_interval = scrape_interval
        self.with_prometheus = prometheus
        self.target_labels = tuple(target_labels)
        self._stack = contextlib.AsyncExitStack()
        self._prometheus: PrometheusServer | None = None
        self._kubelet: LabKubelet | None = None

    # --- what each API gives ------------------------------------------------------------------

    @property
    @abstractmethod
    def url(self) -> str:
        """The API server's URL."""

    @property
    @abstractmethod
    def kubeconfig(self) -> Path:
        """The kubeconfig a client of this cluster (the operator, kubectl) uses."""

    @property
    @abstractmethod
    def operator_namespaces(self) -> list[str] | None:
        """The namespaces an operator on this cluster should watch; None: all."""

    @property
    @abstractmethod
    def api_server_version(self) -> str | None:
        """The API server's ``gitVersion``; None where there is none."""

    @abstractmethod
    async def _start(self) -> None:
        """Start the API and the kubelet stand-in (and Prometheus, when wanted), each stop on the exit stack."""

    @abstractmethod
    async def apply(self, obj: Mapping[str, Any]) -> Obj:
        """Create an object or update it, as ``kubectl apply`` would."""

    @abstractmethod
    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj | None:
        """An object's current state, or None."""

    @abstractmethod
    async def list_items(self, path: str, selector: str = "") -> list[Obj]:
        """The items at a collection path (``/apis/apps/v1/namespaces/NS/deployments``), label selector honoured."""

    @abstractmethod
    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj:
        """Delete an object; the garbage collector removes its dependents."""

    # --- parts ------------------------------------------------------------------------------

    @property
    def prometheus(self) -> PrometheusServer:
        if self._prometheus is None:
            raise LocalClusterError("the cluster runs without Prometheus")
        return self._prometheus

    @property
    def kubelet(self) -> LabKubelet:
        if self._kubelet is None:
            raise LocalClusterError("the cluster is not running")
        return self._kubelet

    @property
    def namespace(self) -> str:
        """The first of the cluster's namespaces, where the tests and the demo put their objects."""
        return self.namespaces[0]

    # --- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            if self._own_workdir:
                self._stack.callback(shutil.rmtree, self.workdir, ignore_errors=True)
            await self._start()
        except BaseException:
            await self._stack.aclose()  # a failed start leaves nothing running
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def _run_prometheus(self, port: int | None = None) -> PrometheusServer:
        """Start Prometheus in the work directory, on ``port`` or a free one; it stops on exit."""
        server = PrometheusServer(self.workdir / "prometheus", scrape_interval=self.scrape_interval)
        self._stack.callback(server.stop)
        await asyncio.to_thread(server.start, port=port)
        self._prometheus = server
        return server

    async def _run_kubelet(self, kubelet: LabKubelet) -> None:
        """Start the kubelet stand-in; it stops, with every engine, on exit."""
        self._stack.push_async_callback(kubelet.stop)
        await kubelet.start()
        self._kubelet = kubelet

    # --- the engines' and Prometheus's controls -------------------------------------------------

    def endpoints(self, policy: str, namespace: str | None = None, level: str | None = None) -> list[str]:
        """URLs of the ready engines the policy's Service routes to (for the load generator)."""
        return self.kubelet.engines.endpoints(policy, namespace, level)

    def pods(self, selector: str = "", namespace: str | None = None) -> list[PodEngine]:
        """The engines of the pods matching a label selector, ready or not."""
        return self.kubelet.engines.matching(selector, namespace, ready_only=False)

    async def set_faults(
        self, selector: str, faults: Mapping[str, Any], *, namespace: str | None = None, sticky: bool = False
    ) -> dict[str, Any]:
        """Faults (``/emulator/faults`` body, e.g. ``{"ttft_multiplier": 3}``) for the engines matching."""
        return await self.kubelet.engines.set_faults(selector, faults, namespace=namespace, sticky=sticky)

    async def oom_kill(self, pod: str, namespace: str = "default") -> None:
        """OOM-kill a pod's engine: it restarts, ``lastState.terminated.reason`` is OOMKilled."""
        await self.kubelet.oom_kill(namespace, pod)

    async def stop_prometheus(self) -> None:
        """Make Prometheus unreachable (its port closes)."""
        await asyncio.to_thread(self.prometheus.stop)

    async def start_prometheus(self) -> None:
        """Start Prometheus again on the same port, with the same data and targets."""
        server = self.prometheus
        await asyncio.to_thread(server.start, port=server.port)


__all__ = ("ClusterSettings", "LabCluster", "LabKubelet")
