"""``trtllm-serve`` for one ladder level: its command line, and the ``--extra_llm_api_options`` YAML that holds the
level's KV-cache settings, its host cache among them.

TensorRT-LLM cannot be installed here (docs/engines.md), so every fact below is read from its sources, saved in
``tools/trtllm-sources/`` and turned into tables by ``scripts/trtllm_options.py``; tests/engines check every rendered
file against those tables (``extra_options.problems``) and every flag against ``trtllm-serve``'s options:

- The options that have a flag (host, port, TP size, sequence length, KV dtype, served name) go on the command
  line; the KV cache's own settings have none (``host_cache_size``, ``enable_block_reuse``,
  ``secondary_offload_min_priority``) and go in the file as ``kv_cache_config``, with the GPU memory share beside
  them. The file is merged over the flags' values, explicit flags winning (serve.py's ``--config`` help text).
- The host cache is pinned host memory allocated whole at start, per rank: each rank's block pools get
  ``BufferManager::pinned`` of ``host_cache_size`` bytes (rounded down to whole blocks), and ``host_cache_size`` is
  not divided or all-reduced across ranks (``kvCacheManager.cpp`` ``allocatePools``, ``resource_manager.py``
  ``calculate_max_num_blocks``, at ``b35ac1b6``). ``spec.offload.cpu`` is the tier "total across TP ranks", so each
  rank gets its share: ``host_cache_size = cpu // tp``, and the pod pins ``tp × host_cache_size``.
- ``--backend`` is not rendered: at ``44373a31`` it is a deprecated option whose default is ``pytorch``, the backend
  rendered here; ``extraArgs`` may not set it.
"""

from __future__ import annotations

import posixpath
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

import yaml

from kvoffload.api.errors import FieldError
from kvoffload.api.serving import Backend, EvictionPolicy, KVCacheDtype
from kvoffload.api.types import KVOffloadPolicy, KVOffloadPolicySpec
from kvoffload.engines.adoption import Adopts, Item
from kvoffload.engines.dialect import Dialect
from kvoffload.engines.engine import CONFIG_DIR, PORT, Rung
from kvoffload.engines.options import ArgProblem, OptionTable
from kvoffload.engines.trtllm import options
from kvoffload.engines.trtllm.dialect import METRICS_PATH
from kvoffload.engines.trtllm.dialect import TRTLLM as TRTLLM_DIALECT

LAUNCH: Final = "trtllm-serve"
CONFIG_FILE: Final = "extra-llm-api-options.yaml"
CONFIG_PATH: Final = posixpath.join(CONFIG_DIR, CONFIG_FILE)

# Blocks at or above this retention priority may move to the host cache: the eviction policy offloads a block
# when ``level >= mSecondaryOffloadMinPriority`` (batch_manager/evictionPolicy.cpp), and a block's default
# priority is ``KvCacheRetentionConfig::kDefaultRetentionPriority = 35`` (executor.h; both read in the index at no
# pinned commit): so 35, the seeds' value, offloads every block of default priority. TensorRT-LLM's own default
# is None (its C++ default then applies, not read here).
SECONDARY_OFFLOAD_MIN_PRIORITY: Final = 35

# spec.model.kvCacheDtype -> trtllm-serve's --kv_cache_dtype (choices auto, fp8, nvfp4 at 44373a31). fp8 there is
# the checkpoint's FP8 KV format; the other spellings have no value of their own and are refused by check().
KV_CACHE_DTYPES: Final[Mapping[KVCacheDtype, str]] = {KVCacheDtype.AUTO: "auto", KVCacheDtype.FP8: "fp8"}


def host_cache_size(spec: KVOffloadPolicySpec, rung: Rung) -> int | None:
    """``kv_cache_config.host_cache_size`` of ``rung``: each rank's share of the CPU tier, in bytes (None on a level
    without one). Every rank pins the whole value, so the shares add up to the tier, less under ``tp`` bytes."""
    if rung.cpu_bytes is None:
        return None
    return rung.cpu_bytes // spec.model.tensor_parallel_size


