"""A local cluster on the real control plane: kube-apiserver and its controllers, fake GPU Nodes, a kubelet
stand-in that runs emulated engines, and a real Prometheus.

:class:`KubeCluster` is the :class:`~kvoffload_lab.cluster.labcluster.LabCluster` of the ``kube`` API,
:class:`kvoffload_lab.cluster.localcluster.LocalCluster`'s twin on a real API server, so the end-to-end
scenarios and the demo run on either:

- the control plane (:class:`kvoffload_lab.controlplane.ControlPlane`): its own, started here, or one
  that is shared (a test session's), in which case this cluster keeps to its own namespaces and
  cleans them away on exit;
- the KVOffloadPolicy CRD and the Prometheus Operator's own CRDs (``monitoring.coreos.com``, from its
  pinned release);
- :class:`kvoffload_lab.cluster.nodekubelet.NodeKubelet`: the fake Nodes and the kubelet's work, each pod
  on a loopback address of its own;
- the real Prometheus Operator (:mod:`kvoffload_lab.promoperator`) with a ``Prometheus`` resource that
  selects PodMonitors labelled ``release: kvoffload-lab``, and Debian's Prometheus running the
  configuration it generates: the engines are found through the PodMonitors the operator writes, by
  Kubernetes discovery, as in a cluster.

Everything is reached over HTTPS with the admin's client certificate; the operator
(:func:`kvoffload_lab.cluster.laboperator.start_operator`) gets the admin kubeconfig.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, Unpack

from kvoffload.api.conventions import API_GROUP, API_VERSION, PLURAL
from kvoffload.api.crd import crd_manifest, template_crd_manifest
from kvoffload.api.webhook import WEBHOOK_PATH, validating_webhook_configuration
from kvoffload_lab import promoperator
from kvoffload_lab.cluster.kubeapi import KubeAPI, KubeAPIError, Obj, object_path, tls_context
from kvoffload_lab.cluster.labcluster import ClusterSettings, LabCluster
from kvoffload_lab.cluster.nodekubelet import NodeKubelet
from kvoffload_lab.cluster.podengine import LocalClusterError
from kvoffload_lab.controlplane import ControlPlane, ensure_binaries
from kvoffload_lab.promoperator import LAB_RELEASE, RELEASE_LABEL, ConfigSync, PrometheusOperator
from kvoffload_lab.promserver import PrometheusServer, free_port

PODMONITOR_CRD = "podmonitors.monitoring.coreos.com"


def _established(crd: Mapping[str, Any] | None) -> bool:
    conditions = ((crd or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


class KubeOptions(TypedDict, total=False):
    """:class:`KubeCluster`'s own settings by keyword, beside :class:`~kvoffload_lab.cluster.labcluster.LabCluster`'s
    (:func:`kvoffload_lab.cluster.apis.lab_cluster` hands them on)."""

    plane: ControlPlane | None
    prometheus_port: int | None
    gpu_class_pricing: bool
    build: bool
    progress: Callable[[str], None] | None
    webhook_port: int | None


class KubeCluster(LabCluster):
    """The real control plane, fake Nodes, the kubelet stand-in and Prometheus: the lab cluster on the ``kube`` API.

    ``plane``: a started control plane to share (its owner stops it); then ``namespaces`` are this
    cluster's own: made on entry, and on exit their pods removed and the namespaces deleted. Without
    ``plane`` the cluster starts its own (building the binaries first when they are missing and
    ``build`` is set, with ``progress`` told each line) and stops it on exit; the kubelet then runs the
    pods of every namespace. Prometheus listens on ``prometheus_port`` (a free port if None); each engine
    is priced as its Node's GPU class unless ``gpu_class_pricing`` is false (then as the emulated API
    prices it); ``webhook_port`` registers the operator's admission webhook (:attr:`webhook_args`). The
    other settings are :class:`~kvoffload_lab.cluster.labcluster.LabCluster`'s.
    """

    workdir_prefix = "kvoffload-kube-cluster-"

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        plane: ControlPlane | None = None,
        prometheus_port: int | None = None,
        gpu_class_pricing: bool = True,
        build: bool = False,
        progress: Callable[[str], None] | None = None,
        webhook_port: int | None = None,
        **settings: Unpack[ClusterSettings],
    ) -> None:
        super().__init__(workdir, **settings)
        self._shared_plane = plane
        self.prometheus_port = prometheus_port
        self.gpu_class_pricing = gpu_class_pricing
        self.build = build
        self.progress = progress or (lambda line: None)
        self.webhook_port = webhook_port
        self.webhook_files: tuple[Path, Path] | None = None
        """The webhook's serving certificate and key, once registered."""
        self._plane: ControlPlane | None = None
        self._tls: ssl.SSLContext | None = None
        self._api: KubeAPI | None = None
        self.prometheus_operator: PrometheusOperator | None = None
        self.config_sync: ConfigSync | None = None
        self.version: dict[str, Any] = {}
        """The API server's /version answer (``gitVersion`` and the rest)."""

    # --- parts ------------------------------------------------------------------------------

    @property
    def plane(self) -> ControlPlane:
        if self._plane is None:
            raise LocalClusterError("the cluster is not running")
        return self._plane

    @property
    def url(self) -> str:
        return self.plane.server

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    @property
    def api(self) -> KubeAPI:
        if self._api is None:
            raise LocalClusterError("the cluster is not running")
        return self._api

    @property
    def api_server_version(self) -> str:
        """The server's ``gitVersion``, e.g. ``v1.37.2``."""
        return str(self.version.get("gitVersion", ""))

    @property
    def operator_namespaces(self) -> list[str] | None:
        """The namespaces an operator on this cluster should watch: this cluster's own on a shared plane,
        None (all) on its own."""
        return self.namespaces if self._shared_plane is not None else None

    # --- lifecycle ------------------------------------------------------------------------

    async def _start(self) -> None:
        if self.build:
            await asyncio.to_thread(promoperator.ensure_built, progress=self.progress)
        if gone := promoperator.missing():
            raise LocalClusterError(f"the Prometheus Operator is not built ({', '.join(gone)}): run make kube")
        if self._shared_plane is not None:
            self._plane = self._shared_plane
        else:
            if self.build:
                await ensure_binaries(progress=self.progress)
            plane = ControlPlane(workdir=self.workdir / "control-plane")
            self._stack.callback(plane.stop)
            self.progress("starting etcd, kube-apiserver, kube-controller-manager and kube-scheduler")
            starting = asyncio.ensure_future(asyncio.to_thread(plane.start))
            try:
                await asyncio.shield(starting)
            except asyncio.CancelledError:
                # A thread cannot be cancelled: let start() end (it stops what it began if it fails), so
                # that plane.stop() on the way out sees every process it launched.
                with contextlib.suppress(Exception):
                    await starting
                raise
            self._plane = plane
            ready = {name: round(seconds, 1) for name, seconds in plane.ready_s.items()}
            self.progress(f"control plane healthy; seconds to healthy: {ready}")
        plane = self._plane
        self._tls = tls_context(plane.ca_file, plane.client_cert, plane.client_key)
        api = KubeAPI(plane.server, self._tls)
        api.open()
        self._stack.push_async_callback(api.close)
        self._api = api
        self.version = await api.request("GET", "/version")
        self.progress(f"API server {self.version.get('gitVersion')} at {plane.server}")
        await self._install_crds()
        for namespace in self.namespaces:
            if await api.get(f"/api/v1/namespaces/{namespace}") is None:
                await api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        if self._shared_plane is not None:
            self._stack.push_async_callback(self._clean_namespaces)
        if self.webhook_port is not None:
            await self._register_webhook(self.webhook_port)
        await self._wait_for_service_accounts()
        if self.with_prometheus:
            server = await self._run_prometheus(self.prometheus_port)
            await self._start_prometheus_operator(server)
            self.progress(f"Prometheus at {server.url}, running the Prometheus Operator's configuration")
        engines_dir = self.workdir / "engines"
        engines_dir.mkdir(exist_ok=True)
        await self._run_kubelet(
            NodeKubelet(
                api,
                engines_dir,
                None,  # Prometheus finds the engines through the PodMonitors, by Kubernetes discovery
                pod_addresses=True,
                namespaces=self.namespaces if self._shared_plane is not None else None,
                engine_args=self.engine_args,
                engine_env=self.engine_env,
                target_labels=self.target_labels,
                gpu_class_pricing=self.gpu_class_pricing,
            )
        )

    async def _start_prometheus_operator(self, server: PrometheusServer) -> None:
        """The Prometheus Operator, its ``Prometheus`` resource, and Prometheus kept on its configuration."""
        operator = PrometheusOperator(
            self.plane, self.workdir / "prometheus-operator", namespaces=self.operator_namespaces
        )
        self._stack.callback(operator.stop)
        operator.start()
        self.prometheus_operator = operator
        version_tag = await asyncio.to_thread(promoperator.prometheus_version)
        await self.api.apply(
            promoperator.prometheus_resource(
                self.namespace,
                scrape_interval=self.scrape_interval,
                selector={RELEASE_LABEL: LAB_RELEASE},
                version_tag=version_tag,
                all_namespaces=len(self.namespaces) > 1 or self._shared_plane is None,
            )
        )
        sync = ConfigSync(self.api, server, self.namespace)
        await sync.wait_first(60.0, operator)
        sync.start()
        self._stack.push_async_callback(sync.stop)
        self.config_sync = sync

    async def _install_crds(self) -> None:
        api = self.api
        crds = [crd_manifest(), template_crd_manifest(), *promoperator.crd_manifests()]
        for crd in crds:
            await api.apply(crd)
        deadline = time.monotonic() + 60
        for name in (crd["metadata"]["name"] for crd in crds):
            path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            while not _established(await api.get(path)):
                if time.monotonic() > deadline:
                    raise LocalClusterError(f"the CRD {name} was not Established within 60 s")
                await asyncio.sleep(0.1)  # the API server registers the kind in a moment
        self.progress(f"CRDs installed: {', '.join(crd['metadata']['name'] for crd in crds)}")

    async def _register_webhook(self, port: int) -> None:
        """Register the operator's validating webhook at https://127.0.0.1:``port`` with a certificate from the
        cluster's CA; the operator serves it when started with :attr:`webhook_args`. Until then the API server
        skips it (``failurePolicy: Ignore``)."""
        cert, key = self.plane.issue_loopback_certificate(self.workdir / "webhook", "webhook")
        self.webhook_files = (cert, key)
        configuration = validating_webhook_configuration(
            url=f"https://127.0.0.1:{port}", ca_bundle=self.plane.ca_file.read_bytes()
        )
        await self.api.apply(configuration)
        self.progress(f"admission webhook registered at https://127.0.0.1:{port}{WEBHOOK_PATH}")

    @property
    def webhook_args(self) -> list[str]:
        """The ``kvoffload run`` arguments that serve the registered webhook (none when there is none)."""
        if self.webhook_files is None or self.webhook_port is None:
            return []
        cert, key = self.webhook_files
        return [
            "--webhook-port",
            str(self.webhook_port),
            "--webhook-address",
            "127.0.0.1",
            "--webhook-cert",
            str(cert),
            "--webhook-key",
            str(key),
        ]

    async def _wait_for_service_accounts(self) -> None:
        """Wait for each namespace's ``default`` ServiceAccount: the ServiceAccount admission plugin refuses
        pods until the controller has made it."""
        deadline = time.monotonic() + 60
        for namespace in self.namespaces:
            while await self.api.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default") is None:
                if time.monotonic() > deadline:
                    raise LocalClusterError(f"no default ServiceAccount in namespace {namespace} after 60 s")
                await asyncio.sleep(0.1)  # the serviceaccount controller makes it in a moment

    async def _clean_namespaces(self) -> None:
        """On a shared plane: take this cluster's namespaces away without leaving pods on the shared Nodes.

        The operator is gone by now, so nothing would remove its finalizer from the policies: strip it, or
        the namespaces would never finish terminating. The pods go at once (grace 0), since no kubelet
        will confirm their deletion once this one has stopped."""
        api = self.api
        for namespace in self.namespaces:
            policies = f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{namespace}/{PLURAL}"
            for policy in await api.items(policies):
                with contextlib.suppress(KubeAPIError):
                    await api.merge_patch(
                        f"{policies}/{policy['metadata']['name']}", {"metadata": {"finalizers": None}}
                    )
            await api.delete(f"/api/v1/namespaces/{namespace}")
            for pod in await api.items(f"/api/v1/namespaces/{namespace}/pods"):
                await api.delete(f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}", grace_seconds=0)

    # --- objects ----------------------------------------------------------------------------

    async def apply(self, obj: Mapping[str, Any]) -> Obj:
        """Server-side apply (field manager ``kvoffload-lab``), as ``kubectl apply --server-side`` would."""
        applied = await self.api.apply(obj)
        self.kubelet.poke()
        return applied

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj | None:
        """An object's current state, or None (a blocking read: a few milliseconds on loopback)."""
        return self.read(object_path(api_version, kind, namespace, name))

    def read(self, path: str) -> Obj | None:
        """GET ``path`` (blocking); None on 404."""
        request = urllib.request.Request(f"{self.url}{path}", headers={"Accept": "application/json"})
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=self._tls)
        )
        try:
            with opener.open(request, timeout=10) as response:
                body: Obj = json.loads(response.read())
                return body
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    async def list_items(self, path: str, selector: str = "") -> list[Obj]:
        """The items at a collection path (``/apis/apps/v1/namespaces/NS/deployments``), label selector honoured."""
        return await self.api.items(path, {"labelSelector": selector} if selector else None)

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj:
        """Delete an object (background propagation: the garbage collector removes its dependents)."""
        path = object_path(api_version, kind, namespace, name)
        answer = await self.api.request("DELETE", path, body={"propagationPolicy": "Background"})
        self.kubelet.poke()
        return answer


