"""A metric dialect: which Prometheus series an engine exports, in words every engine's table fills in.

Names here are the names Prometheus stores (``__name__``): counters carry their
``_total`` suffix, histograms are given by their base name (the series are
``<base>_bucket``, ``<base>_sum`` and ``<base>_count``), gauges are plain.

Each engine's folder holds its own table (``engines/<engine>/dialect.py``) and hands a policy's dialect out through
``Engine.dialect``; analysis reads only the fields of :class:`Dialect` and the label vocabulary below. The vocabulary
is vLLM's spelling, as the first engine's: an engine that labels otherwise says so in its dialect
(``cached_source_label``, ``cached_tier_sources``, ``http_status_label``) and the queries relabel its answers into
these words.

:func:`confirm_dialect` corrects a dialect against the names Prometheus actually holds, from what the dialect itself
says may vary (``renamed``, ``optional_series``, ``offload_variants``, ``evidence_series``): release boundaries of
the newer metrics are taken from the PRs that added them and can be off by one release, the series present in
Prometheus are not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Final

# Label values of the prompt tokens by source (vLLM's vllm:prompt_tokens_by_source_total).
LABEL_SOURCE: Final = "source"
SOURCE_LOCAL_COMPUTE: Final = "local_compute"
SOURCE_LOCAL_CACHE_HIT: Final = "local_cache_hit"
SOURCE_EXTERNAL_KV_TRANSFER: Final = "external_kv_transfer"
PROMPT_TOKEN_SOURCES: Final = (SOURCE_LOCAL_COMPUTE, SOURCE_LOCAL_CACHE_HIT, SOURCE_EXTERNAL_KV_TRANSFER)

# Label values of the cached prompt tokens by source (vLLM's vllm:prompt_tokens_cached_by_source_total): the tier
# that supplied a hit.
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

# finished_reason label values of the finished requests (vLLM's FinishReason).
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

# Labels of the cache config info (vLLM's vllm:cache_config_info) that show the live offload level.
LABEL_OFFLOADING_SIZE: Final = "kv_offloading_size"
LABEL_OFFLOADING_BACKEND: Final = "kv_offloading_backend"

# Labels of the offload config info (vLLM 0.33's vllm:kv_offload_config_info): the CPU tier as the engine allocated it.
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

# The tier label of the tiering metrics (and of the offload config info under tiering).
LABEL_TIER: Final = "tier"
TIER_PRIMARY: Final = "0:primary"
"""The CPU tier under tiering; secondary tier i (from 0) is ``f"{i + 1}:{type}"``."""


def secondary_tier_label(index: int, tier_type: str) -> str:
    """The tier label vLLM gives the secondary tier at ``index`` (from 0): ``1:fs`` for the first fs tier."""
    return f"{index + 1}:{tier_type}"


HISTOGRAM_SUFFIXES: Final = ("_bucket", "_count", "_sum")


@dataclass(frozen=True)
class OffloadSeries:
    """How one engine version reports offload transfers (GPU <-> offload tiers).

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


