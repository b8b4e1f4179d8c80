"""The engine's registry speaking TensorRT-LLM (``--speak trtllm``): ``trtllm-serve``'s ``trtllm_`` families, filled
from the same events as vLLM's, at ``/prometheus/metrics``.

Names, types, label names, help texts and buckets are those of TensorRT-LLM's ``MetricsCollector``
(``tensorrt_llm/metrics/collector.py`` at :data:`COLLECTOR_COMMIT`, saved in
``tools/trtllm-sources/050f80de``); tests/lab/test_emulator_trtllm.py reads that source with ``ast`` and checks
every family here against it, and every series ``engines/trtllm/dialect.py`` names against what is exposed.

How ``trtllm-serve`` serves them (``tensorrt_llm/serve/openai_server.py``, read in the index at commit
``00057725d9a6591f033e44f31c219e2426827bb7``, no release tag):

- only with ``return_perf_metrics: true`` (``--enable-metrics`` here, which the lab's translation sets from it) does
  it build the collector and mount prometheus_client's ASGI app at ``/prometheus/metrics``; without it that path
  answers 404. ``/metrics`` is another route: the engine's iteration stats as JSON, always;
- the collector's labels are ``{"model_name": "undefined", "engine_type": "undefined"}``, whatever the model;
- the registry is prometheus_client's multiprocess one (``set_prometheus_multiproc_dir``,
  ``MultiProcessCollector``): a family shows only once it has a series, no ``_created`` samples, and a gauge
  (multiprocess mode ``all``, the default) carries the writing process' ``pid`` label;
- the HTTP instrumentator excludes every handler (``excluded_handlers=[".*"]``), so its ``http_*`` families never
  get a series and never show.

Where the series come from (``log_request_metrics_dict`` and ``log_iteration_stats``, read at
:data:`COLLECTOR_COMMIT` past the saved excerpt's end):

- per request, when it finishes: ``request_success_total{finished_reason}``, its e2e, TTFT, TPOT (the mean gap,
  one sample per request), queue, prefill, decode and inference times, its prompt and generated tokens, and its
  cached prompt tokens (the counter only above zero, the histogram always);
- per iteration (after each engine step here): running and queued requests, the GPU pool's blocks and
  utilisation, the host pool's utilisation (used over max secondary blocks, with a host cache only), the bytes
  onboarded (host to GPU) and offloaded (GPU to host), completed requests, and the prompt tokens each cache level
  supplied (``prompt_cache_hit_tokens_total{cache_level, cache_tier}``, its series made for every configured
  level at the first report, counted only above zero). The levels are the GPU (``0``, ``gpu``) and, with a host
  cache, the host (``1``, ``host``): the tier names come from the engine's tier list, which was not read; the
  collector's help text names ``gpu`` and ``host``, and the dialect reads ``host``;
- a request the engine failed (``--error-share``) answers 500 and counts ``request_error_total{http_code="500"}``
  (``log_request_error``), nothing else.

Priced as vLLM: one cost model and one block cache for every engine (16-token blocks where TensorRT-LLM's
``tokens_per_block`` defaults to 32; a host-cache hit at the CPU tier's restore rate; every new block stored, as
every block of default retention priority 35 is offloaded at ``secondary_offload_min_priority`` 35). Only the
metrics differ. Not emitted, having nothing honest to fill them with: speculative decoding, perplexity, memory
usage, batch-size and inflight-batching gauges, the per-iteration reuse counters, disk prefetch and the config
info gauges.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvoffload.engines.trtllm.dialect import COLLECTOR_COMMIT, LABEL_CACHE_TIER, METRICS_PATH, TIER_HOST
from kvoffload_lab.engine.config import EngineConfig, ItlClock
from kvoffload_lab.engine.kvengine import Admission, KVEngine
from kvoffload_lab.engine.sglangmetrics import AsMultiprocess

__all__ = ("COLLECTOR_COMMIT", "TRTLLM_FAMILIES", "TRTLLMMetrics")

LABELS: Final = ("model_name", "engine_type")
"""``MetricsCollector(labels)``'s keys as ``trtllm-serve`` passes them; every value ``undefined``."""
UNDEFINED: Final = "undefined"
LABEL_CACHE_LEVEL: Final = "cache_level"
TIER_GPU: Final = "gpu"
FINISHED: Final = "length"
"""The finish reason of every request the emulator ends: it always generates ``max_tokens``."""

