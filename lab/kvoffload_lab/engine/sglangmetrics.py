"""The engine's registry speaking SGLang 0.5.23 (``--speak sglang``): its own ``sglang:`` families, filled from the
same events as vLLM's.

Names, types, label names, help texts and buckets are SGLang 0.5.23's, copied from its collectors
(``srt/observability/metrics_collector.py`` and ``http_request_metrics.py``; the line of each is beside it);
tests/lab/test_emulator_sglang.py checks them against tests/data/sglang-0.5.23-families.json, the table
SGLang's own collectors register. SGLang serves /metrics from prometheus_client's multiprocess mode, so the
exposition here is shaped like it: a family shows only once it has a series, and no ``_created`` samples.

Where the series come from:

- the tokenizer's (``TokenizerMetricsCollector``, labels model_name and engine_type ``unified``): at a request's
  end, its prompt and generated tokens, the request, its e2e latency, its prompt-length histograms, and its
  cached tokens by source, each only when above zero as SGLang counts them: ``device`` the GPU prefix hit,
  ``host`` the tokens restored from the CPU tier (HiCache's host pool), ``storage`` those restored from the
  fs tier (the file storage backend). TTFT and TPOT only for a request that was not aborted.
- the scheduler's (``SchedulerMetricsCollector``, TP rank 0 only, as SGLang logs stats on that rank): running
  and queued requests and token usage after each step; with HiCache the host pool's used and total tokens.
- the radix cache's (``RadixCacheMetricsCollector``, ``cache_type`` UnifiedRadixCache, one series per TP
  rank): load-back (host to GPU: every restored token, a storage hit included, since SGLang prefetches it into
  the host pool first) and backup (GPU to host: every block newly stored) bytes, tokens and durations. Each
  rank reports its own shard of the bytes and the same token count, as SGLang's help texts say.
- the HTTP server's: every request but the emulator's own ``/emulator/*``, probes and /metrics included, by
  endpoint and method, and its answer by status code.

Priced as vLLM: the emulator has one cost model and one block cache for both engines, so SGLang's HiCache is
priced exactly as vLLM's native offload (16-token blocks, where SGLang's radix cache matches single tokens
on CUDA, so a repeated 1,480-token prompt counts 1,472 cached tokens where SGLang would count 1,479; stores as
write-through; a storage hit at the fs tier's rate; vLLM's batch defaults). Only the metrics differ.

Not emitted, because the emulator has nothing honest to fill them with: the startup and CUDA-graph timings,
speculative decoding, LoRA, PD disaggregation, grammar and routing-key families, the per-stage latencies,
``sglang:num_retracted_requests_total`` (the emulator's scheduler never retracts, so SGLang would not show it
either), ``sglang:cache_hit_rate`` and the other scheduler gauges beside the three above, the L3 storage
collector's families (``sglang:prefetched_tokens_total``, ``sglang:backuped_tokens_total``...), and the process
CPU counters. ``sglang:num_aborted_requests_total`` is registered but never counted: see ``record_failure``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from kvoffload_lab.engine.config import EngineConfig, ItlClock
from kvoffload_lab.engine.kvengine import Admission, KVEngine

ENGINE_TYPE: Final = "unified"
"""``engine_type`` of a server neither a PD prefill nor decode worker (``DisaggregationMode.to_engine_type``)."""
CACHE_TYPE: Final = "UnifiedRadixCache"
"""``cache_type``: the tree cache's class name; 0.5.23 builds a UnifiedRadixCache, HiCache on or off
(``mem_cache/registry.py`` ``create_unified_radix_cache``)."""
POOL_KV: Final = "kv"
"""``pool`` of the load-back/backup token counters for a plain attention model's KV pool."""
CACHE_SOURCES: Final = ("device", "host", "storage")
NOT_ABORTED: Final = frozenset({"stop", "length"})
"""Finish reasons SGLang observes a TPOT for (``tokenizer_manager.py`` ``collect_metrics``)."""

