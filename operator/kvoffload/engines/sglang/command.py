"""``python3 -m sglang.launch_server`` for one ladder level, with SGLang's hierarchical cache (HiCache).

The facts below are SGLang 0.5.23's (the ``sglang`` wheel on PyPI), and every rendered command line is
checked by its own parser (tests/sglang):

- ``--hicache-size`` is an int, "the size of host KV cache memory pool in gigabytes", read as
  ``host_size * 1e9`` bytes by each rank's pool (``mem_cache/pool_host/base.py`` line 223), so the CPU
  tier must be whole decimal gigabytes per TP rank. It overrides ``--hicache-ratio``.
- The pool is anonymous host memory pinned with cudaHostRegister (``mem_cache/pool_host/common.py``
  ``alloc_with_host_register``), not a /dev/shm file: the memory request holds it, /dev/shm does not. SGLang
  allocates it only while its cgroup's headroom less 10 GiB holds it, so the request holds those 10 GiB too.
- The one secondary tier is the ``file`` storage backend, whose directory is
  ``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR`` (``mem_cache/hicache_storage.py`` ``HiCacheFile``; the
  variable wins over the backend's extra config). It has no size setting; the volume bounds it.
- SGLang binds 127.0.0.1:30000 by default (``arg_groups/fields/serving.py``) and serves ``/metrics`` only
  with ``--enable-metrics``.
"""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from kvoffload.api.errors import FieldError
from kvoffload.api.quantity import GIB, quantity_bytes
from kvoffload.api.serving import Backend, EvictionPolicy, KVCacheDtype
from kvoffload.api.types import KVOffloadPolicy, KVOffloadPolicySpec
from kvoffload.engines.adoption import Adopts
from kvoffload.engines.dialect import Dialect
from kvoffload.engines.engine import PORT, Rung, managed_env_errors
from kvoffload.engines.options import ArgProblem, OptionTable, judge_extra_args, load_option_table, managed_flags
from kvoffload.engines.sglang.dialect import SGLANG as SGLANG_DIALECT
from kvoffload.engines.sglang.hostmemory import pinned_bytes

LAUNCH = ("python3", "-m", "sglang.launch_server")
GB = 10**9
FILE_BACKEND_DIR = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"
# HICACHE_HOST_MEMORY_RESERVE_BYTES (mem_cache/pool_host/base.py line 28): what must stay free beside the pool.
HOST_RESERVE = 10 * GIB

# spec.model.kvCacheDtype values SGLang 0.5.23's --kv-cache-dtype takes as they are spelt.
KV_CACHE_DTYPES = frozenset({KVCacheDtype.AUTO, KVCacheDtype.BFLOAT16, KVCacheDtype.FP8_E4M3, KVCacheDtype.FP8_E5M2})

# dest -> why extraArgs may not set it (SGLang's parser's dests).
_RENDERED = "the operator renders it from the spec"
_POOL = "the pinned pool is sized from spec.offload per ladder level"
MANAGED_DESTS: Mapping[str, str] = {
    "model_path": _RENDERED + " (spec.model.name)",
    "served_model_name": _RENDERED + " (spec.model.servedModelName)",
    "host": _RENDERED + ": the probes, the Service and the PodMonitor use it",
    "port": _RENDERED + ": the probes, the Service and the PodMonitor use it",
    "context_length": _RENDERED + " (spec.model.maxModelLen), and the sizing uses it",
    "tp_size": _RENDERED + " (spec.model.tensorParallelSize), and the GPUs and pinned pool follow it",
    "kv_cache_dtype": _RENDERED + " (spec.model.kvCacheDtype), and the bytes per token follow it",
    "mem_fraction_static": _RENDERED + " (spec.gpu.memoryUtilization)",
    "enable_metrics": _RENDERED + ": the analysis reads /metrics",
    "enable_hierarchical_cache": _RENDERED + " per ladder level: " + _POOL,
    "hicache_size": _RENDERED + " per ladder level: " + _POOL,
    "hicache_ratio": _POOL + " (--hicache-size), which a ratio would override or resize",
    "hicache_host_memory_fraction": _POOL + " (--hicache-size)",
    "hicache_host_memory_mode": _POOL + ", as a cache tier",
    "hicache_storage_backend": _RENDERED + " per ladder level (spec.offload.secondaryTiers)",
    "hicache_storage_backend_extra_config": "it can move the storage tier off the volume the operator mounts",
    "dp_size": "more engines per pod would each pin a pool the memory request does not hold",
    "pp_size": "it changes the GPUs an engine spans, which spec.gpu.count sets",
    "nnodes": "an engine spanning pods is not what the operator sizes",
    "cpu_offload_gb": "weights offloaded to host memory are pinned memory the request does not hold",
    "enable_lmcache": "LMCache's host buffers are pinned memory the request does not hold",
    "enable_flexkv": "FlexKV's host buffers are pinned memory the request does not hold",
    "config": "a config file can set any flag, managed ones included",
    # The GPU memory share and the KV pool: the sizing and the analysis read them from the spec.
    "max_total_tokens": "it caps the KV pool outright, below what spec.gpu.memoryUtilization gives it",
    # Host memory beside the pool: pinned or held copies the memory request does not hold.
    "enable_weights_cpu_backup": "a copy of the weights in host memory the request does not hold",
    "enable_draft_weights_cpu_backup": "a copy of the draft model's weights in host memory the request does not hold",
    "disaggregation_decode_enable_offload_kvcache": "a KV offload tier beside the pool the operator renders",
    "enable_unified_cache_external_linker": "an external KV store beside the tiers the operator renders",
    "offload_mode": "weights offloaded to host memory are pinned memory the request does not hold",
    "offload_group_size": "weights offloaded to host memory are pinned memory the request does not hold",
    "offload_num_in_group": "weights offloaded to host memory are pinned memory the request does not hold",
    "offload_prefetch_step": "weights offloaded to host memory are pinned memory the request does not hold",
    "ple_offload_embedding": "embedding weights in pinned host memory the request does not hold",
    "ple_offload_backend": "embedding weights in pinned host memory the request does not hold",
    "kt_weight_path": "experts run from host memory the request does not hold (ktransformers)",
}
# What a level's offload sets on the command line: a referenced container's own are replaced. LMCache too, which
# SGLang refuses beside HiCache (tests/sglang: with-lmcache).
OFFLOAD_DESTS = frozenset(
    {
        "enable_hierarchical_cache",
        "hicache_size",
        "hicache_ratio",
        "hicache_host_memory_fraction",
        "hicache_host_memory_mode",
        "hicache_storage_backend",
        "hicache_storage_backend_extra_config",
        "enable_lmcache",
    }
)

