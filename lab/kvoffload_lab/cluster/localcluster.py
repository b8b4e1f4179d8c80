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

The operator is not part of it: :func:`kvoffload_lab.cluster.laboperator.start_operator` runs ``kvoffload run`` as
a separate process, pointed at a lab cluster of either API.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

from kvoffload.api.crd import crd_manifest, template_crd_manifest
from kvoffload_lab.cluster.kubeemu import KubeEmulator, Obj, serve, write_kubeconfig
from kvoffload_lab.cluster.kubelet import Kubelet
from kvoffload_lab.cluster.labcluster import LabCluster
from kvoffload_lab.cluster.podengine import LocalClusterError


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


__all__ = ("LocalCluster",)
