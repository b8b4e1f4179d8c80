"""What a policy serves and on what: the engine, the model and its KV shape, the GPUs, host resources, the
offload tiers, and the Deployment a policy may take over (``spec.workloadRef``); parts of the spec."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvoffload.api.fields import DnsLabel, Model, Name, NonNegativeQuantity, Quantity, cel_list, cel_rules
from kvoffload.api.podspec import EmptyDirSource, EnvVar, HostPathSource, PVCSource, Toleration

# Ladder level names the operator uses itself (see ladder.py).
RESERVED_LEVEL_NAMES = frozenset({"gpu-only", "cpu-pilot", "cpu"})


@dataclass(frozen=True)
class KnownEngine:
    """A serving engine ``spec.engine`` may name, as ``api/data/engines.json`` lists it."""

    name: str
    title: str
    managed_patterns: tuple[str, ...]
    """RE2 patterns of an ``extraArgs`` item that spells one of the engine's managed flags outright (several where
    one would cost more than the API server allows a rule)."""


def _engine_table() -> tuple[str, tuple[KnownEngine, ...]]:
    # api is the bottom floor and may not ask engines/: scripts/engine_tables.py writes the file from the registered
    # engines, and a test fails when it differs.
    raw: dict[str, Any] = json.loads(
        (resources.files("kvoffload.api") / "data" / "engines.json").read_text(encoding="utf-8")
    )
    engines = tuple(KnownEngine(e["name"], e["title"], tuple(e["managedPatterns"])) for e in raw["engines"])
    return str(raw["default"]), engines


DEFAULT_ENGINE, KNOWN_ENGINES = _engine_table()
ENGINE_NAMES: tuple[str, ...] = tuple(e.name for e in KNOWN_ENGINES)


def managed_flag_rules() -> list[tuple[str, str, str]]:
    """The spec's CEL rules on ``model.extraArgs``, one per engine and pattern: each applies its engine's pattern
    only to a policy of that engine. The webhook and the operator judge the rest (aliases, abbreviations, values
    read as the model), with the engine's own option table (``Engine.judge_extra_args``, in policy/tenancy.py)."""
    return [
        (
            f"self.engine != '{e.name}' || !has(self.model.extraArgs)"
            f" || self.model.extraArgs.all(a, !a.matches('{pattern}'))",
            f"may not set a flag the operator manages ({e.title}'s model, port, parallelism, memory and offload "
            "flags, however spelt); set the matching spec field instead",
            ".model.extraArgs",
        )
        for e in KNOWN_ENGINES
        for pattern in e.managed_patterns
    ]


class KVCacheDtype(StrEnum):
    AUTO = "auto"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FP8 = "fp8"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"


class Backend(StrEnum):
    NATIVE = "native"
    LMCACHE = "lmcache"


class EvictionPolicy(StrEnum):
    LRU = "lru"
    ARC = "arc"


class TierType(StrEnum):
    FS = "fs"


