"""The kubelet stand-in, which is also the Deployment controller: each Deployment's pods, run as emulated engines."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import hashlib
import json
import logging
import math
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import kmock

from kvoffload.api.conventions import API_GROUP, LABEL_POLICY, LABEL_VARIANT
from kvoffload.lab.cluster.kubeemu import KubeEmulator, label_selector
from kvoffload.lab.promserver import PrometheusServer, free_port

log = logging.getLogger("kvoffload.localcluster")

HOST = "127.0.0.1"
POD_TEMPLATE_HASH = "pod-template-hash"
ANNOTATION_PORT = f"localcluster.{API_GROUP}/port"
"""Pod annotation: the loopback port its engine listens on (every pod's IP is 127.0.0.1)."""
DEFAULT_TARGET_LABELS = (LABEL_POLICY, LABEL_VARIANT)
"""Pod labels the rendered PodMonitor copies into series labels (``podTargetLabels``)."""

CLI = (sys.executable, "-c", "from kvoffload.cli.main import main; main()")
"""``kvoffload`` run by this interpreter: the engines' command, and the operator's."""
Obj = dict[str, Any]


class LocalClusterError(RuntimeError):
    """Something the local cluster cannot do (an unknown pod, a container it cannot run)."""


# --- pure helpers ---------------------------------------------------------------------------


def vllm_serve_args(container: Mapping[str, Any]) -> list[str]:
    """The ``vllm serve`` arguments of an engine container, after any shell wrapper.

    Understood forms: no ``command`` (the vLLM image's entrypoint is ``vllm serve``),
    ``command: [vllm, serve, ...]``, and ``command: [sh, -c, '...; exec vllm serve "$@"', NAME]``
    with the arguments in ``args`` (``$0`` is NAME, ``$@`` the rest), as kvoffload renders it.
    """
    command = [str(c) for c in container.get("command") or []]
    args = [str(a) for a in container.get("args") or []]
    if not command:
        return args[1:] if args[:1] == ["serve"] else args
    if Path(command[0]).name == "vllm" and command[1:2] == ["serve"]:
        return [*command[2:], *args]
    if Path(command[0]).name in ("sh", "bash") and command[1:2] == ["-c"] and len(command) >= 3:
        script = command[2]
        if 'vllm serve "$@"' in script:
            positional = [*command[3:], *args]
            return positional[1:]  # positional[0] is $0
    raise LocalClusterError(f"cannot tell the vllm serve arguments of command {command!r}")


def template_hash(template: Mapping[str, Any]) -> str:
    """A stable short hash of a pod template (the Deployment controller's ``pod-template-hash``)."""
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def _int_or_percent(value: Any, total: int, *, round_up: bool, default: str) -> int:
    raw = default if value is None else value
    if isinstance(raw, str) and raw.endswith("%"):
        share = total * float(raw[:-1]) / 100
        return math.ceil(share) if round_up else math.floor(share)
    return int(raw)


def rolling_limits(deployment: Mapping[str, Any]) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) of a RollingUpdate Deployment, as numbers of pods (never both 0)."""
    spec = deployment.get("spec") or {}
    desired = int(spec.get("replicas", 1))
    rolling = ((spec.get("strategy") or {}).get("rollingUpdate")) or {}
    surge = _int_or_percent(rolling.get("maxSurge"), desired, round_up=True, default="25%")
    unavailable = _int_or_percent(rolling.get("maxUnavailable"), desired, round_up=False, default="25%")
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


def sanitize_label(name: str) -> str:
    """A pod label name as the Prometheus Operator turns it into a series label name."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_parent_death_signal() -> None:
    """Linux: the engine gets SIGTERM when the process that started it dies, so none outlives a crash."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# --- one pod's engine -----------------------------------------------------------------------


@dataclasses.dataclass
class PodEngine:
    """The engine process behind one pod, and the container state the kubelet reports for it."""

    namespace: str
    pod: str
    deployment: str
    labels: dict[str, str]
    argv: list[str]
    env: dict[str, str]
    port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    ready: bool = False
    opened: bool = False  # the port answered once since the last (re)start
    restart_count: int = 0
    last_terminated: Obj | None = None
    started_at: str = ""
    failed_probes: int = 0
    terminating: bool = False
    restart_at: float | None = None  # loop time of the next start after a crash (back-off)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.pod}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                preexec_fn=set_parent_death_signal if sys.platform == "linux" else None,
            )
        self.started_at = _now()
        self.ready = self.opened = False
        self.failed_probes = 0

    async def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; returns once the process is gone."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while process.poll() is None:
            if loop.time() > deadline:
                process.kill()
                await asyncio.to_thread(process.wait)
                break
            await asyncio.sleep(0.05)  # poll for the exit; the loop keeps serving meanwhile

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def container_status(self, image: str) -> Obj:
        state: Obj
        if self.alive():
            state = {"running": {"startedAt": self.started_at}}
        elif self.restart_count:
            state = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting failed container"}}
        else:
            state = {"waiting": {"reason": "ContainerCreating"}}
        status: Obj = {
            "name": "vllm",
            "image": image,
            "imageID": image,
            "containerID": f"emulated://{self.process.pid if self.process else 0}",
            "ready": self.ready,
            "started": self.opened,
            "restartCount": self.restart_count,
            "state": state,
            "lastState": {"terminated": self.last_terminated} if self.last_terminated else {},
        }
        return status


# --- the kubelet (and Deployment controller) stand-in ----------------------------------------


@dataclasses.dataclass(frozen=True)
class StickyFault:
    """Faults applied to every engine whose pod matches, including engines started later."""

    selector: str
    faults: Mapping[str, Any]
    namespace: str | None


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
        self.prometheus = prometheus
        self.engine_args = list(engine_args)
        self.engine_env = dict(engine_env or {})
        self.target_labels = tuple(target_labels)
        self.tick = tick
        self.probe_period = probe_period
        self.engines: dict[str, PodEngine] = {}  # by namespace/pod
        self.sticky_faults: list[StickyFault] = []
        self._counters: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._last_probe: dict[str, float] = {}
        self._lock = asyncio.Lock()
        self.errors: list[str] = []

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
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
        await asyncio.gather(*(self._stop_engine(engine) for engine in list(self.engines.values())))
        self.engines.clear()
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)
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
        live_pods = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}

        # Pods deleted (by the garbage collector, a test or a person): their engines go.
        for key, engine in list(self.engines.items()):
            pod = live_pods.get(key)
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                await self._drop_engine(engine)

        await self._check_engines()

        by_owner: dict[str, list[Obj]] = {}
        for pod in pods:
            for ref in pod["metadata"].get("ownerReferences") or []:
                if ref.get("controller") and ref.get("kind") == "Deployment":
                    by_owner.setdefault(ref["uid"], []).append(pod)
        for deployment in deployments:
            if deployment["metadata"].get("deletionTimestamp"):
                continue
            owned = [p for p in by_owner.get(deployment["metadata"]["uid"], []) if self._key(p) in self.engines]
            await self._reconcile_deployment(deployment, owned)
        # Pods that lost their engine (a kubelet restart) or were made by hand are not ours to run.

    @staticmethod
    def _key(pod: Mapping[str, Any]) -> str:
        return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"

    async def _reconcile_deployment(self, deployment: Obj, pods: list[Obj]) -> None:
        meta, spec = deployment["metadata"], deployment.get("spec") or {}
        desired = int(spec.get("replicas", 1))
        current_hash = template_hash(spec.get("template") or {})
        surge, max_unavailable = rolling_limits(deployment)

        def is_new(pod: Obj) -> bool:
            return (pod["metadata"].get("labels") or {}).get(POD_TEMPLATE_HASH) == current_hash

        def ready(pod: Obj) -> bool:
            return self.engines[self._key(pod)].ready

        new = [p for p in pods if is_new(p)]
        old = [p for p in pods if not is_new(p)]

        # Scaling down the new set ignores availability, as the Deployment controller does.
        for pod in sorted(new, key=lambda p: (ready(p), p["metadata"]["name"]))[: max(0, len(new) - desired)]:
            await self._delete_pod(pod)
            new.remove(pod)
        # Create new pods while the surge allows.
        while len(new) < desired and len(new) + len(old) < desired + surge:
            new.append(await self._create_pod(deployment, current_hash))
        # Take old pods away while enough stay available (unready old pods go first).
        min_available = desired - max_unavailable
        for pod in sorted(old, key=lambda p: (ready(p), p["metadata"]["name"])):
            available = sum(1 for p in new + old if ready(p))
            if ready(pod) and available - 1 < min_available:
                break
            await self._delete_pod(pod)
            old.remove(pod)
        while len(new) < desired and len(new) + len(old) < desired + surge:
            new.append(await self._create_pod(deployment, current_hash))

        for pod in new + old:
            await self._write_pod_status(pod, deployment)
        ready_count = sum(1 for p in new + old if ready(p))
        status: Obj = {
            "observedGeneration": int(meta.get("generation") or 0),
            "replicas": len(new) + len(old),
            "updatedReplicas": len(new),
            "readyReplicas": ready_count,
            "availableReplicas": ready_count,
            "unavailableReplicas": max(0, desired - ready_count),
        }
        complete = len(new) == desired and not old and ready_count == desired
        available_ok = ready_count >= min_available
        status["conditions"] = self._conditions(deployment, available_ok, complete)
        current = deployment.get("status") or {}
        if any(current.get(k) != v for k, v in status.items() if k != "conditions") or self._changed_conditions(
            current.get("conditions") or [], status["conditions"]
        ):
            with contextlib.suppress(kmock.KubernetesError):  # deleted meanwhile: nothing to report
                await self.emulator.patch_object(
                    "apps/v1", "Deployment", meta["namespace"], meta["name"], {"status": status}, subresource="status"
                )

    @staticmethod
    def _conditions(deployment: Obj, available: bool, complete: bool) -> list[Obj]:
        previous = {c.get("type"): c for c in (deployment.get("status") or {}).get("conditions") or []}
        now = _now()

        def condition(type_: str, ok: bool, reason: str, message: str) -> Obj:
            status = "True" if ok else "False"
            before = previous.get(type_) or {}
            changed = before.get("status") != status
            return {
                "type": type_,
                "status": status,
                "reason": reason,
                "message": message,
                "lastUpdateTime": now if changed or before.get("reason") != reason else before.get("lastUpdateTime"),
                "lastTransitionTime": now if changed else before.get("lastTransitionTime", now),
            }

        name = deployment["metadata"]["name"]
        return [
            condition(
                "Available",
                available,
                "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
                "Deployment has minimum availability."
                if available
                else "Deployment does not have minimum availability.",
            ),
            condition(
                "Progressing",
                True,
                "NewReplicaSetAvailable" if complete else "ReplicaSetUpdated",
                f'Deployment "{name}" has successfully progressed.'
                if complete
                else f'Deployment "{name}" is progressing.',
            ),
        ]

    @staticmethod
    def _changed_conditions(before: list[Obj], after: list[Obj]) -> bool:
        def essence(conditions: list[Obj]) -> list[tuple[Any, ...]]:
            return sorted((c.get("type"), c.get("status"), c.get("reason")) for c in conditions)

        return essence(before) != essence(after)

    # --- pods --------------------------------------------------------------------------------

    async def _create_pod(self, deployment: Obj, pod_hash: str) -> Obj:
        meta, spec = deployment["metadata"], deployment["spec"]
        template = spec.get("template") or {}
        tmeta, tspec = template.get("metadata") or {}, template.get("spec") or {}
        containers = tspec.get("containers") or []
        if not containers:
            raise LocalClusterError(f"Deployment {meta['namespace']}/{meta['name']} has no container")
        container = containers[0]
        serve_args = vllm_serve_args(container)
        namespace = meta["namespace"]
        counter_key = f"{namespace}/{meta['name']}"
        self._counters[counter_key] = self._counters.get(counter_key, 0) + 1
        name = f"{meta['name']}-{pod_hash}-{self._counters[counter_key]}"
        port = free_port()
        labels = {**(tmeta.get("labels") or {}), POD_TEMPLATE_HASH: pod_hash}
        pod = await self.emulator.create_object(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": labels,
                    "annotations": {**(tmeta.get("annotations") or {}), ANNOTATION_PORT: str(port)},
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "Deployment",
                            "name": meta["name"],
                            "uid": meta["uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": {**tspec, "nodeName": "localhost"},
            }
        )
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.update({e["name"]: str(e["value"]) for e in container.get("env") or [] if "value" in e})
        env.update(self.engine_env)
        engine = PodEngine(
            namespace=namespace,
            pod=name,
            deployment=meta["name"],
            labels=labels,
            argv=[*CLI, "emulate", *serve_args, *self.engine_args, "--host", HOST, "--port", str(port)],
            env=env,
            port=port,
            log_path=self.workdir / f"{namespace}_{name}.log",
        )
        self.engines[engine.key] = engine
        engine.start()
        log.info("pod %s started: engine on port %d", engine.key, port)
        return pod

    async def _delete_pod(self, pod: Obj) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(kmock.KubernetesError):  # already gone
            await self.emulator.delete_object("v1", "Pod", meta["namespace"], meta["name"])
        engine = self.engines.get(self._key(pod))
        if engine is not None:
            await self._drop_engine(engine)

    async def _drop_engine(self, engine: PodEngine) -> None:
        """Forget a pod's engine now (no traffic, no scraping); its process stops in the background."""
        self.engines.pop(engine.key, None)
        engine.terminating = True
        engine.ready = False
        if self.prometheus is not None:
            self.prometheus.remove_target(engine.key)
        task = asyncio.create_task(self._stop_engine(engine))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def _stop_engine(self, engine: PodEngine) -> None:
        if self.prometheus is not None:
            self.prometheus.remove_target(engine.key)
        await engine.stop()

    async def _write_pod_status(self, pod: Obj, deployment: Obj) -> None:
        engine = self.engines[self._key(pod)]
        containers = ((pod.get("spec") or {}).get("containers")) or [{}]
        image = str(containers[0].get("image", ""))
        ready = "True" if engine.ready else "False"
        before = pod.get("status") or {}
        previous = {c.get("type"): c for c in before.get("conditions") or []}

        def condition(type_: str, status: str) -> Obj:
            old = previous.get(type_) or {}
            kept = old.get("status") == status and old.get("lastTransitionTime")
            return {"type": type_, "status": status, "lastTransitionTime": kept or _now()}

        status: Obj = {
            "phase": "Running" if engine.alive() or engine.restart_count else "Pending",
            "hostIP": HOST,
            "podIP": HOST,
            "podIPs": [{"ip": HOST}],
            "startTime": before.get("startTime") or engine.started_at,
            "qosClass": "Guaranteed",
            "conditions": [
                condition("PodScheduled", "True"),
                condition("Initialized", "True"),
                condition("ContainersReady", ready),
                condition("Ready", ready),
            ],
            "containerStatuses": [engine.container_status(image)],
        }
        if status != before:
            meta = pod["metadata"]
            with contextlib.suppress(kmock.KubernetesError):  # deleted meanwhile: the next pass drops it
                await self.emulator.patch_object(
                    "v1", "Pod", meta["namespace"], meta["name"], {"status": status}, subresource="status"
                )

    # --- engines -----------------------------------------------------------------------------

    async def _check_engines(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        checks = []
        for engine in list(self.engines.values()):
            if engine.terminating:
                continue
            if engine.process is not None and engine.process.poll() is not None:
                self._terminated(engine, reason="Error")
                # Like the kubelet: restart at once the first time, then back off (0.5 s doubling, 5 s at most).
                delay = 0.0 if engine.restart_count <= 1 else min(5.0, 0.5 * 2 ** (engine.restart_count - 2))
                engine.restart_at = now + delay
            if engine.process is None:
                if engine.restart_at is not None and now >= engine.restart_at:
                    engine.restart_at = None
                    engine.start()
                continue
            if not engine.opened or now - self._last_probe.get(engine.key, 0.0) >= self.probe_period:
                self._last_probe[engine.key] = now
                checks.append(self._probe(engine))
        if checks:
            await asyncio.gather(*checks)

    async def _probe(self, engine: PodEngine) -> None:
        """The readiness probe: GET /health; three failures in a row make a ready pod unready."""
        assert self._session is not None
        try:
            async with self._session.get(f"{engine.url}/health", timeout=aiohttp.ClientTimeout(total=1)) as response:
                healthy = response.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            healthy = False
        if engine.terminating or engine.key not in self.engines:
            return
        if healthy:
            engine.failed_probes = 0
            if not engine.opened:
                engine.opened = True
                await self._apply_sticky_faults(engine)
                self._register(engine)
            engine.ready = True
        else:
            engine.failed_probes += 1
            if engine.ready and engine.failed_probes >= 3:
                engine.ready = False

    def _register(self, engine: PodEngine) -> None:
        if self.prometheus is None:
            return
        labels = {"namespace": engine.namespace, "pod": engine.pod, "container": "vllm", "endpoint": "http"}
        for name in self.target_labels:
            if name in engine.labels:
                labels[sanitize_label(name)] = engine.labels[name]
        self.prometheus.set_target(engine.key, f"{HOST}:{engine.port}", labels)

    def _terminated(self, engine: PodEngine, *, reason: str) -> None:
        """Record a dead container (lastState, restartCount); it is not serving until restarted."""
        process = engine.process
        code = process.returncode if process is not None and process.returncode is not None else -9
        engine.last_terminated = {
            "reason": reason,
            "exitCode": 137 if reason == "OOMKilled" else (code if code >= 0 else 128 - code),
            "startedAt": engine.started_at,
            "finishedAt": _now(),
            "containerID": f"emulated://{process.pid if process else 0}",
        }
        engine.restart_count += 1
        engine.process = None
        engine.ready = engine.opened = False
        log.warning("pod %s: engine terminated (%s)", engine.key, reason)

    async def oom_kill(self, namespace: str, pod: str) -> None:
        """Kill a pod's engine as the kernel's OOM killer would; it restarts, and the pod shows OOMKilled."""
        async with self._lock:
            engine = self.engines.get(f"{namespace}/{pod}")
            if engine is None or engine.process is None:
                raise LocalClusterError(f"no running engine for pod {namespace}/{pod}")
            engine.process.kill()
            await asyncio.to_thread(engine.process.wait)
            self._terminated(engine, reason="OOMKilled")
            engine.start()  # the first restart is immediate
            current = self.emulator.read_object("v1", "Pod", namespace, pod)
            deployment = self.emulator.read_object("apps/v1", "Deployment", namespace, engine.deployment)
            if current is not None and deployment is not None:
                await self._write_pod_status(current, deployment)
        self.poke()

    # --- faults and endpoints ------------------------------------------------------------------

    def matching(self, selector: str, namespace: str | None = None, *, ready_only: bool = True) -> list[PodEngine]:
        """The engines whose pods match a label selector (e.g. ``kvoffload.io/variant=canary``)."""
        matches = label_selector(selector)
        return [
            engine
            for engine in self.engines.values()
            if not engine.terminating
            and (namespace is None or engine.namespace == namespace)
            and (engine.ready or not ready_only)
            and matches(engine.labels)
        ]

    async def set_faults(
        self, selector: str, faults: Mapping[str, Any], *, namespace: str | None = None, sticky: bool = False
    ) -> dict[str, Any]:
        """POST ``faults`` to ``/emulator/faults`` of every running engine matching; returns each answer by pod.

        ``sticky``: also apply them to matching engines that start later (before they take traffic).
        """
        if sticky:
            self.sticky_faults.append(StickyFault(selector, dict(faults), namespace))
        answers: dict[str, Any] = {}
        for engine in self.matching(selector, namespace, ready_only=False):
            if engine.opened:
                answers[engine.key] = await self._post_faults(engine, faults)
        return answers

    def clear_sticky_faults(self) -> None:
        self.sticky_faults.clear()

    async def _apply_sticky_faults(self, engine: PodEngine) -> None:
        for fault in self.sticky_faults:
            if (fault.namespace is None or fault.namespace == engine.namespace) and label_selector(fault.selector)(
                engine.labels
            ):
                await self._post_faults(engine, fault.faults)

    async def _post_faults(self, engine: PodEngine, faults: Mapping[str, Any]) -> Any:
        assert self._session is not None
        async with self._session.post(f"{engine.url}/emulator/faults", json=dict(faults)) as response:
            response.raise_for_status()
            return await response.json()

    def endpoints(self, policy: str, namespace: str | None = None, variant: str | None = None) -> list[str]:
        """URLs of the ready engines the policy's Service would route to (optionally one variant)."""
        selector = f"{LABEL_POLICY}={policy}" + (f",{LABEL_VARIANT}={variant}" if variant else "")
        return [engine.url for engine in self.matching(selector, namespace)]
