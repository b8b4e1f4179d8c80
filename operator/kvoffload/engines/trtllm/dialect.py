"""TensorRT-LLM's metric dialect: the series ``trtllm-serve`` exports, as ``engines/dialect.py``'s ``Dialect`` reads
them.

Read from ``tensorrt_llm/metrics/collector.py`` at ``050f80def8df236e326949c8bd9dee10fd896a83``
(``tools/trtllm-sources/050f80de``; tests/engines/test_trtllm_engine.py checks every name against that source with
``ast``). prometheus_client exposes a counter with ``_total`` and a histogram by its base name's ``_bucket``,
``_sum`` and ``_count``, so the names below are those Prometheus stores. Prometheus scrapes them at
:data:`METRICS_PATH`.

None marks a gate's series TensorRT-LLM does not have: the gate is then "not judged", by name.

- **ITL: none.** ``trtllm_time_per_output_token_seconds`` is one sample per finished request (its TPOT, the mean
  gap), not one per token, so its p99 is not the p99 inter-token latency.
- **Failures: not gated yet.** ``trtllm_request_success_total{finished_reason}`` counts finished requests by
  reason, but TensorRT-LLM's reasons are ``stop``, ``length``, ``timeout`` and ``cancelled``
  (``tensorrt_llm/executor/result.py``, ``CompletionOutput.finish_reason``, read in the index at no pinned
  commit), not vLLM's ``abort``/``error`` that the error gate counts as failed; read as it is, the gate would see
  no failure ever. ``trtllm_request_error_total{http_code}`` counts error answers but no successful ones.
- **Per-request series** (TTFT, e2e, tokens, cached tokens) are recorded only with ``return_perf_metrics: true``,
  **iteration series** (KV-cache usage, host utilisation, onboard/offload bytes, running requests) only with
  ``enable_iter_perf_stats: true`` (``log_request_metrics_dict``/``log_iteration_stats`` docstrings, read at
  ``050f80de`` past the saved excerpt's end): the
  operator's extra-options file sets both (``command.extra_options``).
- **Offload transfers:** bytes both ways (``trtllm_kv_cache_onboard_bytes_total`` host to GPU,
  ``trtllm_kv_cache_offload_bytes_total`` GPU to host), but no transfer time.
- **Prompt tokens per request, preemptions:** no such series (``trtllm_num_paused_requests`` is a gauge of paused
  requests, not a counter of preempted ones).
"""

from __future__ import annotations

from typing import Final

from kvoffload.engines.dialect import Dialect

COLLECTOR_COMMIT: Final = "050f80def8df236e326949c8bd9dee10fd896a83"
PREFIX: Final = "trtllm_"

# trtllm-serve's /metrics answers JSON iteration stats; Prometheus' text is mounted at /prometheus/metrics
# (tensorrt_llm/serve/openai_server.py, ``Mount("/prometheus/metrics", make_asgi_app(registry=registry))``, read
# in the index at no pinned commit). The PodMonitor must scrape this path, not /metrics.
METRICS_PATH: Final = "/prometheus/metrics"

# The cache_tier label of trtllm_prompt_cache_hit_tokens_total names the memory behind each cache level
# (collector.py: "a deployment with a hot and a cold GPU level reports them as two series sharing the gpu name";
# "Pages already prefetched from disk to host count as host"). The values come from the engine's tier list, which
# the saved excerpt does not hold: "host" and "disk" are read from those docstrings, not from the list itself.
LABEL_CACHE_TIER: Final = "cache_tier"
TIER_HOST: Final = "host"
TIER_DISK: Final = "disk"

ONBOARD_BYTES: Final = "trtllm_kv_cache_onboard_bytes_total"
"""Counter: bytes brought back from the host cache to the GPU (a load)."""
OFFLOAD_BYTES: Final = "trtllm_kv_cache_offload_bytes_total"
"""Counter: bytes written from the GPU to the host cache (a store)."""

NAME: Final = "trtllm-050f80de"

TRTLLM: Final = Dialect(
    name=NAME,
    series_prefix=PREFIX,
    ttft="trtllm_time_to_first_token_seconds",
    # No ITL series (module docstring): the ITL gates say they are not judged.
    itl=None,
    e2e="trtllm_e2e_request_latency_seconds",
    request_success=None,
    requests_finished=None,
    requests_aborted=None,
    # trtllm-serve's instrumentator excludes every handler (excluded_handlers=[".*"]), so this family carries no
    # samples and the error gate reads none from it; the field has no None today.
    http_requests="http_requests_total",
    prompt_tokens="trtllm_prompt_tokens_total",
    generation_tokens="trtllm_generation_tokens_total",
    prompt_tokens_by_source=None,
    # Tokens by the cache level that supplied them: the offload share is host (and disk) over prompt tokens.
    prompt_tokens_cached_by_source="trtllm_prompt_cache_hit_tokens_total",
    cached_source_label=LABEL_CACHE_TIER,
    cached_tier_sources=(TIER_HOST, TIER_DISK),
    external_from_cached=True,
    # used / max GPU blocks, a fraction as vllm:kv_cache_usage_perc is.
    kv_cache_usage="trtllm_kv_cache_utilization",
    # Tokens, as SGLang's are: prompt tokens served from any KV cache level over prompt tokens.
    prefix_cache_queries="trtllm_prompt_tokens_total",
    prefix_cache_hits="trtllm_prompt_cached_tokens_total",
    gpu_prefix_cache_hits_matcher=None,
    # No prompt-length histogram and no preemption counter: those workload figures stay unknown.
    request_prompt_tokens=None,
    num_requests_running="trtllm_num_requests_running",
    num_preemptions=None,
    # trtllm_kv_cache_config_info exists, but its labels are the keys of a dict its caller builds (left out of the
    # saved excerpt): not read, so the live config check is not made.
    cache_config_info=None,
    config_offload_labels=False,
    # No transfer time, which OffloadSeries requires (see ONBOARD_BYTES, OFFLOAD_BYTES).
    offload=None,
    offload_cpu_usage="trtllm_kv_cache_host_utilization",
    tiering_chunk_queries=None,
    tiering_chunk_hits=None,
    offload_config_info=None,
    tiering_promotion_latency=None,
)
"""TensorRT-LLM's series at ``050f80de``; every name is checked against the collector's source."""
