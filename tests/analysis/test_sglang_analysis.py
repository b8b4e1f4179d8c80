"""SGLang's series read by the same queries and gates as vLLM's, through a real Prometheus.

The synthetic exporter speaks SGLang 0.5.23's names and labels (tests/support/prometheus.py): TTFT and ITL under
``sglang:``, requests finished and aborted in two counters, HTTP answers by status code, cached tokens by
``cache_source`` (device, host, storage) shown only once used.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from kvoffload.analysis.prometheus import PrometheusProvider
from kvoffload.analysis.queries import build_queries
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.engines import engine_for
from kvoffload.engines.dialect import Dialect
from kvoffload.engines.sglang.dialect import SGLANG
from kvoffload.engines.vllm.dialect import NEWEST
from tests.policy.render_policies import make_policy, sglang_policy
from tests.support.prometheus import (
    ITL_BUCKETS,
    TTFT_BUCKETS,
    PrometheusServer,
    SyntheticEngine,
    expected_p99,
    scraping,
    synthetic_target,
)

WINDOW = "10s"
CANARY = SyntheticEngine(
    "hicache",
    "canary",
    requests_per_s=10,
    ttft_s=0.3,
    itl_s=0.03,
    prompt_tokens_per_s=1000,
    host_tokens_per_s=200,
    disk_tokens_per_s=50,
    prefix_hit_rate=0.4,
    failed_share=0.05,
    load_bytes_per_s=1e9,
)
STABLE = SyntheticEngine("hicache", "stable", requests_per_s=20, ttft_s=0.1, itl_s=0.02, prompt_tokens_per_s=2000)


def test_a_policy_names_its_engines_dialect() -> None:
    def dialect_of(spec: KVOffloadPolicySpec) -> Dialect:
        return engine_for(spec).dialect(spec)

    assert dialect_of(sglang_policy().spec) is SGLANG
    assert dialect_of(make_policy().spec).name == "0.32"
    assert dialect_of(make_policy(model={"image": "vllm/vllm-openai:latest"}).spec) is NEWEST


def test_sglang_has_no_cache_config_query_and_reads_its_counters_as_vllms_labels() -> None:
    queries = {q.field: q.expr for q in build_queries("2m", SGLANG)}
    assert "config" not in queries
    assert (
        "label_replace(sum by (namespace, kvoffload_io_policy, kvoffload_io_level, kvoffload_io_config_hash)"
        in (queries["finished"])
    )
    assert '"status", "${1}xx", "status_code", "([1-5])[0-9][0-9]"' in queries["http_responses"]
    assert 'cache_source=~"host|storage"' in queries["tier_hits"]
    assert queries["external_share"].count("sglang:prompt_tokens_total") == 2
    # The GPU's own hits: SGLang's cached tokens hold the HiCache tiers' too.
    assert (
        'sglang:cached_tokens_total{kvoffload_io_policy!="", cache_source="device"}' in queries["prefix_cache_hit_rate"]
    )
    assert "sglang:time_to_first_token_seconds_bucket" in queries["ttft_histogram"]
    assert "sglang:inter_token_latency_seconds_bucket" in queries["itl_histogram"]


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    with scraping([CANARY, STABLE], tmp_path_factory.mktemp("prometheus"), WINDOW, SGLANG) as server:
        yield server


@pytest.mark.prometheus
def test_the_provider_reads_an_sglang_canary_and_stable(scraped: PrometheusServer) -> None:
    got = PrometheusProvider(scraped.url).measure([synthetic_target("llm", "hicache", WINDOW, SGLANG)])
    m = got[("llm", "hicache")]
    assert m.error is None
    assert m.canary is not None
    assert m.stable is not None
    canary, stable = m.canary, m.stable
    assert canary.requests == pytest.approx(100, rel=0.15)
    assert canary.ttft_p99 == pytest.approx(expected_p99(0.3, TTFT_BUCKETS), rel=0.01)
    assert stable.ttft_p99 == pytest.approx(expected_p99(0.1, TTFT_BUCKETS), rel=0.01)
    assert canary.itl_p99 == pytest.approx(expected_p99(0.03, ITL_BUCKETS), rel=0.01)
    # The offload share: host and storage hits over prompt tokens; a stable with no hit yet reads 0, not nothing.
    assert canary.external_share == pytest.approx(0.25, rel=0.01)
    assert stable.external_share == 0.0
    assert canary.tier_hits["host"] == pytest.approx(200 * 10, rel=0.15)
    assert canary.tier_hits["disk"] == pytest.approx(50 * 10, rel=0.15)  # SGLang's storage, read as disk
    assert stable.tier_hits == {}
    # The error gate: aborted requests as abort, the rest as stop; HTTP codes folded into classes.
    assert set(canary.finished) == {"stop", "abort"}
    assert canary.finished["abort"] / sum(canary.finished.values()) == pytest.approx(0.05, rel=0.01)
    assert set(stable.finished) == {"stop"}  # no abort counter before the first abort
    assert canary.http_responses["5xx"] == pytest.approx(100 * 0.05, rel=0.15)
    assert canary.http_responses["2xx"] == pytest.approx(100 * 0.95 + 10, rel=0.15)
    assert canary.load_bytes_per_second == pytest.approx(12.6e9, rel=0.01)
    assert canary.config is None
    # The buckets by le, the +Inf one every request; the GPU hit rate without the host and storage hits (0.25 more),
    # and 0 for a stable whose device source has no hit yet, so no series.
    assert canary.requests is not None
    assert [bound for bound, _ in canary.ttft_histogram] == [*TTFT_BUCKETS, math.inf]
    assert canary.ttft_histogram[-1][1] == pytest.approx(canary.requests, rel=1e-9)
    assert canary.itl_histogram[-1][1] == pytest.approx(canary.requests, rel=1e-9)
    assert canary.prefix_cache_hit_rate == pytest.approx(0.4, rel=0.01)
    assert stable.prefix_cache_hit_rate == 0.0
