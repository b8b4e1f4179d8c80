"""Analysis: judging what Prometheus shows for canary and stable, as one pure ``assess()``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvoffload.models import MetricResult, Verdict


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
    external_share: float | None = None
    """Share of prompt tokens loaded from the offload tiers, 0..1."""
    tier_hits: Mapping[str, float] = field(default_factory=dict)
    """Prompt tokens served per cache source over the window (``host``, ``disk``...)."""
    kv_usage: float | None = None
    """GPU KV cache usage, 0..1."""
    load_bytes_per_second: float | None = None
    """Offload load throughput (bytes / transfer seconds)."""
    config: Mapping[str, str] | None = None
    """Labels of vllm:cache_config_info, e.g. kv_offloading_size."""


@dataclass(frozen=True)
class Measurements:
    """One cycle's evidence for one policy: both variants over the same window."""

    canary: VariantSample | None
    stable: VariantSample | None
    error: str | None = None
    """Set when Prometheus could not answer; the verdict is then Inconclusive."""


@dataclass(frozen=True)
class Assessment:
    """A verdict with each metric's value, threshold and reason."""

    verdict: Verdict
    metrics: tuple[MetricResult, ...] = ()
    message: str = ""
