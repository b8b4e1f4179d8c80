"""The running engines, one per pod: probed, restarted after a crash, scraped by Prometheus, given faults."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import aiohttp

from kvoffload.api.conventions import LABEL_LEVEL, LABEL_POLICY, SERIES_POD_LABELS
from kvoffload_lab.cluster.kubeemu import Obj, label_selector
from kvoffload_lab.cluster.podengine import PodEngine
from kvoffload_lab.promserver import PrometheusServer

log = logging.getLogger("kvoffload.localcluster")

DEFAULT_TARGET_LABELS = SERIES_POD_LABELS
"""Pod labels the rendered PodMonitor copies into series labels (``podTargetLabels``)."""


def sanitize_label(name: str) -> str:
    """A pod label name as the Prometheus Operator turns it into a series label name."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


@dataclasses.dataclass(frozen=True)
class StickyFault:
    """Faults applied to every engine whose pod matches, including engines started later."""

    selector: str
    faults: Mapping[str, Any]
    namespace: str | None


class Engines(Mapping[str, PodEngine]):
    """The engines by pod (``namespace/pod``), as the kubelet runs them.

    A pod's engine is registered with Prometheus, under the labels the PodMonitor would
    give it, once its port first answers; it is unregistered as soon as it is dropped.
    """

    def __init__(
        self,
        prometheus: PrometheusServer | None,
        *,
        target_labels: Sequence[str] = DEFAULT_TARGET_LABELS,
        probe_period: float = 1.0,
    ) -> None:
        self.prometheus = prometheus
        self.target_labels = tuple(target_labels)
        self.probe_period = probe_period
        self.sticky_faults: list[StickyFault] = []
        self._engines: dict[str, PodEngine] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._last_probe: dict[str, float] = {}

    def __getitem__(self, key: str) -> PodEngine:
        return self._engines[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._engines)

    def __len__(self) -> int:
        return len(self._engines)

    # --- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))

    async def close(self) -> None:
        """Stop every engine and unregister them from Prometheus."""
        await asyncio.gather(*(self._stop(engine) for engine in list(self._engines.values())))
        self._engines.clear()
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def start(self, engine: PodEngine) -> None:
        self._engines[engine.key] = engine
        engine.start()
        log.info("pod %s started: engine on port %d", engine.key, engine.port)

    def drop(self, engine: PodEngine) -> None:
        """Forget a pod's engine now (no traffic, no scraping); its process stops in the background."""
        self._engines.pop(engine.key, None)
        engine.terminating = True
        engine.ready = False
        if self.prometheus is not None:
            self.prometheus.remove_target(engine.key)
        task = asyncio.create_task(self._stop(engine), name=engine.key)
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def is_stopping(self, key: str) -> bool:
        """Whether a dropped pod's engine (``namespace/pod``) is still on its way out."""
        return any(task.get_name() == key and not task.done() for task in self._stopping)

    def drop_gone(self, live_pods: Mapping[str, Obj]) -> None:
        """Drop the engines of pods deleted (by the garbage collector, a test or a person)."""
        for key, engine in list(self._engines.items()):
            pod = live_pods.get(key)
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                self.drop(engine)

    async def _stop(self, engine: PodEngine) -> None:
        if self.prometheus is not None:
            self.prometheus.remove_target(engine.key)
        await engine.stop()

    # --- health ------------------------------------------------------------------------------

    async def check(self) -> None:
        """Restart crashed engines (with back-off) and probe the others."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        checks = []
        for engine in list(self._engines.values()):
            if engine.terminating:
                continue
            if engine.process is not None and engine.process.poll() is not None:
                engine.terminated(reason="Error")
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
        if engine.terminating or engine.key not in self._engines:
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
        if engine.metrics_path != "/metrics":
            labels["__metrics_path__"] = engine.metrics_path  # the path its PodMonitor names, as relabelling sets it
        for name in self.target_labels:
            if name in engine.labels:
                labels[sanitize_label(name)] = engine.labels[name]
        self.prometheus.set_target(engine.key, f"{engine.host}:{engine.port}", labels)

    # --- faults and endpoints ------------------------------------------------------------------

    def matching(self, selector: str, namespace: str | None = None, *, ready_only: bool = True) -> list[PodEngine]:
        """The engines whose pods match a label selector (e.g. ``kvoffload.io/level=nvme``)."""
        matches = label_selector(selector)
        return [
            engine
            for engine in self._engines.values()
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

    def endpoints(self, policy: str, namespace: str | None = None, level: str | None = None) -> list[str]:
        """URLs of the ready engines the policy's Service would route to (optionally one level's)."""
        selector = f"{LABEL_POLICY}={policy}" + (f",{LABEL_LEVEL}={level}" if level else "")
        return [engine.url for engine in self.matching(selector, namespace)]
