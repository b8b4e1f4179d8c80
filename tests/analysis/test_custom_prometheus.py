"""Custom metrics against the real Prometheus: its parser judges the queries, and each reading selects only the
policy's own engines, whatever the names hold."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvoffload.analysis.custom import CustomReading
from kvoffload.analysis.customquery import read_custom
from kvoffload.analysis.prometheus import ParserUnavailable, PrometheusProvider
from kvoffload.analysis.queryparse import query_problems
from kvoffload.api.analysistemplate import CustomMetric, MetricSource
from kvoffload.api.promql import Selection, for_checking, render, selector_problems
from kvoffload.lab.promserver import free_port
from tests.api.test_promql import GOOD, KEYWORD_METRICS
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
    refused = "sum(rate(vllm:kv_cache_usage_perc{ {{ selector }} }))"  # rate() of an instant vector
    several, bad = read_custom(
        PrometheusProvider(scraped.url),
        [metric("perPod", per_pod), metric("bad", refused)],
        synthetic_target("llm", "chat", WINDOW),
    )
    assert several == CustomReading(
        several.source, None, None, "canary: the query gave 2 series, not one number: aggregate it (sum, max, ...)"
    )
    assert bad.error is not None
    assert "expected type range vector" in bad.error


@pytest.mark.parametrize(
    "hostile",
    ['llm" } or vector(1) or x{a="', 'llm"}) or vector(1) #', "llm\\", 'llm", namespace=~".+'],
)
def test_a_name_built_to_inject_selects_nothing_on_the_real_prometheus(scraped: PrometheusServer, hostile: str) -> None:
    provider = PrometheusProvider(scraped.url)
    selection = Selection("namespace", hostile, "kvoffload_io_policy", "chat", "kvoffload_io_config_hash", "canary")
    query = render(REQUESTS, selection, "10s")
    assert provider.format_query(query) is None  # it parses: one selector whose value is the whole name
    (answer,) = provider.instant([query])
    assert answer == []  # no namespace is called that; unescaped, these would have answered 1 or every namespace


def test_prometheus_own_parser_takes_the_good_templates_and_names_each_bad_query_by_its_field(
    scraped: PrometheusServer,
) -> None:
    provider = PrometheusProvider(scraped.url)
    good = [CustomMetric(name=f"m{i}", query=q, max=1) for i, q in enumerate(GOOD)]
    assert query_problems(good, "spec.analysis.metrics", provider.format_query) == []
    bad = [
        CustomMetric(name="ok", query=REQUESTS, max=1),
        CustomMetric(name="unclosed", query="sum(rate(x{ {{ selector }} }[{{ window }}])", max=1),
        CustomMetric(name="typed", query="rate(x{ {{ selector }} })", max=1),
        CustomMetric(name="nofunc", query="nosuchfunction(x{ {{ selector }} })", max=1),
    ]
    found = query_problems(bad, "spec.analysis.metrics", provider.format_query)
    assert [e.path for e in found] == [f"spec.analysis.metrics[{i}].query" for i in (1, 2, 3)]
    assert all("Prometheus does not parse it" in e.message and "parse error" in e.message for e in found)
    assert "unknown function" in found[2].message


def test_a_keyword_in_an_operand_place_parses_as_a_metric_of_every_namespace_and_is_refused(
    scraped: PrometheusServer,
) -> None:
    provider = PrometheusProvider(scraped.url)
    for template, keyword in KEYWORD_METRICS:
        # The real parser takes it: the keyword is a selector with no matchers, read across every namespace.
        assert provider.format_query(for_checking(template)) is None, template
        assert any(f"the metric {keyword} at " in p for p in selector_problems(template)), template


def test_an_unreachable_prometheus_cannot_parse_and_says_so() -> None:
    provider = PrometheusProvider(f"http://127.0.0.1:{free_port()}", timeout=1.0, retries=0)
    with pytest.raises(ParserUnavailable, match="unreachable"):
        provider.format_query("up")