class Architecture(Model):
    """The KV-relevant shape of a model; overrides the built-in catalog."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "has(self.kvLoraRank) != (has(self.numKVHeads) && has(self.headDim))",
                "give either numKVHeads and headDim (MHA/GQA) or kvLoraRank and qkRopeHeadDim (MLA)",
            )
        )
    )

    num_layers: int = Field(ge=1, le=1024, description="Transformer layers that hold KV (num_hidden_layers).")
    num_kv_heads: int | None = Field(
        default=None,
        alias="numKVHeads",
        ge=1,
        le=1024,
        description="KV heads per layer (num_key_value_heads); omit for MLA.",
    )
    head_dim: int | None = Field(default=None, ge=1, le=4096, description="Dimension of one attention head.")
    kv_lora_rank: int | None = Field(default=None, ge=1, le=65536, description="MLA only: compressed KV rank.")
    qk_rope_head_dim: int | None = Field(default=None, ge=0, le=4096, description="MLA only: RoPE key dimension.")
    dtype_bytes: int = Field(
        default=2, ge=1, le=8, description="Bytes per KV element when kvCacheDtype is auto (model dtype)."
    )

    @model_validator(mode="after")
    def _one_attention_kind(self) -> Architecture:
        mla = self.kv_lora_rank is not None
        mha = self.num_kv_heads is not None and self.head_dim is not None
        if mla == mha:
            raise ValueError("give either numKVHeads and headDim (MHA/GQA) or kvLoraRank and qkRopeHeadDim (MLA)")
        return self


class ConfigMapRef(Model):
    """A ConfigMap key holding a Hugging Face config.json."""

    name: DnsLabel = Field(description="ConfigMap name, in the policy's namespace.")
    key: str = Field(default="config.json", min_length=1, max_length=253, description="Key holding config.json.")


class ModelSpec(Model):
    """What vLLM serves and how."""

    name: str = Field(min_length=1, max_length=512, description="Model that `vllm serve` loads (HF id or path).")
    served_model_name: str | None = Field(
        default=None, min_length=1, max_length=253, description="Name clients use; default: metadata.name."
    )
    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        pattern=r"^[^\s]+$",
        description="vLLM image, pinned; its tag selects the metric dialect. Absent with spec.workloadRef, whose "
        "container's image is used.",
    )
    vllm_version: str | None = Field(
        default=None,
        pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?([.+-][0-9A-Za-z.]+)?$",
        max_length=64,
        description="vLLM version, when the image tag does not tell it.",
    )
    max_model_len: int = Field(ge=16, le=10_000_000, description="Longest prompt plus output, in tokens.")
    tensor_parallel_size: int = Field(default=1, ge=1, le=64, description="GPUs one engine spans (TP ranks).")
    kv_cache_dtype: KVCacheDtype = Field(default=KVCacheDtype.AUTO, description="KV cache element type.")
    architecture: Architecture | None = Field(
        default=None, description="KV shape of the model; default: the built-in catalog."
    )
    config_map: ConfigMapRef | None = Field(
        default=None, description="A ConfigMap holding the model's HF config.json, instead of the catalog."
    )
    # 64 items of 2,048 characters keep the CEL rules' regular expressions (managed_flag_rules, on the spec, where
    # they see spec.engine) within the API server's cost budget (scripts/engine_tables.py, MAX_PATTERN).
    extra_args: list[Annotated[str, Field(max_length=2048)]] = Field(
        default_factory=list,
        max_length=64,
        description="More arguments for the engine's command line; none may set a value the operator manages, "
        "however spelt (the engine's own option table judges them).",
    )
    env: list[EnvVar] = Field(default_factory=list, max_length=128, description="More environment variables.")


class GPUSpec(Model):
    """Which GPUs each replica gets."""

    class_: str = Field(
        alias="class",
        min_length=1,
        max_length=63,
        description="GPU class from the catalog (e.g. nvidia-h100-80gb): resource, node labels, host RAM.",
    )
    count: int = Field(default=1, ge=1, le=16, description="GPUs per replica; must equal tensorParallelSize.")
    memory_utilization: float = Field(
        default=0.90, gt=0.0, le=0.99, description="--gpu-memory-utilization: share of GPU memory vLLM may use."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, max_length=64, description="Extra node labels to select on."
    )
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64, description="Extra tolerations.")


class ResourceSpec(Model):
    """Host resources per replica, apart from the pinned pool."""

    base_memory: Quantity = Field(description="Engine process memory without offload.")
    headroom: NonNegativeQuantity = Field(default="4Gi", description="OS, page cache and co-located processes.")
    cpu: Quantity = Field(default="8", description="CPU request and limit.")


class TierVolume(Model):
    """Where a filesystem tier lives: exactly one source."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "(has(self.emptyDir) ? 1 : 0) + (has(self.persistentVolumeClaim) ? 1 : 0)"
                " + (has(self.hostPath) ? 1 : 0) == 1",
                "set exactly one of emptyDir, persistentVolumeClaim or hostPath",
            )
        )
    )

    empty_dir: EmptyDirSource | None = Field(default=None, description="Node-local scratch space.")
    persistent_volume_claim: PVCSource | None = Field(default=None, description="A claim, e.g. local NVMe.")
    host_path: HostPathSource | None = Field(default=None, description="A path on the node.")

    @model_validator(mode="after")
    def _exactly_one(self) -> TierVolume:
        count = sum(v is not None for v in (self.empty_dir, self.persistent_volume_claim, self.host_path))
        if count != 1:
            raise ValueError("set exactly one of emptyDir, persistentVolumeClaim or hostPath")
        return self