def extra_options(spec: KVOffloadPolicySpec, rung: Rung) -> dict[str, Any]:
    """The ``--extra_llm_api_options`` mapping of ``rung`` (``TorchLlmArgs`` keys)."""
    kv: dict[str, Any] = {
        "enable_block_reuse": True,
        # Not vLLM's share: TensorRT-LLM gives the KV cache this fraction of the GPU memory left free after the
        # weights and activations, where vLLM caps everything at this fraction of the whole GPU. The sizing's GPU
        # KV estimate is vLLM's rule; it errs low for TensorRT-LLM.
        "free_gpu_memory_fraction": spec.gpu.memory_utilization,
    }
    size = host_cache_size(spec, rung)
    if size is not None:
        kv["host_cache_size"] = size
        kv["secondary_offload_min_priority"] = SECONDARY_OFFLOAD_MIN_PRIORITY
    return {
        "kv_cache_config": kv,
        # The per-request series (TTFT, e2e, tokens) need return_perf_metrics, the iteration ones (KV usage, host
        # cache, transfers) enable_iter_perf_stats (collector.py's docstrings): the gates read both.
        "return_perf_metrics": True,
        "enable_iter_perf_stats": True,
    }


def config_text(spec: KVOffloadPolicySpec, rung: Rung) -> str:
    return yaml.safe_dump(extra_options(spec, rung), sort_keys=False)


