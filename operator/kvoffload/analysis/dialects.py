"""The metric dialect table: which Prometheus series each vLLM version exposes.

Names here are the names Prometheus stores (``__name__``): counters carry their
``_total`` suffix, histograms are given by their base name (the series are
``<base>_bucket``, ``<base>_sum`` and ``<base>_count``), gauges are plain.

Choose a dialect from the image tag or ``spec.model.vllmVersion``
(:func:`dialect_for`), then correct it against the names Prometheus actually
holds (:func:`confirm_dialect`): release boundaries of the newer metrics are
taken from the PRs that added them and can be off by one release, the series
present in Prometheus are not.

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

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Final

from kvoffload.api.serving import EngineName
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.api.versions import VersionTuple, parse_version, version_from_image

# Label values of vllm:prompt_tokens_by_source_total.
SOURCE_LOCAL_COMPUTE: Final = "local_compute"
SOURCE_LOCAL_CACHE_HIT: Final = "local_cache_hit"
SOURCE_EXTERNAL_KV_TRANSFER: Final = "external_kv_transfer"
PROMPT_TOKEN_SOURCES: Final = (SOURCE_LOCAL_COMPUTE, SOURCE_LOCAL_CACHE_HIT, SOURCE_EXTERNAL_KV_TRANSFER)

# Label values of vllm:prompt_tokens_cached_by_source_total: the tier that supplied a hit.
CACHED_SOURCE_DEVICE: Final = "device"
CACHED_SOURCE_HOST: Final = "host"
CACHED_SOURCE_P2P: Final = "p2p"
CACHED_SOURCE_DISK: Final = "disk"
CACHED_SOURCE_EXTERNAL_UNSPECIFIED: Final = "external_unspecified"
CACHED_TOKEN_SOURCES: Final = (
    CACHED_SOURCE_DEVICE,
    CACHED_SOURCE_HOST,
    CACHED_SOURCE_P2P,
    CACHED_SOURCE_DISK,
    CACHED_SOURCE_EXTERNAL_UNSPECIFIED,
)

# The status label of http_requests_total: prometheus-fastapi-instrumentator groups codes by their first digit.
LABEL_HTTP_STATUS: Final = "status"
HTTP_SERVER_ERROR: Final = "5xx"

# finished_reason label values of vllm:request_success_total (vLLM's FinishReason).
FINISHED_STOP: Final = "stop"
FINISHED_LENGTH: Final = "length"
FINISHED_ABORT: Final = "abort"
FINISHED_ERROR: Final = "error"
FINISHED_REPETITION: Final = "repetition"
LABEL_FINISHED_REASON: Final = "finished_reason"
FAILED_REASONS: Final = (FINISHED_ABORT, FINISHED_ERROR)
"""Reasons the error gate counts as failed. repetition is the model's output (a loop it was stopped in), not a failure
of the engine or its tiers, so it counts as finished, like stop and length."""

# transfer_type label values of the legacy offload counters.
TRANSFER_LOAD: Final = "CPU_to_GPU"
TRANSFER_STORE: Final = "GPU_to_CPU"

# Labels of vllm:cache_config_info that show the live offload level.
LABEL_OFFLOADING_SIZE: Final = "kv_offloading_size"
LABEL_OFFLOADING_BACKEND: Final = "kv_offloading_backend"

# Labels of vllm:kv_offload_config_info (0.33): the CPU tier as the engine allocated it.
LABEL_CPU_SIZE_BYTES: Final = "cpu_kv_cache_size_bytes"
LABEL_CPU_SIZE_TOKENS: Final = "cpu_kv_cache_size_tokens"
LABEL_CPU_NUM_CHUNKS: Final = "cpu_num_chunks"
LABEL_CPU_BLOCKS_PER_CHUNK: Final = "cpu_blocks_per_chunk"
CPU_CONFIG_LABELS: Final = (
    LABEL_CPU_NUM_CHUNKS,
    LABEL_CPU_BLOCKS_PER_CHUNK,
    LABEL_CPU_SIZE_BYTES,
    LABEL_CPU_SIZE_TOKENS,
)
"""In CPUOffloadingInfo's field order."""

# The tier label of the tiering metrics (and of kv_offload_config_info under tiering).
LABEL_TIER: Final = "tier"
TIER_PRIMARY: Final = "0:primary"
"""The CPU tier under tiering; secondary tier i (from 0) is ``f"{i + 1}:{type}"``."""


def secondary_tier_label(index: int, tier_type: str) -> str:
    """The tier label vLLM gives the secondary tier at ``index`` (from 0): ``1:fs`` for the first fs tier."""
    return f"{index + 1}:{tier_type}"


HISTOGRAM_SUFFIXES: Final = ("_bucket", "_count", "_sum")


