"""The kubelet stand-in, which is also the Deployment controller: each Deployment's pods, run as emulated engines."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import aiohttp
import kmock

from kvoffload_lab.cluster.census import Census
from kvoffload_lab.cluster.deployments import (
    POD_TEMPLATE_HASH,
    deployment_status,
    pod_manifest,
    rolling_limits,
    status_changed,
    template_hash,
)
from kvoffload_lab.cluster.engines import DEFAULT_TARGET_LABELS, Engines
from kvoffload_lab.cluster.kubeemu import KubeEmulator, Obj
from kvoffload_lab.cluster.podengine import (
    ANNOTATION_PORT,
    LocalClusterError,
    PodEngine,
    container_env,
    emulate_argv,
    pod_key,
)
from kvoffload_lab.cluster.speakers import Speaker, config_map_mounts, emulate_options, mounted_files
from kvoffload_lab.promserver import PrometheusServer, free_port

log = logging.getLogger("kvoffload.localcluster")


class Kubelet:
    """Keeps every Deployment's pods running as emulated engines, and reports their status.

    One reconcile loop, woken by watches on Deployments and Pods and by a short tick (for
    the engines' health). Pods are owned by their Deployment (ownerReference), so the
    emulator's garbage collector removes them with it; the kubelet then stops their engines.
    """

    def __init__(
        self,
        emulator: KubeEmulator,
        url: str,
        workdir: Path,
        prometheus: PrometheusServer | None,
        *,
        engine_args: Sequence[str] = (),
        engine_env: Mapping[str, str] | None = None,
        target_labels: Sequence[str] = DEFAULT_TARGET_LABELS,
        tick: float = 0.2,
        probe_period: float = 1.0,
    ) -> None:
        self.emulator = emulator
        self.url = url
        self.workdir = workdir
        self.engine_args = list(engine_args)
        self.engine_env = dict(engine_env or {})
        self.tick = tick
        self.engines = Engines(prometheus, target_labels=target_labels, probe_period=probe_period)
        self.census = Census()
        """Every engine started, and Ready engines per level when sampled (``lab/cluster/census.py``)."""
        self._counters: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._lock = asyncio.Lock()
        self.errors: list[str] = []

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        self.engines.open()
        self._tasks = [
            asyncio.create_task(self._run(), name="kubelet reconcile"),
            asyncio.create_task(self._watch("/apis/apps/v1/deployments"), name="kubelet watch deployments"),
            asyncio.create_task(self._watch("/api/v1/pods"), name="kubelet watch pods"),
        ]

    async def stop(self) -> None:
        """Stop the loop and every engine; unregister them from Prometheus."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        await self.engines.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

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
            except Exception as exc:  # keep the cluster running; a test reads .errors
                log.exception("kubelet reconcile failed")
                self.errors.append(f"{type(exc).__name__}: {exc}")
            # asyncio.timeout, not wait_for: wait_for in 3.11 can swallow a cancellation.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.tick):
                    await self._wake.wait()
            self._wake.clear()

    async def _watch(self, path: str) -> None:
        """Wake the loop on every change of a resource (reconnecting when the stream ends)."""
        assert self._session is not None
        while True:
            try:
                listing = await self._get(path)
                version = listing["metadata"]["resourceVersion"]
                params = {"watch": "true", "resourceVersion": version, "timeoutSeconds": "60"}
                timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
                async with self._session.get(f"{self.url}{path}", params=params, timeout=timeout) as response:
                    async for line in response.content:
                        if line.strip():
                            self._wake.set()
            except asyncio.CancelledError:
                raise
            except (aiohttp.ClientError, KeyError, TimeoutError):
                await asyncio.sleep(0.5)  # the API is restarting or closing: retry shortly

    async def _get(self, path: str) -> Obj:
        assert self._session is not None
        async with self._session.get(f"{self.url}{path}") as response:
            response.raise_for_status()
            body: Obj = await response.json()
            return body

    # --- reconcile ---------------------------------------------------------------------------

    async def _reconcile(self) -> None:
        deployments = (await self._get("/apis/apps/v1/deployments"))["items"]
        pods = (await self._get("/api/v1/pods"))["items"]
        self.engines.drop_gone({pod_key(p): p for p in pods})
        await self.engines.check()

        by_owner: dict[str, list[Obj]] = {}
        for pod in pods:
            for ref in pod["metadata"].get("ownerReferences") or []:
                if ref.get("controller") and ref.get("kind") == "Deployment":
                    by_owner.setdefault(ref["uid"], []).append(pod)
        for deployment in deployments:
            if deployment["metadata"].get("deletionTimestamp"):
                continue
            owned = [p for p in by_owner.get(deployment["metadata"]["uid"], []) if pod_key(p) in self.engines]
            await self._reconcile_deployment(deployment, owned)
        # Pods that lost their engine (a kubelet restart) or were made by hand are not ours to run.

    async def _reconcile_deployment(self, deployment: Obj, pods: list[Obj]) -> None:
        meta, spec = deployment["metadata"], deployment.get("spec") or {}
        desired = int(spec.get("replicas", 1))
        current_hash = template_hash(spec.get("template") or {})
        surge, max_unavailable = rolling_limits(deployment)

        def is_new(pod: Obj) -> bool:
            return (pod["metadata"].get("labels") or {}).get(POD_TEMPLATE_HASH) == current_hash

        def ready(pod: Obj) -> bool:
            return self.engines[pod_key(pod)].ready

        new = [p for p in pods if is_new(p)]
        old = [p for p in pods if not is_new(p)]

        # Scaling down the new set ignores availability, as the Deployment controller does.
        for pod in sorted(new, key=lambda p: (ready(p), p["metadata"]["name"]))[: max(0, len(new) - desired)]:
            await self._delete_pod(pod)
            new.remove(pod)
        # Create new pods while the surge allows (none while a ConfigMap they mount is missing).
        while len(new) < desired and len(new) + len(old) < desired + surge:
            if (created := await self._create_pod(deployment, current_hash)) is None:
                break
            new.append(created)
        # Take old pods away while enough stay available (unready old pods go first).
        min_available = desired - max_unavailable
        for pod in sorted(old, key=lambda p: (ready(p), p["metadata"]["name"])):
            available = sum(1 for p in new + old if ready(p))
            if ready(pod) and available - 1 < min_available:
                break
            await self._delete_pod(pod)
            old.remove(pod)
        while len(new) < desired and len(new) + len(old) < desired + surge:
            if (created := await self._create_pod(deployment, current_hash)) is None:
                break
            new.append(created)

        for pod in new + old:
            await self._write_pod_status(pod)
        ready_count = sum(1 for p in new + old if ready(p))
        status = deployment_status(
            deployment, updated=len(new), outdated=len(old), ready=ready_count, min_available=min_available
        )
        if status_changed(deployment.get("status") or {}, status):
            with contextlib.suppress(kmock.KubernetesError):  # deleted meanwhile: nothing to report
                await self.emulator.patch_object(
                    "apps/v1", "Deployment", meta["namespace"], meta["name"], {"status": status}, subresource="status"
                )

    # --- pods --------------------------------------------------------------------------------

    def _engine_options(self, deployment: Obj) -> tuple[Speaker, list[str]] | None:
        """The speaker and emulator options of the Deployment's engine container, its ConfigMap volumes read from
        the API; None while a ConfigMap it needs is missing (a kubelet would leave the pod ContainerCreating)."""
        meta, template = deployment["metadata"], (deployment["spec"].get("template") or {})
        tspec = template.get("spec") or {}
        containers = tspec.get("containers") or []
        if not containers:
            raise LocalClusterError(f"Deployment {meta['namespace']}/{meta['name']} has no container")
        mounts = config_map_mounts(tspec, containers[0])
        maps = {
            str(source.get("name")): self.emulator.read_object("v1", "ConfigMap", meta["namespace"], source["name"])
            for _, source in mounts
        }
        if any(maps[str(source.get("name"))] is None and not source.get("optional") for _, source in mounts):
            return None
        labels = (template.get("metadata") or {}).get("labels") or {}
        return emulate_options(containers[0], labels, mounted_files(mounts, maps))

    async def _create_pod(self, deployment: Obj, pod_hash: str) -> Obj | None:
        """Create a pod of the Deployment's template and start its engine; None (no pod) while a ConfigMap it
        mounts is missing."""
        meta, spec = deployment["metadata"], deployment["spec"]
        options = self._engine_options(deployment)
        if options is None:
            return None
        speaker, serve_args = options
        container = ((spec.get("template") or {}).get("spec") or {})["containers"][0]
        namespace = meta["namespace"]
        counter_key = f"{namespace}/{meta['name']}"
        self._counters[counter_key] = self._counters.get(counter_key, 0) + 1
        name = f"{meta['name']}-{pod_hash}-{self._counters[counter_key]}"
        port = free_port()
        manifest = pod_manifest(deployment, name, pod_hash, {ANNOTATION_PORT: str(port)})
        pod = await self.emulator.create_object(manifest)
        engine = PodEngine(
            namespace=namespace,
            pod=name,
            deployment=meta["name"],
            labels=manifest["metadata"]["labels"],
            argv=emulate_argv(serve_args, self.engine_args, port),
            env=container_env(container, self.engine_env),
            port=port,
            log_path=self.workdir / f"{namespace}_{name}.log",
            metrics_path=speaker.metrics_path,
        )
        self.engines.start(engine)
        self.census.engine_started(engine.labels)
        return pod

    async def _delete_pod(self, pod: Obj) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(kmock.KubernetesError):  # already gone
            await self.emulator.delete_object("v1", "Pod", meta["namespace"], meta["name"])
        engine = self.engines.get(pod_key(pod))
        if engine is not None:
            self.engines.drop(engine)

    async def _write_pod_status(self, pod: Obj) -> None:
        status = self.engines[pod_key(pod)].pod_status(pod)
        if status != (pod.get("status") or {}):
            meta = pod["metadata"]
            with contextlib.suppress(kmock.KubernetesError):  # deleted meanwhile: the next pass drops it
                await self.emulator.patch_object(
                    "v1", "Pod", meta["namespace"], meta["name"], {"status": status}, subresource="status"
                )

    async def oom_kill(self, namespace: str, pod: str) -> None:
        """Kill a pod's engine as the kernel's OOM killer would; it restarts, and the pod shows OOMKilled."""
        async with self._lock:
            engine = self.engines.get(f"{namespace}/{pod}")
            if engine is None or engine.process is None:
                raise LocalClusterError(f"no running engine for pod {namespace}/{pod}")
            await engine.oom_kill()
            current = self.emulator.read_object("v1", "Pod", namespace, pod)
            deployment = self.emulator.read_object("apps/v1", "Deployment", namespace, engine.deployment)
            if current is not None and deployment is not None:
                await self._write_pod_status(current)
        self.poke()