class TensorRTLLM(Adopts):
    """TensorRT-LLM's ``trtllm-serve`` (PyTorch backend) with its host cache as the CPU tier."""

    name = "trtllm"
    title = "TensorRT-LLM"
    container = "trtllm"
    # The shipped GPU profiles time vLLM's restore path, not TensorRT-LLM's onboarding of host blocks.
    restore_profiled = False
    metrics_path = METRICS_PATH  # trtllm-serve's own /metrics answers JSON

    # What a level's offload sets on the command line: the file. A container's own is replaced (adoption_problems
    # says what that loses).
    OFFLOAD_DESTS = frozenset({"extra_llm_api_options"})
    # No variable configures the host cache. Environment names cannot contain "=", so this prefix keeps them all.
    OFFLOAD_ENV_PREFIX = "="
    DEFAULT_PORT = 8000
    MODEL_DEST = "model"  # no option sets it: the model is trtllm-serve's one positional argument
    MAX_MODEL_LEN_DEST = "max_seq_len"
    TP_DEST = "tensor_parallel_size"
    # Never matched (image_repository() is a last path segment, which holds no "/"): NGC's TensorRT-LLM image
    # (nvcr.io/nvidia/tensorrt-llm/release) runs whatever its command says, not trtllm-serve, so a container is
    # recognised by its command or args only.
    IMAGE_WORD = "/"
    POSITIONAL_WINS = True
    CODE_DESTS = options.CODE_LOADING_DESTS

    def table(self) -> OptionTable:
        return options.walk_table()

    def launch(self, tokens: Sequence[str]) -> tuple[int, bool] | None:
        for i, token in enumerate(tokens):
            if posixpath.basename(token) == LAUNCH:
                start = i + 1
                # serve is click's command, named "serve"; trtllm-serve MODEL reaches it by default.
                if start < len(tokens) and tokens[start] == "serve":
                    start += 1
                return start, True
        return None

    def offload_args(self, spec: KVOffloadPolicySpec, rung: Rung) -> list[str]:
        # Every level, the GPU-only one included: the file also turns on the series the gates read.
        return ["--extra_llm_api_options", CONFIG_PATH]

    def offload_env(self, spec: KVOffloadPolicySpec, rung: Rung) -> list[dict[str, Any]]:
        return []

    def adopted_problems(self, items: Sequence[Item]) -> list[str]:
        problems = [
            f"sets {item.spelt} {item.value}: its options live in that file, which the operator cannot read, and "
            f"each level's own file ({CONFIG_PATH}) would replace it; move them into args, or into spec.model"
            for item in items
            if item.dest == "extra_llm_api_options" and item.value is not None
        ]
        problems += [
            f"sets {item.spelt} {item.value}, applied after the level's own file: it would override the level's "
            "KV-cache settings"
            for item in items
            if item.dest == "config_overrides" and (item.value or "").startswith("kv_cache_config")
        ]
        return problems

    def pool_in_shm(self, spec: KVOffloadPolicySpec, rung: Rung) -> bool:
        return False  # BufferManager::pinned: cudaHostAlloc'd anonymous memory, which the memory request holds

    def host_reserve(self, spec: KVOffloadPolicySpec, rung: Rung) -> int:
        return 0

    def pinned_bytes(self, spec: KVOffloadPolicySpec, rung: Rung, layers: int | None) -> int:
        # An upper bound by less than a block per rank: each rank rounds host_cache_size down to whole blocks,
        # whose size (the rank's KV heads, layers, tokens per block) the rule does not need.
        size = host_cache_size(spec, rung)
        return 0 if size is None else size * spec.model.tensor_parallel_size

    def config_files(self, policy: KVOffloadPolicy, rung: Rung) -> dict[str, str]:
        return {CONFIG_FILE: config_text(policy.spec, rung)}

    def command(self, spec: KVOffloadPolicySpec) -> list[str]:
        return [LAUNCH]

    def dialect(self, spec: KVOffloadPolicySpec) -> Dialect:
        return TRTLLM_DIALECT

    def args(self, policy: KVOffloadPolicy, rung: Rung) -> list[str]:
        spec = policy.spec
        model = spec.model
        return [
            model.name,
            "--host",
            "0.0.0.0",
            "--port",
            str(PORT),
            "--tp_size",
            str(model.tensor_parallel_size),
            "--max_seq_len",
            str(model.max_model_len),
            "--kv_cache_dtype",
            KV_CACHE_DTYPES.get(model.kv_cache_dtype, model.kv_cache_dtype.value),
            "--served_model_name",
            model.served_model_name or policy.metadata.name,
            *self.offload_args(spec, rung),
            *model.extra_args,
        ]

    def env(self, spec: KVOffloadPolicySpec, rung: Rung) -> list[dict[str, Any]]:
        return []

    def check(self, policy: KVOffloadPolicy) -> list[FieldError]:
        spec = policy.spec
        offload = spec.offload
        errors: list[FieldError] = []
        if offload.backend != Backend.NATIVE:
            errors.append(
                FieldError(
                    "spec.offload.backend", "lmcache is a vLLM connector; TensorRT-LLM offloads to its own host cache"
                )
            )
        # TensorRT-LLM's secondary memory is the host cache alone: no file tier the operator could size or mount.
        errors += [
            FieldError(f"spec.offload.secondaryTiers[{i}]", "TensorRT-LLM has no tier beyond its host cache (CPU)")
            for i in range(len(offload.secondary_tiers))
        ]
        if offload.eviction_policy != EvictionPolicy.LRU:
            errors.append(
                FieldError("spec.offload.evictionPolicy", "TensorRT-LLM evicts by retention priority, then LRU")
            )
        for field, value in (("blockSize", offload.block_size), ("storeThreshold", offload.store_threshold)):
            if value is not None:
                errors.append(FieldError(f"spec.offload.{field}", "applies to vLLM's native offload only"))
        if spec.model.vllm_version is not None:
            errors.append(FieldError("spec.model.vllmVersion", "applies to engine vllm only"))
        if spec.model.kv_cache_dtype not in KV_CACHE_DTYPES:
            takes = ", ".join(sorted(d.value for d in KV_CACHE_DTYPES))
            errors.append(FieldError("spec.model.kvCacheDtype", f"TensorRT-LLM's --kv_cache_dtype takes {takes}"))
        return errors

    @property
    def code_options(self) -> Mapping[str, str]:
        return options.CODE_LOADING_DESTS

    @property
    def managed_flags(self) -> Sequence[str]:
        return options.managed_flags()

    def eager(self, spec: KVOffloadPolicySpec) -> bool:
        # CUDA graphs are a cuda_graph_config in the extra-options file, which kvoffload writes without one: the
        # PyTorch backend's default (graphs on) holds unless an adopted container's own file says otherwise.
        return False

    def judge_extra_args(self, args: Sequence[str], *, allowed: Collection[str] = ()) -> list[ArgProblem]:
        return options.judge_extra_args(args, allowed=allowed)


ENGINE = TensorRTLLM()
