"""``vllm serve`` for one ladder level: its flags, the KV-transfer JSON and LMCache's variables.

Pure: every value is computed from the policy and the level.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Collection, Mapping, Sequence
from decimal import Context, Decimal, Inexact
from typing import Any

from kvoffload.api.errors import FieldError, PolicyError
from kvoffload.api.quantity import GIB, quantity_bytes
from kvoffload.api.serving import Backend, EvictionPolicy, SecondaryTier
from kvoffload.api.types import KVOffloadPolicy, KVOffloadPolicySpec
from kvoffload.api.versions import version_from_image
from kvoffload.engines.adoption import Adopts, Item
from kvoffload.engines.dialect import Dialect
from kvoffload.engines.engine import PORT, SHM_PATH, Rung, managed_env_errors
from kvoffload.engines.options import ArgProblem, OptionTable
from kvoffload.engines.vllm.dialect import dialect_for
from kvoffload.engines.vllm.flags import CODE_LOADING_DESTS, judge_extra_args, managed_flags, option_table
from kvoffload.engines.vllm.hostmemory import pinned_bytes, pins_per_layer

# vLLM keeps the CPU pool in /dev/shm/vllm_offload_<engine>.mmap (PR 50094) and an
# OOM-kill leaves it there (issue 57303). The memory emptyDir outlives a container
# restart, so the stale file would count against the limit a second time and the
# restarted engine would be OOM-killed again. An initContainer runs only when the
# pod starts, when the emptyDir is new and empty anyway, so the engine container
# clears the files itself before it execs vLLM: that runs on every restart.
ENGINE_COMMAND = ("/bin/sh", "-c", f'rm -f {SHM_PATH}/vllm_offload_*; exec vllm serve "$@"', "vllm")

# vLLM's GPU KV block is 16 tokens on CUDA attention backends; an offload block
# (``block_size`` in kv_connector_extra_config) must be a multiple of it.
GPU_BLOCK_TOKENS = 16

LMCACHE_ENV = frozenset(
    {"LMCACHE_LOCAL_CPU", "LMCACHE_MAX_LOCAL_CPU_SIZE", "LMCACHE_CHUNK_SIZE", "LMCACHE_LOCAL_DISK"}
    | {"LMCACHE_MAX_LOCAL_DISK_SIZE"}
)
# What a level's offload sets on the command line: a referenced container's own are replaced.
OFFLOAD_DESTS = frozenset({"kv_offloading_size", "kv_offloading_backend", "kv_transfer_config"})
# Connectors that only offload (the operator's, or LMCache's): any other (NixlConnector, P2pNcclConnector,
# MultiConnector...) moves KV between engines, which replacing --kv-transfer-config would break.
OFFLOAD_CONNECTORS = frozenset({"OffloadingConnector", "LMCacheConnectorV1", "LMCacheMPConnector", "LMCacheConnector"})
# The modules that run vLLM's OpenAI server, as ``python -m`` names them.
_SERVER_MODULES = ("vllm.entrypoints.openai.api_server",)


def decimal_of(numerator: int, denominator: int) -> str:
    """An exact decimal of a fraction when it terminates (sizes over 2^30 do), else 12 digits."""
    ctx = Context(prec=80, traps=[Inexact])
    try:
        value = ctx.divide(Decimal(numerator), Decimal(denominator))
    except Inexact:
        ctx = Context(prec=12)
        value = ctx.divide(Decimal(numerator), Decimal(denominator))
    return format(value.normalize(ctx), "f")


def gib(n_bytes: int) -> str:
    """Bytes as the GiB figure vLLM's ``--kv-offloading-size`` takes, exact: 536870912 -> ``0.5``.

    vLLM multiplies the parsed float by 2^30; every whole byte count below 2^53
    survives that round trip exactly.
    """
    return decimal_of(n_bytes, GIB)


def _needs_connector_config(spec: KVOffloadPolicySpec, level: Rung) -> bool:
    offload = spec.offload
    return bool(
        level.secondary_tiers
        or offload.block_size is not None
        or offload.eviction_policy != EvictionPolicy.LRU
        or offload.store_threshold is not None
    )


def _fs_tier_config(tier: SecondaryTier) -> dict[str, Any]:
    # vLLM 0.32 FileSystemTierManager(root_dir, n_read_threads, n_write_threads): it
    # has no size setting, so ``size`` bounds the volume instead (policy/render.py).
    return {
        "type": tier.type.value,
        "root_dir": tier.path,
        "n_read_threads": tier.read_threads,
        "n_write_threads": tier.write_threads,
    }


def kv_transfer_config(spec: KVOffloadPolicySpec, level: Rung) -> dict[str, Any] | None:
    """The ``--kv-transfer-config`` object of a level, or None when the plain flags say it all.

    native: OffloadingConnector with ``CPUOffloadingSpec`` (one CPU tier) or
    ``TieringOffloadingSpec`` (CPU plus filesystem tiers), used when the level has
    secondary tiers or the spec sets blockSize, evictionPolicy arc or storeThreshold.
    lmcache: LMCacheConnectorV1, configured through LMCACHE_* variables.
    """
    if level.cpu_bytes is None:
        return None
    offload = spec.offload
    if offload.backend == Backend.LMCACHE:
        return {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    if not _needs_connector_config(spec, level):
        return None
    extra: dict[str, Any] = {
        "spec_name": "TieringOffloadingSpec" if level.secondary_tiers else "CPUOffloadingSpec",
        "cpu_bytes_to_use": level.cpu_bytes,
        "eviction_policy": offload.eviction_policy.value,
    }
    if offload.block_size is not None:
        extra["block_size"] = offload.block_size
    if offload.store_threshold is not None:
        extra["store_threshold"] = offload.store_threshold
    if level.secondary_tiers:
        extra["secondary_tiers"] = [_fs_tier_config(t) for t in level.secondary_tiers]
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": extra}


def offload_args(spec: KVOffloadPolicySpec, level: Rung) -> list[str]:
    """The offload flags of a level (none on the GPU-only level).

    native always carries ``--kv-offloading-size/--kv-offloading-backend``, so
    ``vllm:cache_config_info`` shows the CPU tier on every level (the live config
    check); vLLM then merges ``cpu_bytes_to_use`` into any ``--kv-transfer-config``
    with the same value. lmcache must not: ``--kv-offloading-backend lmcache``
    selects LMCacheMPConnector, which needs a separate LMCache server.
    """
    if level.cpu_bytes is None:
        return []
    args: list[str] = []
    if spec.offload.backend == Backend.NATIVE:
        args += ["--kv-offloading-size", gib(level.cpu_bytes), "--kv-offloading-backend", "native"]
    config = kv_transfer_config(spec, level)
    if config is not None:
        args += ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
    return args


def lmcache_env(spec: KVOffloadPolicySpec, level: Rung) -> list[dict[str, Any]]:
    """LMCACHE_* variables of a level (lmcache backend only).

    LMCache sizes are GiB (it multiplies by 1024**3) per engine process, and every
    TP rank runs its own LMCache engine, so the totals are divided by the TP size.
    """
    if spec.offload.backend != Backend.LMCACHE or level.cpu_bytes is None:
        return []
    ranks = spec.model.tensor_parallel_size
    env = [
        {"name": "LMCACHE_LOCAL_CPU", "value": "True"},
        {"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "value": decimal_of(level.cpu_bytes, GIB * ranks)},
    ]
    if spec.offload.block_size is not None:
        env.append({"name": "LMCACHE_CHUNK_SIZE", "value": str(spec.offload.block_size)})
    for tier in level.secondary_tiers:  # at most one: check() refuses more
        env.append({"name": "LMCACHE_LOCAL_DISK", "value": f"file://{tier.path}/"})
        env.append({"name": "LMCACHE_MAX_LOCAL_DISK_SIZE", "value": decimal_of(quantity_bytes(tier.size), GIB * ranks)})
    return env


def _connector(item: Item) -> str | None:
    """The kv_connector a ``--kv-transfer-config`` item names; None when it names none readable."""
    if item.key is not None:
        return item.value if item.key == "kv_connector" else None
    try:
        config = json.loads(item.value or "")
    except ValueError:
        return None
    connector = config.get("kv_connector") if isinstance(config, dict) else None
    return connector if isinstance(connector, str) else None


class VLLM(Adopts):
    """vLLM's ``vllm serve`` with its native OffloadingConnector or LMCache."""

    name = "vllm"
    title = "vLLM"
    container = "vllm"
    restore_profiled = True  # the GPU profiles time vLLM 0.32's loads
    metrics_path = "/metrics"

    OFFLOAD_DESTS = OFFLOAD_DESTS
    OFFLOAD_ENV_PREFIX = "LMCACHE_"
    DEFAULT_PORT = 8000
    MODEL_DEST = "model"
    MAX_MODEL_LEN_DEST = "max_model_len"
    TP_DEST = "tensor_parallel_size"
    IMAGE_WORD = "vllm"
    POSITIONAL_WINS = True  # vllm serve: model_tag replaces --model
    CODE_DESTS = CODE_LOADING_DESTS
    DASH_O = True

    def table(self) -> OptionTable:
        return option_table()

    def launch(self, tokens: Sequence[str]) -> tuple[int, bool] | None:
        for i, token in enumerate(tokens[:-1]):
            if posixpath.basename(token) == "vllm" and tokens[i + 1] == "serve":
                return i + 2, True
            if token == "-m" and tokens[i + 1] in _SERVER_MODULES:
                return i + 2, False
        return None

    def offload_args(self, spec: KVOffloadPolicySpec, rung: Rung) -> list[str]:
        return offload_args(spec, rung)

    def offload_env(self, spec: KVOffloadPolicySpec, rung: Rung) -> list[dict[str, Any]]:
        return lmcache_env(spec, rung)

    def adopted_problems(self, items: Sequence[Item]) -> list[str]:
        connectors = {c for i in items if i.dest == "kv_transfer_config" and (c := _connector(i)) is not None}
        return [
            f"sets --kv-transfer-config with kv_connector {c}, which moves KV between engines: each level's offload "
            "would replace it (kvoffload does not combine connectors)"
            for c in sorted(connectors - OFFLOAD_CONNECTORS)
        ]

    def pool_in_shm(self, spec: KVOffloadPolicySpec, rung: Rung) -> bool:
        # Since PR 50094 (0.27) vLLM's native pool is a /dev/shm file; before it, per-layer tensors pin anonymous
        # memory (hostmemory.pins_per_layer). LMCache's own buffers are sized as the native pool.
        return not pins_per_layer(spec, rung)

    def pinned_bytes(self, spec: KVOffloadPolicySpec, rung: Rung, layers: int | None) -> int:
        return pinned_bytes(spec, rung, layers)

    def config_files(self, policy: KVOffloadPolicy, rung: Rung) -> dict[str, str]:
        return {}

    def host_reserve(self, spec: KVOffloadPolicySpec, rung: Rung) -> int:
        return 0

    def command(self, spec: KVOffloadPolicySpec) -> list[str]:
        return list(ENGINE_COMMAND)

    def dialect(self, spec: KVOffloadPolicySpec) -> Dialect:
        # model.vllmVersion, else the image tag's version; neither: the newest.
        try:
            return dialect_for(spec.model.vllm_version or version_from_image(spec.image))
        except ValueError as exc:
            raise PolicyError([FieldError("spec.model.vllmVersion", str(exc))]) from None

    def args(self, policy: KVOffloadPolicy, rung: Rung) -> list[str]:
        spec = policy.spec
        model = spec.model
        return [
            "--model",
            model.name,
            "--served-model-name",
            model.served_model_name or policy.metadata.name,
            "--port",
            str(PORT),
            "--max-model-len",
            str(model.max_model_len),
            "--tensor-parallel-size",
            str(model.tensor_parallel_size),
            "--kv-cache-dtype",
            model.kv_cache_dtype.value,
            "--gpu-memory-utilization",
            repr(spec.gpu.memory_utilization),
            *offload_args(spec, rung),
            *model.extra_args,
        ]

    def env(self, spec: KVOffloadPolicySpec, rung: Rung) -> list[dict[str, Any]]:
        return lmcache_env(spec, rung)

    def check(self, policy: KVOffloadPolicy) -> list[FieldError]:
        offload = policy.spec.offload
        errors: list[FieldError] = []
        if offload.backend == Backend.LMCACHE:
            if len(offload.secondary_tiers) > 1:
                errors.append(FieldError("spec.offload.secondaryTiers", "lmcache supports one local disk tier"))
            if offload.eviction_policy != EvictionPolicy.LRU:
                errors.append(
                    FieldError("spec.offload.evictionPolicy", "arc is a native-backend policy; lmcache uses lru")
                )
            if offload.store_threshold is not None:
                errors.append(FieldError("spec.offload.storeThreshold", "applies to the native backend only"))
            errors += managed_env_errors(policy, LMCACHE_ENV, "")
        elif offload.block_size is not None and offload.block_size % GPU_BLOCK_TOKENS:
            errors.append(
                FieldError(
                    "spec.offload.blockSize",
                    f"must be a multiple of vLLM's GPU block size ({GPU_BLOCK_TOKENS} tokens)",
                )
            )
        return errors

    @property
    def code_options(self) -> Mapping[str, str]:
        return CODE_LOADING_DESTS

    @property
    def managed_flags(self) -> Sequence[str]:
        return managed_flags()

    def eager(self, spec: KVOffloadPolicySpec) -> bool:
        if spec.workload is not None:
            return self.last_switch(self.adopted_options(spec), "enforce_eager")
        return any(a == "--enforce-eager" or a.lower() == "--enforce-eager=true" for a in spec.model.extra_args)

    def judge_extra_args(self, args: Sequence[str], *, allowed: Collection[str] = ()) -> list[ArgProblem]:
        return judge_extra_args(args, allowed=allowed)


ENGINE = VLLM()
