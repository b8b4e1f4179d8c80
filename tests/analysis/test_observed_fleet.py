"""An observe-only policy's fleet through the Prometheus provider: selected by namespace and pod name, summed over
its pods, one sample for both roles, and kept apart from the policies measured by their labels."""

from __future__ import annotations

import pytest

from kvoffload.analysis.prometheus import PrometheusProvider
from kvoffload.analysis.queries import Target, build_queries, fleet_matcher
from kvoffload.engines.vllm.dialect import NEWEST
from tests.analysis.test_prometheus_provider import WINDOW, scraped_fleet  # noqa: F401  (the module's fixture)
from tests.support.prometheus import TTFT_BUCKETS, PrometheusServer, expected_p99, synthetic_target

FLEET_PODS = ("chat-canary-0", "chat-stable-0")


def test_a_fleets_queries_select_its_pods_by_name_and_sum_them_by_namespace() -> None:
    target = Target("llm", "team", dialect=NEWEST, pods=("vllm-0", "vllm.a-1"))
    matcher = fleet_matcher(target)
    assert matcher == 'namespace="llm", pod=~`vllm-0|vllm\\.a-1`'
    for query in build_queries("2m", NEWEST, 'cluster="prod"', workload=True, scope=matcher, fleet=True):
        assert f'{{{matcher}, cluster="prod"' in query.expr
        assert "kvoffload_io" not in query.expr  # neither selected nor grouped by labels the fleet lacks
    # No pods: a name no pod can have. An empty regex would match every series of the namespace without a pod label.
    assert fleet_matcher(Target("llm", "team", dialect=NEWEST, pods=())) == 'namespace="llm", pod=~`-`'


@pytest.mark.prometheus
def test_an_observed_fleet_is_measured_by_its_pods_for_both_roles(scraped_fleet: PrometheusServer) -> None:  # noqa: F811
    provider = PrometheusProvider(scraped_fleet.url)
    team = Target("llm", "team", WINDOW, dialect=NEWEST, stable_hash="gpu-only", canary_hash="cpu", pods=FLEET_PODS)
    got = provider.measure([team, synthetic_target("llm", "chat", WINDOW)])

    observed = got[("llm", "team")]
    assert observed.error is None
    assert observed.stable is not None
    assert observed.canary is observed.stable  # the same engines answer for both roles
    # 10 req/s at 300 ms and 20 req/s at 100 ms, summed: the p99 lies in the slow pod's bucket.
    assert observed.stable.requests == pytest.approx(300, rel=0.15)
    assert observed.stable.ttft_p99 is not None
    assert expected_p99(0.1, TTFT_BUCKETS) < observed.stable.ttft_p99 <= expected_p99(0.3, TTFT_BUCKETS)
    # The same pod name in another namespace is not the fleet's; the labelled policy is measured as before.
    chat = got[("llm", "chat")]
    assert chat.canary is not None
    assert chat.canary.requests == pytest.approx(100, rel=0.15)
    without_canary = provider.measure([Target("llm", "team", WINDOW, dialect=NEWEST, pods=FLEET_PODS)])[("llm", "team")]
    assert without_canary.canary is None
    assert without_canary.stable is not None
    assert without_canary.stable.requests == pytest.approx(300, rel=0.15)


@pytest.mark.prometheus
def test_a_fleet_whose_pods_are_not_scraped_shows_no_series(scraped_fleet: PrometheusServer) -> None:  # noqa: F811
    provider = PrometheusProvider(scraped_fleet.url)
    got = provider.measure([Target("other", "team", WINDOW, dialect=NEWEST, pods=("chat-canary-0",))])[
        ("other", "team")
    ]
    assert got.error is None
    assert got.stable is not None
    assert got.stable.requests is None