# --- `kvoffload cluster` ------------------------------------------------------------------------


def usage_lines(cluster: KubeCluster, kubeconfig: Path) -> list[str]:
    """What a person needs to point kubectl and the operator at the cluster."""
    prometheus = cluster.prometheus.url if cluster.with_prometheus else "(none)"
    return [
        f"kubeconfig written to {kubeconfig} (admin, group system:masters)",
        f"  API server {cluster.url} ({cluster.api_server_version}); Prometheus {prometheus}",
        "  nodes: one per GPU class the applied policies name, made when a policy names it; "
        f"engine logs in {cluster.workdir / 'engines'}",
        f"  kubectl --kubeconfig {kubeconfig} apply -f POLICY.yaml   (with spec.prometheus.url: {prometheus})",
        # The lab's Prometheus is on 127.0.0.1, which only an admin's --prometheus-allow-private lets a policy name.
        # Its Prometheus selects PodMonitors labelled release=kvoffload-lab, as kube-prometheus-stack's does.
        f"  KUBECONFIG={kubeconfig} kvoffload run -A --prometheus-allow-private "
        f"--monitor-label {promoperator.MONITOR_LABEL_ARG} --standalone "
        f"{' '.join(cluster.webhook_args)}".rstrip(),
        "stop with Ctrl-C or SIGTERM: everything started here stops, and the kubeconfig is removed",
    ]


