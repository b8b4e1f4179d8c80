# SPDX-FileCopyrightText: Copyright (c) 2026 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
# SPDX-License-Identifier: Apache-2.0
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
# http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Utilities for Prometheus Metrics Collection."""

import math
import time
from typing import Dict, List, Optional, Union

from .enums import MetricNames


# Adapted from https://github.com/vllm-project/vllm/blob/v0.10.0rc1/vllm/engine/metrics.py#L30
class MetricsCollector:
    """Collects and logs metrics from TensorRT-LLM engine stats to Prometheus.

    Used by OpenAIServer in tensorrt_llm/serve/openai_server.py.

    Args:
        labels: A key-value dictionary of labels to add as metadata to all created Prometheus metrics. Useful for
        distinguishing between multiple series of the same metric name. Example:
        {"model_name": "nemotron-nano-3", "engine_type": "trtllm"}

    Created Prometheus metrics:
        Per-request metrics:
            trtllm_request_success_total
            trtllm_e2e_request_latency_seconds
            trtllm_time_to_first_token_seconds
            trtllm_time_per_output_token_seconds
            trtllm_request_queue_time_seconds
            trtllm_request_prefill_time_seconds
            trtllm_request_decode_time_seconds
            trtllm_request_inference_time_seconds
            trtllm_prompt_tokens_total
            trtllm_generation_tokens_total
            trtllm_prompt_cached_tokens_total
            trtllm_prompt_cache_hit_tokens_total
            trtllm_prompt_cached_tokens_per_request
            trtllm_spec_decode_drafted_tokens_total
            trtllm_spec_decode_accepted_tokens_total
            trtllm_prefill_perplexity
            trtllm_generation_perplexity
            trtllm_request_error_total

        Scheduler metric (published independently by metrics.batch_metrics):
            trtllm_scheduled_batch_size

        Iteration-level metrics:
            trtllm_kv_cache_hit_rate
            trtllm_kv_cache_utilization
            trtllm_kv_cache_host_utilization
            trtllm_kv_cache_iter_reuse_rate
            trtllm_kv_cache_reused_blocks_total
            trtllm_kv_cache_missed_blocks_total
            trtllm_kv_cache_iter_reused_blocks_total
            trtllm_kv_cache_iter_full_reused_blocks_total
            trtllm_kv_cache_iter_partial_reused_blocks_total
            trtllm_kv_cache_iter_missed_blocks_total
            trtllm_kv_cache_gen_alloc_blocks_total
            trtllm_kv_cache_onboard_bytes_total
            trtllm_kv_cache_offload_bytes_total
            trtllm_kv_cache_disk_prefetch_blocks_total
            trtllm_kv_cache_intra_device_copy_bytes_total
            trtllm_num_requests_running
            trtllm_num_requests_waiting
            trtllm_num_requests_completed_total
            trtllm_max_num_active_requests
            trtllm_iteration_latency_seconds
            trtllm_gpu_memory_usage_bytes
            trtllm_cpu_memory_usage_bytes
            trtllm_pinned_memory_usage_bytes
            trtllm_max_batch_size_static
            trtllm_max_batch_size_runtime
            trtllm_max_num_tokens_runtime
            trtllm_kv_cache_max_blocks
            trtllm_kv_cache_free_blocks
            trtllm_kv_cache_used_blocks
            trtllm_kv_cache_tokens_per_block
            trtllm_num_context_requests
            trtllm_num_generation_requests
            trtllm_num_paused_requests
            trtllm_num_scheduled_requests
            trtllm_total_context_tokens
            trtllm_avg_decoded_tokens_per_iter
            trtllm_spec_decode_num_draft_tokens_total
            trtllm_spec_decode_num_accepted_tokens_total
            trtllm_spec_decode_acceptance_length
            trtllm_spec_decode_draft_overhead
            trtllm_prefill_batch_occupancy
            trtllm_prefill_batch_tokens

        Config info metrics (logged once at startup via log_config_info):
            trtllm_model_config_info
            trtllm_parallel_config_info
            trtllm_speculative_config_info
            trtllm_kv_cache_config_info
    """
    labelname_finish_reason = "finished_reason"
    labelname_cache_level = "cache_level"
    labelname_cache_tier = "cache_tier"

    def __init__(
        self,
        labels: Dict[str, str],
        e2e_request_latency_buckets: Optional[List[float]] = None,
        time_to_first_token_buckets: Optional[List[float]] = None,
        time_per_output_token_buckets: Optional[List[float]] = None,
        request_queue_time_buckets: Optional[List[float]] = None,
        request_prefill_time_buckets: Optional[List[float]] = None,
        request_decode_time_buckets: Optional[List[float]] = None,
        request_inference_time_buckets: Optional[List[float]] = None,
    ) -> None:
        from prometheus_client import Counter, Gauge, Histogram
        _bucket_params = {
            "e2e_request_latency_buckets": e2e_request_latency_buckets,
            "time_to_first_token_buckets": time_to_first_token_buckets,
            "time_per_output_token_buckets": time_per_output_token_buckets,
            "request_queue_time_buckets": request_queue_time_buckets,
            "request_prefill_time_buckets": request_prefill_time_buckets,
            "request_decode_time_buckets": request_decode_time_buckets,
            "request_inference_time_buckets": request_inference_time_buckets,
        }
        for name, buckets in _bucket_params.items():
            if buckets is None:
                continue
            if len(buckets) == 0:
                raise ValueError(f"{name} must not be empty when provided.")
            if any(a >= b for a, b in zip(buckets, buckets[1:])):
                raise ValueError(
                    f"{name} must be strictly increasing, got {buckets}.")
        self.last_log_time = time.time()
        self.labels = labels
        self.metric_prefix = "trtllm_"

        self.finish_reason_label = {
            MetricsCollector.labelname_finish_reason: "unknown"
        }
        self.labels_with_finished_reason = {
            **self.labels,
            **self.finish_reason_label
        }

        self.counter_request_success = Counter(
            name=self.metric_prefix + "request_success_total",
            documentation="Count of successfully processed requests.",
            labelnames=self.labels_with_finished_reason.keys())

        self.histogram_e2e_time_request = Histogram(
            name=self.metric_prefix + "e2e_request_latency_seconds",
            documentation="Histogram of end to end request latency in seconds.",
            buckets=e2e_request_latency_buckets or [
                0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0
            ],
            labelnames=self.labels.keys())

        self.histogram_time_to_first_token = Histogram(
            name=self.metric_prefix + "time_to_first_token_seconds",
            documentation="Histogram of time to first token in seconds.",
            buckets=time_to_first_token_buckets or [
                0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
                2560.0
            ],
            labelnames=self.labels.keys())

        self.histogram_time_per_output_token = Histogram(
            name=self.metric_prefix + "time_per_output_token_seconds",
            documentation="Histogram of time per output token in seconds.",
            buckets=time_per_output_token_buckets or [
                0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0
            ],
            labelnames=self.labels.keys())

        self.histogram_queue_time_request = Histogram(
            name=self.metric_prefix + "request_queue_time_seconds",
            documentation=
            "Histogram of time spent in WAITING phase for request.",
            buckets=request_queue_time_buckets or [
                0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0
            ],
            labelnames=self.labels.keys())

        self.histogram_prefill_time_request = Histogram(
            name=self.metric_prefix + "request_prefill_time_seconds",
            documentation=
            "Histogram of prefill (context) phase duration in seconds "
            "(first_token_time - first_scheduled_time).",
            buckets=request_prefill_time_buckets or [
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0
            ],
            labelnames=self.labels.keys())

        self.histogram_decode_time_request = Histogram(
            name=self.metric_prefix + "request_decode_time_seconds",
            documentation=
            "Histogram of decode (generation) phase duration in seconds "
            "(last_token_time - first_token_time).",
            buckets=request_decode_time_buckets or [
                0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0
            ],
            labelnames=self.labels.keys())

        self.histogram_inference_time_request = Histogram(
            name=self.metric_prefix + "request_inference_time_seconds",
            documentation="Histogram of total inference duration in seconds "
            "(last_token_time - first_scheduled_time).",
            buckets=request_inference_time_buckets or [
                0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0
            ],
            labelnames=self.labels.keys())

        self.counter_prompt_tokens = Counter(
            name=self.metric_prefix + "prompt_tokens_total",
            documentation=
            "Cumulative number of prompt (input) tokens processed.",
            labelnames=self.labels.keys())

        self.counter_generation_tokens = Counter(
            name=self.metric_prefix + "generation_tokens_total",
            documentation=
            "Cumulative number of generation (output) tokens produced.",
            labelnames=self.labels.keys())

        self.kv_cache_hit_rate = Gauge(name=self.metric_prefix +
                                       "kv_cache_hit_rate",
                                       documentation="KV cache hit rate",
                                       labelnames=self.labels.keys())
        self.kv_cache_reused_blocks = Counter(
            name=self.metric_prefix + "kv_cache_reused_blocks",
            documentation=
            "Cumulative number of KV cache blocks reused (cache hits)",
            labelnames=self.labels.keys())
        self.kv_cache_missed_blocks = Counter(
            name=self.metric_prefix + "kv_cache_missed_blocks",
            documentation=
            "Cumulative number of KV cache blocks missed (cache misses)",
            labelnames=self.labels.keys())
        self.kv_cache_utilization = Gauge(name=self.metric_prefix +
                                          "kv_cache_utilization",
                                          documentation="KV cache utilization",
                                          labelnames=self.labels.keys())
        self._prev_reused_blocks = 0
        self._prev_missed_blocks = 0

        # Per-iteration KV cache gauges
        self.kv_cache_host_utilization = Gauge(
            name=self.metric_prefix + "kv_cache_host_utilization",
            documentation="KV cache host (secondary) pool utilization",
            labelnames=self.labels.keys())
        self.kv_cache_iter_reuse_rate = Gauge(
            name=self.metric_prefix + "kv_cache_iter_reuse_rate",
            documentation="Per-iteration KV cache block reuse rate",
            labelnames=self.labels.keys())

        # Per-iteration KV cache counters (monotonically increasing via accumulated deltas)
        self.kv_cache_iter_reused_blocks = Counter(
            name=self.metric_prefix + "kv_cache_iter_reused_blocks",
            documentation="Total reused KV cache blocks (full + partial)",
            labelnames=self.labels.keys())
        self.kv_cache_iter_full_reused_blocks = Counter(
            name=self.metric_prefix + "kv_cache_iter_full_reused_blocks",
            documentation="Total fully reused KV cache blocks",
            labelnames=self.labels.keys())
        self.kv_cache_iter_partial_reused_blocks = Counter(
            name=self.metric_prefix + "kv_cache_iter_partial_reused_blocks",
            documentation="Total partially reused KV cache blocks",
            labelnames=self.labels.keys())
        self.kv_cache_iter_missed_blocks = Counter(
            name=self.metric_prefix + "kv_cache_iter_missed_blocks",
            documentation="Total missed KV cache blocks (context phase)",
            labelnames=self.labels.keys())
        self.kv_cache_gen_alloc_blocks_total = Counter(
            name=self.metric_prefix + "kv_cache_gen_alloc_blocks_total",
            documentation="Total blocks allocated during generation phase",
            labelnames=self.labels.keys())
        self.kv_cache_onboard_bytes_total = Counter(
            name=self.metric_prefix + "kv_cache_onboard_bytes_total",
            documentation="Total bytes transferred from host to GPU (onboard)",
            labelnames=self.labels.keys())
        self.kv_cache_offload_bytes_total = Counter(
            name=self.metric_prefix + "kv_cache_offload_bytes_total",
            documentation="Total bytes transferred from GPU to host (offload)",
            labelnames=self.labels.keys())
        self.kv_cache_disk_prefetch_blocks_total = Counter(
            name=self.metric_prefix + "kv_cache_disk_prefetch_blocks_total",
            documentation=(
                "Process-lifetime total V2 KV-cache blocks migrated from disk "
                "to host by the prefetch mechanism. "
                "Resets only when the serving process restarts."),
            labelnames=self.labels.keys())
        self.kv_cache_intra_device_copy_bytes_total = Counter(
            name=self.metric_prefix + "kv_cache_intra_device_copy_bytes_total",
            documentation=
            "Total bytes copied within GPU (intra-device block copies)",
            labelnames=self.labels.keys())

        # Queue & load metrics
        self.num_requests_running = Gauge(
            name=self.metric_prefix + "num_requests_running",
            documentation="Number of active requests",
            labelnames=self.labels.keys())
        self.num_requests_waiting = Gauge(
            name=self.metric_prefix + "num_requests_waiting",
            documentation="Number of queued requests",
            labelnames=self.labels.keys())
        self.counter_num_requests_completed = Counter(
            name=self.metric_prefix + "num_requests_completed_total",
            documentation="Total number of completed requests across iterations",
            labelnames=self.labels.keys())
        self.max_num_active_requests = Gauge(
            name=self.metric_prefix + "max_num_active_requests",
            documentation="Maximum number of active requests",
            labelnames=self.labels.keys())

        # Iteration latency
        self.iteration_latency_seconds = Gauge(
            name=self.metric_prefix + "iteration_latency_seconds",
            documentation="Iteration latency in seconds",
            labelnames=self.labels.keys())

        # Memory usage
        self.gpu_memory_usage_bytes = Gauge(
            name=self.metric_prefix + "gpu_memory_usage_bytes",
            documentation="GPU memory usage in bytes",
            labelnames=self.labels.keys())
        self.cpu_memory_usage_bytes = Gauge(
            name=self.metric_prefix + "cpu_memory_usage_bytes",
            documentation="CPU memory usage in bytes",
            labelnames=self.labels.keys())
        self.pinned_memory_usage_bytes = Gauge(
            name=self.metric_prefix + "pinned_memory_usage_bytes",
            documentation="Pinned memory usage in bytes",
            labelnames=self.labels.keys())

        # Batch size
        self.max_batch_size_static = Gauge(
            name=self.metric_prefix + "max_batch_size_static",
            documentation="Static maximum batch size",
            labelnames=self.labels.keys())
        self.max_batch_size_runtime = Gauge(
            name=self.metric_prefix + "max_batch_size_runtime",
            documentation="Runtime maximum batch size",
            labelnames=self.labels.keys())
        self.max_num_tokens_runtime = Gauge(
            name=self.metric_prefix + "max_num_tokens_runtime",
            documentation="Runtime maximum number of tokens",
            labelnames=self.labels.keys())

        # KV cache block metrics
        self.kv_cache_max_blocks = Gauge(
            name=self.metric_prefix + "kv_cache_max_blocks",
            documentation="Maximum number of KV cache blocks",
            labelnames=self.labels.keys())
        self.kv_cache_free_blocks = Gauge(
            name=self.metric_prefix + "kv_cache_free_blocks",
            documentation="Number of free KV cache blocks",
            labelnames=self.labels.keys())
        self.kv_cache_used_blocks = Gauge(
            name=self.metric_prefix + "kv_cache_used_blocks",
            documentation="Number of used KV cache blocks",
            labelnames=self.labels.keys())
        self.kv_cache_tokens_per_block = Gauge(
            name=self.metric_prefix + "kv_cache_tokens_per_block",
            documentation="Number of tokens per KV cache block",
            labelnames=self.labels.keys())

        # Inflight batching metrics
        self.num_context_requests = Gauge(
            name=self.metric_prefix + "num_context_requests",
            documentation="Number of context (prefill) requests",
            labelnames=self.labels.keys())
        self.num_generation_requests = Gauge(
            name=self.metric_prefix + "num_generation_requests",
            documentation="Number of generation (decode) requests",
            labelnames=self.labels.keys())
        self.num_paused_requests = Gauge(
            name=self.metric_prefix + "num_paused_requests",
            documentation="Number of paused requests",
            labelnames=self.labels.keys())
        self.num_scheduled_requests = Gauge(
            name=self.metric_prefix + "num_scheduled_requests",
            documentation="Number of scheduled requests",
            labelnames=self.labels.keys())
        self.total_context_tokens = Gauge(
            name=self.metric_prefix + "total_context_tokens",
            documentation="Total number of context tokens",
            labelnames=self.labels.keys())
        self.avg_decoded_tokens_per_iter = Gauge(
            name=self.metric_prefix + "avg_decoded_tokens_per_iter",
            documentation="Average number of decoded tokens per iteration",
            labelnames=self.labels.keys())

        # Speculative decoding metrics
        self.counter_spec_decode_num_draft_tokens = Counter(
            name=self.metric_prefix + "spec_decode_num_draft_tokens_total",
            documentation="Total number of draft tokens in speculative decoding",
            labelnames=self.labels.keys())
        self.counter_spec_decode_num_accepted_tokens = Counter(
            name=self.metric_prefix + "spec_decode_num_accepted_tokens_total",
            documentation=
            "Total number of accepted tokens in speculative decoding",
            labelnames=self.labels.keys())
        self.spec_decode_acceptance_length = Gauge(
            name=self.metric_prefix + "spec_decode_acceptance_length",
            documentation="Acceptance length in speculative decoding",
            labelnames=self.labels.keys())
        self.spec_decode_draft_overhead = Gauge(
            name=self.metric_prefix + "spec_decode_draft_overhead",
            documentation="Draft overhead in speculative decoding",
            labelnames=self.labels.keys())

        # Prompt cache hit tracking
        self.counter_tokens_cached_prompt = Counter(
            name=self.metric_prefix + "prompt_cached_tokens_total",
            documentation=(
                "Process-lifetime total prompt tokens served from KV cache. "
                "Resets only when the serving process restarts, not when the "
                "KV cache is flushed or evicted."),
            labelnames=self.labels.keys())
        self.counter_tokens_cached_prompt.labels(**self.labels)
        self.labels_with_cache_level = {
            **self.labels,
            self.labelname_cache_level: "",
            self.labelname_cache_tier: "",
        }
        self.counter_tokens_cached_prompt_by_tier = Counter(
            name=self.metric_prefix + "prompt_cache_hit_tokens_total",
            documentation=(
                "Process-lifetime total prompt tokens served from each KV "
                "cache level. Resets only when the serving process restarts, "
                "not when the KV cache is flushed or evicted. cache_level is "
                "the index into the configured tier list and cache_tier names "
                "the memory backing it, so a deployment with a hot and a cold "
                "GPU level reports them as two series sharing the gpu name. "
                "Pages already prefetched from disk to host count as host."),
            labelnames=self.labels_with_cache_level.keys())
        # The configured levels are only known once stats arrive; children are created then so
        # that zero-valued levels are still visible before their first cache hit.
        self._registered_cache_levels = False
        self.histogram_tokens_cached_prompt = Histogram(
            name=self.metric_prefix + "prompt_cached_tokens_per_request",
            documentation="Histogram of cached prompt tokens per request.",
            buckets=[0, 64, 128, 256, 512, 1024, 2048, 4096, 8192],
            labelnames=self.labels.keys())

        # Per-position speculative decoding acceptance counters
        self.labelname_token_pos = "token_position"  # nosec: B105
        self.labels_with_token_pos = {
            **self.labels, self.labelname_token_pos: ""
        }
        self.counter_tokens_drafted_per_position = Counter(
            name=self.metric_prefix + "spec_decode_drafted_tokens_total",
            documentation=
            "Total drafted tokens per speculative decoding position.",
            labelnames=self.labels_with_token_pos.keys())
        self.counter_tokens_accepted_per_position = Counter(
            name=self.metric_prefix + "spec_decode_accepted_tokens_total",
            documentation=
            "Total accepted tokens per speculative decoding position.",
            labelnames=self.labels_with_token_pos.keys())

        # Per-request perplexity histograms
        self.histogram_prefill_perplexity = Histogram(
            name=self.metric_prefix + "prefill_perplexity",
            documentation="Histogram of prefill perplexity per request.",
            buckets=[1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 500.0, 1000.0],
            labelnames=self.labels.keys())
        self.histogram_generation_perplexity = Histogram(
            name=self.metric_prefix + "generation_perplexity",
            documentation="Histogram of generation perplexity per request.",
            buckets=[1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 500.0, 1000.0],
            labelnames=self.labels.keys())

        # Prefill batch occupancy / context token distribution
        self.gauge_prefill_batch_occupancy = Gauge(
            name=self.metric_prefix + "prefill_batch_occupancy",
            documentation=
            "Fraction of max active slots occupied by context requests.",
            labelnames=self.labels.keys())
        self.histogram_prefill_batch_tokens = Histogram(
            name=self.metric_prefix + "prefill_batch_tokens",
            documentation="Histogram of total context tokens per iteration.",
            buckets=[64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768],
            labelnames=self.labels.keys())

        # HTTP error counter
        self.labelname_http_code = "http_code"
        self.labels_with_http_code = {
            **self.labels, self.labelname_http_code: ""
        }
        self.counter_request_error = Counter(
            name=self.metric_prefix + "request_error_total",
            documentation="Total request errors, labeled by HTTP status code.",
            labelnames=self.labels_with_http_code.keys())

    def log_config_info(
            self,
            model_config: Optional[Dict[str, str]] = None,
            parallel_config: Optional[Dict[str, str]] = None,
            speculative_config: Optional[Dict[str, str]] = None,
            kv_cache_config: Optional[Dict[str, str]] = None) -> None:
        """Log static configuration as Prometheus info-style gauges (set to 1 with config labels).

        Should be called once at startup. Each config dict's keys become Prometheus labels.
        Follows the same pattern as vLLM/SGLang config info metrics.

        Args:
            model_config: Model configuration labels (model, dtype, quantization, gpu_type, etc.)
            parallel_config: Parallelism configuration labels (tp_size, pp_size, etc.)
            speculative_config: Speculative decoding configuration labels (method, draft_model, etc.)
            kv_cache_config: KV cache configuration labels (page_size, enable_block_reuse, etc.)
        """
        from prometheus_client import Gauge

        if model_config:
            info_labels = {**self.labels, **model_config}
            gauge = Gauge(name=self.metric_prefix + "model_config_info",
                          documentation="Model configuration info",
                          labelnames=info_labels.keys())
            gauge.labels(**info_labels).set(1)

        if parallel_config:
            info_labels = {**self.labels, **parallel_config}
            gauge = Gauge(name=self.metric_prefix + "parallel_config_info",
                          documentation="Parallelism configuration info",
                          labelnames=info_labels.keys())
            gauge.labels(**info_labels).set(1)

        if speculative_config:
            info_labels = {**self.labels, **speculative_config}
            gauge = Gauge(
                name=self.metric_prefix + "speculative_config_info",
                documentation="Speculative decoding configuration info",
                labelnames=info_labels.keys())
            gauge.labels(**info_labels).set(1)

        if kv_cache_config:
            info_labels = {**self.labels, **kv_cache_config}
            gauge = Gauge(name=self.metric_prefix + "kv_cache_config_info",
                          documentation="KV cache configuration info",
                          labelnames=info_labels.keys())
            gauge.labels(**info_labels).set(1)
# [kvoffload excerpt] MetricsCollector goes on with the methods that record samples (_label_merge through
# log_request_error), left out: they define no series. log_iteration_stats sets trtllm_kv_cache_host_utilization
# from the cold pool groups' secondaryUsedNumBlocks / secondaryMaxNumBlocks and counts
# trtllm_kv_cache_offload_bytes_total / onboard from iterOffloadBytes / iterOnboardBytes; per-request series need
# return_perf_metrics: true and iteration series enable_iter_perf_stats: true (its docstrings say so).
