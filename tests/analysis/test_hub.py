"""The measurement hub: many policies' requests within the gather window become one provider call."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

from kvoffload.analysis.hub import FULL_BATCH, NAMES_MAX_AGE, MeasurementHub, PrometheusSource
from kvoffload.analysis.measurements import Measurements, VariantSample
from kvoffload.analysis.queries import PolicyKey, Target
from kvoffload.controller.metrics import OperatorMetrics
from kvoffload.engines.vllm.dialect import NEWEST


class RecordingProvider:
    """Answers each target with its own policy name in the figures, and records every call."""

    def __init__(self, *, fail: bool = False, skip: frozenset[str] = frozenset(), queries_per_call: int = 7) -> None:
        self.calls: list[list[Target]] = []
        self.threads: list[str] = []
        self.fail = fail
        self.skip = skip
        self.queries = 0
        self.queries_per_call = queries_per_call

    def measure(self, targets: Sequence[Target]) -> dict[PolicyKey, Measurements]:
        self.calls.append(list(targets))
        self.threads.append(threading.current_thread().name)
        self.queries += self.queries_per_call
        if self.fail:
            raise ConnectionError("Prometheus is down")
        return {
            t.key: Measurements(canary=None, stable=VariantSample(requests=float(len(t.policy))))
            for t in targets
            if t.policy not in self.skip
        }

    def present_metric_names(self, target: Target | None = None) -> frozenset[str]:
        return frozenset()


def target(name: str, namespace: str = "llm") -> Target:
    return Target(namespace=namespace, policy=name, window="1m", dialect=NEWEST, stable_hash="stable")


async def test_concurrent_policies_share_one_provider_call() -> None:
    provider = RecordingProvider()
    metrics = OperatorMetrics()
    hub = MeasurementHub(provider, gather_window=0.05, query_counter=metrics.prometheus_queries)
    names = [f"policy-{'x' * i}" for i in range(20)]

    results = await asyncio.gather(*(hub.measure(target(n)) for n in names))

    assert len(provider.calls) == 1
    assert sorted(t.policy for t in provider.calls[0]) == sorted(names)
    # each caller gets its own policy's answer, not a neighbour's
    assert [r.stable.requests for r in results if r.stable is not None] == [float(len(n)) for n in names]
    assert provider.threads[0] != threading.main_thread().name  # the blocking call ran in a worker thread
    assert metrics.registry.get_sample_value("kvoffload_prometheus_queries_total") == 7  # counted once, per query


async def later(delay: float, hub: MeasurementHub, name: str, patience: float = 0.0) -> Measurements:
    await asyncio.sleep(delay)
    return await hub.measure(target(name), patience=patience)


async def test_patient_requests_wait_for_each_other_up_to_the_hubs_cap_and_an_impatient_one_sends_them() -> None:
    provider = RecordingProvider()
    hub = MeasurementHub(provider, gather_window=0.01, patient_window=0.5)
    began = time.monotonic()

    await asyncio.gather(later(0.0, hub, "a", 60.0), later(0.3, hub, "b", 60.0))  # capped at 0.5 s

    assert 0.5 <= time.monotonic() - began < 2.5
    assert [[t.policy for t in call] for call in provider.calls] == [["a", "b"]]

    hub.patient_window = 5.0
    began = time.monotonic()
    await asyncio.gather(later(0.0, hub, "c", 5.0), later(0.1, hub, "d"))

    assert time.monotonic() - began < 2.5, "the impatient request waited out the patient one's five seconds"
    assert [[t.policy for t in call] for call in provider.calls[1:]] == [["c", "d"]]


async def test_a_full_batch_is_sent_without_waiting_out_its_patience() -> None:
    provider = RecordingProvider()
    hub = MeasurementHub(provider, gather_window=0.01, patient_window=5.0)
    began = time.monotonic()

    await asyncio.gather(*(hub.measure(target(f"p{i}"), patience=5.0) for i in range(FULL_BATCH)))

    assert time.monotonic() - began < 2.5  # not the five seconds of patience
    assert [len(call) for call in provider.calls] == [FULL_BATCH]


async def test_a_full_batch_takes_no_more_and_the_next_request_starts_another() -> None:
    provider = SlowProvider()
    hub = MeasurementHub(provider, gather_window=0.01)

    # Two and a half batches' worth at once, as after a restart: full batches of their own, never one of 250,
    # which Prometheus would have to answer fleet-wide.
    results = await asyncio.gather(*(hub.measure(target(f"p{i}")) for i in range(FULL_BATCH * 5 // 2)))

    assert all(r.error is None for r in results)
    assert [len(call) for call in provider.calls] == [FULL_BATCH, FULL_BATCH, FULL_BATCH // 2]


async def test_requests_after_the_window_start_a_new_batch() -> None:
    provider = RecordingProvider()
    hub = MeasurementHub(provider, gather_window=0.01)

    await asyncio.gather(hub.measure(target("a")), hub.measure(target("b")))
    await hub.measure(target("c"))

    assert [[t.policy for t in call] for call in provider.calls] == [["a", "b"], ["c"]]


class SlowProvider(RecordingProvider):
    def measure(self, targets: Sequence[Target]) -> dict[PolicyKey, Measurements]:
        time.sleep(0.3)  # a fleet-wide query round at 1,000 policies
        return super().measure(targets)


async def test_requests_that_arrive_while_a_batch_runs_join_one_next_batch_not_a_queue_of_small_ones() -> None:
    provider = SlowProvider()
    hub = MeasurementHub(provider, gather_window=0.01)

    async def trickle(name: str, delay: float) -> Measurements:
        await asyncio.sleep(delay)
        return await hub.measure(target(name))

    # 30 policies whose loops have drifted apart: one asks every 20 ms, over about two batches' time.
    results = await asyncio.gather(*(trickle(f"p{i}", 0.02 * i) for i in range(30)))

    assert all(r.error is None for r in results)
    # The first batch takes p0; everything asked while it ran waits in one batch, and so on: 3 calls, where
    # closing each batch before waiting for the running one made a queue of ~15 (each all the fleet's queries).
    assert len(provider.calls) <= 3, [len(call) for call in provider.calls]
    assert sum(len(call) for call in provider.calls) == 30


async def test_a_failing_provider_gives_every_waiting_policy_an_error_not_an_exception() -> None:
    hub = MeasurementHub(RecordingProvider(fail=True), gather_window=0.01)

    results = await asyncio.gather(hub.measure(target("a")), hub.measure(target("b")))

    assert all(r.error is not None and "Prometheus is down" in r.error for r in results)
    assert all(r.stable is None and r.canary is None for r in results)


async def test_a_policy_the_provider_did_not_answer_for_gets_an_error() -> None:
    hub = MeasurementHub(RecordingProvider(skip=frozenset({"quiet"})), gather_window=0.01)

    loud, quiet = await asyncio.gather(hub.measure(target("loud")), hub.measure(target("quiet")))

    assert loud.error is None
    assert quiet.error == "no answer for llm/quiet"


async def test_each_prometheus_url_gets_its_own_provider_and_batch() -> None:
    made: dict[str, RecordingProvider] = {}

    def factory(source: PrometheusSource) -> RecordingProvider:
        made[source.url] = RecordingProvider()
        return made[source.url]

    hub = MeasurementHub(factory, gather_window=0.02)
    prom_a, prom_b = PrometheusSource("http://prom-a:9090"), PrometheusSource("http://prom-b:9090")
    await asyncio.gather(
        hub.measure(target("a"), prom_a),
        hub.measure(target("b"), prom_b),
        hub.measure(target("c"), prom_a),
    )

    assert sorted(made) == ["http://prom-a:9090", "http://prom-b:9090"]
    assert [[t.policy for t in call] for call in made["http://prom-a:9090"].calls] == [["a", "c"]]
    assert [[t.policy for t in call] for call in made["http://prom-b:9090"].calls] == [["b"]]
    assert hub.provider_calls == 2


async def test_the_same_policy_twice_in_a_batch_is_measured_once() -> None:
    provider = RecordingProvider()
    hub = MeasurementHub(provider, gather_window=0.02)

    first, second = await asyncio.gather(hub.measure(target("chat")), hub.measure(target("chat")))

    assert [len(call) for call in provider.calls] == [1]
    assert first == second


async def test_policies_with_different_bearer_tokens_never_share_a_provider() -> None:
    made: list[PrometheusSource] = []

    def factory(source: PrometheusSource) -> RecordingProvider:
        made.append(source)
        return RecordingProvider()

    hub = MeasurementHub(factory, gather_window=0.02)
    await asyncio.gather(
        hub.measure(target("a"), PrometheusSource("http://prom:9090", "token-a")),
        hub.measure(target("b"), PrometheusSource("http://prom:9090", "token-b")),
    )

    assert sorted(s.bearer_token or "" for s in made) == ["token-a", "token-b"]
    assert "token-a" not in repr(made[0])  # tokens stay out of logs


class NamedProvider(RecordingProvider):
    """Answers the series-name listing with the names of an engine that still speaks an older dialect."""

    def __init__(self, names: frozenset[str]) -> None:
        super().__init__()
        self.names = names
        self.listings = 0

    def present_metric_names(self, target: Target | None = None) -> frozenset[str]:
        self.listings += 1
        return self.names


async def test_series_names_are_listed_once_per_prometheus_and_reused_until_they_age() -> None:
    provider = NamedProvider(frozenset({"vllm:time_to_first_token_seconds_bucket"}))
    hub = MeasurementHub(provider, gather_window=0.0)
    source = PrometheusSource("http://prom:9090")

    first = await hub.present_names(source, now=1000.0)
    await hub.present_names(source, now=1100.0)
    assert provider.listings == 1
    await hub.present_names(source, now=1000.0 + NAMES_MAX_AGE)

    assert first == provider.names
    assert provider.listings == 2


class SlowNamedProvider(NamedProvider):
    """Takes a moment to list, as a Prometheus holding 200,000 series does."""

    def present_metric_names(self, target: Target | None = None) -> frozenset[str]:
        time.sleep(0.05)
        return super().present_metric_names(target)


async def test_policies_that_ask_for_the_names_at_once_share_one_listing() -> None:
    provider = SlowNamedProvider(frozenset({"vllm:time_to_first_token_seconds_bucket"}))
    hub = MeasurementHub(provider, gather_window=0.0)
    source = PrometheusSource("http://prom:9090")

    answers = await asyncio.gather(*(hub.present_names(source, now=1000.0) for _ in range(100)))

    assert provider.listings == 1
    assert set(answers) == {provider.names}


async def test_an_empty_listing_is_not_cached() -> None:
    provider = NamedProvider(frozenset())
    hub = MeasurementHub(provider, gather_window=0.0)

    await hub.present_names(PrometheusSource(), now=0.0)
    await hub.present_names(PrometheusSource(), now=1.0)

    assert provider.listings == 2
