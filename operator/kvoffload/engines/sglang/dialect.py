"""SGLang's metric dialect: the series SGLang 0.5.23's collectors export, and how analysis reads them as vLLM's
(``engines/dialect.py``)."""

from __future__ import annotations

from typing import Final

from kvoffload.engines.dialect import Dialect, OffloadSeries

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
    series_prefix="sglang:",
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
