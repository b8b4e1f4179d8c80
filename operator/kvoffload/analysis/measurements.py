"""What one cycle shows of a policy: each variant's sample as the provider reads it from Prometheus, the pair that
``assess()`` judges, and the reading of a figure (NaN and infinities are no data)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvoffload.analysis.evidence import Histogram
from kvoffload.analysis.payoff import SubWindow


@dataclass(frozen=True)
class Percentiles:
    """p50, p95 and p99 of one histogram over the window; None where it had no observations."""

    p50: float | None = None
    p95: float | None = None
    p99: float | None = None


WORKLOAD_QUANTILES = (0.50, 0.95, 0.99)
"""The quantiles a ``Percentiles`` holds, in its field order."""


@dataclass(frozen=True)
class WorkloadSample:
    """What a careful operator records of a fleet before offloading (issue 11, part 5).

    Read only while a ladder is in its baseline (``Target.workload``); the preflight
    judges whether offload can pay from these figures.
    """

    prompt_tokens: Percentiles = field(default_factory=Percentiles)
    """Prompt length per finished request, tokens (``vllm:request_prompt_tokens``)."""
    ttft: Percentiles = field(default_factory=Percentiles)
    """Time to first token, seconds."""
    itl: Percentiles = field(default_factory=Percentiles)
    """Inter-token latency, seconds."""
    e2e: Percentiles = field(default_factory=Percentiles)
    """End-to-end request latency, seconds."""
    running_requests: float | None = None
    """Concurrency: requests in an engine's running batch, averaged over the window and the engines."""
    prefix_cache_hit_rate: float | None = None
    """Prompt tokens found in the GPU prefix cache / prompt tokens looked up, 0..1."""
    kv_usage_max: float | None = None
    """Highest GPU KV cache usage any engine showed in the window, 0..1."""
    preemptions_per_second: float | None = None
    """Requests preempted per second for lack of GPU KV blocks, summed over the engines."""


@dataclass(frozen=True)
class VariantSample:
    """What Prometheus shows for one variant of one policy over the analysis window."""

    requests: float | None = None
    """Requests finished in the window (increase of the TTFT histogram count)."""
    request_rate: float | None = None
    """Requests per second over the window."""
    ttft_p99: float | None = None
    """p99 time to first token, seconds."""
    itl_p99: float | None = None
    """p99 inter-token latency, seconds."""
    ttft_histogram: Histogram = ()
    """TTFT bucket counts over the window (``increase`` by ``le``): (upper bound in seconds, cumulative count),
    ascending, ``inf`` last. Empty where Prometheus returned none."""
    itl_histogram: Histogram = ()
    """Inter-token latency bucket counts over the window, as ``ttft_histogram``."""
    prefix_cache_hit_rate: float | None = None
    """GPU prefix-cache hits / lookups over the window, 0..1: the warm-up's cache parity."""
    external_share: float | None = None
    """Share of prompt tokens loaded from the offload tiers, 0..1."""
    tier_hits: Mapping[str, float] = field(default_factory=dict)
    """Prompt tokens served per cache source over the window (``host``, ``disk``...).

    Empty when the engine does not export per-source counters at all."""
    tier_chunk_queries: Mapping[str, float] = field(default_factory=dict)
    """Chunk lookups per tier over the window under tiering, by tier label (``0:primary``, ``1:fs``).

    Empty when no tiering runs or the engine lacks ``vllm:kv_offload_tiering_chunk_queries``."""
    tier_chunk_hits: Mapping[str, float] = field(default_factory=dict)
    """Chunk lookups that hit, per tier, over the window (``vllm:kv_offload_tiering_chunk_hits``)."""
    offload_allocated: tuple[Mapping[str, str], ...] = ()
    """One label set per series of ``vllm:kv_offload_config_info`` now (vLLM 0.33 on): ``pod``, ``tier``,
    ``cpu_kv_cache_size_bytes``, ``cpu_num_chunks``. Empty where the engine does not export it."""
    finished: Mapping[str, float] = field(default_factory=dict)
    """Requests finished in the window per ``finished_reason`` (``vllm:request_success_total``): stop, length,
    abort, error... Empty when the engine exports no such series."""
    http_responses: Mapping[str, float] = field(default_factory=dict)
    """Answers of vLLM's API server in the window per status class (``http_requests_total``: 2xx, 4xx, 5xx).
    Empty where it is not exported."""
    kv_usage: float | None = None
    """GPU KV cache usage, 0..1."""
    load_bytes_per_second: float | None = None
    """Offload load throughput (bytes / transfer seconds)."""
    config: Mapping[str, str] | None = None
    """Labels of vllm:cache_config_info, e.g. kv_offloading_size."""
    workload: WorkloadSample | None = None
    """The baseline's workload figures; None unless the target asked for them (``Target.workload``)."""
    payoff_rows: tuple[SubWindow, ...] = ()
    """Increments over the step's sub-windows, oldest first (``Target.payoff_since``): what the live payoff is
    fitted to. Empty unless the target asked for them."""


@dataclass(frozen=True)
class Measurements:
    """One cycle's evidence for one policy: both variants over the same window.

    ``canary is None`` means no canary runs (guard or baseline); a canary that
    runs but shows no series is an empty ``VariantSample()``.
    """

    canary: VariantSample | None
    stable: VariantSample | None
    error: str | None = None
    """Set when Prometheus could not answer; the verdict is then Inconclusive."""
    no_itl: str | None = None
    """Why no inter-token latency can be measured (the engine's dialect has no such series); the ITL rows are then
    not judged, by name, rather than Inconclusive forever."""


def has_series(sample: VariantSample | None) -> bool:
    """Whether Prometheus showed anything at all for this variant in the window (a count of 0 is something)."""
    if sample is None:
        return False
    figures = (
        sample.requests,
        sample.request_rate,
        sample.ttft_p99,
        sample.itl_p99,
        sample.prefix_cache_hit_rate,
        sample.external_share,
        sample.kv_usage,
        sample.load_bytes_per_second,
    )
    return (
        any(value is not None for value in figures)
        or bool(
            sample.ttft_histogram
            or sample.itl_histogram
            or sample.tier_hits
            or sample.tier_chunk_queries
            or sample.tier_chunk_hits
            or sample.offload_allocated
            or sample.finished
            or sample.http_responses
            or sample.payoff_rows
        )
        or sample.config is not None
        or (sample.workload is not None and sample.workload != WorkloadSample())
    )


def not_scraped(measurements: Measurements | None) -> bool:
    """Prometheus answered, and holds no series of any of the policy's pods, canary or stable: no Prometheus
    scrapes them (or not yet). False when there was no answer (an error is another problem)."""
    if measurements is None or measurements.error is not None:
        return False
    return not has_series(measurements.canary) and not has_series(measurements.stable)


def _num(value: float | None) -> float | None:
    """NaN and infinities (empty histograms, 0/0) are no data."""
    if value is None or math.isnan(value) or math.isinf(value):
        return None
    return float(value)


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den
