"""Issue 33, bounded clients: what a hostile Prometheus can cost the operator is capped.

A body is read up to a cap (errors much lower), a query ends by its total deadline however slowly the server drips,
the queries run on threads of their own, and a policy whose URL changes, or that goes, leaves no client behind.
Nothing here asserts a tight timing: each bound is checked against a server that would hold for ever (or send
100 MiB) without it. RSS is measured, loosely, in ``bench/security/hostile_policies.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from kvoffload.analysis import hub as hub_module
from kvoffload.analysis import promhttp
from kvoffload.analysis.hub import MAX_PROVIDERS, MeasurementHub, PrometheusSource
from kvoffload.analysis.measurements import Measurements
from kvoffload.analysis.prometheus import PrometheusProvider
from kvoffload.analysis.promhttp import MAX_ERROR_BYTES
from kvoffload.analysis.queries import Target
from kvoffload.api.errors import MAX_ERROR_CHARS
from kvoffload.engines.vllm.dialect import NEWEST
from tests.support.hostile import EMPTY_ANSWER, HostileServer, wait_until

TARGET = Target("llm", "chat", dialect=NEWEST)
SLACK = 8.0
"""Seconds over a deadline a test allows: generous, as the machine is shared; without the bound it would be minutes."""


class Fake:
    """A provider that answers nothing, noting the threads it runs on and when it is closed."""

    def __init__(self, url: str = "", closed: list[str] | None = None, threads: list[str] | None = None) -> None:
        self.url = url
        self.closed = closed if closed is not None else []
        self.threads = threads if threads is not None else []

    def measure(self, targets: Sequence[Target]) -> dict[tuple[str, str], Measurements]:
        self.threads.append(threading.current_thread().name)
        return {t.key: Measurements(canary=None, stable=None) for t in targets}

    def present_metric_names(self, target: Target | None = None) -> frozenset[str]:
        self.threads.append(threading.current_thread().name)
        return frozenset()

    def close(self) -> None:
        self.closed.append(self.url)


def measure(provider: PrometheusProvider) -> Measurements:
    return provider.measure([TARGET])[TARGET.key]


def bounded_error(result: Measurements) -> str:
    assert result.error is not None
    assert result.canary is None
    assert result.stable is None
    assert result.error.isprintable()
    assert len(result.error) <= MAX_ERROR_CHARS
    return result.error


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[HostileServer]:
    mode, kwargs = request.param
    with HostileServer(mode, **kwargs) as running:
        yield running


@pytest.mark.parametrize("server", [("huge", {}), ("declared", {})], indirect=True, ids=["chunked", "declared"])
def test_a_huge_answer_is_cut_at_the_cap_and_its_connections_closed(server: HostileServer) -> None:
    provider = PrometheusProvider(server.url, max_answer_bytes=1 << 20, retries=0)
    error = bounded_error(measure(provider))
    assert "too large" in error
    # Each connection took at most the cap and what the kernel buffers: nowhere near the 100 MiB each was offered.
    assert server.connections >= 1
    assert server.sent < server.connections * (8 << 20)
    assert provider.present_metric_names() == frozenset()


def test_the_default_cap_stops_a_100_mib_answer() -> None:
    with HostileServer("huge") as server:
        error = bounded_error(measure(PrometheusProvider(server.url, retries=0)))
    assert "too large" in error  # at the cap, or at the budget all answers share when four reach it at once
    # Every byte of the shared budget comes back once the batch's queries end (those still reading end at the cap).
    assert wait_until(lambda: promhttp._BODIES.used == 0, timeout=15)
    assert server.sent < server.connections * (promhttp.MAX_ANSWER_BYTES + (8 << 20))


def test_a_gzip_bomb_is_cut_at_the_cap_as_decoded() -> None:
    with HostileServer("gzip") as server:
        error = bounded_error(measure(PrometheusProvider(server.url, max_answer_bytes=1 << 20, retries=0)))
    assert "too large" in error


def test_an_error_answer_is_read_only_to_its_own_small_cap() -> None:
    with HostileServer("huge", status=500) as server:
        error = bounded_error(measure(PrometheusProvider(server.url, retries=0)))
    assert "HTTP 500" in error
    assert server.sent < server.connections * (MAX_ERROR_BYTES + (8 << 20))


def test_an_answer_of_too_many_series_is_refused_before_it_is_decoded() -> None:
    with HostileServer("series", size=50) as server:
        assert measure(PrometheusProvider(server.url, max_answer_series=50, retries=0)).error is None
        error = bounded_error(measure(PrometheusProvider(server.url, max_answer_series=49, retries=0)))
    assert "more than 49 series" in error


@pytest.mark.parametrize(
    "server",
    [("tarpit", {"drip": 0.1}), ("header-tarpit", {"drip": 0.1})],
    indirect=True,
    ids=["body", "headers"],
)
def test_a_server_that_drips_is_cut_at_the_total_deadline(server: HostileServer) -> None:
    """A byte every 0.1 s restarts any read timeout; only a deadline over the whole query ends it."""
    provider = PrometheusProvider(server.url, timeout=1.0)
    started = time.monotonic()
    error = bounded_error(measure(provider))
    elapsed = time.monotonic() - started
    assert "timed out" in error
    assert "1 s deadline" in error
    assert elapsed < 1.0 + SLACK  # the tarpit drips until the test ends


def test_a_retry_after_header_is_not_obeyed() -> None:
    with HostileServer("retry-after") as server:
        started = time.monotonic()
        error = bounded_error(measure(PrometheusProvider(server.url, timeout=2.0, retries=1)))
    assert "HTTP 503" in error
    assert time.monotonic() - started < 2.0 + SLACK  # not the 3,600 s it asks for


def test_queries_run_on_the_prometheus_threads_not_asyncios_default_executor() -> None:
    names: list[str] = []
    with HostileServer("answer") as server:
        provider = PrometheusProvider(server.url)
        original = provider._query

        def noting(expr: str, at: float) -> list[dict[str, object]]:
            names.append(threading.current_thread().name)
            return original(expr, at)

        provider._query = noting  # type: ignore[method-assign]
        assert measure(provider).error is None
    assert names
    assert all(name.startswith("prometheus query") for name in names)


async def test_measurements_run_on_the_analysis_threads() -> None:
    names: list[str] = []
    hub = MeasurementHub(Fake(threads=names), gather_window=0.0)
    await hub.present_names(PrometheusSource(), 0.0)
    await hub.measure(TARGET)
    assert names
    assert all(name.startswith("prometheus batch") for name in names)


def _thread_names() -> set[str]:
    """The process's threads but the stand-in servers' own."""
    return {thread.name for thread in threading.enumerate() if not thread.name.startswith("hostile")}


async def test_fifty_url_edits_of_one_policy_leave_one_provider_and_no_new_threads() -> None:
    made: list[PrometheusProvider] = []

    def factory(source: PrometheusSource) -> PrometheusProvider:
        made.append(PrometheusProvider(source.url, retries=0))
        return made[-1]

    with HostileServer("answer") as server:
        hub = MeasurementHub(factory, gather_window=0.0)
        # Warm: the shared pools' threads exist once the first cycles ran.
        for i in range(3):
            source = PrometheusSource(f"{server.url}/warm{i}")
            hub.assign("uid-1", source)
            assert (await hub.measure(TARGET, source)).error is None
        before = _thread_names()
        for i in range(50):
            source = PrometheusSource(f"{server.url}/edit{i}")
            hub.assign("uid-1", source)
            await hub.present_names(source, float(i))
            assert (await hub.measure(TARGET, source)).error is None
        assert hub.provider_count == 1
        assert len(made) == 53
        assert all(p.closed for p in made[:-1])
        assert not made[-1].closed
        # None per provider: the pools are the process's, and only they may have grown (their threads start lazily).
        new = _thread_names() - before
        assert all(name.startswith(("prometheus query", "prometheus batch", "prometheus deadlines")) for name in new)
        names = _thread_names()
        assert sum(name.startswith("prometheus query") for name in names) <= promhttp.QUERY_THREADS
        assert sum(name.startswith("prometheus batch") for name in names) <= hub_module.ANALYSIS_THREADS
        hub.forget("uid-1")
        assert hub.provider_count == 0
        assert made[-1].closed


async def test_a_token_change_is_a_new_source_and_the_old_client_is_closed() -> None:
    made: dict[str | None, PrometheusProvider] = {}

    def factory(source: PrometheusSource) -> PrometheusProvider:
        made[source.bearer_token] = PrometheusProvider(source.url, bearer_token=source.bearer_token, retries=0)
        return made[source.bearer_token]

    with HostileServer("answer") as server:
        hub = MeasurementHub(factory, gather_window=0.0)
        for token in ("first", "rotated"):
            source = PrometheusSource(server.url, token)
            hub.assign("uid-1", source)
            await hub.measure(TARGET, source)
    assert made["first"].closed
    assert not made["rotated"].closed
    assert hub.provider_count == 1


async def test_a_source_two_policies_share_stays_until_both_leave_it() -> None:
    closed: list[str] = []
    hub = MeasurementHub(lambda source: Fake(source.url, closed), gather_window=0.0)
    shared = PrometheusSource("http://shared")
    for uid in ("a", "b"):
        hub.assign(uid, shared)
        await hub.measure(Target("ns", uid, dialect=NEWEST), shared)
    hub.assign("a", PrometheusSource("http://elsewhere"))
    assert closed == []
    hub.forget("b")
    assert closed == ["http://shared"]


async def test_providers_no_policy_releases_are_bounded() -> None:
    closed: list[str] = []
    hub = MeasurementHub(lambda source: Fake(source.url, closed), gather_window=0.0)
    for i in range(MAX_PROVIDERS + 10):
        hub.provider_for(PrometheusSource(f"http://p{i}"))
    assert hub.provider_count == MAX_PROVIDERS
    assert closed == [f"http://p{i}" for i in range(10)]  # the least recently used first


async def test_a_single_given_provider_is_never_closed_by_the_hub() -> None:
    closed: list[str] = []
    hub = MeasurementHub(Fake("given", closed), gather_window=0.0)
    for i in range(3):
        source = PrometheusSource(f"http://p{i}")
        hub.assign("uid", source)
        await hub.measure(TARGET, source)
    hub.forget("uid")
    assert closed == []


def test_the_process_pools_are_bounded() -> None:
    assert promhttp.query_pool()._max_workers == promhttp.QUERY_THREADS
    assert hub_module.analysis_pool()._max_workers == hub_module.ANALYSIS_THREADS
    assert EMPTY_ANSWER  # the honest server's answer is what the provider reads as no series


def test_hub_helpers_run_on_the_analysis_threads() -> None:
    async def main() -> str:
        return await hub_module.in_analysis_pool(lambda: threading.current_thread().name)

    assert asyncio.run(main()).startswith("prometheus batch")