@dataclass(frozen=True)
class OffloadSeries:
    """How one vLLM version reports offload transfers (GPU <-> offload tiers).

    ``load_selector``/``store_selector`` are PromQL label matchers (without braces)
    to add to the bytes/time series; empty for the flat names.
    """

    load_bytes: str
    load_time: str
    store_bytes: str
    store_time: str
    load_selector: str = ""
    store_selector: str = ""
    legacy: bool = False

    def families(self) -> tuple[str, ...]:
        """The distinct series names, in a stable order."""
        return tuple(dict.fromkeys((self.load_bytes, self.load_time, self.store_bytes, self.store_time)))


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
class Dialect:
    """The series names one vLLM version exposes. ``None``: that version lacks the metric."""

    name: str
    """The first vLLM version this dialect describes, e.g. ``"0.32"``."""
    ttft: str = "vllm:time_to_first_token_seconds"
    """Histogram base name."""
    itl: str = "vllm:inter_token_latency_seconds"
    """Histogram base name."""
    e2e: str = "vllm:e2e_request_latency_seconds"
    """Histogram base name."""
    request_success: str | None = "vllm:request_success_total"
    """Counter, label ``finished_reason``: every request the engine finished, by why (the error gate)."""
    requests_finished: str | None = None
    """Where the engine has no ``request_success``: a counter of finished requests (SGLang's), read as ``stop``."""
    requests_aborted: str | None = None
    """...and a counter of aborted ones, read as ``abort`` (the error gate's failed reason)."""
    http_requests: str = "http_requests_total"
    """Counter of vLLM's API server (prometheus-fastapi-instrumentator), labels ``handler``, ``method``, ``status``
    (``2xx``, ``4xx``, ``5xx``). Not the engine's: the error gate reads it where it exists, and never requires it."""
    http_status_label: str = LABEL_HTTP_STATUS
    """The label of ``http_requests``' status: vLLM's holds classes (``5xx``); any other holds codes (``500``),
    which the query folds into classes."""
    prompt_tokens: str = "vllm:prompt_tokens_total"
    generation_tokens: str = "vllm:generation_tokens_total"
    prompt_tokens_by_source: str | None = "vllm:prompt_tokens_by_source_total"
    """Label ``source``: local_compute, local_cache_hit, external_kv_transfer."""
    prompt_tokens_cached_by_source: str | None = "vllm:prompt_tokens_cached_by_source_total"
    """Label ``source``: device, host, p2p, disk, external_unspecified."""
    cached_source_label: str = "source"
    """The label of ``prompt_tokens_cached_by_source`` (SGLang's: ``cache_source``)."""
    cached_tier_sources: tuple[str, str] = ("host", "disk")
    """Its values for the CPU tier and the secondary tiers, read as ``host`` and ``disk`` (SGLang's: host, storage)."""
    external_from_cached: bool = False
    """Whether the offload share is the tier sources of ``prompt_tokens_cached_by_source`` over ``prompt_tokens``
    (an engine with no ``prompt_tokens_by_source``)."""
    kv_cache_usage: str = "vllm:kv_cache_usage_perc"
    prefix_cache_queries: str = "vllm:prefix_cache_queries_total"
    prefix_cache_hits: str = "vllm:prefix_cache_hits_total"
    gpu_prefix_cache_hits_matcher: str | None = None
    """A matcher on ``prefix_cache_hits`` that keeps the GPU cache's own hits, where the counter also holds the
    offload tiers' (SGLang's ``cache_source``): a variant's GPU hit rate (``VariantSample.prefix_cache_hit_rate``)."""
    request_prompt_tokens: str = "vllm:request_prompt_tokens"
    """Histogram base name: prompt tokens per finished request."""
    num_requests_running: str = "vllm:num_requests_running"
    """Gauge: requests in the engine's running batch (concurrency)."""
    num_preemptions: str = "vllm:num_preemptions_total"
    """Counter: requests preempted (their KV freed) because the GPU KV cache ran out."""
    cache_config_info: str | None = "vllm:cache_config_info"
    config_offload_labels: bool = True
    """Whether cache_config_info carries kv_offloading_size / kv_offloading_backend."""
    offload: OffloadSeries | None = FLAT_OFFLOAD
    """Offload transfer counters; only emitted when an offloading connector runs."""
    offload_cpu_usage: str | None = "vllm:kv_offload_cpu_cache_usage_perc"
    """Gauge; only emitted with the native CPU offloading spec."""
    tiering_chunk_queries: str | None = "vllm:kv_offload_tiering_chunk_queries_total"
    """Counter, label ``tier``; only emitted under tiering (secondary tiers configured)."""
    tiering_chunk_hits: str | None = "vllm:kv_offload_tiering_chunk_hits_total"
    """Counter, label ``tier``; only emitted under tiering."""
    offload_config_info: str | None = "vllm:kv_offload_config_info"
    """Info gauge of the allocated offload tiers (``CPU_CONFIG_LABELS``, ``tier``); only with a connector."""
    tiering_promotion_latency: str | None = "vllm:kv_offload_tiering_promotion_latency_seconds"
    """Histogram base name, labels ``tier``, ``result``; only emitted under tiering."""

    @property
    def ttft_bucket(self) -> str:
        return self.ttft + "_bucket"

    @property
    def itl_bucket(self) -> str:
        return self.itl + "_bucket"

    @property
    def e2e_bucket(self) -> str:
        return self.e2e + "_bucket"

    @property
    def request_prompt_tokens_bucket(self) -> str:
        return self.request_prompt_tokens + "_bucket"

    def required_families(self) -> tuple[str, ...]:
        """Every non-offload series name this dialect names (histograms by base name).

        A vLLM engine of this version shows all of them from start, offload or not; SGLang shows a labelled
        family with its first sample (prometheus_client creates a label set when it is first used).
        """
        names: list[str | None] = [
            self.ttft,
            self.itl,
            self.e2e,
            self.request_success,
            self.requests_finished,
            self.requests_aborted,
            self.prompt_tokens,
            self.generation_tokens,
            self.prompt_tokens_by_source,
            self.prompt_tokens_cached_by_source,
            self.kv_cache_usage,
            self.prefix_cache_queries,
            self.prefix_cache_hits,
            self.request_prompt_tokens,
            self.num_requests_running,
            self.num_preemptions,
            self.cache_config_info,
        ]
        return tuple(n for n in names if n is not None)

    def offload_families(self) -> tuple[str, ...]:
        """The series only an engine with an offloading connector shows."""
        names = list(self.offload.families()) if self.offload else []
        if self.offload_cpu_usage:
            names.append(self.offload_cpu_usage)
        if self.offload_config_info:
            names.append(self.offload_config_info)
        return tuple(names)

    def tiering_families(self) -> tuple[str, ...]:
        """The series only an engine with secondary tiers shows (histograms by base name)."""
        names = (self.tiering_chunk_queries, self.tiering_chunk_hits, self.tiering_promotion_latency)
        return tuple(n for n in names if n is not None)

    def histograms(self) -> tuple[str, ...]:
        """Base names of the histogram families."""
        return (self.ttft, self.itl, self.e2e, self.request_prompt_tokens)


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
    itl="vllm:time_per_output_token_seconds",
    prompt_tokens_by_source=None,
    prompt_tokens_cached_by_source=None,
    kv_cache_usage="vllm:gpu_cache_usage_perc",
    config_offload_labels=False,
    offload=None,
    offload_cpu_usage=None,
    tiering_chunk_queries=None,
    tiering_chunk_hits=None,
    offload_config_info=None,
    tiering_promotion_latency=None,
)

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


