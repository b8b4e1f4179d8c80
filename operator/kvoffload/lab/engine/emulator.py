"""``kvoffload emulate``: an engine that speaks vLLM's ``/v1/completions`` and ``/metrics``.

It keeps a block-level GPU prefix cache and the offload tiers (CPU, filesystem)
the flags describe, prices each request's time to first token with
:mod:`kvoffload.costmodel`, really waits that long (asynchronously), then emits
output tokens at the inter-token latency. Its ``/metrics`` carries exactly the
``vllm:`` families of a real vLLM 0.32 capture (names, label names, buckets),
plus the ``vllm:kv_offload_*`` families a GPU build shows with offloading on,
which vLLM for CPU cannot. The classic text format is served whatever the
scraper asks for, so the colons in the names survive (prometheus_client
rewrites them to ``_`` in OpenMetrics).

Faults for demos and tests: fixed added latency, a TTFT multiplier from a
given time on, an outage (503 everywhere) from a given time on; set by flags,
``KVOFFLOAD_EMULATE_*`` variables, or at runtime with ``POST /emulator/faults``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from aiohttp import web
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

from kvoffload.analysis import dialects
from kvoffload.api.quantity import GIB
from kvoffload.lab.engine.blockcache import ARCCache, BlockHash, LRUCache, block_hashes, make_cache
from kvoffload.lab.engine.costmodel import CostModel, Price, price

log = logging.getLogger("kvoffload.emulate")

DEFAULT_KV_BYTES_PER_TOKEN: Final = 114_688  # Qwen3-0.6B, bf16
DEFAULT_VLLM_VERSION: Final = "0.32.0"
CONTENT_TYPE_CLASSIC: Final = "text/plain; version=0.0.4; charset=utf-8"
VOCAB: Final = 151_936
ENV_PREFIX: Final = "KVOFFLOAD_EMULATE_"


# --- the metric families of vLLM 0.32 ------------------------------------------


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


# Copied from shared/fixtures/vllm-0.32.0-cpu-metrics.txt (docs, label names,
# pre-created label values, buckets); tests/test_emulator_conformance.py keeps them equal.
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

# vLLM 0.32 offloading/metrics.py: TRANSFER_SIZE_BUCKETS.
TRANSFER_SIZE_BUCKETS: Final = (1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6)

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


# --- configuration ------------------------------------------------------------


@dataclass(frozen=True)
class Tier:
    """An offload tier below the GPU: ``cpu`` or a secondary (``fs``) tier."""

    name: str
    capacity_blocks: int
    restore_bytes_per_s: float


@dataclass
class Faults:
    """Injected faults. Times are ``time.monotonic()`` values; None: not scheduled."""

    added_latency_s: float = 0.0
    ttft_multiplier: float = 1.0
    ttft_multiplier_from: float | None = None
    itl_multiplier: float = 1.0
    itl_multiplier_from: float | None = None
    outage_from: float | None = None
    outage_until: float | None = None

    def ttft_factor(self, now: float) -> float:
        if self.ttft_multiplier_from is not None and now >= self.ttft_multiplier_from:
            return self.ttft_multiplier
        return 1.0

    def itl_factor(self, now: float) -> float:
        if self.itl_multiplier_from is not None and now >= self.itl_multiplier_from:
            return self.itl_multiplier
        return 1.0

    def in_outage(self, now: float) -> bool:
        if self.outage_from is None or now < self.outage_from:
            return False
        return self.outage_until is None or now < self.outage_until

    def describe(self, now: float) -> dict[str, Any]:
        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - now, 3)

        return {
            "added_latency": self.added_latency_s,
            "ttft_multiplier": self.ttft_multiplier,
            "ttft_multiplier_in": rel(self.ttft_multiplier_from),
            "itl_multiplier": self.itl_multiplier,
            "itl_multiplier_in": rel(self.itl_multiplier_from),
            "outage_in": rel(self.outage_from),
            "outage_ends_in": rel(self.outage_until),
            "in_outage": self.in_outage(now),
        }


@dataclass
class EngineConfig:
    """Everything one emulated engine needs, parsed from vLLM-style flags."""

    model: str = "Qwen/Qwen3-0.6B"
    served_model_name: str | None = None
    block_size: int = 16
    max_model_len: int = 8192
    gpu_kv_blocks: int = 4096
    kv_bytes_per_token: int = DEFAULT_KV_BYTES_PER_TOKEN
    offload_backend: str | None = None
    """``native`` or ``lmcache`` when offloading is on, else None."""
    offload_size_gib: float | None = None
    """--kv-offloading-size as given (GiB), for cache_config_info."""
    cpu_bytes: int | None = None
    eviction_policy: str = "lru"
    secondary_tiers: tuple[Tier, ...] = ()
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    kv_cache_dtype: str = "auto"
    vllm_version: str = DEFAULT_VLLM_VERSION
    startup_delay_s: float = 0.0
    cost: CostModel = field(default_factory=CostModel)

    @property
    def name(self) -> str:
        return self.served_model_name or self.model

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.kv_bytes_per_token

    def cpu_tier(self) -> Tier | None:
        if self.cpu_bytes is None:
            return None
        return Tier("cpu", self.cpu_bytes // self.block_bytes, self.cost.cpu_restore_bytes_per_s)


class ConfigError(ValueError):
    """Bad engine flags; the message starts with the flag."""


def kv_bytes_per_token_for(model: str, kv_cache_dtype: str = "auto") -> int | None:
    """KV bytes per token of a catalog model (None if the catalog does not know it)."""
    from kvoffload.policy.catalog import find_model
    from kvoffload.policy.sizing import bytes_per_token

    entry = find_model(model)
    if entry is None:
        return None
    arch = entry.architecture
    dtype_bytes = 1 if kv_cache_dtype.startswith("fp8") else arch.dtype_bytes
    return bytes_per_token(arch, dtype_bytes)


def parse_transfer_config(raw: str | None, config: EngineConfig) -> None:
    """Apply a ``--kv-transfer-config`` JSON object to ``config`` (OffloadingConnector or LMCache)."""
    if raw is None:
        return
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--kv-transfer-config: not JSON ({exc.msg})") from exc
    if not isinstance(obj, dict):
        raise ConfigError("--kv-transfer-config: must be a JSON object")
    connector = str(obj.get("kv_connector", ""))
    extra = obj.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise ConfigError("--kv-transfer-config: kv_connector_extra_config must be an object")
    if connector.startswith("LMCache"):
        config.offload_backend = "lmcache"
        size = os.environ.get("LMCACHE_MAX_LOCAL_CPU_SIZE")
        if config.cpu_bytes is None and size:
            config.cpu_bytes = int(float(size) * GIB)
        return
    if connector != "OffloadingConnector":
        log.warning("--kv-transfer-config: connector %r is not emulated; ignored", connector)
        return
    config.offload_backend = "native"
    if "cpu_bytes_to_use" in extra:
        try:
            config.cpu_bytes = int(extra["cpu_bytes_to_use"])
        except (TypeError, ValueError) as exc:
            raise ConfigError("--kv-transfer-config: cpu_bytes_to_use must be a byte count") from exc
    policy = str(extra.get("eviction_policy", "lru")).lower()
    if policy not in ("lru", "arc"):
        raise ConfigError(f"--kv-transfer-config: eviction_policy must be lru or arc, got {policy!r}")
    config.eviction_policy = policy
    tiers = extra.get("secondary_tiers", [])
    if not isinstance(tiers, list):
        raise ConfigError("--kv-transfer-config: secondary_tiers must be a list")
    parsed: list[Tier] = []
    for i, tier in enumerate(tiers):
        if not isinstance(tier, dict) or "type" not in tier:
            raise ConfigError(f"--kv-transfer-config: secondary_tiers[{i}] needs a type")
        # vLLM's fs tier has no size; the volume bounds it. Take one if given, else ~unbounded.
        size = tier.get("size_bytes", tier.get("size"))
        capacity = int(size) // config.block_bytes if size is not None else 10_000_000
        parsed.append(Tier(str(tier.get("name", tier["type"])), capacity, config.cost.disk_restore_bytes_per_s))
    config.secondary_tiers = tuple(parsed)


# --- the engine -----------------------------------------------------------------


def tokenize(text: str) -> list[int]:
    """A trivial deterministic tokenizer: one token per whitespace-separated word."""
    return [int.from_bytes(hashlib.blake2b(w.encode(), digest_size=4).digest(), "big") % VOCAB for w in text.split()]


@dataclass(frozen=True)
class Admission:
    """Where one request's prompt tokens come from, and what its prefill costs."""

    prompt_tokens: int
    local_hit_tokens: int
    """From the GPU prefix cache."""
    cpu_hit_tokens: int
    disk_hit_tokens: int
    computed_tokens: int
    stored_blocks: int
    """Blocks newly written to the CPU tier (an offload store)."""
    price: Price

    @property
    def external_tokens(self) -> int:
        return self.cpu_hit_tokens + self.disk_hit_tokens

    @property
    def cached_tokens(self) -> int:
        return self.local_hit_tokens + self.external_tokens