async def serve_until_signalled(
    kubeconfig: Path,
    *,
    workdir: Path | None = None,
    prometheus_port: int | None = None,
    webhook_port: int | None = None,
    engine_args: Sequence[str] = (),
    progress: Callable[[str], None] = print,
    ready: Callable[[KubeCluster], None] | None = None,
) -> None:
    """Run a :class:`KubeCluster` (its own control plane, built first if need be) until SIGTERM or SIGINT.

    ``kubeconfig`` is written only once the API server answers and the CRDs are served, and removed on
    the way out (it would name a server that is gone)."""
    import signal

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    task = asyncio.current_task()
    assert task is not None

    def on_signal() -> None:
        # While starting, cancel (the exit stack stops what was started); once up, leave the wait.
        if task is not None and not started:
            task.cancel()
        stop.set()

    started = False
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    written = False
    try:
        async with KubeCluster(
            workdir,
            engine_args=engine_args,
            prometheus_port=prometheus_port,
            webhook_port=webhook_port or free_port(),
            build=True,
            progress=progress,
        ) as cluster:
            started = True
            kubeconfig.parent.mkdir(parents=True, exist_ok=True)
            kubeconfig.touch(mode=0o600)
            shutil.copyfile(cluster.kubeconfig, kubeconfig)
            written = True
            for line in usage_lines(cluster, kubeconfig):
                progress(line)
            if ready is not None:
                ready(cluster)
            await stop.wait()  # deadline: none; it serves until SIGTERM or SIGINT, as `kvoffload cluster` says
            progress("stopping")
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        if written:
            kubeconfig.unlink(missing_ok=True)
    progress("stopped: nothing left running")


__all__ = ("PODMONITOR_CRD", "KubeCluster", "KubeOptions", "serve_until_signalled", "usage_lines")