# dest -> why it loads code beyond the image's own entry points and the model's weights; refused unless the
# cluster admin allows it (Tenancy.code_options, --allowed-code-option).
_IMPORTS = "it names a Python object (module.qualname) that SGLang imports and runs"
CODE_LOADING_DESTS: Mapping[str, str] = {
    "trust_remote_code": "the model repository's own Python code runs in the engine",
    "custom_weight_loader": _IMPORTS + " to load weights",
    "forward_hooks": "its hook_factory entries are Python objects that SGLang imports and attaches to the model",
    "sidecar": "it names a Python module that SGLang runs as a sidecar process",
    "enable_custom_logit_processor": "clients may then send serialized (dill) logit processors, code that runs in "
    "the engine",
    "radix_cache_backend": "it selects a plug-in's radix cache implementation",
}


@functools.cache
def option_table() -> OptionTable:
    """SGLang 0.5.23's launch_server options (its own parser: ``scripts/sglang_options.py``)."""
    return load_option_table("kvoffload.engines.sglang", "sglang-options.json")


def hicache_gigabytes(cpu_bytes: int, ranks: int) -> int | None:
    """``--hicache-size`` for a CPU tier of ``cpu_bytes`` over ``ranks``; None when it is not whole gigabytes."""
    per_rank, rest = divmod(cpu_bytes, ranks * GB)
    return per_rank if not rest and per_rank > 0 else None


