"""vLLM 0.33's offload evidence through the real Prometheus: per-tier chunk hits and the allocated CPU tier.

A synthetic fleet speaks the 0.33 dialect: under tiering it counts chunk lookups and hits per tier
(``vllm:kv_offload_tiering_chunk_{queries,hits}_total{tier}``) and shows the CPU tier it allocated
(``vllm:kv_offload_config_info``). The provider reads them and ``assess()`` judges them: the fs tier is
gated on its own hits, and an engine that allocated another size than the level rendered fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kvoffload.analysis.assess import LIVE_CONFIG, assess
from kvoffload.analysis.prometheus import PrometheusProvider
from kvoffload.api.quantity import GIB
from kvoffload.api.rollout import AnalysisSpec
from kvoffload.api.serving import SecondaryTier
from kvoffload.api.status import MetricResult, Verdict
from kvoffload.engines.vllm.dialect import dialect_for
from kvoffload.policy.ladder import Level
from tests.support.prometheus import (
    PrometheusServer,
    SyntheticEngine,
    SyntheticFleet,
    require_prometheus,
    synthetic_target,
)

WINDOW = "10s"
V033 = dialect_for("0.33.0")
CHUNK = 2_359_296  # bytes per aligned chunk; 32 GiB holds 14563 of them and a remainder
NVME = Level(2, "nvme", 32 * GIB, (SecondaryTier(name="nvme", size="500Gi", path="/mnt/kv"),))
RIGHT = ("0:primary", 32 * GIB // CHUNK * CHUNK, 32 * GIB // CHUNK)
WRONG = ("0:primary", 16 * GIB // CHUNK * CHUNK, 16 * GIB // CHUNK)


def engine(policy: str, variant: str, **kwargs: Any) -> SyntheticEngine:
    defaults: dict[str, Any] = {"requests_per_s": 10, "ttft_s": 0.2, "itl_s": 0.02, "external_share": 0.2}
    return SyntheticEngine(policy, variant, **{**defaults, **kwargs})


FLEET = [
    # fs serves 30 of the 120 chunk lookups that reach it each second; allocated as rendered.
    engine("warm", "canary", tier_chunks=(("0:primary", 200.0, 80.0), ("1:fs", 120.0, 30.0)), allocated=(RIGHT,)),
    engine("warm", "stable"),
    # fs is looked up and never hits, while the lumped disk source still counts tokens; allocated half.
    engine(
        "cold",
        "canary",
        disk_tokens_per_s=50.0,
        tier_chunks=(("0:primary", 200.0, 80.0), ("1:fs", 120.0, 0.0)),
        allocated=(WRONG,),
    ),
    engine("cold", "stable"),
]


@pytest.fixture(scope="module")
def tiered_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    require_prometheus()
    fleet = SyntheticFleet(FLEET, V033)
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"))
    server.start()
    try:
        server.add_targets([(fleet.address, {})])
        server.wait_for_series(
            f"count_over_time(vllm:kv_offload_tiering_chunk_hits_total[{WINDOW}]) >= 10", deadline=60, count=4
        )
        yield server
    finally:
        server.stop()
        fleet.close()


def judge(server: PrometheusServer, policy: str) -> tuple[Verdict, dict[str, MetricResult], str]:
    provider = PrometheusProvider(server.url)
    measured = provider.measure([synthetic_target("llm", policy, WINDOW, dialect=V033)])[("llm", policy)]
    assert measured.error is None
    spec = AnalysisSpec(minRequests=10)
    result = assess(spec, NVME, measured, warmed_up=True)
    return result.verdict, {m.name: m for m in result.metrics}, result.message


@pytest.mark.prometheus
def test_the_provider_reads_per_tier_chunk_counters_and_the_allocated_tier(tiered_fleet: PrometheusServer) -> None:
    provider = PrometheusProvider(tiered_fleet.url)
    got = provider.measure([synthetic_target("llm", "warm", WINDOW, dialect=V033)])[("llm", "warm")]
    assert got.canary is not None
    assert got.stable is not None
    canary = got.canary
    assert set(canary.tier_chunk_queries) == {"0:primary", "1:fs"}
    assert canary.tier_chunk_queries["1:fs"] == pytest.approx(120 * 10, rel=0.15)
    assert canary.tier_chunk_hits["1:fs"] / canary.tier_chunk_queries["1:fs"] == pytest.approx(0.25, rel=0.01)
    assert canary.tier_chunk_hits["0:primary"] / canary.tier_chunk_queries["0:primary"] == pytest.approx(0.4, rel=0.01)
    (alloc,) = canary.offload_allocated
    assert alloc["tier"] == "0:primary"
    assert (int(alloc["cpu_kv_cache_size_bytes"]), int(alloc["cpu_num_chunks"])) == RIGHT[1:]
    assert alloc["pod"] == "warm-canary-0"
    assert got.stable.tier_chunk_queries == {}
    assert got.stable.offload_allocated == ()


@pytest.mark.prometheus
def test_a_tiered_canary_whose_fs_tier_hits_and_whose_cpu_tier_is_as_rendered_passes(
    tiered_fleet: PrometheusServer,
) -> None:
    verdict, metrics, message = judge(tiered_fleet, "warm")
    assert verdict is Verdict.PASS, message
    fs = metrics["tierHitShare.1:fs"]
    assert fs.passed is True
    assert fs.canary == pytest.approx(0.25, rel=0.01)
    assert metrics[LIVE_CONFIG].passed is True


@pytest.mark.prometheus
def test_an_fs_tier_never_hit_and_a_cpu_tier_allocated_at_half_fail_with_their_figures(
    tiered_fleet: PrometheusServer,
) -> None:
    verdict, metrics, message = judge(tiered_fleet, "cold")
    assert verdict is Verdict.FAIL
    assert metrics["tierHitShare.1:fs"].passed is False
    assert metrics["tierHits.disk"].passed is None  # the lumped source: reported only
    assert "secondary tier 1:fs (nvme) was never hit on the canary" in message
    live = metrics[LIVE_CONFIG]
    assert live.passed is False
    assert (
        f"canary pod cold-canary-0 allocated {WRONG[1]} B ({WRONG[2]} chunks of {CHUNK} B) for the CPU tier, "
        f"rendered {32 * GIB} B (32 GiB) at level nvme"
    ) in live.message