SGLANG_OFFLOAD: Final = OffloadSeries(
    load_bytes="sglang:load_back_bytes_total",
    load_time="sglang:load_back_duration_seconds_sum",
    store_bytes="sglang:hicache_backup_bytes_total",
    store_time="sglang:hicache_backup_duration_seconds_sum",
)
"""HiCache's transfers: host (and storage) to GPU is a load back, GPU to host a backup (0.5.23
``observability/metrics_collector.py``; the durations are histograms, so their ``_sum`` is the time)."""

SGLANG: Final = Dialect(
    name="sglang-0.5",
    ttft="sglang:time_to_first_token_seconds",
    itl="sglang:inter_token_latency_seconds",
    e2e="sglang:e2e_request_latency_seconds",
    request_success=None,
    requests_finished="sglang:num_requests_total",
    requests_aborted="sglang:num_aborted_requests_total",
    http_requests="sglang:http_responses_total",
    http_status_label="status_code",
    prompt_tokens="sglang:prompt_tokens_total",
    generation_tokens="sglang:generation_tokens_total",
    prompt_tokens_by_source=None,
    prompt_tokens_cached_by_source="sglang:cached_tokens_total",
    cached_source_label="cache_source",
    cached_tier_sources=("host", "storage"),
    external_from_cached=True,
    kv_cache_usage="sglang:token_usage",
    # Tokens, as vLLM's prefix-cache counters are: cached tokens of any source over prompt tokens.
    prefix_cache_queries="sglang:prompt_tokens_total",
    prefix_cache_hits="sglang:cached_tokens_total",
    gpu_prefix_cache_hits_matcher='cache_source="device"',
    request_prompt_tokens="sglang:prompt_tokens_histogram",
    num_requests_running="sglang:num_running_reqs",
    num_preemptions="sglang:num_retracted_requests_total",
    cache_config_info=None,
    config_offload_labels=False,
    offload=SGLANG_OFFLOAD,
    offload_cpu_usage=None,
    tiering_chunk_queries=None,
    tiering_chunk_hits=None,
    offload_config_info=None,
    tiering_promotion_latency=None,
)
"""SGLang 0.5.23's series (its collectors, instantiated in tests/sglang; docs/engines.md):

- TTFT, ITL and e2e histograms as vLLM's, under ``sglang:``;
- the error gate: ``sglang:num_aborted_requests_total`` over it plus ``sglang:num_requests_total`` (SGLang has no
  finished reason; it counts an abort when a client or the API aborts a request, ``tokenizer_manager.py``
  ``abort_request``), and ``sglang:http_responses_total{status_code}`` for 5xx;
- the offload share: ``sglang:cached_tokens_total{cache_source}`` host and storage over ``sglang:prompt_tokens_total``;
- no cache config series, no per-tier chunk lookups: those rows are not judged for SGLang."""


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