class SGLang(Adopts):
    """SGLang with HiCache: a pinned host pool, and the file storage backend as its one further tier."""

    name = "sglang"
    title = "SGLang"
    container = "sglang"
    restore_profiled = False
    metrics_path = "/metrics"

    OFFLOAD_DESTS = OFFLOAD_DESTS
    OFFLOAD_ENV_PREFIX = "SGLANG_HICACHE_"
    DEFAULT_PORT = 30000
    MODEL_DEST = "model_path"
    MAX_MODEL_LEN_DEST = "context_length"
    TP_DEST = "tp_size"
    IMAGE_WORD = "sglang"
    POSITIONAL_WINS = False  # sglang serve MODEL: the positional is read as a leading --model-path
    CODE_DESTS = CODE_LOADING_DESTS

    def table(self) -> OptionTable:
        return option_table()

    def launch(self, tokens: Sequence[str]) -> tuple[int, bool] | None:
        for i, token in enumerate(tokens[:-1]):
            if token == "-m" and tokens[i + 1] == "sglang.launch_server":
                return i + 2, False
            if posixpath.basename(token) == "sglang" and tokens[i + 1] == "serve":
                return i + 2, True
        return None

    def offload_args(self, spec: KVOffloadPolicySpec, rung: Rung) -> list[str]:
        if rung.cpu_bytes is None:
            return []
        size = hicache_gigabytes(rung.cpu_bytes, spec.model.tensor_parallel_size)
        if size is None:  # check() refused it already
            raise ValueError(f"{rung.cpu_bytes} bytes are not whole gigabytes per rank")
        args = ["--enable-hierarchical-cache", "--hicache-size", str(size)]
        if rung.secondary_tiers:
            args += ["--hicache-storage-backend", "file"]
        return args

    def offload_env(self, spec: KVOffloadPolicySpec, rung: Rung) -> list[dict[str, Any]]:
        return self.env(spec, rung)

    def pool_in_shm(self, spec: KVOffloadPolicySpec, rung: Rung) -> bool:
        return False

    def host_reserve(self, spec: KVOffloadPolicySpec, rung: Rung) -> int:
        # SGLang refuses to allocate the host pool unless its cgroup's headroom, less HOST_RESERVE, holds it
        # (mem_cache/pool_host/base.py lines 248-257, host_memory.py 136-162).
        return HOST_RESERVE if rung.cpu_bytes is not None else 0

    def pinned_bytes(self, spec: KVOffloadPolicySpec, rung: Rung, layers: int | None) -> int:
        return pinned_bytes(rung)

    def config_files(self, policy: KVOffloadPolicy, rung: Rung) -> dict[str, str]:
        return {}

    def command(self, spec: KVOffloadPolicySpec) -> list[str]:
        return list(LAUNCH)

    def dialect(self, spec: KVOffloadPolicySpec) -> Dialect:
        return SGLANG_DIALECT

    def args(self, policy: KVOffloadPolicy, rung: Rung) -> list[str]:
        spec = policy.spec
        model = spec.model
        args = [
            "--model-path",
            model.name,
            "--served-model-name",
            model.served_model_name or policy.metadata.name,
            "--host",
            "0.0.0.0",
            "--port",
            str(PORT),
            "--context-length",
            str(model.max_model_len),
            "--tp-size",
            str(model.tensor_parallel_size),
            "--kv-cache-dtype",
            model.kv_cache_dtype.value,
            "--mem-fraction-static",
            repr(spec.gpu.memory_utilization),
            "--enable-metrics",
            *self.offload_args(spec, rung),
        ]
        return [*args, *model.extra_args]

    def env(self, spec: KVOffloadPolicySpec, rung: Rung) -> list[dict[str, Any]]:
        if rung.cpu_bytes is None or not rung.secondary_tiers:
            return []
        return [{"name": FILE_BACKEND_DIR, "value": rung.secondary_tiers[0].path}]

    def check(self, policy: KVOffloadPolicy) -> list[FieldError]:
        spec = policy.spec
        offload = spec.offload
        ranks = spec.model.tensor_parallel_size
        errors: list[FieldError] = []
        if offload.backend != Backend.NATIVE:
            errors.append(FieldError("spec.offload.backend", "lmcache is a vLLM connector; SGLang offloads natively"))
        if offload.eviction_policy != EvictionPolicy.LRU:
            errors.append(FieldError("spec.offload.evictionPolicy", "SGLang's radix cache evicts by LRU only"))
        for field, value in (("blockSize", offload.block_size), ("storeThreshold", offload.store_threshold)):
            if value is not None:
                errors.append(FieldError(f"spec.offload.{field}", "applies to vLLM's native offload only"))
        if len(offload.secondary_tiers) > 1:
            errors.append(FieldError("spec.offload.secondaryTiers", "SGLang has one storage tier (its file backend)"))
        if spec.model.vllm_version is not None:
            errors.append(FieldError("spec.model.vllmVersion", "applies to engine vllm only"))
        if spec.model.kv_cache_dtype not in KV_CACHE_DTYPES:
            takes = ", ".join(sorted(d.value for d in KV_CACHE_DTYPES))
            errors.append(FieldError("spec.model.kvCacheDtype", f"SGLang's --kv-cache-dtype takes {takes}"))
        sizes = [("spec.offload.cpu", offload.cpu)]
        if spec.rollout.pilot_cpu is not None:
            sizes.append(("spec.rollout.pilotCpu", spec.rollout.pilot_cpu))
        for where, size in sizes:
            if hicache_gigabytes(quantity_bytes(size), ranks) is None:
                errors.append(
                    FieldError(
                        where,
                        f"SGLang's --hicache-size takes whole gigabytes (10^9 bytes) per TP rank: {size} over "
                        f"{ranks} rank(s) is not; use a multiple of {ranks}G",
                    )
                )
        return errors + managed_env_errors(policy, frozenset({FILE_BACKEND_DIR}), "")

    @property
    def code_options(self) -> Mapping[str, str]:
        return CODE_LOADING_DESTS

    @property
    def managed_flags(self) -> Sequence[str]:
        return managed_flags(option_table(), MANAGED_DESTS)

    def eager(self, spec: KVOffloadPolicySpec) -> bool:
        if spec.workload is not None:
            return self.last_switch(self.adopted_options(spec), "disable_cuda_graph")
        return any(
            a == "--disable-cuda-graph" or a.lower() == "--disable-cuda-graph=true" for a in spec.model.extra_args
        )

    def judge_extra_args(self, args: Sequence[str], *, allowed: Collection[str] = ()) -> list[ArgProblem]:
        return judge_extra_args(
            args, option_table(), managed=MANAGED_DESTS, code=CODE_LOADING_DESTS, allowed=allowed, engine="SGLang"
        )


ENGINE = SGLang()
