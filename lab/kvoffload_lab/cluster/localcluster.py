"""A whole cluster on this machine on the emulated API, for ``kvoffload demo --api emulated`` and the tests.

:class:`LocalCluster`, the :class:`~kvoffload_lab.cluster.labcluster.LabCluster` of the ``emulated`` API,
runs, in the caller's event loop and its child processes:

- the emulated Kubernetes API (:class:`kvoffload_lab.cluster.kubeemu.KubeEmulator`) on a free
  loopback port, with the KVOffloadPolicy CRD posted and a kubeconfig written;
- a real Prometheus (:mod:`kvoffload_lab.promserver`), 1 s scrape;
- the kubelet stand-in (:class:`kvoffload_lab.cluster.kubelet.Kubelet`), which is also the
  Deployment controller: for every Deployment it keeps ``spec.replicas`` Pods, each served
  by one ``kvoffload emulate`` process running the container's rendered ``vllm serve``
  arguments, rolls them when the pod template changes, writes pod and Deployment status,
  and registers each engine with Prometheus under the labels the PodMonitor would give it.

The operator is not part of it: :func:`start_operator` runs ``kvoffload run`` as a
separate process (so it can be SIGKILLed and started again), pointed at a lab cluster (either API)
through ``$KUBECONFIG``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from kvoffload.api.crd import crd_manifest, template_crd_manifest
from kvoffload.policy.tenancy import Tenancy
from kvoffload_lab.cluster.kubeemu import KubeEmulator, Obj, serve, write_kubeconfig
from kvoffload_lab.cluster.kubelet import Kubelet
from kvoffload_lab.cluster.labcluster import LabCluster
from kvoffload_lab.cluster.podengine import CLI, LocalClusterError, set_parent_death_signal
from kvoffload_lab.processes import end_process_async
from kvoffload_lab.promoperator import LAB_RELEASE, RELEASE_LABEL

# --- the cluster ------------------------------------------------------------------------------


class LocalCluster(LabCluster):
    """The emulated API, a real Prometheus and the kubelet stand-in: the lab cluster on the ``emulated`` API.

    ``async with LocalCluster(engine_args=["--gpu-kv-blocks", "64"]) as cluster:``; the work directory
    holds the kubeconfig too. The settings are :class:`~kvoffload_lab.cluster.labcluster.LabCluster`'s.
    """

    _emulator: KubeEmulator | None = None
    _url: str | None = None

    # --- parts ------------------------------------------------------------------------------

    @property
    def emulator(self) -> KubeEmulator:
        if self._emulator is None:
            raise LocalClusterError("the cluster is not running")
        return self._emulator

    @property
    def url(self) -> str:
        if self._url is None:
            raise LocalClusterError("the cluster is not running")
        return self._url

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def operator_namespaces(self) -> list[str] | None:
        """The namespaces an operator here should watch: None, all (kmock cannot list namespaces for kopf)."""
        return None

    @property
    def api_server_version(self) -> str | None:
        """None: the emulated API is no real server with a gitVersion."""
        return None

    # --- lifecycle ------------------------------------------------------------------------

    async def _start(self) -> None:
        emulator, url = await self._stack.enter_async_context(serve(KubeEmulator()))
        self._emulator, self._url = emulator, url
        for namespace in self.namespaces:
            await emulator.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        await emulator.create_object(crd_manifest())  # registers the KVOffloadPolicy resource
        await emulator.create_object(template_crd_manifest())  # and the cluster-scoped KVOffloadAnalysisTemplate
        write_kubeconfig(url, self.kubeconfig)
        if self.with_prometheus:
            await self._run_prometheus()
        engines_dir = self.workdir / "engines"
        engines_dir.mkdir(exist_ok=True)
        await self._run_kubelet(
            Kubelet(
                emulator,
                url,
                engines_dir,
                self._prometheus,
                engine_args=self.engine_args,
                engine_env=self.engine_env,
                target_labels=self.target_labels,
            )
        )

    # --- objects ----------------------------------------------------------------------------

    async def apply(self, obj: Mapping[str, Any]) -> Obj:
        """Create an object, or merge-patch it when it exists (as ``kubectl apply`` would, roughly)."""
        meta = obj.get("metadata") or {}
        current = self.emulator.read_object(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        if current is None:
            created = await self.emulator.create_object(obj)
        else:
            created = await self.emulator.patch_object(
                obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"], dict(obj)
            )
        self.kubelet.poke()
        return created

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj | None:
        """An object's current state, or None."""
        return self.emulator.read_object(api_version, kind, namespace, name)

    async def list_items(self, path: str, selector: str = "") -> list[Obj]:
        """The items at a collection path (``/apis/apps/v1/namespaces/NS/deployments``) over HTTP, as a client
        would list them (label selector honoured)."""
        params = {"labelSelector": selector} if selector else {}
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.get(f"{self.url}{path}", params=params) as response,
        ):
            response.raise_for_status()
            body = await response.json()
        return list(body["items"])

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj:
        """Delete an object (finalizers honoured, dependents garbage-collected)."""
        deleted = await self.emulator.delete_object(api_version, kind, namespace, name)
        self.kubelet.poke()
        return deleted