class KVEngine:
    """The cache state of one engine: a GPU prefix cache and the offload tiers, block by block."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.gpu = LRUCache(config.gpu_kv_blocks)
        cpu = config.cpu_tier()
        self.cpu: LRUCache | ARCCache | None = (
            make_cache(config.eviction_policy, cpu.capacity_blocks) if cpu is not None else None
        )
        self.secondary: list[tuple[Tier, LRUCache]] = [
            (t, LRUCache(t.capacity_blocks)) for t in config.secondary_tiers if self.cpu is not None
        ]

    def admit(self, tokens: Sequence[int]) -> Admission:
        """Look the prompt up tier by tier, price it, and update every tier as vLLM would."""
        cfg = self.config
        bs = cfg.block_size
        hashes = block_hashes(tokens, bs)
        n_local = self.gpu.prefix_hits(hashes)
        rest = hashes[n_local:]
        n_cpu = self.cpu.prefix_hits(rest) if self.cpu is not None else 0
        rest = rest[n_cpu:]
        n_disk = 0
        disk_hits: list[tuple[LRUCache, list[BlockHash]]] = []
        for _, cache in self.secondary:
            k = cache.prefix_hits(rest)
            if k == 0:
                break
            disk_hits.append((cache, rest[:k]))
            n_disk += k
            rest = rest[k:]

        local, cpu_tok, disk_tok = n_local * bs, n_cpu * bs, n_disk * bs
        if local + cpu_tok + disk_tok >= len(tokens) > 0:
            # A full hit still recomputes the last token to get logits (vLLM scheduler).
            if disk_tok:
                disk_tok -= 1
            elif cpu_tok:
                cpu_tok -= 1
            else:
                local -= 1
        computed = len(tokens) - local - cpu_tok - disk_tok

        self.gpu.touch(hashes[:n_local])
        # vLLM frees a request's blocks tail first, so a prefix outlives its tail.
        self.gpu.insert(reversed(hashes))
        stored = 0
        if self.cpu is not None:
            self.cpu.touch(hashes[n_local : n_local + n_cpu])
            for cache, blocks in disk_hits:
                cache.touch(blocks)
            new = [h for h in hashes if h not in self.cpu]
            self.cpu.insert(new)  # every computed block is stored (native offload)
            stored = len(new)
            for _, cache in self.secondary:  # tiers below cascade from the CPU tier
                cache.insert(new)

        cost = price(
            cfg.cost,
            computed_tokens=computed,
            cpu_restored_tokens=cpu_tok,
            disk_restored_tokens=disk_tok,
            kv_bytes_per_token=cfg.kv_bytes_per_token,
        )
        return Admission(len(tokens), local, cpu_tok, disk_tok, computed, stored, cost)

    def state(self) -> dict[str, Any]:
        return {
            "gpu_blocks": len(self.gpu),
            "gpu_capacity_blocks": self.gpu.capacity,
            "cpu_blocks": None if self.cpu is None else len(self.cpu),
            "cpu_capacity_blocks": None if self.cpu is None else self.cpu.capacity,
            "secondary": [{"name": t.name, "blocks": len(c), "capacity_blocks": c.capacity} for t, c in self.secondary],
        }


# --- metrics --------------------------------------------------------------------


class EngineMetrics:
    """The engine's Prometheus registry: vLLM's families, filled where the emulator models them."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.dialect = dialects.dialect_for(config.vllm_version)
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

    # Older dialects rename or lack some families; everything else stays as in 0.32.
    def _for_dialect(self, fam: Family) -> Family | None:
        d = self.dialect
        if fam.name == "vllm:inter_token_latency_seconds":
            return Family(d.itl, fam.type, fam.doc, buckets=fam.buckets)
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
        # Pre-create the children vLLM creates, so zero series exist from the start.
        combos: list[dict[str, str]] = [{}]
        for label, values in zip(fam.labels, fam.values, strict=True):
            combos = [{**c, label: v} for c in combos for v in values]
        for combo in combos:
            metric.labels(**self._base(fam), **combo)

    def _base(self, fam: Family) -> dict[str, str]:
        return {"engine": self.engine, "model_name": self.model} if fam.per_engine else {"model_name": self.model}

    def _register_cache_config(self) -> None:
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
        if not self.dialect.config_offload_labels:
            labels.pop(dialects.LABEL_OFFLOADING_SIZE)
            labels.pop(dialects.LABEL_OFFLOADING_BACKEND)
        labels["engine"] = self.engine
        info = Gauge(
            self.dialect.cache_config_info,
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
                "Fraction of CPU KV-cache space currently pinned by active transfers (0.0 = idle, 1.0 = saturated).",
                base,
                registry=reg,
            )
            self.metrics["cpu_usage"].labels(self.engine, self.model).set(0)

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
            self._record_transfers(adm)

    def _record_transfers(self, adm: Admission) -> None:
        p = adm.price
        load_bytes = p.cpu_restored_bytes + p.disk_restored_bytes
        load_time = p.cpu_restore_s + p.disk_restore_s
        store_bytes = adm.stored_blocks * self.config.block_bytes
        store_time = store_bytes / self.config.cost.store_bytes_per_s
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
        self, *, ttft: float, itls: Sequence[float], e2e: float, generated: int, finished_reason: str
    ) -> None:
        d = self.dialect
        self._m("vllm:time_to_first_token_seconds").observe(ttft)
        itl = self._m(d.itl)
        for v in itls:
            itl.observe(v)
        decode = sum(itls)
        if itls:
            self._m("vllm:request_time_per_output_token_seconds").observe(decode / len(itls))
        self._m("vllm:e2e_request_latency_seconds").observe(e2e)
        self._m("vllm:request_queue_time_seconds").observe(0.0)
        self._m("vllm:request_inference_time_seconds").observe(e2e)
        self._m("vllm:request_prefill_time_seconds").observe(ttft)
        self._m("vllm:request_decode_time_seconds").observe(decode)
        self._m("vllm:request_num_preemptions").observe(0)
        self._m("vllm:request_generation_tokens").observe(generated)
        self._m("vllm:generation_tokens").inc(generated)
        self._m("vllm:request_success", finished_reason=finished_reason).inc()

    def set_load(self, running: int, used_blocks: int) -> None:
        self._m("vllm:num_requests_running").set(running)
        self._m(self.dialect.kv_cache_usage).set(min(1.0, used_blocks / max(1, self.config.gpu_kv_blocks)))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


