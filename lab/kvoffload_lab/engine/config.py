"""One engine's configuration, from ``vllm serve``-style options and ``--kv-transfer-config``."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from kvoffload.api.quantity import GIB
from kvoffload.api.versions import parse_version
from kvoffload_lab.engine import sizing
from kvoffload_lab.engine.costmodel import CostModel

log = logging.getLogger("kvoffload.emulate")

DEFAULT_KV_BYTES_PER_TOKEN: Final = 114_688  # Qwen3-0.6B, bf16
DEFAULT_VLLM_VERSION: Final = "0.32.0"
SPEAK_VLLM: Final = "vllm"
SPEAK_SGLANG: Final = "sglang"
SPEAK_TRTLLM: Final = "trtllm"
SPEAKS: Final = (SPEAK_VLLM, SPEAK_SGLANG, SPEAK_TRTLLM)
"""Whose metrics the engine speaks (``--speak``): vLLM's families (the default), SGLang 0.5.23's, or TensorRT-LLM's
(its collector at the commit ``trtllmmetrics`` names), by the names of ``kvoffload.engines.ENGINES``."""
ItlClock = Literal["engine", "frontend"]
"""Whose clock times the gaps between output tokens in an engine's metrics: the engine's own step stamps
(``engine``), or the API server's as it hands each token on (``frontend``), where a busy host's delays show."""
SGLANG_VERSION: Final = "0.5.23"
"""The SGLang release whose families ``--speak sglang`` exposes (tests/data/sglang-0.5.23-families.json)."""


@dataclass(frozen=True)
class Tier:
    """An offload tier below the GPU: ``cpu`` or a secondary (``fs``) tier."""

    name: str
    capacity_blocks: int
    restore_bytes_per_s: float
    type: str = "fs"
    """The secondary tier's vLLM type (its tier label is ``<index + 1>:<type>``)."""


CHUNK_ALIGNMENT: Final = 4096
"""vLLM 0.33 rounds each CPU chunk up to the page size (``SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT``)."""