# --- the operator, as its own process -----------------------------------------------------------


LAB_TENANCY = Tenancy(private_prometheus=True)
"""What the lab's operator allows a policy (:func:`operator_command`): its Prometheus on 127.0.0.1."""


LAB_MONITOR_LABELS: Mapping[str, str] = {RELEASE_LABEL: LAB_RELEASE}
"""The labels the lab's operator gives every PodMonitor (``--monitor-label``): what the lab's Prometheus selects."""


def operator_command(
    *,
    standalone: bool = True,
    namespaces: Sequence[str] | None = None,
    metrics_port: int = 0,
    monitor_labels: Mapping[str, str] = LAB_MONITOR_LABELS,
) -> list[str]:
    """The ``kvoffload run`` command line (this interpreter), all namespaces unless some are given.

    The operator's own metrics endpoint is off by default (``metrics_port=0``), so several
    local clusters can run side by side. Policies may name the lab's Prometheus on 127.0.0.1
    (``--prometheus-allow-private``): everything of a lab is on this machine. Every PodMonitor
    carries ``monitor_labels`` (by default ``release: kvoffload-lab``, which the lab's Prometheus
    selects on the real control plane, as kube-prometheus-stack's does).
    """
    command = [*CLI, "run", "--prometheus-allow-private"]
    command += [arg for key, value in monitor_labels.items() for arg in ("--monitor-label", f"{key}={value}")]
    command += [arg for namespace in namespaces for arg in ("-n", namespace)] if namespaces else ["-A"]
    if standalone:
        command.append("--standalone")
    command += ["--metrics-port", str(metrics_port)]
    return command


def start_operator(
    cluster: LabCluster,
    *,
    standalone: bool = True,
    namespaces: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    log_path: Path | None = None,
    extra_args: Sequence[str] = (),
    metrics_port: int = 0,
    monitor_labels: Mapping[str, str] = LAB_MONITOR_LABELS,
) -> subprocess.Popen[bytes]:
    """Run ``kvoffload run -A --standalone`` against the cluster (``$KUBECONFIG``) and return the process;
    ``-n`` for each of ``namespaces``, by default the cluster's :attr:`LabCluster.operator_namespaces`.

    Its output goes to ``log_path`` (default ``<workdir>/operator.log``, appended). The caller
    stops it (:func:`stop_operator`) or kills it; it also gets SIGTERM if the caller dies.
    """
    path = log_path or cluster.workdir / "operator.log"
    with path.open("ab") as out:
        return subprocess.Popen(
            [
                *operator_command(
                    standalone=standalone,
                    namespaces=namespaces if namespaces is not None else cluster.operator_namespaces,
                    metrics_port=metrics_port,
                    monitor_labels=monitor_labels,
                ),
                *extra_args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "PYTHONUNBUFFERED": "1", **(env or {})},
            preexec_fn=set_parent_death_signal if sys.platform == "linux" else None,
        )


async def stop_operator(process: subprocess.Popen[bytes], grace: float = 10.0) -> int:
    """SIGTERM, then SIGKILL after ``grace`` seconds; returns the exit status."""
    return await end_process_async(process, name="the operator", grace=grace)


@contextlib.asynccontextmanager
async def running_operator(cluster: LabCluster, **kwargs: Any) -> AsyncIterator[subprocess.Popen[bytes]]:
    """:func:`start_operator` for the length of a ``with`` block."""
    process = start_operator(cluster, **kwargs)
    try:
        yield process
    finally:
        await stop_operator(process)


__all__ = (
    "LAB_MONITOR_LABELS",
    "LocalCluster",
    "operator_command",
    "running_operator",
    "start_operator",
    "stop_operator",
)
