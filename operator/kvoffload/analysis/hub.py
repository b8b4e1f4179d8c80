"""Measurement batching: many policies' analysis requests, one provider call.

Each policy's reconcile asks the hub for its own ``Measurements``. Requests that
arrive within a short gather window (50 ms by default; longer for a patient
request, as a policy at rest makes: up to 2 s in ``kvoffload run``) for the same
Prometheus, or while the batch before them runs, are coalesced into one
``MetricsProvider.measure(targets)`` call of up to ``FULL_BATCH`` policies, which
the provider answers with one query per metric for all of them. So a sweep over
the fleet sends one batch's queries per hundred policies, not per policy. The
provider is blocking; it runs in a worker thread, one batch at a time per
Prometheus.

The blocking calls run on the hub's own ``ANALYSIS_THREADS`` threads, never on asyncio's default executor, which
the Kubernetes API calls use: a Prometheus that drips its answers cannot starve them (issue 33). A provider is
closed and dropped when the last policy that used its source moves to another (a new URL, token or TLS setting) or
goes (``assign``, ``forget``), and at most ``MAX_PROVIDERS`` are kept whatever happens.

The hub never raises into a reconcile: a provider that fails, or that does not
answer for a target, gives that target ``Measurements(error=...)``, which
``assess()`` turns into Inconclusive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from kvoffload.analysis.measurements import Measurements
from kvoffload.analysis.prometheus import MetricsProvider
from kvoffload.analysis.promhttp import Connection
from kvoffload.analysis.queries import PolicyKey, Target

log = logging.getLogger(__name__)

DEFAULT_GATHER_WINDOW = 0.05
"""Seconds the first request of a batch waits for others to join it."""

PATIENT_GATHER_WINDOW = 2.0
"""The longest ``kvoffload run`` lets a patient request (a policy at rest) wait for others: a resting fleet's loops
are spread over the interval, and every batch costs the same few queries however many policies it carries."""

FULL_BATCH = 100
"""Policies at which a batch closes: it stops waiting out its requests' patience and goes after the gather window,
as an impatient one does, and the next request starts another. Up to this size a batch's queries cost about the
same however many policies they name, so a longer wait would save none; a larger one is scoped to the whole fleet
(``queries.SCOPE_MAX_CHARS``): at 1,000 policies a batch of 200 took Prometheus 1.0-1.2 s against 0.05-0.07 s
for one of 100 (bench/operator)."""

NAMES_MAX_AGE = 300.0
"""Seconds the series names of a Prometheus are reused before they are asked again."""

ANALYSIS_THREADS = 4
"""Threads that run providers' batches and series-name lookups, for every hub of the process: each waits on its
batch's queries (``promhttp.QUERY_THREADS`` send them), each query bounded by its deadline."""

MAX_PROVIDERS = 64
"""Providers kept at most, least recently used dropped first: a backstop to ``forget``, for sources no policy
releases (a policy deleted while the operator was not watching)."""

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()

_R = TypeVar("_R")