# --- HTTP -----------------------------------------------------------------------


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


class Emulator:
    """One engine: its caches, its metrics, its faults and its aiohttp application."""

    def __init__(self, config: EngineConfig, faults: Faults | None = None) -> None:
        self.config = config
        self.engine = KVEngine(config)
        self.metrics = EngineMetrics(config)
        self.faults = faults or Faults()
        self.started = time.monotonic()
        self.running = 0
        self.used_blocks = 0

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._outage])
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_handler)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/emulator/faults", self.get_faults)
        app.router.add_post("/emulator/faults", self.set_faults)
        app.router.add_get("/emulator/state", self.state)
        return app

    @web.middleware
    async def _outage(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not request.path.startswith("/emulator/") and self.faults.in_outage(time.monotonic()):
            return _error(503, "engine unavailable (emulated outage)", "ServiceUnavailableError")
        response: web.StreamResponse = await handler(request)
        return response

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metrics_handler(self, request: web.Request) -> web.Response:
        # Always the classic format, whatever Accept says: OpenMetrics would turn ':' into '_'.
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_CLASSIC})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.config.name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "vllm",
                        "root": self.config.model,
                        "max_model_len": self.config.max_model_len,
                    }
                ],
            }
        )

    async def get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self.faults.describe(time.monotonic()))

    async def set_faults(self, request: web.Request) -> web.Response:
        """Set faults now. Times are seconds from now; ``{"clear": true}`` removes them all."""
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return _error(400, "body: not JSON")
        if not isinstance(body, dict):
            return _error(400, "body: must be a JSON object")
        try:
            apply_faults(self.faults, body, time.monotonic())
        except (TypeError, ValueError) as exc:
            return _error(400, str(exc))
        return web.json_response(self.faults.describe(time.monotonic()))

    async def state(self, request: web.Request) -> web.Response:
        return web.json_response({**self.engine.state(), "running": self.running})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return _error(400, "body: not JSON")
        if not isinstance(body, dict):
            return _error(400, "body: must be a JSON object")
        model = body.get("model")
        if model is not None and model not in (self.config.name, self.config.model):
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        tokens = _prompt_tokens(body.get("prompt"))
        if tokens is None:
            return _error(400, "prompt: a string, a list of token ids, or a one-element list of either")
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(400, "max_tokens: must be a positive integer")
        if len(tokens) + max_tokens > self.config.max_model_len:
            return _error(
                400,
                f"This model's maximum context length is {self.config.max_model_len} tokens. However, you "
                f"requested {len(tokens) + max_tokens} tokens ({len(tokens)} in the messages, "
                f"{max_tokens} in the completion).",
            )
        stream = bool(body.get("stream", False))

        adm = self.engine.admit(tokens)
        self.metrics.record_admission(adm, max_tokens)
        faults = self.faults
        ttft_target = adm.price.ttft_s * faults.ttft_factor(arrived) + faults.added_latency_s
        itl_target = self.config.cost.itl_s * faults.itl_factor(arrived)
        blocks = math.ceil((len(tokens) + max_tokens) / self.config.block_size)
        self.running += 1
        self.used_blocks += blocks
        self.metrics.set_load(self.running, self.used_blocks)
        rid = f"cmpl-{uuid.uuid4().hex}"
        response: web.StreamResponse | None = None
        try:
            await _sleep_until(arrived + ttft_target)
            first = time.monotonic()
            if stream:
                response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await response.prepare(request)
                await _send_chunk(response, rid, self.config.name, _word(0), None)
            itls: list[float] = []
            last = first
            for i in range(1, max_tokens):
                await _sleep_until(last + itl_target)
                now = time.monotonic()
                itls.append(now - last)
                last = now
                if response is not None:
                    await _send_chunk(response, rid, self.config.name, _word(i), None)
        finally:
            self.running -= 1
            self.used_blocks -= blocks
            self.metrics.set_load(self.running, self.used_blocks)
        done = time.monotonic()
        ttft = first - arrived
        self.metrics.record_finish(
            ttft=ttft, itls=itls, e2e=done - arrived, generated=max_tokens, finished_reason="length"
        )
        extension = {
            "modelled_ttft_s": ttft_target,
            "measured_ttft_s": ttft,
            "modelled_itl_s": itl_target,
            "prompt_tokens": adm.prompt_tokens,
            "local_cache_hit_tokens": adm.local_hit_tokens,
            "cpu_hit_tokens": adm.cpu_hit_tokens,
            "disk_hit_tokens": adm.disk_hit_tokens,
            "computed_tokens": adm.computed_tokens,
            "stored_blocks": adm.stored_blocks,
            "price": asdict(adm.price),
        }
        usage = {
            "prompt_tokens": len(tokens),
            "completion_tokens": max_tokens,
            "total_tokens": len(tokens) + max_tokens,
            "prompt_tokens_details": {"cached_tokens": adm.cached_tokens},
        }
        if response is not None:
            await _send_chunk(response, rid, self.config.name, "", "length", usage=usage, extension=extension)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        return web.json_response(
            {
                "id": rid,
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.config.name,
                "choices": [
                    {
                        "index": 0,
                        "text": " ".join(_word(i) for i in range(max_tokens)),
                        "logprobs": None,
                        "finish_reason": "length",
                        "stop_reason": None,
                    }
                ],
                "usage": usage,
                "kvoffload": extension,
            }
        )


