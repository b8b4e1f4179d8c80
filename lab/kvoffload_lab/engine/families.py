"""vLLM 0.32's metric families as its ``/metrics`` shows them: names, types, docs, label names, buckets.

Also the offload transfer buckets and ``vllm:cache_config_info``'s labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from kvoffload.api.versions import VersionTuple

# Histogram buckets exactly as vLLM 0.32 declares them (see tests/data/vllm-0.32.0-cpu-metrics.txt).
# fmt: off
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0, 160.0, 640.0, 2560.0
)
TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0
)
REQUEST_TIME_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0
)
# fmt: on


@dataclass(frozen=True)
class Family:
    """One vLLM metric family as the 0.32 capture shows it."""

    name: str
    """Registered name (counters without ``_total``)."""
    type: str
    doc: str
    labels: tuple[str, ...] = ()
    """Label names besides model_name and engine."""
    values: tuple[tuple[str, ...], ...] = ()
    """Label values vLLM creates up front, one tuple per extra label."""
    per_engine: bool = True
    """Whether the family carries the ``engine`` label."""
    buckets: tuple[float, ...] | None = None
    request_tokens: bool = False
    """Histogram bucketed 1-2-5 up to --max-model-len (vLLM's ``request_tokens`` family)."""
    lazy: bool = False
    """vLLM creates the series at its first report: none shows before it."""


# Copied from tests/data/vllm-0.32.0-cpu-metrics.txt (docs, label names,
# pre-created label values, buckets); tests/lab/test_emulator_conformance.py keeps them equal.
VLLM_FAMILIES: Final[tuple[Family, ...]] = (
    Family(
        "vllm:estimated_flops_per_gpu",
        "counter",
        "Estimated number of floating point operations per GPU (for Model Flops Utilization calculations).",
    ),
    Family(
        "vllm:estimated_read_bytes_per_gpu",
        "counter",
        "Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations).",
    ),
    Family(
        "vllm:estimated_write_bytes_per_gpu",
        "counter",
        "Estimated number of bytes written to memory per GPU (for Model Flops Utilization calculations).",
    ),
    Family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches."),
    Family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    Family(
        "vllm:num_requests_waiting_by_reason",
        "gauge",
        (
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
            "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all "
            "reasons equals vllm:num_requests_waiting."
        ),
        labels=("reason",),
        values=(("capacity", "deferred"),),
    ),
    Family(
        "vllm:engine_sleep_state",
        "gauge",
        (
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2."
        ),
        labels=("sleep_state",),
        values=(("awake", "weights_offloaded", "discard_all"),),
    ),
    Family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    Family("vllm:prefix_cache_queries", "counter", "Prefix cache queries, in terms of number of queried tokens."),
    Family("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of cached tokens."),
    Family(
        "vllm:external_prefix_cache_queries",
        "counter",
        (
            "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of "
            "queried tokens."
        ),
    ),
    Family(
        "vllm:external_prefix_cache_hits",
        "counter",
        (
            "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached "
            "tokens."
        ),
    ),
    Family("vllm:mm_cache_queries", "counter", "Multi-modal cache queries, in terms of number of queried items."),
    Family("vllm:mm_cache_hits", "counter", "Multi-modal cache hits, in terms of number of cached items."),
    Family("vllm:num_preemptions", "counter", "Cumulative number of preemption from the engine."),
    Family("vllm:prompt_tokens", "counter", "Number of prefill tokens processed."),
    Family(
        "vllm:prompt_tokens_by_source",
        "counter",
        "Number of prompt tokens by source.",
        labels=("source",),
        values=(("local_compute", "local_cache_hit", "external_kv_transfer"),),
    ),
    Family("vllm:prompt_tokens_cached", "counter", "Number of cached prompt tokens (local + external)."),
    Family(
        "vllm:prompt_tokens_cached_by_source",
        "counter",
        (
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to "
            "DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at "
            "admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits."
        ),
        labels=("source",),
        values=(("device", "host", "p2p", "disk", "external_unspecified"),),
    ),
    Family("vllm:generation_tokens", "counter", "Number of generation tokens processed."),
    Family(
        "vllm:request_success",
        "counter",
        "Count of successfully processed requests.",
        labels=("finished_reason",),
        values=(("stop", "length", "abort", "error", "repetition"),),
    ),
    Family(
        "vllm:admission_rejections",
        "counter",
        "Number of admission attempts rejected by a queue limit, by reason.",
        labels=("reason",),
        values=(("max_num_queued_reqs", "max_num_queued_tokens"),),
        per_engine=False,
    ),
    Family("vllm:request_prompt_tokens", "histogram", "Number of prefill tokens processed.", request_tokens=True),
    Family(
        "vllm:request_generation_tokens", "histogram", "Number of generation tokens processed.", request_tokens=True
    ),
    Family(
        "vllm:iteration_tokens_total",
        "histogram",
        "Histogram of number of tokens per engine_step.",
        buckets=(1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0),
    ),
    Family(
        "vllm:request_max_num_generation_tokens",
        "histogram",
        "Histogram of maximum number of requested generation tokens.",
        request_tokens=True,
    ),
    Family(
        "vllm:request_params_n",
        "histogram",
        "Histogram of the n request parameter.",
        buckets=(1.0, 2.0, 5.0, 10.0, 20.0),
    ),
    Family(
        "vllm:request_params_max_tokens",
        "histogram",
        "Histogram of the max_tokens request parameter.",
        request_tokens=True,
    ),
    Family(
        "vllm:time_to_first_token_seconds",
        "histogram",
        "Histogram of time to first token in seconds.",
        buckets=TTFT_BUCKETS,
    ),
    Family(
        "vllm:inter_token_latency_seconds",
        "histogram",
        "Histogram of inter-token latency in seconds.",
        buckets=TOKEN_LATENCY_BUCKETS,
    ),
    Family(
        "vllm:request_time_per_output_token_seconds",
        "histogram",
        "Histogram of time_per_output_token_seconds per request.",
        buckets=TOKEN_LATENCY_BUCKETS,
    ),
    Family(
        "vllm:e2e_request_latency_seconds",
        "histogram",
        "Histogram of e2e request latency in seconds.",
        buckets=REQUEST_TIME_BUCKETS,
    ),
    Family(
        "vllm:request_queue_time_seconds",
        "histogram",
        "Histogram of time spent in WAITING phase for request.",
        buckets=REQUEST_TIME_BUCKETS,
    ),
    Family(
        "vllm:request_inference_time_seconds",
        "histogram",
        "Histogram of time spent in RUNNING phase for request.",
        buckets=REQUEST_TIME_BUCKETS,
    ),
    Family(
        "vllm:request_prefill_time_seconds",
        "histogram",
        "Histogram of time spent in PREFILL phase for request.",
        buckets=REQUEST_TIME_BUCKETS,
    ),
    Family(
        "vllm:request_decode_time_seconds",
        "histogram",
        "Histogram of time spent in DECODE phase for request.",
        buckets=REQUEST_TIME_BUCKETS,
    ),
    Family(
        "vllm:request_num_preemptions",
        "histogram",
        "Histogram of the number of times a request was preempted.",
        buckets=(1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0),
    ),
    Family(
        "vllm:request_prefill_kv_computed_tokens",
        "histogram",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        request_tokens=True,
    ),
)

# The emulator speaks two releases it was checked against: 0.32 (tests/data/vllm-0.32.0-cpu-metrics.txt and its
# source) and 0.26 (the GPU captures, tests/data/vllm-0.26.0-gpu*-metrics.txt). Releases between were not checked,
# so what differs between the two is dated 0.32, the first release known to have it.
SINCE_032: Final[VersionTuple] = (0, 32)
FAMILIES_SINCE: Final[Mapping[str, VersionTuple]] = {
    "vllm:admission_rejections": SINCE_032,  # vLLM PR 55812
    "vllm:request_num_preemptions": SINCE_032,
}
# vllm:cache_config_info is CacheConfig.__dict__: 0.32's fields that the 0.26.0 capture lacks, and the two it has
# that 0.32 dropped (with the capture's values).
CACHE_CONFIG_SINCE_032: Final = frozenset(
    {
        "cache_hit_alignment_tokens",
        "effective_attention_block_size",
        "enable_mamba_shared_prefix_checkpoint",
        "hash_block_size",
        "kv_cache_layout",
        "prefix_cache_retention_interval",
        "replayssm_buffer_len",
        "swa_bounded_replay",
        "use_kda_recoverssm",
        "use_replayssm",
    }
)
CACHE_CONFIG_BEFORE_032: Final[Mapping[str, str]] = {
    "calculate_kv_scales": "False",
    "user_specified_mamba_block_size": "False",
}

# The offload manager's own families, beside the transfer counters: vLLM 0.32
# distributed/kv_transfer/kv_connector/v1/offloading/metrics.py (get_connector_metric_definitions) and
# v1/kv_offload/cpu/spec.py (the CPU spec's gauges and allocation histogram); the 0.26.0 GPU capture has the same
# types, buckets and (but one word, below) docs. A deferred lookup or a failed allocation never happens in the
# emulator, so those two stay without series, as in the capture.
CPU_USAGE_DOC: Final = (
    "Fraction of CPU KV-cache space currently pinned by active transfers (0.0 = idle, 1.0 = saturated). "
    "Sustained high values indicate transfers (stores or promotions) may be dropped due to insufficient capacity."
)
ALLOCATION_SIZE: Final = "vllm:kv_offload_cpu_allocation_size"
LOOKUP_SYNC_DELAY: Final = "vllm:kv_offload_lookup_sync_delay_seconds"
OFFLOAD_MANAGER_FAMILIES: Final[tuple[Family, ...]] = (
    Family(
        "vllm:kv_offload_cpu_cache_write_usage_perc",
        "gauge",
        "Fraction of CPU KV-cache space currently pinned by in-flight stores that have not yet completed "
        "(0.0 = idle, 1.0 = saturated).",
    ),
    Family(
        "vllm:kv_offload_cpu_cache_read_usage_perc",
        "gauge",
        "Fraction of CPU KV-cache space currently pinned by in-flight loads that have not yet completed "
        "(0.0 = idle, 1.0 = saturated).",
    ),
    Family(
        ALLOCATION_SIZE,
        "histogram",
        "Histogram of the number of CPU chunks requested by each KV offload prepare_store call.",
        buckets=(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144),
        lazy=True,
    ),
    Family(
        LOOKUP_SYNC_DELAY,
        "histogram",
        "Histogram of the time spent in a single offload lookup call, in seconds.",
        buckets=(0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1),
        lazy=True,
    ),
    Family(
        "vllm:kv_offload_lookup_async_delay_seconds",
        "histogram",
        "Histogram of time between a request's offload lookup first deferring and the following lookup resolving, "
        "or request finish, in seconds.",
        buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10),
        lazy=True,
    ),
    Family(
        "vllm:kv_offload_allocation_failure",
        "counter",
        "Number of KV offload store allocation attempts that failed.",
        lazy=True,
    ),
)
# 0.26 counted CPU blocks where 0.32 counts chunks (one block each in the native spec).
DOCS_BEFORE_032: Final[Mapping[str, str]] = {
    ALLOCATION_SIZE: "Histogram of the number of CPU blocks requested by each KV offload prepare_store call."
}
LOOKUP_SECONDS: Final = 3.2e-5
"""One synchronous offload lookup: the 0.26.0 GPU capture's mean (0.00458 s over 144 calls). Nothing reads it."""