@dataclass(frozen=True, kw_only=True)
class Dialect:
    """The series names one engine version exposes. ``None``: that version lacks the metric.

    No field has an engine's name as its default: each engine's table names every series it exports."""

    name: str
    """The first engine version this dialect describes, e.g. ``"0.32"``."""
    series_prefix: str
    """The prefix of the engine's own series (``vllm:``): :func:`confirm_dialect` confirms nothing where Prometheus
    holds none of them."""
    ttft: str
    """Histogram base name."""
    itl: str | None
    """Histogram base name; None where the engine exports no per-token gaps (its ITL gates are then not judged)."""
    e2e: str
    """Histogram base name."""
    request_success: str | None = None
    """Counter, label ``finished_reason``: every request the engine finished, by why (the error gate)."""
    requests_finished: str | None = None
    """Where the engine has no ``request_success``: a counter of finished requests (SGLang's), read as ``stop``."""
    requests_aborted: str | None = None
    """...and a counter of aborted ones, read as ``abort`` (the error gate's failed reason)."""
    http_requests: str
    """Counter of the engine's API server. vLLM's (prometheus-fastapi-instrumentator) has labels ``handler``,
    ``method``, ``status`` (``2xx``, ``4xx``, ``5xx``). The error gate reads it where it exists, and never requires
    it."""
    http_status_label: str = LABEL_HTTP_STATUS
    """The label of ``http_requests``' status: vLLM's holds classes (``5xx``); any other holds codes (``500``),
    which the query folds into classes."""
    prompt_tokens: str
    generation_tokens: str
    prompt_tokens_by_source: str | None = None
    """Label ``source``: local_compute, local_cache_hit, external_kv_transfer."""
    prompt_tokens_cached_by_source: str | None = None
    """Label ``source``: device, host, p2p, disk, external_unspecified."""
    cached_source_label: str = LABEL_SOURCE
    """The label of ``prompt_tokens_cached_by_source`` (SGLang's: ``cache_source``)."""
    cached_tier_sources: tuple[str, str] = (CACHED_SOURCE_HOST, CACHED_SOURCE_DISK)
    """Its values for the CPU tier and the secondary tiers, read as ``host`` and ``disk`` (SGLang's: host, storage)."""
    external_from_cached: bool = False
    """Whether the offload share is the tier sources of ``prompt_tokens_cached_by_source`` over ``prompt_tokens``
    (an engine with no ``prompt_tokens_by_source``)."""
    kv_cache_usage: str
    prefix_cache_queries: str
    prefix_cache_hits: str
    gpu_prefix_cache_hits_matcher: str | None = None
    """A matcher on ``prefix_cache_hits`` that keeps the GPU cache's own hits, where the counter also holds the
    offload tiers' (SGLang's ``cache_source``): a variant's GPU hit rate (``VariantSample.prefix_cache_hit_rate``)."""
    request_prompt_tokens: str | None
    """Histogram base name: prompt tokens per finished request (None: not exported)."""
    num_requests_running: str
    """Gauge: requests in the engine's running batch (concurrency)."""
    num_preemptions: str | None
    """Counter: requests preempted (their KV freed) because the GPU KV cache ran out (None: not exported)."""
    cache_config_info: str | None = None
    config_offload_labels: bool = False
    """Whether cache_config_info carries kv_offloading_size / kv_offloading_backend."""
    offload: OffloadSeries | None = None
    """Offload transfer counters; only emitted when an offloading connector runs."""
    offload_cpu_usage: str | None = None
    """Gauge; only emitted with the native CPU offloading spec."""
    tiering_chunk_queries: str | None = None
    """Counter, label ``tier``; only emitted under tiering (secondary tiers configured)."""
    tiering_chunk_hits: str | None = None
    """Counter, label ``tier``; only emitted under tiering."""
    offload_config_info: str | None = None
    """Info gauge of the allocated offload tiers (``CPU_CONFIG_LABELS``, ``tier``); only with a connector."""
    tiering_promotion_latency: str | None = None
    """Histogram base name, labels ``tier``, ``result``; only emitted under tiering."""

    # --- what confirm_dialect may correct, per the engine's own release history ---
    renamed: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(field, every name the field's series had across releases): where the dialect's name is absent and another
    is present, the present one wins."""
    optional_series: tuple[tuple[str, str], ...] = ()
    """(field, its name): a family some releases lack, added where present, dropped where absent while the engine
    is scraped (its TTFT histogram is there)."""
    offload_variants: tuple[OffloadSeries, ...] = ()
    """The ways releases report offload transfers, preferred first: the first one seen wins (offload series exist
    only while a connector runs, so they are switched on evidence, never dropped)."""
    evidence_series: tuple[tuple[str, str], ...] = ()
    """(field, its name): a newer family added where present (a release boundary may be off by one), never
    dropped."""

    @property
    def ttft_bucket(self) -> str:
        return self.ttft + "_bucket"

    @property
    def itl_bucket(self) -> str | None:
        return None if self.itl is None else self.itl + "_bucket"

    @property
    def e2e_bucket(self) -> str:
        return self.e2e + "_bucket"

    @property
    def request_prompt_tokens_bucket(self) -> str | None:
        return None if self.request_prompt_tokens is None else self.request_prompt_tokens + "_bucket"

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
        return tuple(n for n in (self.ttft, self.itl, self.e2e, self.request_prompt_tokens) if n is not None)


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
    (its TTFT histogram is there) become None. With no series of the engine at all,
    nothing can be confirmed and the dialect comes back unchanged.
    """
    if not any(n.startswith(dialect.series_prefix) for n in present):
        return dialect
    changes: dict[str, object] = {}

    for field, names in dialect.renamed:
        current = getattr(dialect, field)
        if not has_family(current, present):
            found = next((n for n in names if n != current and has_family(n, present)), None)
            if found is not None:
                changes[field] = found

    scraped = has_family(dialect.ttft, present)
    for field, canonical in dialect.optional_series:
        current = getattr(dialect, field)
        if current is None and canonical in present:
            changes[field] = canonical
        elif current is not None and scraped and current not in present:
            changes[field] = None

    # Offload series exist only while a connector runs: switch names only on
    # evidence of the other variant, never drop them.
    seen = next((v for v in dialect.offload_variants if v.load_bytes in present or v.store_bytes in present), None)
    if seen is not None:
        changes["offload"] = seen
    # Newer offload families: added on evidence (a release boundary may be off by one), never dropped.
    for field, canonical in dialect.evidence_series:
        if getattr(dialect, field) is None and has_family(canonical, present):
            changes[field] = canonical

    changes = {k: v for k, v in changes.items() if getattr(dialect, k) != v}
    return replace(dialect, **changes) if changes else dialect  # type: ignore[arg-type]