TOKENIZER: Final = ("engine_type", "model_name")
"""``tokenizer_metric_labels()`` without priority scheduling, custom or extra labels."""
SCHEDULER: Final = ("engine_type", "model_name", "moe_ep_rank", "pp_rank", "tp_rank")
"""``SchedulerMetricsCollector.init_new``'s labels without priority scheduling or DP."""
RADIX: Final = ("cache_type", "dp_rank", "pp_rank", "tp_rank")
"""``radix_cache_metric_labels()``."""

# metrics_collector.py TokenizerMetricsCollector: the defaults when no --bucket-* flag is given.
TTFT_BUCKETS: Final = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS: Final = (*TTFT_BUCKETS, 600, 1200, 1800, 2400)
ITL_BUCKETS: Final = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.000,
    2.000,
    4.000,
    6.000,
    8.000,
)
TOKEN_BUCKETS: Final = (
    100,
    300,
    500,
    700,
    1000,
    1500,
    2000,
    3000,
    4000,
    5000,
    6000,
    7000,
    8000,
    9000,
    10000,
    12500,
    15000,
    17500,
    20000,
    22500,
    25000,
    27500,
    30000,
    35000,
    40000,
    60000,
    80000,
    100000,
    200000,
    300000,
    400000,
    600000,
    800000,
    1000000,
    1100000,
)
"""``default_bucket_prompt_tokens``, also the generation-token histogram's (``generate_buckets`` "default")."""
# metrics_collector.py RadixCacheMetricsCollector: without SGLANG_BUCKET_LOAD_BACK_DURATION, and the backup's.
LOAD_BACK_BUCKETS: Final = (
    0.001,
    0.002,
    0.003,
    0.004,
    0.005,
    0.006,
    0.007,
    0.008,
    0.009,
    0.01,
    0.02,
    0.03,
    0.04,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
)
BACKUP_BUCKETS: Final = (0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class SGLangFamily:
    """One family as SGLang registers it."""

    name: str
    """As SGLang's source names it (a counter with its ``_total``, which prometheus_client keeps once)."""
    type: str
    doc: str
    labels: tuple[str, ...]
    """Label names (prometheus_client writes a sample's labels sorted, as SGLang's multiprocess exposition does)."""
    where: str
    """Where SGLang 0.5.23 defines it, under ``sglang/srt/observability/``."""
    buckets: tuple[float, ...] = ()


MC = "metrics_collector.py"
SGLANG_FAMILIES: Final[tuple[SGLangFamily, ...]] = (
    # TokenizerMetricsCollector
    SGLangFamily(
        "sglang:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        (*TOKENIZER, "is_streaming"),
        f"{MC}:1855",
    ),
    SGLangFamily(
        "sglang:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        (*TOKENIZER, "is_streaming"),
        f"{MC}:1860",
    ),
    SGLangFamily(
        "sglang:prompt_tokens_histogram",
        "histogram",
        "Histogram of prompt token length.",
        TOKENIZER,
        f"{MC}:1908",
        TOKEN_BUCKETS,
    ),
    SGLangFamily(
        "sglang:uncached_prompt_tokens_histogram",
        "histogram",
        "Histogram of uncached (compute) prompt token length.",
        TOKENIZER,
        f"{MC}:1916",
        TOKEN_BUCKETS,
    ),
    SGLangFamily(
        "sglang:generation_tokens_histogram",
        "histogram",
        "Histogram of generation token length.",
        TOKENIZER,
        f"{MC}:1924",
        TOKEN_BUCKETS,
    ),
    SGLangFamily(
        "sglang:cached_tokens_total",
        "counter",
        "Number of cached prompt tokens by source (device/host/storage).",
        ("cache_source", *TOKENIZER),
        f"{MC}:1934",
    ),
    SGLangFamily(
        "sglang:num_requests_total",
        "counter",
        "Number of requests processed.",
        (*TOKENIZER, "is_streaming"),
        f"{MC}:1940",
    ),
    SGLangFamily(
        "sglang:num_aborted_requests_total", "counter", "Number of requests aborted.", TOKENIZER, f"{MC}:1959"
    ),
    SGLangFamily(
        "sglang:time_to_first_token_seconds",
        "histogram",
        "Histogram of time to first token in seconds.",
        (*TOKENIZER, "is_streaming"),
        f"{MC}:2040",
        TTFT_BUCKETS,
    ),
    SGLangFamily(
        "sglang:inter_token_latency_seconds",
        "histogram",
        "Histogram of inter-token latency in seconds.",
        TOKENIZER,
        f"{MC}:2050",
        ITL_BUCKETS,
    ),
    SGLangFamily(
        "sglang:request_time_per_output_token_seconds",
        "histogram",
        "Per-request TPOT in seconds: (finished_time - first_token_time) / (completion_tokens - 1).",
        (*TOKENIZER, "is_streaming"),
        f"{MC}:2057",
        ITL_BUCKETS,
    ),
    SGLangFamily(
        "sglang:e2e_request_latency_seconds",
        "histogram",
        "Histogram of End-to-end request latency in seconds",
        (*TOKENIZER, "is_streaming"),
        f"{MC}:2067",
        E2E_BUCKETS,
    ),
    # SchedulerMetricsCollector (multiprocess_mode "mostrecent": no pid label)
    SGLangFamily("sglang:num_running_reqs", "gauge", "The number of running requests.", SCHEDULER, f"{MC}:364"),
    SGLangFamily(
        "sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", SCHEDULER, f"{MC}:370"
    ),
    SGLangFamily("sglang:token_usage", "gauge", "The token usage.", SCHEDULER, f"{MC}:404"),
    SGLangFamily(
        "sglang:hicache_host_used_tokens",
        "gauge",
        "Number of tokens currently used in the host KV cache.",
        SCHEDULER,
        f"{MC}:770",
    ),
    SGLangFamily(
        "sglang:hicache_host_total_tokens",
        "gauge",
        "Total capacity of the host KV cache in tokens.",
        SCHEDULER,
        f"{MC}:776",
    ),
    # RadixCacheMetricsCollector
    SGLangFamily(
        "sglang:load_back_duration_seconds",
        "histogram",
        "GPU-stream span of a merged host-to-device load-back copy loop, including gaps between per-layer I/O "
        "submissions but excluding pre-transfer queue and fence waits.",
        RADIX,
        f"{MC}:2543",
        LOAD_BACK_BUCKETS,
    ),
    SGLangFamily(
        "sglang:load_back_tokens_total",
        "counter",
        "The number of tokens loaded back from local host DRAM (L2) to GPU, by host pool (kv, swa, mamba, ...). "
        "Every TP rank reports the same logical count under its own rank labels; read one rank rather than "
        "summing ranks.",
        ("cache_type", "dp_rank", "pool", "pp_rank", "tp_rank"),
        f"{MC}:2552",
    ),
    SGLangFamily(
        "sglang:hicache_backup_duration_seconds",
        "histogram",
        "Time taken to back up KV cache from GPU to local host DRAM (L2) in seconds, per merged write op. Covers "
        "all D->H backups regardless of --hicache-write-policy. Distinct from the host-to-storage (L3) "
        "sglang:backuped_tokens_total.",
        RADIX,
        f"{MC}:2561",
        BACKUP_BUCKETS,
    ),
    SGLangFamily(
        "sglang:hicache_backup_bytes_total",
        "counter",
        "Bytes backed up from GPU to local host DRAM (L2), all pools combined, including draft/sidecar transfers "
        "that the token counter excludes. Each rank reports its own KV shard; sum ranks for the physical total. "
        "A window's byte delta divided by the same window's hicache_backup_duration_seconds sum is the "
        "bytes-weighted active bandwidth; the plain rate is wall-clock payload traffic that includes idle time.",
        RADIX,
        f"{MC}:2571",
    ),
    SGLangFamily(
        "sglang:load_back_bytes_total",
        "counter",
        "Bytes loaded back from local host DRAM (L2) to GPU, all pools combined, including draft/sidecar "
        "transfers that the token counter excludes. Each rank reports its own KV shard; sum ranks for the "
        "physical total. A window's byte delta divided by the same window's load_back_duration_seconds sum is "
        "the bytes-weighted active bandwidth; the plain rate is wall-clock payload traffic that includes idle "
        "time.",
        RADIX,
        f"{MC}:2583",
    ),
    SGLangFamily(
        "sglang:hicache_backup_tokens_total",
        "counter",
        "The number of tokens backed up from GPU to local host DRAM (L2), by host pool (kv, swa, mamba, ...). "
        "Covers all D->H backups regardless of --hicache-write-policy. Distinct from the host-to-storage (L3) "
        "sglang:backuped_tokens_total. Every TP rank reports the same logical count under its own rank labels; "
        "read one rank rather than summing ranks.",
        ("cache_type", "dp_rank", "pool", "pp_rank", "tp_rank"),
        f"{MC}:2595",
    ),
    # http_request_metrics.py _HttpRequestMetrics (registered with --enable-metrics, http_server.py:317)
    SGLangFamily(
        "sglang:http_requests_total",
        "counter",
        "Total number of HTTP requests by endpoint and method",
        ("endpoint", "method"),
        "http_request_metrics.py:28",
    ),
    SGLangFamily(
        "sglang:http_responses_total",
        "counter",
        "Total number of HTTP responses by endpoint and status code",
        ("endpoint", "method", "status_code"),
        "http_request_metrics.py:34",
    ),
    SGLangFamily(
        "sglang:http_requests_active",
        "gauge",
        "Number of currently active HTTP requests",
        ("endpoint", "method"),
        "http_request_metrics.py:40",
    ),
)
LOAD_BACK: Final = (
    "sglang:load_back_bytes_total",
    "sglang:load_back_tokens_total",
    "sglang:load_back_duration_seconds",
)
BACKUP: Final = (
    "sglang:hicache_backup_bytes_total",
    "sglang:hicache_backup_tokens_total",
    "sglang:hicache_backup_duration_seconds",
)
HICACHE_ONLY: Final = frozenset({"sglang:hicache_host_used_tokens", "sglang:hicache_host_total_tokens"})
"""Registered by the scheduler only with --enable-hierarchical-cache."""


class AsMultiprocess(Collector):
    """A registry's families as SGLang's multiprocess exposition shows them: none without a series, no
    ``_created`` samples (``prometheus_client.multiprocess.MultiProcessCollector``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self.registry.collect():
            samples = [s for s in metric.samples if not s.name.endswith("_created")]
            if samples:
                shown = copy.copy(metric)
                shown.samples = samples
                yield shown


class SGLangMetrics:
    """The engine's Prometheus registry speaking SGLang 0.5.23, over the engine's own caches."""

    def __init__(self, config: EngineConfig, engine: KVEngine) -> None:
        self.config = config
        self.engine = engine
        self.registry = CollectorRegistry(auto_describe=True)
        self.hicache = config.cpu_tier() is not None
        self.metrics: dict[str, Any] = {}
        for fam in SGLANG_FAMILIES:
            if fam.name in HICACHE_ONLY and not self.hicache:
                continue
            self.metrics[fam.name] = _make(fam, self.registry)
        self.tokenizer = {"model_name": config.name, "engine_type": ENGINE_TYPE}
        self.scheduler = {**self.tokenizer, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        self.ranks = [
            {"cache_type": CACHE_TYPE, "tp_rank": str(r), "pp_rank": "0", "dp_rank": "0"}
            for r in range(config.tensor_parallel_size)
        ]

    metrics_path = "/metrics"
    # SGLang 0.5.23 (managers/tokenizer_manager.py, collect_metrics): the tokenizer manager times each gap as the
    # outputs reach it.
    itl_clock: Final[ItlClock] = "frontend"

    @property
    def serves_metrics(self) -> bool:
        return self.config.enable_metrics

    def iteration_stats(self) -> list[dict[str, Any]] | None:
        return None  # SGLang's /metrics is Prometheus' text

    def _m(self, name: str, **labels: str) -> Any:
        return self.metrics[name].labels(**labels)

    # --- the scheduler and the radix cache -----------------------------------------------------------

    def record_admission(self, adm: Admission, max_tokens: int) -> None:
        """HiCache's transfers for one prefill: the restored tokens loaded back to the GPU, the new blocks backed
        up to the host pool, one merged operation each."""
        if not self.hicache:
            return
        cfg = self.config
        loaded = adm.cpu_hit_tokens + adm.disk_hit_tokens
        if loaded:
            nbytes = loaded * cfg.kv_bytes_per_token
            self._transfer(LOAD_BACK, loaded, nbytes, cfg.cost.cpu_restore_seconds(nbytes))
        if adm.stored_blocks:
            nbytes = adm.stored_blocks * cfg.block_bytes
            self._transfer(BACKUP, adm.stored_blocks * cfg.block_size, nbytes, cfg.cost.store_seconds(nbytes))

    def _transfer(self, families: tuple[str, str, str], tokens: int, nbytes: int, seconds: float) -> None:
        """One merged transfer on every TP rank: the same tokens, its shard of the bytes, the same time (each rank
        copies over its own link, as the cost model prices it)."""
        bytes_total, tokens_total, duration = families
        ranks = len(self.ranks)
        for r, rank in enumerate(self.ranks):
            self._m(bytes_total, **rank).inc(nbytes * (r + 1) // ranks - nbytes * r // ranks)
            self._m(tokens_total, **rank, pool=POOL_KV).inc(tokens)
            self._m(duration, **rank).observe(seconds)

    def set_load(self, running: int, used_blocks: int, waiting: int = 0) -> None:
        self._m("sglang:num_running_reqs", **self.scheduler).set(running)
        self._m("sglang:num_queue_reqs", **self.scheduler).set(waiting)
        self._m("sglang:token_usage", **self.scheduler).set(min(1.0, used_blocks / max(1, self.config.gpu_kv_blocks)))
        host = self.engine.cpu
        if self.hicache and host is not None:
            block = self.config.block_size
            self._m("sglang:hicache_host_used_tokens", **self.scheduler).set(len(host) * block)
            self._m("sglang:hicache_host_total_tokens", **self.scheduler).set(host.capacity * block)

    # --- the tokenizer -----------------------------------------------------------------------------------

    def record_finish(
        self,
        *,
        ttft: float,
        itls: Sequence[float],
        e2e: float,
        generated: int,
        finished_reason: str,
        queued: float = 0.0,
        admission: Admission | None = None,
        stream: bool = False,
    ) -> None:
        streaming = _is_streaming(stream)
        self._m("sglang:time_to_first_token_seconds", **self.tokenizer, is_streaming=streaming).observe(ttft)
        itl = self._m("sglang:inter_token_latency_seconds", **self.tokenizer)
        for v in itls:
            itl.observe(v)
        decode = sum(itls)
        # (finished_time - first_token_time) / (completion_tokens - 1), only when positive and not aborted.
        tpot = decode / len(itls) if finished_reason in NOT_ABORTED and itls and decode > 0 else None
        self._finished(admission, generated, e2e, streaming, tpot)

    def record_failure(
        self,
        *,
        e2e: float,
        queued: float,
        finished_reason: str,
        admission: Admission | None = None,
        stream: bool = False,
    ) -> None:
        """A request the engine failed after its prefill, before any token: SGLang's scheduler finishes such a
        request with ``FINISH_ABORT(..., HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError")`` and the
        tokenizer answers 500 (``_handle_abort_finish_reason``), which ``sglang:http_responses_total
        {status_code="500"}`` counts. It still counts as a finished request (``collect_metrics`` runs for it:
        prompt, cached and zero generated tokens, the request, its e2e latency), without a TTFT (an abort) or a
        TPOT. ``sglang:num_aborted_requests_total`` is not counted: SGLang 0.5.23 increments it only in
        ``TokenizerManager.abort_request``, on a client's disconnect or an explicit abort, never for a request
        the scheduler failed."""
        self._finished(admission, 0, e2e, _is_streaming(stream), None)

    def _finished(self, adm: Admission | None, generated: int, e2e: float, streaming: str, tpot: float | None) -> None:
        """``observe_one_finished_request``: a request without an admission (none reaches here) counts no tokens."""
        tok = self.tokenizer
        prompt = adm.prompt_tokens if adm is not None else 0
        cached = adm.cached_tokens if adm is not None else 0
        self._m("sglang:prompt_tokens_total", **tok, is_streaming=streaming).inc(prompt)
        self._m("sglang:generation_tokens_total", **tok, is_streaming=streaming).inc(generated)
        if adm is not None:
            for source, tokens in zip(
                CACHE_SOURCES, (adm.local_hit_tokens, adm.cpu_hit_tokens, adm.disk_hit_tokens), strict=True
            ):
                if tokens > 0:
                    self._m("sglang:cached_tokens_total", **tok, cache_source=source).inc(tokens)
        self._m("sglang:num_requests_total", **tok, is_streaming=streaming).inc()
        self._m("sglang:e2e_request_latency_seconds", **tok, is_streaming=streaming).observe(e2e)
        if tpot is not None:
            self._m("sglang:request_time_per_output_token_seconds", **tok, is_streaming=streaming).observe(tpot)
        self._m("sglang:prompt_tokens_histogram", **tok).observe(prompt)
        self._m("sglang:uncached_prompt_tokens_histogram", **tok).observe(prompt - cached)
        self._m("sglang:generation_tokens_histogram", **tok).observe(generated)

    # --- the HTTP server ---------------------------------------------------------------------------------

    def http_endpoint(self, route: str | None, path: str) -> str | None:
        """SGLang counts every request (its middleware wraps the whole app, /metrics and /health included), by
        the matched route's path, else the raw path; the emulator's own control API is left out."""
        endpoint = route if route is not None else path
        return None if endpoint.startswith("/emulator/") else endpoint

    def record_http_start(self, *, handler: str, method: str) -> None:
        self._m("sglang:http_requests_total", endpoint=handler, method=method).inc()
        self._m("sglang:http_requests_active", endpoint=handler, method=method).inc()

    def record_http(self, *, handler: str, method: str, status: int | None) -> None:
        self._m("sglang:http_requests_active", endpoint=handler, method=method).dec()
        if status is not None:  # SGLang counts a response only when its handler returned one
            self._m("sglang:http_responses_total", endpoint=handler, method=method, status_code=str(status)).inc()

    def exposition(self) -> bytes:
        return generate_latest(AsMultiprocess(self.registry))


def _is_streaming(stream: bool) -> str:
    return "true" if stream else "false"


def _make(fam: SGLangFamily, registry: CollectorRegistry) -> Any:
    if fam.type == "counter":
        return Counter(fam.name, fam.doc, fam.labels, registry=registry)
    if fam.type == "gauge":
        return Gauge(fam.name, fam.doc, fam.labels, registry=registry)
    if fam.type == "histogram":
        return Histogram(fam.name, fam.doc, fam.labels, buckets=fam.buckets, registry=registry)
    raise ValueError(fam.type)  # pragma: no cover - the table holds only these types