def policy_dialect(spec: KVOffloadPolicySpec) -> Dialect:
    """The dialect of a policy's engines: SGLang's, or vLLM's of ``model.vllmVersion``, else of the image tag.

    Raises ValueError when the vLLM version is not a version."""
    if spec.engine == EngineName.SGLANG:
        return SGLANG
    return dialect_for(spec.model.vllm_version or version_from_image(spec.image))


def has_family(name: str, present: Iterable[str] | set[str]) -> bool:
    """Whether Prometheus holds the series ``name`` (a histogram base counts via its suffixes)."""
    names = present if isinstance(present, set | frozenset) else set(present)
    return name in names or any(name + s in names for s in HISTOGRAM_SUFFIXES)


def confirm_dialect(dialect: Dialect, present: set[str] | frozenset[str]) -> Dialect:
    """Correct ``dialect`` to the names Prometheus actually holds.

    ``present`` is the set of ``__name__`` values found (for the engines in
    question). For each metric that exists under two names across versions, the
    name that is present wins when the dialect's choice is absent. Optional
    families (by-source counters) absent while the engine is clearly scraped
    (its TTFT histogram is there) become None. With no vLLM series at all,
    nothing can be confirmed and the dialect comes back unchanged.
    """
    if not any(n.startswith("vllm:") for n in present):
        return dialect
    changes: dict[str, object] = {}

    def prefer(field: str, current: str, alternative: str) -> None:
        if not has_family(current, present) and has_family(alternative, present):
            changes[field] = alternative

    prefer(
        "itl",
        dialect.itl,
        "vllm:time_per_output_token_seconds"
        if dialect.itl == "vllm:inter_token_latency_seconds"
        else "vllm:inter_token_latency_seconds",
    )
    prefer(
        "kv_cache_usage",
        dialect.kv_cache_usage,
        "vllm:gpu_cache_usage_perc"
        if dialect.kv_cache_usage == "vllm:kv_cache_usage_perc"
        else "vllm:kv_cache_usage_perc",
    )

    scraped = has_family(dialect.ttft, present)
    for field, canonical in (
        ("prompt_tokens_by_source", "vllm:prompt_tokens_by_source_total"),
        ("prompt_tokens_cached_by_source", "vllm:prompt_tokens_cached_by_source_total"),
    ):
        current = getattr(dialect, field)
        if current is None and canonical in present:
            changes[field] = canonical
        elif current is not None and scraped and current not in present:
            changes[field] = None

    # Offload series exist only while a connector runs: switch names only on
    # evidence of the other variant, never drop them.
    flat_seen = FLAT_OFFLOAD.load_bytes in present or FLAT_OFFLOAD.store_bytes in present
    legacy_seen = LEGACY_OFFLOAD.load_bytes in present
    if flat_seen:
        changes["offload"] = FLAT_OFFLOAD
    elif legacy_seen:
        changes["offload"] = LEGACY_OFFLOAD
    if dialect.offload_cpu_usage is None and "vllm:kv_offload_cpu_cache_usage_perc" in present:
        changes["offload_cpu_usage"] = "vllm:kv_offload_cpu_cache_usage_perc"
    # Newer offload families: added on evidence (a release boundary may be off by one), never dropped.
    for field, canonical in (
        ("tiering_chunk_queries", "vllm:kv_offload_tiering_chunk_queries_total"),
        ("tiering_chunk_hits", "vllm:kv_offload_tiering_chunk_hits_total"),
        ("offload_config_info", "vllm:kv_offload_config_info"),
        ("tiering_promotion_latency", "vllm:kv_offload_tiering_promotion_latency_seconds"),
    ):
        if getattr(dialect, field) is None and has_family(canonical, present):
            changes[field] = canonical

    changes = {k: v for k, v in changes.items() if getattr(dialect, k) != v}
    return replace(dialect, **changes) if changes else dialect  # type: ignore[arg-type]
