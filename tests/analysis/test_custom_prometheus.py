"""Custom metrics against the real Prometheus: its parser judges the queries, and each reading selects only the
policy's own engines, whatever the names hold."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from kvoffload.analysis.custom import CustomReading
from kvoffload.analysis.customquery import read_custom
from kvoffload.analysis.prometheus import PrometheusProvider
from kvoffload.api.analysistemplate import CustomMetric, MetricSource
from kvoffload.api.promql import Selection, render
from tests.api.test_promql_prometheus import prometheus_parse
from tests.support.prometheus import (
    PrometheusServer,
    SyntheticEngine,
    SyntheticFleet,
    require_prometheus,
    synthetic_target,
)

pytestmark = pytest.mark.prometheus

WINDOW = "10s"
FLEET = [
    SyntheticEngine("chat", "canary", requests_per_s=20, kv_usage=0.9),
    SyntheticEngine("chat", "stable", requests_per_s=10, kv_usage=0.3),
    # Another tenant with a policy of the same name: its series must never be read for llm/chat.
    SyntheticEngine("chat", "canary", namespace="other", requests_per_s=500, kv_usage=0.1),
]
REQUESTS = "sum(rate(vllm:time_to_first_token_seconds_count{ {{ selector }} }[{{ window }}]))"
USAGE = "max(vllm:kv_cache_usage_perc{ {{ selector }} })"


@pytest.fixture(scope="module")
def scraped() -> Iterator[PrometheusServer]:
    require_prometheus()
    import tempfile
    from pathlib import Path

    fleet = SyntheticFleet(FLEET)
    with tempfile.TemporaryDirectory() as tmp:
        server = PrometheusServer(Path(tmp) / "prometheus")
        server.workdir.mkdir()
        server.start()
        try:
            server.add_targets([(fleet.address, {})])
            server.wait_for_series(
                f"count_over_time(vllm:time_to_first_token_seconds_count[{WINDOW}]) >= 8", deadline=60, count=3
            )
            yield server
        finally:
            server.stop()
            fleet.close()


def metric(name: str, query: str, **bounds: object) -> MetricSource:
    return MetricSource(metric=CustomMetric.model_validate({"name": name, "query": query, "max": 1e9, **bounds}))


def test_a_custom_metric_reads_the_canary_and_the_stable_of_this_policy_only(scraped: PrometheusServer) -> None:
    provider = PrometheusProvider(scraped.url)
    target = synthetic_target("llm", "chat", WINDOW)
    absolute, ratio = read_custom(
        provider, [metric("rate", REQUESTS), metric("usage", USAGE, comparison="ratio")], target
    )
    assert absolute.error is None
    # About 20 a second (rate() over a young 10 s window runs low), and never 520: the other tenant's is not in it.
    assert absolute.canary is not None
    assert 10 < absolute.canary < 40
    assert absolute.stable is None  # an absolute bound asks only for the subject
    assert (ratio.canary, ratio.stable) == (pytest.approx(0.9), pytest.approx(0.3))
    assert provider.queries == 3


def test_without_a_canary_the_stable_is_the_subject(scraped: PrometheusServer) -> None:
    (reading,) = read_custom(
        PrometheusProvider(scraped.url),
        [metric("rate", REQUESTS)],
        synthetic_target("llm", "chat", WINDOW, with_canary=False),
    )
    assert reading.canary is None
    assert reading.stable is not None
    assert 5 < reading.stable < 20


def test_a_query_of_several_series_or_one_prometheus_refuses_is_not_judged(scraped: PrometheusServer) -> None:
    per_pod = (
        'label_replace(vllm:kv_cache_usage_perc{ {{ selector }} }, "copy", "1", "", "")'
        " or vllm:kv_cache_usage_perc{ {{ selector }} }"
    )
    # promql-parser takes start() as a function; Prometheus 2.42 only after @ (tests/api/test_promql_prometheus.py).
    refused = "sum(vllm:kv_cache_usage_perc{ {{ selector }} }) + start()"
    several, bad = read_custom(
        PrometheusProvider(scraped.url),
        [metric("perPod", per_pod), metric("bad", refused)],
        synthetic_target("llm", "chat", WINDOW),
    )
    assert several == CustomReading(
        several.source, None, None, "canary: the query gave 2 series, not one number: aggregate it (sum, max, ...)"
    )
    assert bad.error is not None
    assert "unexpected" in bad.error or "unknown function" in bad.error, bad.error


@pytest.mark.parametrize(
    "hostile",
    ['llm" } or vector(1) or x{a="', 'llm"}) or vector(1) #', "llm\\", 'llm", namespace=~".+'],
)
def test_a_name_built_to_inject_selects_nothing_on_the_real_prometheus(scraped: PrometheusServer, hostile: str) -> None:
    provider = PrometheusProvider(scraped.url)
    selection = Selection("namespace", hostile, "kvoffload_io_policy", "chat", "kvoffload_io_config_hash", "canary")
    query = render(REQUESTS, selection, "10s")
    printed, why = prometheus_parse(scraped.url, query)
    assert printed is not None, why  # it parses: one selector whose value is the whole name
    (answer,) = provider.instant([query])
    assert answer == []  # no namespace is called that; unescaped, these would have answered 1 or every namespace


def test_what_prometheus_refuses_to_parse_is_refused_with_the_policy_naming_the_query() -> None:
    for query in (
        "sum(rate(x{ {{ selector }} }[{{ window }}])",  # unclosed
        "rate(x{ {{ selector }} })",  # rate() of an instant vector
        "nosuchfunction(x{ {{ selector }} })",
    ):
        with pytest.raises(ValidationError, match=r"query\n.*not PromQL"):
            CustomMetric.model_validate({"name": "m", "query": query, "max": 1})
