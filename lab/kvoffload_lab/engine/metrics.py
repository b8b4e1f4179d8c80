"""The engine's Prometheus registry: vLLM's families in the configured dialect, filled from each request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from kvoffload.api.versions import VersionTuple, parse_version
from kvoffload.engines import dialect as dialects
from kvoffload.engines.vllm.dialect import dialect_for
from kvoffload_lab.engine.config import EngineConfig, ItlClock
from kvoffload_lab.engine.families import (
    ALLOCATION_SIZE,
    CACHE_CONFIG_BEFORE_032,
    CACHE_CONFIG_DEFAULTS,
    CACHE_CONFIG_SINCE_032,
    CHUNK_HITS_DOC,
    CHUNK_QUERIES_DOC,
    CPU_USAGE_DOC,
    DOCS_BEFORE_032,
    FAMILIES_SINCE,
    LOOKUP_SECONDS,
    LOOKUP_SYNC_DELAY,
    OFFLOAD_CONFIG_INFO_DOC,
    OFFLOAD_MANAGER_FAMILIES,
    PROMOTION_LATENCY_BUCKETS,
    PROMOTION_LATENCY_DOC,
    SINCE_032,
    TRANSFER_SIZE_BUCKETS,
    VLLM_FAMILIES,
    Family,
    build_1_2_5_buckets,
)
from kvoffload_lab.engine.kvengine import Admission

UNCOUNTED_HANDLERS: Final = frozenset({"/metrics", "/health", "/load", "/ping", "/version", "/server_info"})
"""The handlers vLLM's instrumentator excludes (``excluded_handlers``, entrypoints/serve/instrumentator/metrics.py)."""

MANAGER_SINCE: Final[VersionTuple] = (0, 26)
"""The offload manager's lookup, allocation and read/write usage families: in the 0.26.0 capture; older not checked."""