# collector.py's default buckets (no bucket argument is passed by trtllm-serve).
LONG_BUCKETS: Final = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)  # fmt: skip
"""e2e, queue, decode and inference times."""
TTFT_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)  # fmt: skip
TPOT_BUCKETS: Final = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
PREFILL_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
CACHED_BUCKETS: Final = (0, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


@dataclass(frozen=True)
class TRTLLMFamily:
    """One family as ``MetricsCollector.__init__`` declares it."""

    name: str
    """As the source names it, prefix included (a counter's ``_total`` as the source spells it, or not)."""
    type: str
    doc: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()


P = "trtllm_"
TRTLLM_FAMILIES: Final[tuple[TRTLLMFamily, ...]] = (
    # per request (log_request_metrics_dict)
    TRTLLMFamily(
        f"{P}request_success_total",
        "counter",
        "Count of successfully processed requests.",
        (*LABELS, "finished_reason"),
    ),
    TRTLLMFamily(
        f"{P}e2e_request_latency_seconds",
        "histogram",
        "Histogram of end to end request latency in seconds.",
        LABELS,
        LONG_BUCKETS,
    ),
    TRTLLMFamily(
        f"{P}time_to_first_token_seconds",
        "histogram",
        "Histogram of time to first token in seconds.",
        LABELS,
        TTFT_BUCKETS,
    ),
    TRTLLMFamily(
        f"{P}time_per_output_token_seconds",
        "histogram",
        "Histogram of time per output token in seconds.",
        LABELS,
        TPOT_BUCKETS,
    ),
    TRTLLMFamily(
        f"{P}request_queue_time_seconds",
        "histogram",
        "Histogram of time spent in WAITING phase for request.",
        LABELS,
        LONG_BUCKETS,
    ),
    TRTLLMFamily(
        f"{P}request_prefill_time_seconds",
        "histogram",
        "Histogram of prefill (context) phase duration in seconds (first_token_time - first_scheduled_time).",
        LABELS,
        PREFILL_BUCKETS,
    ),
    TRTLLMFamily(
        f"{P}request_decode_time_seconds",
        "histogram",
        "Histogram of decode (generation) phase duration in seconds (last_token_time - first_token_time).",
        LABELS,
        LONG_BUCKETS,
    ),
    TRTLLMFamily(
        f"{P}request_inference_time_seconds",
        "histogram",
        "Histogram of total inference duration in seconds (last_token_time - first_scheduled_time).",
        LABELS,
        LONG_BUCKETS,
    ),
    TRTLLMFamily(f"{P}prompt_tokens_total", "counter", "Cumulative number of prompt (input) tokens processed.", LABELS),
    TRTLLMFamily(
        f"{P}generation_tokens_total", "counter", "Cumulative number of generation (output) tokens produced.", LABELS
    ),
    TRTLLMFamily(
        f"{P}prompt_cached_tokens_total",
        "counter",
        "Process-lifetime total prompt tokens served from KV cache. Resets only when the serving process restarts, "
        "not when the KV cache is flushed or evicted.",
        LABELS,
    ),
    TRTLLMFamily(
        f"{P}prompt_cached_tokens_per_request",
        "histogram",
        "Histogram of cached prompt tokens per request.",
        LABELS,
        CACHED_BUCKETS,
    ),
    TRTLLMFamily(
        f"{P}request_error_total",
        "counter",
        "Total request errors, labeled by HTTP status code.",
        (*LABELS, "http_code"),
    ),
    # per iteration (log_iteration_stats)
    TRTLLMFamily(f"{P}num_requests_running", "gauge", "Number of active requests", LABELS),
    TRTLLMFamily(f"{P}num_requests_waiting", "gauge", "Number of queued requests", LABELS),
    TRTLLMFamily(
        f"{P}num_requests_completed_total", "counter", "Total number of completed requests across iterations", LABELS
    ),
    TRTLLMFamily(f"{P}kv_cache_utilization", "gauge", "KV cache utilization", LABELS),
    TRTLLMFamily(f"{P}kv_cache_max_blocks", "gauge", "Maximum number of KV cache blocks", LABELS),
    TRTLLMFamily(f"{P}kv_cache_free_blocks", "gauge", "Number of free KV cache blocks", LABELS),
    TRTLLMFamily(f"{P}kv_cache_used_blocks", "gauge", "Number of used KV cache blocks", LABELS),
    TRTLLMFamily(f"{P}kv_cache_tokens_per_block", "gauge", "Number of tokens per KV cache block", LABELS),
    TRTLLMFamily(f"{P}kv_cache_host_utilization", "gauge", "KV cache host (secondary) pool utilization", LABELS),
    TRTLLMFamily(
        f"{P}kv_cache_onboard_bytes_total", "counter", "Total bytes transferred from host to GPU (onboard)", LABELS
    ),
    TRTLLMFamily(
        f"{P}kv_cache_offload_bytes_total", "counter", "Total bytes transferred from GPU to host (offload)", LABELS
    ),
    TRTLLMFamily(
        f"{P}prompt_cache_hit_tokens_total",
        "counter",
        "Process-lifetime total prompt tokens served from each KV cache level. Resets only when the serving process "
        "restarts, not when the KV cache is flushed or evicted. cache_level is the index into the configured tier "
        "list and cache_tier names the memory backing it, so a deployment with a hot and a cold GPU level reports "
        "them as two series sharing the gpu name. Pages already prefetched from disk to host count as host.",
        (*LABELS, LABEL_CACHE_LEVEL, LABEL_CACHE_TIER),
    ),
)


class TRTLLMMetrics:
    """The engine's Prometheus registry speaking TensorRT-LLM, over the engine's own caches."""

    metrics_path = METRICS_PATH
    # Its TPOT's clock was not read in its sources; it has no ITL histogram to gate.
    itl_clock: Final[ItlClock] = "frontend"

    def __init__(self, config: EngineConfig, engine: KVEngine) -> None:
        self.config = config
        self.engine = engine
        self.registry = CollectorRegistry(auto_describe=True)
        self.host = config.cpu_tier() is not None
        self.labels = dict.fromkeys(LABELS, UNDEFINED)
        self.pid = str(os.getpid())
        self.metrics: dict[str, Any] = {fam.name: _make(fam, self.registry) for fam in TRTLLM_FAMILIES}
        # The collector makes this one series at start: it shows at 0 before any hit.
        self.metrics[f"{P}prompt_cached_tokens_total"].labels(**self.labels)
        self.levels = [(TIER_GPU, "0"), *([(TIER_HOST, "1")] if self.host else [])]
        self._levels_made = False
        self._last: dict[str, Any] = {}

    @property
    def serves_metrics(self) -> bool:
        return self.config.enable_metrics

    def _m(self, name: str, **extra: str) -> Any:
        return self.metrics[P + name].labels(**self.labels, **extra)

    def _gauge(self, name: str, value: float) -> None:
        self._m(name, pid=self.pid).set(value)

    # --- per iteration -----------------------------------------------------------------------------------

    def record_admission(self, adm: Admission, max_tokens: int) -> None:
        """The iteration that ran this prefill: the tokens each cache level supplied, the bytes onboarded from the
        host cache and offloaded to it."""
        self._make_levels()
        for (tier, level), tokens in zip(self.levels, (adm.local_hit_tokens, adm.cpu_hit_tokens), strict=False):
            if tokens > 0:
                self._m("prompt_cache_hit_tokens_total", cache_level=level, cache_tier=tier).inc(tokens)
        if not self.host:
            return
        cfg = self.config
        if adm.cpu_hit_tokens:
            self._m("kv_cache_onboard_bytes_total").inc(adm.cpu_hit_tokens * cfg.kv_bytes_per_token)
        if adm.stored_blocks:
            self._m("kv_cache_offload_bytes_total").inc(adm.stored_blocks * cfg.block_bytes)

    def _make_levels(self) -> None:
        """The per-level series, made for every configured level at the first stats report."""
        if not self._levels_made:
            for tier, level in self.levels:
                self._m("prompt_cache_hit_tokens_total", cache_level=level, cache_tier=tier)
            self._levels_made = True

    def set_load(self, running: int, used_blocks: int, waiting: int = 0) -> None:
        self._make_levels()
        total = self.config.gpu_kv_blocks
        used = min(used_blocks, total)
        self._gauge("num_requests_running", running)
        self._gauge("num_requests_waiting", waiting)
        self._gauge("kv_cache_max_blocks", total)
        self._gauge("kv_cache_free_blocks", total - used)
        self._gauge("kv_cache_used_blocks", used)
        self._gauge("kv_cache_tokens_per_block", self.config.block_size)
        if total:
            self._gauge("kv_cache_utilization", used / total)
        host = self.engine.cpu
        if host is not None and host.capacity:
            self._gauge("kv_cache_host_utilization", len(host) / host.capacity)
        self._last = {
            "numActiveRequests": running,
            "numQueuedRequests": waiting,
            "kvCacheStats": {
                "maxNumBlocks": total,
                "freeNumBlocks": total - used,
                "usedNumBlocks": used,
                "tokensPerBlock": self.config.block_size,
            },
        }

    # --- per request -------------------------------------------------------------------------------------

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
        """``log_request_metrics_dict`` of a finished request: each time only when above zero, as it logs them."""
        decode = sum(itls)
        self._m("request_success_total", finished_reason=finished_reason).inc()
        self._m("num_requests_completed_total").inc()
        # TPOT: (last_token_time - first_token_time) / (output tokens - 1), the mean gap.
        times = {
            "e2e_request_latency_seconds": e2e,
            "time_to_first_token_seconds": ttft,
            "time_per_output_token_seconds": decode / len(itls) if itls else 0.0,
            "request_prefill_time_seconds": ttft - queued,
            "request_decode_time_seconds": decode,
            "request_inference_time_seconds": e2e - queued,
        }
        for name, seconds in times.items():
            if seconds > 0:
                self._m(name).observe(seconds)
        self._m("request_queue_time_seconds").observe(queued)  # logged whenever present, zero included
        prompt = admission.prompt_tokens if admission is not None else 0
        if prompt:
            self._m("prompt_tokens_total").inc(prompt)
        if generated:
            self._m("generation_tokens_total").inc(generated)
        cached = admission.cached_tokens if admission is not None else 0
        if cached > 0:
            self._m("prompt_cached_tokens_total").inc(cached)
        self._m("prompt_cached_tokens_per_request").observe(cached)

    def record_failure(
        self,
        *,
        e2e: float,
        queued: float,
        finished_reason: str,
        admission: Admission | None = None,
        stream: bool = False,
    ) -> None:
        """A request the engine failed: the server answers 500 and logs it by HTTP code (``log_request_error``);
        no finish reason reaches the per-request series."""
        self._m("request_error_total", http_code="500").inc()

    # --- the HTTP server ---------------------------------------------------------------------------------

    def http_endpoint(self, route: str | None, path: str) -> str | None:
        return None  # the instrumentator excludes every handler

    def record_http_start(self, *, handler: str, method: str) -> None:
        """Never called: :meth:`http_endpoint` counts no request."""

    def record_http(self, *, handler: str, method: str, status: int | None) -> None:
        """Never called: :meth:`http_endpoint` counts no request."""

    def iteration_stats(self) -> list[dict[str, Any]] | None:
        """``/metrics``: the iteration stats as JSON (the latest one here; none before the first step)."""
        return [self._last] if self._last else []

    def exposition(self) -> bytes:
        return generate_latest(AsMultiprocess(self.registry))


def _make(fam: TRTLLMFamily, registry: CollectorRegistry) -> Any:
    if fam.type == "counter":
        return Counter(fam.name, fam.doc, fam.labels, registry=registry)
    if fam.type == "gauge":
        # multiprocess mode "all": each process' value under its pid.
        return Gauge(fam.name, fam.doc, (*fam.labels, "pid"), registry=registry)
    if fam.type == "histogram":
        return Histogram(fam.name, fam.doc, fam.labels, buckets=fam.buckets, registry=registry)
    raise ValueError(fam.type)  # pragma: no cover - the table holds only these types