def _word(i: int) -> str:
    return f"tok{i}"


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def _send_chunk(
    response: web.StreamResponse,
    rid: str,
    model: str,
    text: str,
    finish_reason: str | None,
    *,
    usage: Mapping[str, Any] | None = None,
    extension: Mapping[str, Any] | None = None,
) -> None:
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
    }
    if usage is not None:
        chunk["usage"] = usage
    if extension is not None:
        chunk["kvoffload"] = extension
    await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")


def _prompt_tokens(prompt: Any) -> list[int] | None:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenize(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    return None


def apply_faults(faults: Faults, body: Mapping[str, Any], now: float) -> None:
    """Update ``faults`` from a ``POST /emulator/faults`` body; ``*_after`` are seconds from ``now``."""

    def num(key: str) -> float | None:
        value = body.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{key}: must be a number")
        if value < 0:
            raise ValueError(f"{key}: must be >= 0")
        return float(value)

    known = {
        "clear",
        "added_latency",
        "ttft_multiplier",
        "ttft_multiplier_after",
        "itl_multiplier",
        "itl_multiplier_after",
        "outage_after",
        "outage_for",
    }
    unknown = sorted(set(body) - known)
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown fault (known: {', '.join(sorted(known))})")
    if body.get("clear"):
        fresh = Faults()
        for key, value in vars(fresh).items():
            setattr(faults, key, value)
    if (v := num("added_latency")) is not None:
        faults.added_latency_s = v
    if (v := num("ttft_multiplier")) is not None:
        faults.ttft_multiplier = v
        faults.ttft_multiplier_from = now + (num("ttft_multiplier_after") or 0.0)
    if (v := num("itl_multiplier")) is not None:
        faults.itl_multiplier = v
        faults.itl_multiplier_from = now + (num("itl_multiplier_after") or 0.0)
    if (v := num("outage_after")) is not None or "outage_for" in body:
        start = now + (v or 0.0)
        duration = num("outage_for")
        faults.outage_from = start
        faults.outage_until = None if duration is None else start + duration


def faults_from_options(
    *,
    added_latency: float = 0.0,
    ttft_multiplier: float = 1.0,
    ttft_multiplier_after: float | None = None,
    itl_multiplier: float = 1.0,
    itl_multiplier_after: float | None = None,
    outage_after: float | None = None,
    outage_for: float | None = None,
    start: float,
) -> Faults:
    """Faults from command-line options, whose times count from engine start."""
    f = Faults(added_latency_s=added_latency, ttft_multiplier=ttft_multiplier, itl_multiplier=itl_multiplier)
    if ttft_multiplier != 1.0:
        f.ttft_multiplier_from = start + (ttft_multiplier_after or 0.0)
    if itl_multiplier != 1.0:
        f.itl_multiplier_from = start + (itl_multiplier_after or 0.0)
    if outage_after is not None:
        f.outage_from = start + outage_after
        f.outage_until = None if outage_for is None else f.outage_from + outage_for
    return f


async def serve(emulator: Emulator, host: str, port: int, *, ready: asyncio.Event | None = None) -> None:
    """Run the engine until cancelled. The port opens after the startup delay, as pinning delays vLLM's."""
    if emulator.config.startup_delay_s > 0:
        await asyncio.sleep(emulator.config.startup_delay_s)
    runner = web.AppRunner(emulator.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info(
        "emulated vLLM %s serving %s on http://%s:%d", emulator.config.vllm_version, emulator.config.name, host, port
    )
    if ready is not None:
        ready.set()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def config_from_options(
    *,
    positional: Sequence[str] = (),
    model: str | None = None,
    served_model_name: str | None = None,
    kv_offloading_size: float | None = None,
    kv_offloading_backend: str | None = None,
    kv_transfer_config: str | None = None,
    max_model_len: int | None = None,
    block_size: int | None = None,
    gpu_memory_utilization: float | None = None,
    tensor_parallel_size: int | None = None,
    kv_cache_dtype: str | None = None,
    kv_bytes_per_token: int | None = None,
    gpu_kv_blocks: int | None = None,
    vllm_version: str | None = None,
    startup_delay: float | None = None,
    itl: float | None = None,
) -> tuple[EngineConfig, list[str]]:
    """An engine config from ``vllm serve``-style options; also the arguments it ignores.

    ``positional`` may start with ``serve`` and the model, as a Deployment's
    ``vllm serve MODEL --flag ...`` does. Raises ConfigError naming the flag.
    """
    rest = list(positional)
    if rest[:1] == ["serve"]:
        rest = rest[1:]
    if rest and not rest[0].startswith("-"):
        if model is None:
            model = rest[0]
        rest = rest[1:]
    cfg = EngineConfig()
    if model is not None:
        cfg.model = model
    cfg.served_model_name = served_model_name
    if kv_cache_dtype is not None:
        cfg.kv_cache_dtype = kv_cache_dtype
    for flag, value in (
        ("--max-model-len", max_model_len),
        ("--block-size", block_size),
        ("--tensor-parallel-size", tensor_parallel_size),
        ("--gpu-kv-blocks", gpu_kv_blocks),
        ("--kv-bytes-per-token", kv_bytes_per_token),
    ):
        if value is not None and value <= 0:
            raise ConfigError(f"{flag}: must be positive, got {value}")
    if max_model_len is not None:
        cfg.max_model_len = max_model_len
    if block_size is not None:
        cfg.block_size = block_size
    if gpu_kv_blocks is not None:
        cfg.gpu_kv_blocks = gpu_kv_blocks
    if gpu_memory_utilization is not None:
        if not 0 < gpu_memory_utilization <= 1:
            raise ConfigError(f"--gpu-memory-utilization: must be in (0, 1], got {gpu_memory_utilization}")
        cfg.gpu_memory_utilization = gpu_memory_utilization
    if tensor_parallel_size is not None:
        cfg.tensor_parallel_size = tensor_parallel_size
    cfg.kv_bytes_per_token = (
        kv_bytes_per_token or kv_bytes_per_token_for(cfg.model, cfg.kv_cache_dtype) or DEFAULT_KV_BYTES_PER_TOKEN
    )
    if vllm_version is not None:
        try:
            dialects.parse_version(vllm_version)
        except ValueError as exc:
            raise ConfigError(f"--vllm-version: {exc}") from exc
        cfg.vllm_version = vllm_version
    if startup_delay is not None:
        if startup_delay < 0:
            raise ConfigError(f"--startup-delay: must be >= 0, got {startup_delay}")
        cfg.startup_delay_s = startup_delay
    if itl is not None:
        if itl < 0:
            raise ConfigError(f"--itl: must be >= 0, got {itl}")
        cfg.cost = CostModel(itl_s=itl)
    if kv_offloading_size is not None:
        if kv_offloading_size <= 0:
            raise ConfigError(f"--kv-offloading-size: must be positive GiB, got {kv_offloading_size}")
        cfg.offload_size_gib = kv_offloading_size
        cfg.cpu_bytes = int(kv_offloading_size * GIB)
        cfg.offload_backend = kv_offloading_backend or "native"  # vLLM PR 32421: native by default
    elif kv_offloading_backend is not None:
        log.warning("--kv-offloading-backend without --kv-offloading-size: offloading stays off (as in vLLM)")
    parse_transfer_config(kv_transfer_config, cfg)
    if cfg.offload_backend is not None and cfg.cpu_bytes is None:
        raise ConfigError(
            "--kv-transfer-config: an offloading connector needs cpu_bytes_to_use or --kv-offloading-size"
        )
    return cfg, rest


def run(emulator: Emulator, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM."""
    import signal

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serve(emulator, host, port)

    asyncio.run(main())