class EngineMetrics:
    """The engine's Prometheus registry: vLLM's families, filled where the emulator models them."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.dialect = dialect_for(config.vllm_version)
        self.version = parse_version(config.vllm_version)
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.model = config.name
        self.engine = "0"
        self.metrics: dict[str, Any] = {}
        for fam in VLLM_FAMILIES:
            self._register(self._for_dialect(fam))
        self._register_cache_config()
        if config.offload_backend == "native":
            self._register_offload()
        # vLLM's API server: prometheus-fastapi-instrumentator's counter, status grouped into 2xx/4xx/5xx
        # (entrypoints/serve/instrumentator/metrics.py), labels in the capture's order.
        self.http_requests = Counter(
            "http_requests",
            "Total number of requests by method, status and handler.",
            ("handler", "method", "status"),
            registry=self.registry,
        )

    # Older dialects rename or lack some families; everything else stays as in 0.32.
    def _for_dialect(self, fam: Family) -> Family | None:
        d = self.dialect
        if self.version < FAMILIES_SINCE.get(fam.name, ()):
            return None
        if fam.name == "vllm:inter_token_latency_seconds":
            return Family(d.itl or fam.name, fam.type, fam.doc, buckets=fam.buckets)
        if fam.name == "vllm:kv_cache_usage_perc":
            return Family(d.kv_cache_usage, fam.type, fam.doc)
        if fam.name == "vllm:prompt_tokens_by_source" and d.prompt_tokens_by_source is None:
            return None
        if fam.name == "vllm:prompt_tokens_cached_by_source" and d.prompt_tokens_cached_by_source is None:
            return None
        return fam

    def _labelnames(self, fam: Family) -> list[str]:
        base = ["engine", "model_name"] if fam.per_engine else ["model_name"]
        return sorted([*base, *fam.labels])

    def _register(self, fam: Family | None) -> None:
        if fam is None:
            return
        labelnames = self._labelnames(fam)
        if self.version < SINCE_032 and fam.name in DOCS_BEFORE_032:
            fam = replace(fam, doc=DOCS_BEFORE_032[fam.name])
        metric: Any
        if fam.type == "counter":
            metric = Counter(fam.name, fam.doc, labelnames, registry=self.registry)
        elif fam.type == "gauge":
            metric = Gauge(fam.name, fam.doc, labelnames, registry=self.registry)
        elif fam.type == "histogram":
            buckets = build_1_2_5_buckets(self.config.max_model_len) if fam.request_tokens else fam.buckets
            metric = Histogram(fam.name, fam.doc, labelnames, buckets=buckets or (), registry=self.registry)
        else:  # pragma: no cover - the table holds only these types
            raise ValueError(fam.type)
        self.metrics[fam.name] = metric
        if fam.lazy:
            return
        # Pre-create the children vLLM creates, so zero series exist from the start.
        combos: list[dict[str, str]] = [{}]
        for label, values in zip(fam.labels, fam.values, strict=True):
            combos = [{**c, label: v} for c in combos for v in values]
        for combo in combos:
            metric.labels(**self._base(fam), **combo)

    def _base(self, fam: Family) -> dict[str, str]:
        return {"engine": self.engine, "model_name": self.model} if fam.per_engine else {"model_name": self.model}

    def _register_cache_config(self) -> None:
        name = self.dialect.cache_config_info
        if name is None:  # every vLLM dialect has one
            return
        cfg = self.config
        labels = dict(CACHE_CONFIG_DEFAULTS)
        labels.update(
            block_size=str(cfg.block_size),
            effective_attention_block_size=str(cfg.block_size),
            user_specified_block_size="True",
            cache_dtype=cfg.kv_cache_dtype,
            gpu_memory_utilization=str(cfg.gpu_memory_utilization),
            num_gpu_blocks=str(cfg.gpu_kv_blocks),
            kv_cache_size_tokens=str(cfg.gpu_kv_blocks * cfg.block_size),
            kv_cache_memory_bytes=str(cfg.gpu_kv_blocks * cfg.block_bytes),
            kv_offloading_size="None" if cfg.offload_size_gib is None else str(float(cfg.offload_size_gib)),
            kv_offloading_backend=cfg.offload_backend or "native",
        )
        if self.version < SINCE_032:
            labels = {**{k: v for k, v in labels.items() if k not in CACHE_CONFIG_SINCE_032}, **CACHE_CONFIG_BEFORE_032}
        if not self.dialect.config_offload_labels:
            labels.pop(dialects.LABEL_OFFLOADING_SIZE)
            labels.pop(dialects.LABEL_OFFLOADING_BACKEND)
        labels["engine"] = self.engine
        info = Gauge(
            name,
            "Information of the LLMEngine CacheConfig",
            sorted(labels),
            registry=self.registry,
        )
        info.labels(**labels).set(1)
        self.metrics["cache_config_info"] = info

    def _register_offload(self) -> None:
        base = ["engine", "model_name"]
        legacy = ["engine", "model_name", "transfer_type"]
        reg = self.registry
        offload = self.dialect.offload
        self.flat = offload is not None and not offload.legacy
        self.legacy = offload is not None  # 0.32 still emits the labelled counters for the CPU spec
        if self.flat:
            self.metrics["load_bytes"] = Counter(
                "vllm:kv_offload_load_bytes", "Total bytes loaded from offload storage to GPU.", base, registry=reg
            )
            self.metrics["load_time"] = Counter(
                "vllm:kv_offload_load_time",
                "Total load time from offload storage to GPU, in seconds.",
                base,
                registry=reg,
            )
            self.metrics["store_bytes"] = Counter(
                "vllm:kv_offload_store_bytes", "Total bytes stored from GPU to offload storage.", base, registry=reg
            )
            self.metrics["store_time"] = Counter(
                "vllm:kv_offload_store_time",
                "Total store time from GPU to offload storage, in seconds.",
                base,
                registry=reg,
            )
            self.metrics["load_size"] = Histogram(
                "vllm:kv_offload_load_size",
                "Histogram of KV offload load operation size, in bytes.",
                base,
                buckets=TRANSFER_SIZE_BUCKETS,
                registry=reg,
            )
            self.metrics["store_size"] = Histogram(
                "vllm:kv_offload_store_size",
                "Histogram of KV offload store operation size, in bytes.",
                base,
                buckets=TRANSFER_SIZE_BUCKETS,
                registry=reg,
            )
            for key in ("load_bytes", "load_time", "store_bytes", "store_time", "load_size", "store_size"):
                self.metrics[key].labels(self.engine, self.model)
        if self.legacy:
            self.metrics["total_bytes"] = Counter(
                "vllm:kv_offload_total_bytes", "Number of bytes offloaded by KV connector", legacy, registry=reg
            )
            self.metrics["total_time"] = Counter(
                "vllm:kv_offload_total_time",
                "Total time measured by all KV offloading operations",
                legacy,
                registry=reg,
            )
            self.metrics["size"] = Histogram(
                "vllm:kv_offload_size",
                "Histogram of KV offload transfer size, in bytes.",
                legacy,
                buckets=TRANSFER_SIZE_BUCKETS,
                registry=reg,
            )
            for key in ("total_bytes", "total_time", "size"):
                for tt in (dialects.TRANSFER_LOAD, dialects.TRANSFER_STORE):
                    self.metrics[key].labels(self.engine, self.model, tt)
        if self.dialect.offload_cpu_usage is not None:
            self.metrics["cpu_usage"] = Gauge(
                self.dialect.offload_cpu_usage,
                CPU_USAGE_DOC,
                base,
                registry=reg,
            )
            self.metrics["cpu_usage"].labels(self.engine, self.model).set(0)
            # The manager's other families: seen from the 0.26.0 capture on (older releases not checked).
            if self.version >= MANAGER_SINCE:
                for fam in OFFLOAD_MANAGER_FAMILIES:
                    self._register(fam)

        self._register_tiering()

    def tier_labels(self) -> list[str]:
        """vLLM's tier labels under tiering: ``0:primary`` (the CPU tier), then ``<i + 1>:<type>``."""
        tiers = self.config.secondary_tiers
        return [dialects.TIER_PRIMARY, *(dialects.secondary_tier_label(i, t.type) for i, t in enumerate(tiers))]

    def _register_tiering(self) -> None:
        """vLLM 0.33's kv_offload_config_info; under tiering the chunk counters (0.32 on) and promotion latency."""
        reg, d = self.registry, self.dialect
        tiering = bool(self.config.secondary_tiers)
        allocation = self.config.cpu_allocation()
        if d.offload_config_info and allocation is not None:
            names = [*dialects.CPU_CONFIG_LABELS, *([dialects.LABEL_TIER] if tiering else [])]
            info = Gauge(
                d.offload_config_info, OFFLOAD_CONFIG_INFO_DOC, sorted(["engine", "model_name", *names]), registry=reg
            )
            cpu = {
                dialects.LABEL_CPU_NUM_CHUNKS: str(allocation.num_chunks),
                dialects.LABEL_CPU_BLOCKS_PER_CHUNK: str(allocation.blocks_per_chunk),
                dialects.LABEL_CPU_SIZE_BYTES: str(allocation.size_bytes),
                dialects.LABEL_CPU_SIZE_TOKENS: str(allocation.size_tokens),
            }
            series = [cpu]
            if tiering:  # one series per tier; a secondary tier fills none of the CPU labels
                labels = self.tier_labels()
                series = [{**cpu, dialects.LABEL_TIER: labels[0]}]
                series += [{**dict.fromkeys(cpu, ""), dialects.LABEL_TIER: label} for label in labels[1:]]
            for labels_of in series:
                info.labels(engine=self.engine, model_name=self.model, **labels_of).set(1)
            self.metrics["offload_config_info"] = info
        if not tiering:
            return
        by_tier = ["engine", "model_name", dialects.LABEL_TIER]
        if d.tiering_chunk_queries and d.tiering_chunk_hits:
            for key, name, doc in (
                ("chunk_queries", d.tiering_chunk_queries, CHUNK_QUERIES_DOC),
                ("chunk_hits", d.tiering_chunk_hits, CHUNK_HITS_DOC),
            ):
                # Registered without "_total"; prometheus_client adds it, as it does for vLLM.
                self.metrics[key] = Counter(name.removesuffix("_total"), doc, by_tier, registry=reg)
                for label in self.tier_labels():
                    self.metrics[key].labels(self.engine, self.model, label)
        if d.tiering_promotion_latency:
            self.metrics["promotion_latency"] = Histogram(
                d.tiering_promotion_latency,
                PROMOTION_LATENCY_DOC,
                [*by_tier, "result"],
                buckets=PROMOTION_LATENCY_BUCKETS,
                registry=reg,
            )

    def _record_tiering(self, adm: Admission) -> None:
        """Chunk lookups per tier (one block per chunk): the primary tier is asked for every block past the GPU hit,
        the first secondary tier for the ones the primary missed."""
        if "chunk_queries" not in self.metrics and "promotion_latency" not in self.metrics:
            return
        block = self.config.block_size
        primary, fs = self.tier_labels()[:2]
        asked = -(-(adm.prompt_tokens - adm.local_hit_tokens) // block)
        primary_hits = adm.cpu_hit_tokens // block
        fs_hits = min(-(-adm.disk_hit_tokens // block), asked - primary_hits)
        if "chunk_queries" in self.metrics:
            for label, queries, hits in ((primary, asked, primary_hits), (fs, asked - primary_hits, fs_hits)):
                if queries > 0:
                    self._m("chunk_queries", tier=label).inc(queries)
                if hits > 0:
                    self._m("chunk_hits", tier=label).inc(hits)
        if "promotion_latency" in self.metrics and fs_hits > 0:
            self._m("promotion_latency", tier=fs, result="success").observe(adm.price.disk_restore_s)

    def _m(self, name: str, **labels: str) -> Any:
        fam = self.metrics[name]
        return fam.labels(engine=self.engine, model_name=self.model, **labels)

    def record_admission(self, adm: Admission, max_tokens: int) -> None:
        d = self.dialect
        self._m("vllm:prompt_tokens").inc(adm.prompt_tokens)
        self._m("vllm:prefix_cache_queries").inc(adm.prompt_tokens)
        self._m("vllm:prefix_cache_hits").inc(adm.local_hit_tokens)
        if self.config.offload_backend is not None:
            # Only tokens past the local hit are asked of the connector (vLLM PR 30522).
            self._m("vllm:external_prefix_cache_queries").inc(adm.prompt_tokens - adm.local_hit_tokens)
            self._m("vllm:external_prefix_cache_hits").inc(adm.external_tokens)
        self._m("vllm:prompt_tokens_cached").inc(adm.cached_tokens)
        if d.prompt_tokens_by_source is not None:
            fam = "vllm:prompt_tokens_by_source"
            self._m(fam, source=dialects.SOURCE_LOCAL_COMPUTE).inc(adm.computed_tokens)
            self._m(fam, source=dialects.SOURCE_LOCAL_CACHE_HIT).inc(adm.local_hit_tokens)
            self._m(fam, source=dialects.SOURCE_EXTERNAL_KV_TRANSFER).inc(adm.external_tokens)
        if d.prompt_tokens_cached_by_source is not None:
            fam = "vllm:prompt_tokens_cached_by_source"
            host = adm.cpu_hit_tokens if self.config.offload_backend == "native" else 0
            unspecified = adm.external_tokens - host - adm.disk_hit_tokens
            self._m(fam, source=dialects.CACHED_SOURCE_DEVICE).inc(adm.local_hit_tokens)
            self._m(fam, source=dialects.CACHED_SOURCE_HOST).inc(host)
            self._m(fam, source=dialects.CACHED_SOURCE_DISK).inc(adm.disk_hit_tokens)
            self._m(fam, source=dialects.CACHED_SOURCE_EXTERNAL_UNSPECIFIED).inc(unspecified)
        self._m("vllm:request_prompt_tokens").observe(adm.prompt_tokens)
        self._m("vllm:request_prefill_kv_computed_tokens").observe(adm.computed_tokens)
        self._m("vllm:request_params_max_tokens").observe(max_tokens)
        self._m("vllm:request_max_num_generation_tokens").observe(
            min(max_tokens, self.config.max_model_len - adm.prompt_tokens)
        )
        self._m("vllm:request_params_n").observe(1)
        self._m("vllm:iteration_tokens_total").observe(adm.computed_tokens + 1)
        if self.config.offload_backend == "native":
            self._record_lookup(adm)
            self._record_transfers(adm)
            self._record_tiering(adm)

    def _record_lookup(self, adm: Admission) -> None:
        """The manager's lookup of the blocks past the GPU hit, and the CPU chunks (one block each) a store asks for."""
        if LOOKUP_SYNC_DELAY not in self.metrics:
            return
        if adm.prompt_tokens > adm.local_hit_tokens:
            self._m(LOOKUP_SYNC_DELAY).observe(LOOKUP_SECONDS)
        if adm.stored_blocks:
            self._m(ALLOCATION_SIZE).observe(adm.stored_blocks)

    def _record_transfers(self, adm: Admission) -> None:
        p = adm.price
        load_bytes = p.cpu_restored_bytes + p.disk_restored_bytes
        load_time = p.cpu_restore_s + p.disk_restore_s
        store_bytes = adm.stored_blocks * self.config.block_bytes
        store_time = self.config.cost.store_seconds(store_bytes)
        if self.flat:
            if load_bytes:
                self._m("load_bytes").inc(load_bytes)
                self._m("load_time").inc(load_time)
                self._m("load_size").observe(load_bytes)
            if store_bytes:
                self._m("store_bytes").inc(store_bytes)
                self._m("store_time").inc(store_time)
                self._m("store_size").observe(store_bytes)
        if self.legacy:
            for tt, nbytes, secs in (
                (dialects.TRANSFER_LOAD, load_bytes, load_time),
                (dialects.TRANSFER_STORE, store_bytes, store_time),
            ):
                if nbytes:
                    self._m("total_bytes", transfer_type=tt).inc(nbytes)
                    self._m("total_time", transfer_type=tt).inc(secs)
                    self._m("size", transfer_type=tt).observe(nbytes)

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
        """A finished request; vLLM counts its tokens at admission and labels nothing by streaming."""
        d = self.dialect
        self._m("vllm:time_to_first_token_seconds").observe(ttft)
        itl = self._m(d.itl or "vllm:inter_token_latency_seconds")  # every vLLM release has one
        for v in itls:
            itl.observe(v)
        decode = sum(itls)
        if itls:
            self._m("vllm:request_time_per_output_token_seconds").observe(decode / len(itls))
        self._m("vllm:e2e_request_latency_seconds").observe(e2e)
        self._m("vllm:request_queue_time_seconds").observe(max(0.0, queued))
        self._m("vllm:request_inference_time_seconds").observe(max(0.0, e2e - queued))
        self._m("vllm:request_prefill_time_seconds").observe(max(0.0, ttft - queued))
        self._m("vllm:request_decode_time_seconds").observe(decode)
        if "vllm:request_num_preemptions" in self.metrics:
            self._m("vllm:request_num_preemptions").observe(0)
        self._m("vllm:request_generation_tokens").observe(generated)
        self._m("vllm:generation_tokens").inc(generated)
        self._m("vllm:request_success", finished_reason=finished_reason).inc()

    def record_failure(
        self,
        *,
        e2e: float,
        queued: float,
        finished_reason: str,
        admission: Admission | None = None,
        stream: bool = False,
    ) -> None:
        """A request that ended before its first token (a failed KV load): vLLM counts it by its reason and times it
        like any finished request, but it has no TTFT and no ITL (``update_from_finished_request``)."""
        self._m("vllm:e2e_request_latency_seconds").observe(e2e)
        self._m("vllm:request_queue_time_seconds").observe(max(0.0, queued))
        self._m("vllm:request_inference_time_seconds").observe(max(0.0, e2e - queued))
        self._m("vllm:request_prefill_time_seconds").observe(max(0.0, e2e - queued))
        self._m("vllm:request_decode_time_seconds").observe(0.0)
        if "vllm:request_num_preemptions" in self.metrics:  # not in 0.26
            self._m("vllm:request_num_preemptions").observe(0)
        self._m("vllm:request_generation_tokens").observe(0)
        self._m("vllm:request_success", finished_reason=finished_reason).inc()

    serves_metrics = True
    metrics_path = "/metrics"
    # vLLM 0.32 (v1/metrics/stats.py, IterationStats.update_from_output): the ITL is the gap between the engine
    # core's timestamps on its outputs; the TTFT is the frontend's, from the request's arrival.
    itl_clock: Final[ItlClock] = "engine"

    def iteration_stats(self) -> list[dict[str, Any]] | None:
        return None  # vLLM's /metrics is Prometheus' text

    def http_endpoint(self, route: str | None, path: str) -> str | None:
        """The handler a request counts under (``none`` when no route matched); vLLM's probes and /metrics are
        left out as vLLM leaves them out, and so is the emulator's own control API."""
        handler = route if route is not None else "none"
        return None if handler in UNCOUNTED_HANDLERS or handler.startswith("/emulator/") else handler

    def record_http_start(self, *, handler: str, method: str) -> None:
        """vLLM's instrumentator counts a request only once answered."""

    def record_http(self, *, handler: str, method: str, status: int | None) -> None:
        """One answer of the API server, as the instrumentator counts it (``5xx`` for any 500-599)."""
        if status is not None:
            self.http_requests.labels(handler=handler, method=method, status=f"{status // 100}xx").inc()

    def set_load(self, running: int, used_blocks: int, waiting: int = 0) -> None:
        self._m("vllm:num_requests_running").set(running)
        if "vllm:num_requests_waiting" in self.metrics:
            self._m("vllm:num_requests_waiting").set(waiting)
        self._m(self.dialect.kv_cache_usage).set(min(1.0, used_blocks / max(1, self.config.gpu_kv_blocks)))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