def analysis_pool() -> ThreadPoolExecutor:
    """The process's ``ANALYSIS_THREADS`` (made on first use), apart from asyncio's default executor."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(ANALYSIS_THREADS, thread_name_prefix="prometheus batch")
        return _pool


async def in_analysis_pool(fn: Callable[..., _R], *args: object) -> _R:
    """``fn(*args)`` on the analysis threads (``asyncio.to_thread`` would take a Kubernetes API call's thread)."""
    return await asyncio.get_running_loop().run_in_executor(analysis_pool(), fn, *args)


class QueryCounter(Protocol):
    """Counts the PromQL queries sent (the operator passes its ``kvoffload_prometheus_queries`` counter)."""

    def inc(self, amount: float = 1) -> None: ...


@dataclass(frozen=True)
class PrometheusSource:
    """Which Prometheus to ask, and as whom: policies that share one share its batches."""

    url: str = ""
    bearer_token: str | None = field(default=None, repr=False)
    connection: Connection | None = field(default=None, repr=False)
    """The admin's headers, basic auth and TLS settings; only for the operator's own (or an allowed) Prometheus."""


ProviderFactory = Callable[[PrometheusSource], MetricsProvider]
"""A provider for one Prometheus (spec.prometheus.url and its bearer token)."""


@dataclass
class _Batch:
    opened: float
    """Loop time of its first request."""
    due: float
    """Loop time at which it is sent: when its least patient request has waited long enough."""
    sooner: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a request joins that wants the batch sent before ``due`` was."""
    targets: dict[PolicyKey, Target] = field(default_factory=dict)
    waiters: list[tuple[PolicyKey, asyncio.Future[Measurements]]] = field(default_factory=list)


class MeasurementHub:
    """Coalesces concurrent ``measure`` calls into one provider call per Prometheus.

    ``provider`` is one MetricsProvider for every policy, or a factory that makes one per
    Prometheus source (called once per source, then reused until evicted, and then closed if it has ``close``).
    """

    def __init__(
        self,
        provider: MetricsProvider | ProviderFactory,
        *,
        gather_window: float = DEFAULT_GATHER_WINDOW,
        patient_window: float | None = None,
        query_counter: QueryCounter | None = None,
    ) -> None:
        self._owns = not hasattr(provider, "measure")
        """Whether the providers are made here (and so closed here); one given provider is the caller's."""
        if not self._owns:
            single: MetricsProvider = provider  # type: ignore[assignment]
            self._factory: ProviderFactory = lambda _source: single
        else:
            self._factory = provider  # type: ignore[assignment]
        self.gather_window = gather_window
        self.patient_window = gather_window if patient_window is None else patient_window
        """The longest a patient request waits for others (the gather window unless given)."""
        self.query_counter = query_counter
        self.provider_calls = 0
        """Calls made to providers so far (the batching tests count them)."""
        self._providers: OrderedDict[PrometheusSource, MetricsProvider] = OrderedDict()
        self._users: dict[Hashable, PrometheusSource] = {}
        """Who (a policy's uid) asked which source last (``assign``)."""
        self._busy: Counter[PrometheusSource] = Counter()
        """Calls in flight per source: its provider is closed only once they end."""
        self._pending: dict[PrometheusSource, _Batch] = {}
        self._locks: dict[PrometheusSource, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._names: dict[PrometheusSource, tuple[float, frozenset[str]]] = {}
        self._names_asked: dict[PrometheusSource, asyncio.Future[frozenset[str]]] = {}

    def provider_for(self, source: PrometheusSource) -> MetricsProvider:
        """The provider that serves ``source`` (made on first use)."""
        provider = self._providers.get(source)
        if provider is None:
            provider = self._providers[source] = self._factory(source)
            for old in [s for s in self._providers if s != source][: max(0, len(self._providers) - MAX_PROVIDERS)]:
                self._evict(old)
        self._providers.move_to_end(source)
        return provider

    @property
    def provider_count(self) -> int:
        """Providers kept now (the bench and tests check that it stays bounded)."""
        return len(self._providers)

    def assign(self, user: Hashable, source: PrometheusSource) -> None:
        """Note that ``user`` (a policy) now asks ``source``: the source it asked before, if no one else asks it, is
        closed and dropped (its URL, token or TLS settings changed)."""
        before = self._users.get(user)
        self._users[user] = source
        if before is not None and before != source:
            self._release(before)

    def forget(self, user: Hashable) -> None:
        """``user`` is gone (a policy deleted): drop its source if no one else asks it."""
        before = self._users.pop(user, None)
        if before is not None:
            self._release(before)

    def _release(self, source: PrometheusSource) -> None:
        if self._busy[source] or source in self._pending or source in self._users.values():
            return  # still in use: the call in flight releases it again when it ends
        self._evict(source)

    def _evict(self, source: PrometheusSource) -> None:
        provider = self._providers.pop(source, None)
        self._names.pop(source, None)
        lock = self._locks.get(source)
        if lock is not None and not lock.locked():
            del self._locks[source]
        close = getattr(provider, "close", None)
        if self._owns and callable(close):
            try:
                close()
            except Exception as exc:  # closing is tidying: it must not fail a reconcile
                log.warning("Closing the metrics provider for %s failed: %s", source.url or "(default)", exc)

    def close(self) -> None:
        """Close every provider made here."""
        for source in list(self._providers):
            self._evict(source)

    async def measure(
        self, target: Target, source: PrometheusSource | None = None, *, patience: float = 0.0
    ) -> Measurements:
        """This target's measurements, from a batch shared with every request of the gather window.

        A request may wait ``patience`` seconds for others to join its batch, up to ``patient_window``, and at
        least the gather window: a batch is sent when its least patient request has waited that long, or a
        gather window after its first request once it holds ``FULL_BATCH`` policies, and no one else joins it.
        Two requests for the same (namespace, policy) in one batch share its answer (the first request's target is
        measured).
        """
        source = source or PrometheusSource()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Measurements] = loop.create_future()
        due = loop.time() + max(self.gather_window, min(patience, self.patient_window))
        batch = self._pending.get(source)
        if batch is None:
            batch = self._pending[source] = _Batch(loop.time(), due)
            task = loop.create_task(
                self._flush_later(source, batch), name=f"kvoffload measurement batch {source.url or 'default'}"
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        batch.targets.setdefault(target.key, target)
        if len(batch.targets) >= FULL_BATCH:
            due = min(due, batch.opened + self.gather_window)  # as an impatient batch
            del self._pending[source]  # full: whoever asks next starts the next batch
        if due < batch.due:
            batch.due = due
            batch.sooner.set()
        batch.waiters.append((target.key, future))
        return await asyncio.shield(future)

    async def _flush_later(self, source: PrometheusSource, batch: _Batch) -> None:
        lock = self._locks.setdefault(source, asyncio.Lock())
        loop = asyncio.get_running_loop()
        try:
            while (left := batch.due - loop.time()) > 0:
                batch.sooner.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(batch.sooner.wait(), left)
            # The batch stays open while the one before it runs: whoever asks meanwhile joins it, so
            # there is one batch running and one gathering, never a queue of small ones (each of which
            # would send the whole fleet's queries again).
            await lock.acquire()
        finally:
            if self._pending.get(source) is batch:
                del self._pending[source]  # later requests start the next batch
        try:  # one batch at a time per Prometheus: the query counter stays honest
            results = await self._call(source, list(batch.targets.values()))
        finally:
            lock.release()
        for key, future in batch.waiters:
            if not future.done():
                found = results.get(key)
                future.set_result(
                    found
                    if found is not None
                    else Measurements(canary=None, stable=None, error=f"no answer for {key[0]}/{key[1]}")
                )

    async def present_names(self, source: PrometheusSource, now: float) -> frozenset[str]:
        """The vLLM series names this Prometheus holds, fleet-wide: one query per source every
        ``NAMES_MAX_AGE`` seconds, whatever the number of policies. Empty when it cannot tell.

        Callers that ask while the query runs share its answer: after a restart every policy asks at once, and
        each used to send its own (349 of the 379 queries of one restart over 1,000 policies)."""
        cached = self._names.get(source)
        if cached is not None and now - cached[0] < NAMES_MAX_AGE:
            return cached[1]
        asking = self._names_asked.get(source)
        if asking is None:
            asking = self._names_asked[source] = asyncio.ensure_future(self._list_names(source, now))
            asking.add_done_callback(lambda _: self._names_asked.pop(source, None))
        return await asyncio.shield(asking)

    async def _list_names(self, source: PrometheusSource, now: float) -> frozenset[str]:
        try:
            provider = self.provider_for(source)
            self._busy[source] += 1
            try:
                names = await in_analysis_pool(provider.present_metric_names)
            finally:
                self._done(source)
        except Exception as exc:  # an unknown dialect is confirmed later; analysis must go on
            log.warning("Listing series names of %s failed: %s", source.url or "(default)", exc)
            return frozenset()
        if self.query_counter is not None:
            self.query_counter.inc()
        if names:  # an empty answer (Prometheus down) is asked again next time
            self._names[source] = (now, names)
        return names

    async def _call(self, source: PrometheusSource, targets: list[Target]) -> dict[PolicyKey, Measurements]:
        url = source.url
        try:
            provider = self.provider_for(source)
        except Exception as exc:  # a bad URL must not take down other policies' analysis
            return _all_failed(targets, f"no metrics provider for {url!r}: {exc}")
        before = getattr(provider, "queries", None)
        self.provider_calls += 1
        self._busy[source] += 1
        try:
            return await in_analysis_pool(provider.measure, targets)
        except Exception as exc:  # the Protocol says never raises; a provider bug still must not
            log.warning("Metrics provider for %s failed: %s", url or "(default)", exc)
            return _all_failed(targets, f"metrics provider failed: {type(exc).__name__}: {exc}")
        finally:
            self._done(source)
            after = getattr(provider, "queries", None)
            if self.query_counter is not None:
                sent = after - before if isinstance(before, int) and isinstance(after, int) else 1
                self.query_counter.inc(max(0, sent))

    def _done(self, source: PrometheusSource) -> None:
        self._busy[source] -= 1
        if self._busy[source] <= 0:
            del self._busy[source]
            if self._users and source not in self._users.values() and source not in self._pending:
                self._evict(source)  # released while it ran


def _all_failed(targets: list[Target], error: str) -> dict[PolicyKey, Measurements]:
    return {t.key: Measurements(canary=None, stable=None, error=error) for t in targets}
