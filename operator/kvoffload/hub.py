"""Measurement batching: many policies' analysis requests, one provider call.

Each policy's reconcile asks the hub for its own ``Measurements``. Requests that
arrive within a short gather window (50 ms by default) for the same Prometheus
are coalesced into ONE ``MetricsProvider.measure(targets)`` call, which the
provider answers with one query per metric for all of them. So the queries per
cycle stay constant as policies are added. The provider is blocking; it runs in
a worker thread, one batch at a time per Prometheus.

The hub never raises into a reconcile: a provider that fails, or that does not
answer for a target, gives that target ``Measurements(error=...)``, which
``assess()`` turns into Inconclusive.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from kvoffload.analysis import Measurements
from kvoffload.opmetrics import OperatorMetrics
from kvoffload.prometheus import MetricsProvider, PolicyKey, Target

log = logging.getLogger(__name__)

DEFAULT_GATHER_WINDOW = 0.05
"""Seconds the first request of a batch waits for others to join it."""

ProviderFactory = Callable[[str], MetricsProvider]
"""A provider for a Prometheus base URL (spec.prometheus.url)."""


@dataclass
class _Batch:
    targets: dict[PolicyKey, Target] = field(default_factory=dict)
    waiters: list[tuple[PolicyKey, asyncio.Future[Measurements]]] = field(default_factory=list)


class MeasurementHub:
    """Coalesces concurrent ``measure`` calls into one provider call per Prometheus.

    ``provider`` is one MetricsProvider for every policy, or a factory that makes one per
    Prometheus URL (called once per URL, then reused).
    """

    def __init__(
        self,
        provider: MetricsProvider | ProviderFactory,
        *,
        gather_window: float = DEFAULT_GATHER_WINDOW,
        metrics: OperatorMetrics | None = None,
    ) -> None:
        if hasattr(provider, "measure"):
            single: MetricsProvider = provider  # type: ignore[assignment]
            self._factory: ProviderFactory = lambda _url: single
        else:
            self._factory = provider
        self.gather_window = gather_window
        self.metrics = metrics
        self.provider_calls = 0
        """Calls made to providers so far (the batching tests count them)."""
        self._providers: dict[str, MetricsProvider] = {}
        self._pending: dict[str, _Batch] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def provider_for(self, url: str = "") -> MetricsProvider:
        """The provider that serves ``url`` (made on first use)."""
        if url not in self._providers:
            self._providers[url] = self._factory(url)
        return self._providers[url]

    async def measure(self, target: Target, url: str = "") -> Measurements:
        """This target's measurements, from a batch shared with every request of the gather window.

        Two requests for the same (namespace, policy) in one batch share its answer (the
        first request's target is measured).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Measurements] = loop.create_future()
        batch = self._pending.get(url)
        if batch is None:
            batch = self._pending[url] = _Batch()
            task = loop.create_task(
                self._flush_later(url, batch), name=f"kvoffload measurement batch {url or 'default'}"
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        batch.targets.setdefault(target.key, target)
        batch.waiters.append((target.key, future))
        return await asyncio.shield(future)

    async def _flush_later(self, url: str, batch: _Batch) -> None:
        try:
            await asyncio.sleep(self.gather_window)
        finally:
            if self._pending.get(url) is batch:
                del self._pending[url]  # later requests start the next batch
        lock = self._locks.setdefault(url, asyncio.Lock())
        async with lock:  # one batch at a time per Prometheus: the query counter stays honest
            results = await self._call(url, list(batch.targets.values()))
        for key, future in batch.waiters:
            if not future.done():
                found = results.get(key)
                future.set_result(
                    found
                    if found is not None
                    else Measurements(canary=None, stable=None, error=f"no answer for {key[0]}/{key[1]}")
                )

    async def _call(self, url: str, targets: list[Target]) -> dict[PolicyKey, Measurements]:
        try:
            provider = self.provider_for(url)
        except Exception as exc:  # a bad URL must not take down other policies' analysis
            return _all_failed(targets, f"no metrics provider for {url!r}: {exc}")
        before = getattr(provider, "queries", None)
        self.provider_calls += 1
        try:
            return await asyncio.to_thread(provider.measure, targets)
        except Exception as exc:  # the Protocol says never raises; a provider bug still must not
            log.warning("Metrics provider for %s failed: %s", url or "(default)", exc)
            return _all_failed(targets, f"metrics provider failed: {type(exc).__name__}: {exc}")
        finally:
            after = getattr(provider, "queries", None)
            if self.metrics is not None:
                sent = after - before if isinstance(before, int) and isinstance(after, int) else 1
                self.metrics.prometheus_queries.inc(max(0, sent))


def _all_failed(targets: list[Target], error: str) -> dict[PolicyKey, Measurements]:
    return {t.key: Measurements(canary=None, stable=None, error=error) for t in targets}
