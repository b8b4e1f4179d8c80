"""vLLM's metric dialect table: which Prometheus series each vLLM version exposes (``engines/dialect.py`` says
how a dialect is read).

Choose a dialect from the image tag or ``spec.model.vllmVersion``
(:func:`dialect_for`), then correct it against the names Prometheus actually
holds (``engines.dialect.confirm_dialect``, from the fields ``_BASE`` fills in):
release boundaries of the newer metrics are taken from the PRs that added them
and can be off by one release, the series present in Prometheus are not.

Evidence for each change (see also ``DIALECT_CHANGES``):

- ``vllm:inter_token_latency_seconds`` replaced ``vllm:time_per_output_token_seconds``
  in 0.11 (vLLM PR 24015; ``v1/metrics/loggers.py``: "Deprecated in 0.11 -
  Renamed as vllm:inter_token_latency_seconds").
- ``vllm:kv_cache_usage_perc`` replaced ``vllm:gpu_cache_usage_perc`` (vLLM PR
  18354; the old name hidden by default from 0.10).
- ``vllm:cache_config_info`` got ``kv_offloading_size`` / ``kv_offloading_backend``
  labels with the ``--kv-offloading-*`` flags (vLLM PR 27621, 0.12).
- Offload transfer counters ``vllm:kv_offload_total_bytes_total`` /
  ``vllm:kv_offload_total_time_total`` with ``transfer_type`` = ``CPU_to_GPU`` |
  ``GPU_to_CPU`` (vLLM PR 27942, 0.12).
- ``vllm:prompt_tokens_by_source_total{source}`` (vLLM PR 33290, 0.16).
- Flat ``vllm:kv_offload_{load,store}_{bytes,time}_total`` without a
  transfer_type label (vLLM PR 35669, RFC issue 44008, 0.23); the legacy
  labelled counters are still emitted next to them for the CPU spec (checked in
  the 0.32.0 source, ``offloading/metrics.py``).
- ``vllm:kv_offload_cpu_cache_usage_perc`` (vLLM PR 45737, 0.24).
- ``vllm:prompt_tokens_cached_by_source_total{source}`` with sources
  device/host/p2p/disk/external_unspecified (vLLM PR 56318; present in the
  0.32.0 capture ``shared/fixtures/vllm-0.32.0-cpu-metrics.txt``).
- Per-tier chunk lookups under tiering (``TieringOffloadingSpec``),
  ``vllm:kv_offload_tiering_chunk_{queries,hits}_total{tier}`` with tier
  ``0:primary`` (the CPU tier) and ``<i+1>:<type>`` per secondary tier (``1:fs``):
  in the 0.32.0 source (``v1/kv_offload/tiering/base.py`` lines 51-52,
  ``tiering/metrics.py`` line 21) and in 0.33.0 (``tiering/base.py`` lines 54-55);
  older releases not checked, so the row says 0.32 and ``confirm_dialect`` adds
  them wherever Prometheus holds them.
- 0.33.0 (read from the ``vllm==0.33.0`` wheel) adds ``vllm:kv_offload_config_info``
  (gauge, value 1; ``distributed/kv_transfer/kv_connector/v1/offloading/metrics.py``
  line 27), labelled by ``CPUOffloadingInfo`` (``v1/kv_offload/cpu/common.py`` lines
  34-45: ``cpu_num_chunks``, ``cpu_blocks_per_chunk``, ``cpu_kv_cache_size_bytes``
  = chunks x aligned chunk bytes, ``cpu_kv_cache_size_tokens``) plus ``tier`` under
  tiering (``tiering/manager.py`` line 1240), and the histogram
  ``vllm:kv_offload_tiering_promotion_latency_seconds{tier,result}``
  (``tiering/base.py`` line 68, ``tiering/spec.py`` lines 250-259). Neither is in
  the 0.32.0 source. Nothing offload-related is renamed or removed.

The error gate reads ``vllm:request_success_total{finished_reason}`` (every row: vLLM counts every finished
request there, whatever its reason). Its reasons are ``FinishReason``'s (``v1/engine/__init__.py``): stop, length,
abort, error and repetition in the 0.32.0, 0.33.0 and 0.34.0 sources and in the 0.26.0 and 0.32.0 captures; older
releases lack some (error came with request-level failures such as a KV load failure, repetition later), so the
query reads whichever exist and counts ``FAILED_REASONS`` as failed. vLLM's own words for error: "retryable
request-level internal error (e.g., KV load failure). Invariant: always converted to 500 Internal Server Error";
with an offload connector, ``kv_load_failure_policy`` defaults to "fail" (``config/kv_transfer.py``, 0.32-0.34), so a
tier that cannot give back what it stored fails requests with that reason.

The baseline's workload figures read ``vllm:request_prompt_tokens`` (histogram),
``vllm:e2e_request_latency_seconds`` (histogram), ``vllm:num_requests_running``
(gauge) and ``vllm:num_preemptions_total`` (counter), besides the prefix-cache
counters. Their names are exact for 0.32 (in the capture); every row keeps them
unchanged, which is assumed for the older releases, not checked.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

from kvoffload.api.versions import VersionTuple, parse_version
from kvoffload.engines.dialect import TRANSFER_LOAD, TRANSFER_STORE, Dialect, OffloadSeries

FLAT_OFFLOAD: Final = OffloadSeries(
    load_bytes="vllm:kv_offload_load_bytes_total",
    load_time="vllm:kv_offload_load_time_total",
    store_bytes="vllm:kv_offload_store_bytes_total",
    store_time="vllm:kv_offload_store_time_total",
)

# Registered by vLLM as Counter("vllm:kv_offload_total_bytes"), which
# prometheus_client exposes with a second "_total": the series really is
# vllm:kv_offload_total_bytes_total (checked with prometheus_client 0.26).
LEGACY_OFFLOAD: Final = OffloadSeries(
    load_bytes="vllm:kv_offload_total_bytes_total",
    load_time="vllm:kv_offload_total_time_total",
    store_bytes="vllm:kv_offload_total_bytes_total",
    store_time="vllm:kv_offload_total_time_total",
    load_selector=f'transfer_type="{TRANSFER_LOAD}"',
    store_selector=f'transfer_type="{TRANSFER_STORE}"',
    legacy=True,
)


@dataclass(frozen=True)
class DialectChange:
    """One row of the table: from ``since`` on, these fields hold."""

    since: VersionTuple
    changes: dict[str, object]
    evidence: str


# Oldest first; each row applies on top of the ones before it. The base is the
# oldest V1 metric set we know (before 0.10).
_BASE: Final = Dialect(
    name="0.9",
    series_prefix="vllm:",
    ttft="vllm:time_to_first_token_seconds",
    itl="vllm:time_per_output_token_seconds",
    e2e="vllm:e2e_request_latency_seconds",
    request_success="vllm:request_success_total",
    http_requests="http_requests_total",
    prompt_tokens="vllm:prompt_tokens_total",
    generation_tokens="vllm:generation_tokens_total",
    prompt_tokens_by_source=None,
    prompt_tokens_cached_by_source=None,
    kv_cache_usage="vllm:gpu_cache_usage_perc",
    prefix_cache_queries="vllm:prefix_cache_queries_total",
    prefix_cache_hits="vllm:prefix_cache_hits_total",
    request_prompt_tokens="vllm:request_prompt_tokens",
    num_requests_running="vllm:num_requests_running",
    num_preemptions="vllm:num_preemptions_total",
    cache_config_info="vllm:cache_config_info",
    config_offload_labels=False,
    offload=None,
    offload_cpu_usage=None,
    tiering_chunk_queries=None,
    tiering_chunk_hits=None,
    offload_config_info=None,
    tiering_promotion_latency=None,
    # What confirm_dialect may correct: the names that changed, and the families some releases lack.
    renamed=(
        ("itl", ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")),
        ("kv_cache_usage", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
    ),
    optional_series=(
        ("prompt_tokens_by_source", "vllm:prompt_tokens_by_source_total"),
        ("prompt_tokens_cached_by_source", "vllm:prompt_tokens_cached_by_source_total"),
    ),
    offload_variants=(FLAT_OFFLOAD, LEGACY_OFFLOAD),
    evidence_series=(
        ("offload_cpu_usage", "vllm:kv_offload_cpu_cache_usage_perc"),
        ("tiering_chunk_queries", "vllm:kv_offload_tiering_chunk_queries_total"),
        ("tiering_chunk_hits", "vllm:kv_offload_tiering_chunk_hits_total"),
        ("offload_config_info", "vllm:kv_offload_config_info"),
        ("tiering_promotion_latency", "vllm:kv_offload_tiering_promotion_latency_seconds"),
    ),
)
"""The oldest V1 metric set we know; the series it names beside the table's rows (``vllm:request_success_total``,
the prompt-token histogram, the running and preemption counters) are exact for 0.32 and assumed for older releases
(the module's notes)."""

DIALECT_CHANGES: Final[tuple[DialectChange, ...]] = (
    DialectChange(
        (0, 10),
        {"kv_cache_usage": "vllm:kv_cache_usage_perc"},
        "vLLM PR 18354 deprecated vllm:gpu_cache_usage_perc for vllm:kv_cache_usage_perc",
    ),
    DialectChange(
        (0, 11),
        {"itl": "vllm:inter_token_latency_seconds"},
        "vLLM PR 24015; loggers.py 'Deprecated in 0.11 - Renamed as vllm:inter_token_latency_seconds'",
    ),
    DialectChange(
        (0, 12),
        {"config_offload_labels": True, "offload": LEGACY_OFFLOAD},
        "vLLM PR 27621 (--kv-offloading-size/--kv-offloading-backend), "
        "PR 27942 (OffloadPromMetrics: vllm:kv_offload_total_bytes{transfer_type})",
    ),
    DialectChange(
        (0, 16),
        {"prompt_tokens_by_source": "vllm:prompt_tokens_by_source_total"},
        "vLLM PR 33290 (issue 33289): vllm:prompt_tokens_by_source_total{source}",
    ),
    DialectChange(
        (0, 23),
        {"offload": FLAT_OFFLOAD},
        "vLLM PR 35669 / RFC issue 44008: flat vllm:kv_offload_load_bytes etc.; legacy kept as deprecated",
    ),
    DialectChange(
        (0, 24),
        {"offload_cpu_usage": "vllm:kv_offload_cpu_cache_usage_perc"},
        "vLLM PR 45737: vllm:kv_offload_cpu_cache_usage_perc",
    ),
    DialectChange(
        (0, 32),
        {
            "prompt_tokens_cached_by_source": "vllm:prompt_tokens_cached_by_source_total",
            "tiering_chunk_queries": "vllm:kv_offload_tiering_chunk_queries_total",
            "tiering_chunk_hits": "vllm:kv_offload_tiering_chunk_hits_total",
        },
        "vLLM PR 56318; present in the vllm-0.32.0 capture. Tiering chunk counters: vllm 0.32.0 "
        "v1/kv_offload/tiering/base.py lines 51-52 (CHUNK_QUERIES, CHUNK_HITS); older releases not checked",
    ),
    DialectChange(
        (0, 33),
        {
            "offload_config_info": "vllm:kv_offload_config_info",
            "tiering_promotion_latency": "vllm:kv_offload_tiering_promotion_latency_seconds",
        },
        "vllm 0.33.0 wheel: distributed/kv_transfer/kv_connector/v1/offloading/metrics.py line 27 "
        "(KV_OFFLOAD_CONFIG_INFO), v1/kv_offload/cpu/common.py lines 34-45 (CPUOffloadingInfo labels), "
        "v1/kv_offload/tiering/base.py line 68 (PROMOTION_LATENCY); absent from the 0.32.0 source",
    ),
    DialectChange(
        (0, 34),
        {},
        "vllm 0.34.0 wheel: every family the analysis reads is registered as in 0.33.0 (names, labels and buckets "
        "unchanged in v1/metrics/loggers.py, offloading/metrics.py and v1/kv_offload/); 0.34 adds only families "
        "it does not read (vllm:kv_offload_tiering_deferred_release_chunks and _hold_seconds, "
        "vllm:request_render_duration_seconds). tests/realvllm/test_dialect_sources.py checks the names",
    ),
)


def _build_table() -> tuple[tuple[VersionTuple, Dialect], ...]:
    rows: list[tuple[VersionTuple, Dialect]] = [((0,), _BASE)]
    current = _BASE
    for change in DIALECT_CHANGES:
        name = ".".join(str(p) for p in change.since)
        current = replace(current, name=name, **change.changes)  # type: ignore[arg-type]
        rows.append((change.since, current))
    return tuple(rows)


DIALECTS: Final = _build_table()
"""(first version, dialect), oldest first."""

NEWEST: Final = DIALECTS[-1][1]


def dialect_for(version: str | None) -> Dialect:
    """The dialect of a vLLM version; None (unknown) gives the newest.

    Raises ValueError when the string is not a version.
    """
    if version is None:
        return NEWEST
    wanted = parse_version(version)
    chosen = DIALECTS[0][1]
    for since, dialect in DIALECTS:
        if wanted >= since:
            chosen = dialect
    return chosen