# vLLM 0.32 offloading/metrics.py: TRANSFER_SIZE_BUCKETS.
TRANSFER_SIZE_BUCKETS: Final = (1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6)

# vLLM 0.33 v1/kv_offload/tiering/spec.py: the promotion latency histogram's buckets.
PROMOTION_LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# vLLM 0.32/0.33 v1/kv_offload/tiering/spec.py: documentation of the tiering families the emulator models.
CHUNK_QUERIES_DOC: Final = "Number of chunk lookup queries sent to a tier, labeled by tier."
CHUNK_HITS_DOC: Final = "Number of chunk lookup hits in a tier, labeled by tier."
PROMOTION_LATENCY_DOC: Final = (
    "Histogram of per-job latency for secondary-tier promotion attempts, measured from job creation until the "
    "tiering manager observes completion so that tier queueing is included, labeled by tier and result, in "
    "seconds. Includes failed attempts."
)
# vLLM 0.33 kv_connector/v1/offloading/metrics.py: _INFO_METRIC_HELP.
OFFLOAD_CONFIG_INFO_DOC: Final = (
    "Static configuration of the KV offload managers of this engine instance. The configured offloading spec "
    "declares the label names, and each manager fills the values, so a series appears from the first scheduler "
    "step of its engine. A manager reports one series for each configuration it holds, and a label of its own "
    "tells the series apart. Each engine reports its own configuration, not the instance total."
)

# vllm:cache_config_info labels of the capture, with its values as defaults; the
# ones the flags set are overwritten per engine.
CACHE_CONFIG_DEFAULTS: Final[Mapping[str, str]] = {
    "_block_size_resolved": "True",
    "block_size": "128",
    "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None",
    "effective_attention_block_size": "128",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.92",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_cache_max_concurrency": "4096.0",
    "kv_cache_memory_bytes": "1073741824",
    "kv_cache_size_tokens": "2097152",
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "float32",
    "num_cpu_blocks": "None",
    "num_gpu_blocks": "16384",
    "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
}


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 series capped at ``max_value``: 512 -> 1, 2, 5, ..., 200, 500."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exponent
            if v > max_value:
                return tuple(out)
            out.append(float(v))
        exponent += 1