@dataclass(frozen=True)
class Allocation:
    """The CPU tier as vLLM 0.33's ``CPUOffloadingInfo`` reports it (``vllm:kv_offload_config_info``)."""

    num_chunks: int
    blocks_per_chunk: int
    size_bytes: int
    size_tokens: int


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
    speak: str = SPEAK_VLLM
    """``vllm``, ``sglang`` or ``trtllm``: whose metric families the engine exposes (``metrics``, ``sglangmetrics``
    or ``trtllmmetrics``)."""
    enable_metrics: bool = False
    """Whether an engine that serves its Prometheus metrics only when asked does: SGLang's ``--enable-metrics``,
    TensorRT-LLM's ``return_perf_metrics: true`` (vLLM always serves them)."""
    startup_delay_s: float = 0.0
    allocate_cpu_bytes: int | None = None
    """Fault: the CPU tier the engine allocates instead of ``cpu_bytes`` (as kv_offload_config_info shows)."""
    cost: CostModel = field(default_factory=CostModel)
    # Issue 11, part 2: the GPU class's profile prices the engine; vLLM's cache-sizing flags bound the GPU cache.
    gpu_class: str | None = None
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    # Issue 11, part 3: one scheduler per engine (vLLM's batch flags) and the pinning delay at start.
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    pinning_time_scale: float = 1.0
    """Multiplies the modelled pinning time (an explicit lab knob, ``--pinning-time-scale``; 0 turns it off)."""

    @property
    def pinning_s(self) -> float:
        """Seconds pinning the CPU tier takes at start: the profile's pinning rate over the bytes allocated."""
        allocation = self.cpu_allocation()
        if allocation is None or self.pinning_time_scale == 0:
            return 0.0
        return self.cost.pin_seconds(allocation.size_bytes) * self.pinning_time_scale

    @property
    def ready_delay_s(self) -> float:
        """Seconds from start until the engine answers (``/health`` included): ``--startup-delay`` plus pinning."""
        return self.startup_delay_s + self.pinning_s

    @property
    def name(self) -> str:
        return self.served_model_name or self.model

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.kv_bytes_per_token

    def cpu_tier(self) -> Tier | None:
        allocation = self.cpu_allocation()
        if allocation is None:
            return None
        return Tier("cpu", allocation.num_chunks * allocation.blocks_per_chunk, self.cost.cpu_restore_bytes_per_s)

    def cpu_allocation(self) -> Allocation | None:
        """Whole page-aligned chunks of one block each within the CPU bytes, as vLLM 0.33's CPUOffloadingSpec."""
        target = self.allocate_cpu_bytes if self.allocate_cpu_bytes is not None else self.cpu_bytes
        if target is None:
            return None
        chunk = -(-self.block_bytes // CHUNK_ALIGNMENT) * CHUNK_ALIGNMENT
        chunks = target // chunk
        chunks_per_request = -(-self.max_model_len // self.block_size)
        return Allocation(chunks, 1, chunks * chunk, chunks * self.max_model_len // chunks_per_request)


class ConfigError(ValueError):
    """Bad engine flags; the message starts with the flag."""


def kv_bytes_per_token_for(model: str, kv_cache_dtype: str = "auto") -> int | None:
    """KV bytes per token of a catalog model (None if the catalog does not know it)."""
    from kvoffload.policy.catalog import find_model
    from kvoffload.policy.kvshape import bytes_per_token

    entry = find_model(model)
    if entry is None:
        return None
    arch = entry.architecture
    dtype_bytes = 1 if kv_cache_dtype.startswith("fp8") else arch.dtype_bytes
    return bytes_per_token(arch, dtype_bytes)


LARGE_GPU_BYTES: Final = 70 * GIB


def default_batch(gpu_class: str | None) -> tuple[int, int]:
    """vLLM's ``vllm serve`` defaults of (max_num_batched_tokens, max_num_seqs) on ``gpu_class``.

    ``EngineArgs.get_batch_defaults``: 8,192 tokens and 1,024 sequences on a GPU of at least 70 GiB
    whose name does not say A100 (H100, H200, MI300X...), else 2,048 and 256. Without a class
    (the seed's laptop GPU, well under 70 GiB), 2,048 and 256.
    """
    from kvoffload.policy.catalog import find_gpu_class

    gpu = find_gpu_class(gpu_class) if gpu_class is not None else None
    if gpu is not None and gpu.memory_bytes >= LARGE_GPU_BYTES and "a100" not in gpu.name.lower():
        return 8192, 1024
    return 2048, 256


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
        parsed.append(
            Tier(str(tier.get("name", tier["type"])), capacity, config.cost.disk_restore_bytes_per_s, str(tier["type"]))
        )
    config.secondary_tiers = tuple(parsed)


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
    gpu_class: str | None = None,
    kv_cache_memory_bytes: int | None = None,
    num_gpu_blocks_override: int | None = None,
    allocate_cpu_gib: float | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    pinning_time_scale: float | None = None,
    speak: str | None = None,
    enable_metrics: bool = False,
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
            parse_version(vllm_version)
        except ValueError as exc:
            raise ConfigError(f"--vllm-version: {exc}") from exc
        cfg.vllm_version = vllm_version
    if startup_delay is not None:
        if startup_delay < 0:
            raise ConfigError(f"--startup-delay: must be >= 0, got {startup_delay}")
        cfg.startup_delay_s = startup_delay
    if itl is not None and itl < 0:
        raise ConfigError(f"--itl: must be >= 0, got {itl}")
    # Issue 11, part 2: price from the class's profile (or the seed's laptop); size the GPU cache as vLLM does.
    cfg.gpu_class = gpu_class
    cfg.kv_cache_memory_bytes = kv_cache_memory_bytes
    cfg.num_gpu_blocks_override = num_gpu_blocks_override
    try:
        cost = sizing.engine_cost(
            gpu_class,
            cfg.model,
            tensor_parallel_size=cfg.tensor_parallel_size,
            block_size=cfg.block_size,
            kv_bytes_per_token=cfg.kv_bytes_per_token,
        )
        cfg.cost = sizing.with_itl(cost, itl)
        cfg.gpu_kv_blocks = sizing.gpu_kv_blocks(
            default_blocks=cfg.gpu_kv_blocks,
            gpu_kv_blocks=gpu_kv_blocks,
            num_gpu_blocks_override=num_gpu_blocks_override,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            utilization_given=gpu_memory_utilization is not None,
            gpu_class=gpu_class,
            model=cfg.model,
            block_bytes=cfg.block_bytes,
            block_size=cfg.block_size,
            tensor_parallel_size=cfg.tensor_parallel_size,
            max_model_len=cfg.max_model_len,
        )
    except sizing.SizingError as exc:
        raise ConfigError(str(exc)) from exc
    if kv_offloading_size is not None:
        if kv_offloading_size <= 0:
            raise ConfigError(f"--kv-offloading-size: must be positive GiB, got {kv_offloading_size}")
        cfg.offload_size_gib = kv_offloading_size
        cfg.cpu_bytes = int(kv_offloading_size * GIB)
        cfg.offload_backend = kv_offloading_backend or "native"  # vLLM PR 32421: native by default
    elif kv_offloading_backend is not None:
        log.warning("--kv-offloading-backend without --kv-offloading-size: offloading stays off (as in vLLM)")
    batched, seqs = default_batch(gpu_class)
    for flag, value in (("--max-num-batched-tokens", max_num_batched_tokens), ("--max-num-seqs", max_num_seqs)):
        if value is not None and value <= 0:
            raise ConfigError(f"{flag}: must be positive, got {value}")
    cfg.max_num_batched_tokens = max_num_batched_tokens or batched
    cfg.max_num_seqs = max_num_seqs or seqs
    if cfg.max_num_batched_tokens < cfg.max_num_seqs:
        raise ConfigError(
            f"--max-num-batched-tokens: {cfg.max_num_batched_tokens} is smaller than --max-num-seqs "
            f"{cfg.max_num_seqs} (vLLM refuses to start)"
        )
    if pinning_time_scale is not None:
        if pinning_time_scale < 0:
            raise ConfigError(f"--pinning-time-scale: must be >= 0, got {pinning_time_scale}")
        cfg.pinning_time_scale = pinning_time_scale
    if allocate_cpu_gib is not None:
        if allocate_cpu_gib < 0:
            raise ConfigError(f"--allocate-cpu-gib: must be >= 0, got {allocate_cpu_gib}")
        cfg.allocate_cpu_bytes = int(allocate_cpu_gib * GIB)
    parse_transfer_config(kv_transfer_config, cfg)
    if cfg.offload_backend is not None and cfg.cpu_bytes is None:
        raise ConfigError(
            "--kv-transfer-config: an offloading connector needs cpu_bytes_to_use or --kv-offloading-size"
        )
    _apply_speak(cfg, speak, enable_metrics)
    return cfg, rest


def _apply_speak(cfg: EngineConfig, speak: str | None, enable_metrics: bool) -> None:
    """``--speak`` and ``--enable-metrics``; what SGLang or TensorRT-LLM cannot run is refused, naming the flag.

    SGLang's HiCache and TensorRT-LLM's host cache are their own offload (the native one, priced as vLLM's here);
    SGLang's radix cache evicts by LRU only, TensorRT-LLM by retention priority then LRU, and TensorRT-LLM has no
    tier beyond its host cache; vLLM has no ``--enable-metrics`` (it always serves /metrics).
    """
    cfg.speak = speak or SPEAK_VLLM
    if cfg.speak not in SPEAKS:
        raise ConfigError(f"--speak: must be one of {', '.join(SPEAKS)}, got {cfg.speak!r}")
    if cfg.speak == SPEAK_VLLM:
        if enable_metrics:
            raise ConfigError("--enable-metrics: SGLang's flag (--speak sglang); vLLM serves /metrics always")
        return
    cfg.enable_metrics = enable_metrics
    who = "SGLang offloads natively (HiCache)" if cfg.speak == SPEAK_SGLANG else "TensorRT-LLM has its host cache"
    if cfg.offload_backend == "lmcache":
        raise ConfigError(f"--kv-offloading-backend: lmcache is a vLLM connector; {who}")
    if cfg.eviction_policy != "lru":
        raise ConfigError(f"--kv-transfer-config: eviction_policy arc; {cfg.speak} evicts by LRU only")
    if cfg.speak == SPEAK_TRTLLM and cfg.secondary_tiers:
        raise ConfigError("--kv-transfer-config: secondary_tiers; TensorRT-LLM has no tier beyond its host cache")
