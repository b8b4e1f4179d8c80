"""The kubelet stand-in for a real API server: runs the pods the real scheduler bound to the lab's fake Nodes.

On kube-apiserver the real controllers do the Deployment's part (ReplicaSets, pods, rolling
updates, garbage collection) and the real scheduler binds each pod to a Node, or leaves it Pending
with the reason. What no component here does is a kubelet's work, so this class does it, as KWOK
does, for the pods bound to a Node of :mod:`kvoffload_lab.cluster.nodes`:

- it makes those Nodes: one per GPU class that the policies it watches name;
- for every pod bound to one, it starts ``kvoffload emulate`` from the pod's own command and args, and the
  files of the ConfigMap volumes it mounts, as its engine's speaker translates them (``cluster/speakers.py``;
  ``--gpu-class`` from the Node's class) and runs it as :class:`Engines` does for the emulated
  cluster (probes, restarts with back-off, faults). With ``pod_addresses`` each pod gets a loopback
  address of its own (any 127.x.y.z is local on Linux) as its IP, its engine listening there on the
  container's port named ``http``, so Prometheus' Kubernetes discovery reaches it as in a cluster
  (podIP:containerPort); without, every pod is 127.0.0.1 on a port of its own, registered with
  Prometheus under the labels the PodMonitor would give it;
- it writes the pod's status through ``pods/status``: phase, Ready, restartCount, lastState
  (``OOMKilled`` when :meth:`oom_kill` killed the engine);
- a pod being deleted has its engine stopped and is then removed (grace period 0, uid-checked),
  as a kubelet confirms a deletion once the containers are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import socket
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from kvoffload.api.conventions import API_GROUP, API_VERSION, PLURAL
from kvoffload.policy.catalog import find_gpu_class
from kvoffload_lab.cluster.census import Census
from kvoffload_lab.cluster.engines import DEFAULT_TARGET_LABELS, Engines
from kvoffload_lab.cluster.kubeapi import KubeAPI, KubeAPIError, Obj, wake_on_changes
from kvoffload_lab.cluster.nodes import NODE_PREFIX, node_manifest, node_name
from kvoffload_lab.cluster.podengine import (
    ANNOTATION_PORT,
    HOST,
    LocalClusterError,
    PodEngine,
    container_env,
    emulate_argv,
    pod_key,
)
from kvoffload_lab.cluster.speakers import config_map_mounts, emulate_options, mounted_files
from kvoffload_lab.promserver import PrometheusServer, free_port

log = logging.getLogger("kvoffload.localcluster")


def _collection(namespace: str | None, core: bool, plural: str) -> str:
    base = "/api/v1" if core else f"/apis/{API_GROUP}/{API_VERSION}"
    return f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"


def gpu_classes_named(policies: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """The GPU classes the policies name (known to the catalog), each with the node labels their
    ``spec.gpu.nodeSelector`` adds."""
    classes: dict[str, dict[str, str]] = {}
    for policy in policies:
        gpu = ((policy.get("spec") or {}).get("gpu")) or {}
        name = gpu.get("class")
        if not isinstance(name, str) or find_gpu_class(name) is None:
            continue  # the operator reports an unknown class; no Node could stand for it
        selector = gpu.get("nodeSelector") or {}
        labels = classes.setdefault(name, {})
        labels.update({str(k): str(v) for k, v in selector.items() if isinstance(v, str)})
    return classes


def _loopback_candidates() -> itertools.count[int]:
    # A random start keeps two processes on this machine (two test runs) from trying the same addresses first.
    return itertools.count(random.randrange(1 << 20))


_CANDIDATES = _loopback_candidates()


def loopback_address(port: int) -> str:
    """A loopback address (127.64.0.1 to 127.127.255.254) on which ``port`` is free right now."""
    for _ in range(1000):
        n = next(_CANDIDATES) % (64 << 16)
        a, b, c = 64 + (n >> 16), (n >> 8) & 255, n & 255
        if c in (0, 255):
            continue
        address = f"127.{a}.{b}.{c}"
        with socket.socket() as probe:
            try:
                probe.bind((address, port))
            except OSError:
                continue
        return address
    raise LocalClusterError(f"no loopback address with port {port} free")


def container_port(container: Mapping[str, Any], name: str = "http") -> int | None:
    """The containerPort named ``name`` (else the first one), as a PodMonitor's ``port: http`` finds it."""
    ports = [p for p in container.get("ports") or [] if isinstance(p.get("containerPort"), int)]
    named = [p for p in ports if p.get("name") == name]
    chosen = (named or ports or [None])[0]
    return int(chosen["containerPort"]) if chosen is not None else None


