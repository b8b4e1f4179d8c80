"""What tests and the demo drive on a lab cluster, whichever API it runs: the emulated one
(:class:`~kvoffload_lab.cluster.localcluster.LocalCluster`) or kube-apiserver
(:class:`~kvoffload_lab.cluster.kubecluster.KubeCluster`). Both keep their engines in a kubelet stand-in
and run one Prometheus, so these controls are the same on both."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol

from kvoffload_lab.cluster.engines import Engines
from kvoffload_lab.cluster.podengine import PodEngine
from kvoffload_lab.promserver import PrometheusServer


class _Kubelet(Protocol):
    @property
    def engines(self) -> Engines: ...

    async def oom_kill(self, namespace: str, pod: str) -> None: ...


class _Cluster(Protocol):
    @property
    def kubelet(self) -> _Kubelet: ...

    @property
    def prometheus(self) -> PrometheusServer: ...


class EngineControls:
    """The engines' and Prometheus's controls of a lab cluster (a mixin over ``kubelet`` and ``prometheus``)."""

    def endpoints(self: _Cluster, policy: str, namespace: str | None = None, level: str | None = None) -> list[str]:
        """URLs of the ready engines the policy's Service routes to (for the load generator)."""
        return self.kubelet.engines.endpoints(policy, namespace, level)

    def pods(self: _Cluster, selector: str = "", namespace: str | None = None) -> list[PodEngine]:
        """The engines of the pods matching a label selector, ready or not."""
        return self.kubelet.engines.matching(selector, namespace, ready_only=False)

    async def set_faults(
        self: _Cluster, selector: str, faults: Mapping[str, Any], *, namespace: str | None = None, sticky: bool = False
    ) -> dict[str, Any]:
        """Faults (``/emulator/faults`` body, e.g. ``{"ttft_multiplier": 3}``) for the engines matching."""
        return await self.kubelet.engines.set_faults(selector, faults, namespace=namespace, sticky=sticky)

    async def oom_kill(self: _Cluster, pod: str, namespace: str = "default") -> None:
        """OOM-kill a pod's engine: it restarts, ``lastState.terminated.reason`` is OOMKilled."""
        await self.kubelet.oom_kill(namespace, pod)

    async def stop_prometheus(self: _Cluster) -> None:
        """Make Prometheus unreachable (its port closes)."""
        await asyncio.to_thread(self.prometheus.stop)

    async def start_prometheus(self: _Cluster) -> None:
        """Start Prometheus again on the same port, with the same data and targets."""
        server = self.prometheus
        await asyncio.to_thread(server.start, port=server.port)