class SecondaryTier(Model):
    """A filesystem tier after the CPU tier."""

    name: DnsLabel = Field(description="Tier name, unique in the policy; names the ladder level.")
    type: TierType = Field(default=TierType.FS, description="Tier type; fs is the only one today.")
    size: Quantity = Field(description="Bytes this tier may hold.")
    path: str = Field(min_length=2, max_length=1024, pattern=r"^/", description="Mount path in the container.")
    read_threads: int = Field(default=16, ge=1, le=1024, description="Reader threads.")
    write_threads: int = Field(default=8, ge=1, le=1024, description="Writer threads.")
    volume: TierVolume = Field(default_factory=lambda: TierVolume(empty_dir=EmptyDirSource()), description="Volume.")


class OffloadSpec(Model):
    """The offload tiers to climb to."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "!has(self.storeThreshold) || !has(self.secondaryTiers) || size(self.secondaryTiers) == 0",
                "storeThreshold applies only to a single CPU tier, without secondaryTiers",
                ".storeThreshold",
            )
        )
    )

    backend: Backend = Field(default=Backend.NATIVE, description="native (vLLM OffloadingConnector) or lmcache.")
    cpu: Quantity = Field(description="CPU tier size, total across TP ranks (--kv-offloading-size).")
    block_size: int | None = Field(default=None, ge=1, le=4096, description="Offload block size in tokens.")
    eviction_policy: EvictionPolicy = Field(default=EvictionPolicy.LRU, description="CPU tier eviction: lru or arc.")
    store_threshold: int | None = Field(
        default=None, ge=0, le=1000, description="Store a block only after this many hits; single CPU tier only."
    )
    secondary_tiers: list[SecondaryTier] = Field(
        default_factory=list,
        max_length=8,
        description="Filesystem tiers, in order, after the CPU tier.",
        json_schema_extra=cel_rules(
            ("self.all(t, self.exists_one(u, u.name == t.name))", "secondaryTiers names must be unique"),
            (
                f"self.all(t, !(t.name in {cel_list(RESERVED_LEVEL_NAMES)}))",
                f"secondaryTiers may not be named {', '.join(sorted(RESERVED_LEVEL_NAMES))}: those name ladder levels",
            ),
        ),
    )
    overhead_factor: float = Field(
        default=1.0, ge=1.0, le=4.0, description="Pinned pool / configured CPU tier; >1 where vLLM overshoots."
    )

    @model_validator(mode="after")
    def _tiers(self) -> OffloadSpec:
        names = [t.name for t in self.secondary_tiers]
        if len(set(names)) != len(names):
            raise ValueError("secondaryTiers names must be unique")
        if reserved := RESERVED_LEVEL_NAMES.intersection(names):
            raise ValueError(f"secondaryTiers may not be named {', '.join(sorted(reserved))}: those name ladder levels")
        if self.store_threshold is not None and self.secondary_tiers:
            raise ValueError("storeThreshold applies only to a single CPU tier, without secondaryTiers")
        return self


class WorkloadAPIVersion(StrEnum):
    APPS_V1 = "apps/v1"


class WorkloadKind(StrEnum):
    DEPLOYMENT = "Deployment"


class WorkloadRef(Model):
    """A Deployment the team already runs, taken over level by level as Argo Rollouts' ``workloadRef`` does."""

    api_version: WorkloadAPIVersion = Field(
        default=WorkloadAPIVersion.APPS_V1, description="apps/v1, the only one today."
    )
    kind: WorkloadKind = Field(default=WorkloadKind.DEPLOYMENT, description="Deployment, the only one today.")
    name: Name = Field(description="The Deployment, in the policy's namespace.")
    container: DnsLabel | None = Field(
        default=None, description="The engine container, when the pod has more than one."
    )


class AdoptedWorkload(BaseModel):
    """The referenced Deployment as the operator (or ``kvoffload render --workload``) read it. Never part of
    the CRD: it rides on the spec it was read for (``KVOffloadPolicySpec.with_workload``)."""

    model_config = ConfigDict(frozen=True)

    name: str
    replicas: int
    """What it ran before the takeover: its recorded count, else its spec.replicas when first read."""
    template: dict[str, Any]
    """Its spec.template, as read."""
    container: str
    """The engine container's name."""
    image: str
    digest: str
    """A digest of the template: a change starts a new ladder, as a spec change does."""