def _status_essence(status: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a status says, without its times: a write is needed only when this changes."""
    containers = status.get("containerStatuses") or [{}]
    first = containers[0]
    conditions = sorted((c.get("type"), c.get("status")) for c in status.get("conditions") or [])
    last = ((first.get("lastState") or {}).get("terminated") or {}).get("reason")
    state = next(iter(first.get("state") or {}), None)
    return (
        status.get("phase"),
        tuple(conditions),
        first.get("ready"),
        first.get("started"),
        first.get("restartCount"),
        state,
        last,
        status.get("podIP"),
    )


class NodeKubelet:
    """Runs the pods bound to the lab's Nodes as emulated engines, and reports them to the API server.

    ``namespaces`` limits it to those namespaces' policies and pods (several clusters can then
    share one control plane and its Nodes, each running its own namespace's pods); None: all.
    """

    def __init__(
        self,
        api: KubeAPI,
        workdir: Path,
        prometheus: PrometheusServer | None,
        *,
        namespaces: Sequence[str] | None = None,
        engine_args: Sequence[str] = (),
        engine_env: Mapping[str, str] | None = None,
        target_labels: Sequence[str] = DEFAULT_TARGET_LABELS,
        gpu_class_pricing: bool = True,
        tick: float = 0.2,
        probe_period: float = 1.0,
        pod_addresses: bool = False,
    ) -> None:
        self.api = api
        self.pod_addresses = pod_addresses
        self.workdir = workdir
        self.namespaces = list(namespaces) if namespaces is not None else None
        self.engine_args = list(engine_args)
        self.engine_env = dict(engine_env or {})
        self.gpu_class_pricing = gpu_class_pricing
        self.tick = tick
        self.engines = Engines(prometheus, target_labels=target_labels, probe_period=probe_period)
        self.census = Census()
        """Every engine started, and Ready engines per level when sampled (``lab/cluster/census.py``)."""
        self.errors: list[str] = []
        self.nodes: dict[str, dict[str, str]] = {}
        """The Nodes made (or found) so far, with the labels they were given."""
        self._written: dict[str, tuple[str, tuple[Any, ...]]] = {}  # pod key -> (uid, status essence)
        self._refused: set[str] = set()  # pods whose container cannot run here, reported once
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self.engines.open()
        self._tasks = [asyncio.create_task(self._run(), name="kubelet reconcile")]
        for namespace in self._scopes:
            for core, plural in ((True, "pods"), (False, PLURAL)):
                path = _collection(namespace, core, plural)
                self._tasks.append(asyncio.create_task(wake_on_changes(self.api, path, self._wake), name=path))

    async def stop(self) -> None:
        """Stop the loop and every engine; unregister them from Prometheus. Pods and Nodes stay."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        await self.engines.close()

    def poke(self) -> None:
        """Reconcile now rather than at the next tick."""
        self._wake.set()

    async def _run(self) -> None:
        while True:
            try:
                async with self._lock:
                    await self._reconcile()
            except asyncio.CancelledError:
                raise
            except (KubeAPIError, aiohttp.ClientError, TimeoutError) as exc:
                if isinstance(exc, KubeAPIError) and exc.status != 429 and exc.status < 500:
                    log.exception("kubelet reconcile failed")
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                else:  # the server is busy or (re)starting (e.g. 429 while a new CRD's storage initializes)
                    log.warning("kubelet reconcile: API server unavailable, retrying: %s", exc)
            except Exception as exc:  # keep the cluster running; a test reads .errors
                log.exception("kubelet reconcile failed")
                self.errors.append(f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.tick):
                    await self._wake.wait()
            self._wake.clear()

    # --- reconcile ---------------------------------------------------------------------------

    async def _list(self, core: bool, plural: str) -> list[Obj]:
        items: list[Obj] = []
        for namespace in self._scopes:
            items += await self.api.items(_collection(namespace, core, plural))
        return items

    async def _reconcile(self) -> None:
        await self.ensure_nodes(gpu_classes_named(await self._list(False, PLURAL)))
        pods = [p for p in await self._list(True, "pods") if str(p["spec"].get("nodeName", "")) in self._node_names]
        live: dict[str, Obj] = {}
        for pod in pods:
            key = pod_key(pod)
            if pod["metadata"].get("deletionTimestamp"):
                await self._finish_deletion(pod)
                continue
            live[key] = pod
            if key not in self.engines and key not in self._refused:
                await self._start_pod(pod)
        self.engines.drop_gone(live)
        await self.engines.check()
        for key, pod in live.items():
            if key in self.engines:
                await self._write_status(pod)
        self._written = {k: v for k, v in self._written.items() if k in live}

    @property
    def _scopes(self) -> list[str | None]:
        """The namespaces to list and watch; [None]: all of them."""
        return list(self.namespaces) if self.namespaces is not None else [None]

    @property
    def _node_names(self) -> set[str]:
        return {node_name(gpu) for gpu in self.nodes}

    async def ensure_nodes(self, classes: Mapping[str, Mapping[str, str]]) -> None:
        """One Node per GPU class, with the extra labels asked for (added to an existing Node)."""
        for gpu_name, extra in classes.items():
            known = self.nodes.get(gpu_name)
            if known is not None and all(known.get(k) == v for k, v in extra.items()):
                continue
            gpu = find_gpu_class(gpu_name)
            assert gpu is not None
            manifest = node_manifest(gpu, extra)
            path = f"/api/v1/nodes/{manifest['metadata']['name']}"
            current = await self.api.get(path)
            if current is None:
                try:
                    current = await self.api.create(manifest)
                    log.info("node %s made for GPU class %s", manifest["metadata"]["name"], gpu_name)
                except KubeAPIError as exc:
                    if exc.status != 409:  # another cluster on this control plane made it first
                        raise
                    current = await self.api.get(path) or {}
            labels = (current.get("metadata") or {}).get("labels") or {}
            patch: Obj = {}
            if missing := {k: v for k, v in manifest["metadata"]["labels"].items() if labels.get(k) != v}:
                patch["metadata"] = {"labels": missing}
            # The TaintNodesByCondition admission plugin taints a new Node not-ready, and the node-lifecycle
            # controller lifts it on the kubelet's first Ready status; that controller does not run here
            # (with no real kubelet it would taint every Node unreachable), so the taint goes as it would.
            if (current.get("spec") or {}).get("taints") != manifest["spec"]["taints"]:
                patch["spec"] = {"taints": manifest["spec"]["taints"]}
            if patch:
                await self.api.merge_patch(path, patch)
            self.nodes[gpu_name] = {**(known or {}), **extra}

    async def _start_pod(self, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        key = pod_key(pod)
        containers = spec.get("containers") or []
        try:
            if not containers:
                raise LocalClusterError("the pod has no container")
            mounts = config_map_mounts(spec, containers[0])
            maps = {}
            for _, source in mounts:
                name = str(source.get("name"))
                maps[name] = await self.api.get(f"/api/v1/namespaces/{meta['namespace']}/configmaps/{name}")
                if maps[name] is None and not source.get("optional"):
                    return  # a kubelet leaves it ContainerCreating until the ConfigMap is there: tried again next pass
            speaker, serve_args = emulate_options(containers[0], meta.get("labels") or {}, mounted_files(mounts, maps))
        except LocalClusterError as exc:
            self._refused.add(key)
            self.errors.append(f"pod {key}: {exc}")
            return
        gpu_class = str(spec["nodeName"]).removeprefix(NODE_PREFIX)
        extra = [*(["--gpu-class", gpu_class] if self.gpu_class_pricing else []), *self.engine_args]
        port = container_port(containers[0]) if self.pod_addresses else None
        host = loopback_address(port) if port is not None else HOST
        port = port or free_port()
        owners = meta.get("ownerReferences") or [{}]
        engine = PodEngine(
            namespace=meta["namespace"],
            pod=meta["name"],
            deployment=str(owners[0].get("name", "")).rsplit("-", 1)[0],
            labels=dict(meta.get("labels") or {}),
            argv=emulate_argv(serve_args, extra, port, host),
            env=container_env(containers[0], self.engine_env),
            port=port,
            log_path=self.workdir / f"{meta['namespace']}_{meta['name']}.log",
            host=host,
            metrics_path=speaker.metrics_path,
        )
        self.engines.start(engine)
        self.census.engine_started(engine.labels)
        # The annotation says which port is this pod's (on 127.0.0.1, the only way to tell pods apart).
        with contextlib.suppress(KubeAPIError):
            await self.api.merge_patch(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                {"metadata": {"annotations": {ANNOTATION_PORT: str(port)}}},
            )

    async def _finish_deletion(self, pod: Obj) -> None:
        """Stop the engine of a pod being deleted; once it is gone, remove the pod for good."""
        key, meta = pod_key(pod), pod["metadata"]
        engine = self.engines.get(key)
        if engine is not None:
            self.engines.drop(engine)  # stops in the background
        elif not self.engines.is_stopping(key):
            await self.api.delete(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", grace_seconds=0, uid=meta["uid"]
            )
            self._refused.discard(key)

    async def _write_status(self, pod: Obj) -> None:
        meta = pod["metadata"]
        key = pod_key(pod)
        engine = self.engines[key]
        current = pod.get("status") or {}
        status = engine.pod_status(pod)
        # What the API server set stays as it is: the QoS class is computed at creation and immutable,
        # and the scheduler wrote PodScheduled.
        status["hostIPs"] = [{"ip": status["hostIP"]}]  # as a kubelet reports it beside hostIP
        if "qosClass" in current:
            status["qosClass"] = current["qosClass"]
        else:
            status.pop("qosClass", None)
        scheduled = next((c for c in current.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
        if scheduled is not None:
            status["conditions"] = [scheduled, *(c for c in status["conditions"] if c["type"] != "PodScheduled")]
        essence = _status_essence(status)
        if self._written.get(key) == (meta["uid"], essence):
            return
        with contextlib.suppress(KubeAPIError):  # deleted meanwhile: the next pass drops it
            await self.api.merge_patch(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status", {"status": status}
            )
            self._written[key] = (meta["uid"], essence)

    # --- what tests and the demo drive ----------------------------------------------------------

    async def oom_kill(self, namespace: str, pod: str) -> None:
        """Kill a pod's engine as the kernel's OOM killer would; it restarts, and the pod shows OOMKilled."""
        async with self._lock:
            engine = self.engines.get(f"{namespace}/{pod}")
            if engine is None or engine.process is None:
                raise LocalClusterError(f"no running engine for pod {namespace}/{pod}")
            await engine.oom_kill()
            current = await self.api.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
            if current is not None:
                await self._write_status(current)
        self.poke()


__all__ = ("NodeKubelet", "gpu_classes_named")
