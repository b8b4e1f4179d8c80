"""The KVOffloadPolicy custom resource: spec and status as pydantic v2 models.

These models are the single source of the schema: ``kvoffload crd`` turns them
into the CRD, and the operator validates every object through them. Field
names are camelCase on the wire (aliases) and snake_case in Python.
"""

from __future__ import annotations

import itertools
import math
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from kvoffload.api.analysistemplate import CustomMetrics, TemplateRef
from kvoffload.api.baseurl import CRD_DOT_SEGMENT, CRD_PATTERN, base_url_problem
from kvoffload.api.fields import (
    DnsLabel,
    Duration,
    Model,
    Name,
    NonNegativeQuantity,
    Quantity,
    cel_list,
    cel_rules,
)
from kvoffload.api.notifications import NotificationsSpec
from kvoffload.api.podspec import EmptyDirSource, EnvVar, HostPathSource, PodTemplate, PVCSource, Toleration
from kvoffload.api.promql import TemplateError, render_matchers
from kvoffload.api.quantity import parse_duration, parse_quantity
from kvoffload.api.vllmflags import cel_managed_pattern, judge_extra_args

# Ladder level names the operator uses itself (see ladder.py).
RESERVED_LEVEL_NAMES = frozenset({"gpu-only", "cpu-pilot", "cpu"})


# --- spec --------------------------------------------------------------------


class EngineName(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


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


_MANAGED_SPELLING = re.compile(cel_managed_pattern())
_MANAGED_MESSAGE = (
    "may not set a flag the operator manages (its model, port, parallelism, memory and offload flags, however "
    "spelt); set the matching spec field instead"
)


def _not_a_managed_flag(arg: str) -> str:
    if _MANAGED_SPELLING.match(arg):
        found = judge_extra_args([arg])
        raise ValueError(found[0].message if found else _MANAGED_MESSAGE)
    return arg


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
    # 64 items of 2,048 characters keep the CEL rule's regular expression within the API server's cost budget.
    extra_args: list[Annotated[str, Field(max_length=2048), AfterValidator(_not_a_managed_flag)]] = Field(
        default_factory=list,
        max_length=64,
        description="More `vllm serve` arguments; none may set a value the operator manages, however spelt.",
        # The CEL rule catches managed flags spelt outright; the webhook and the operator judge the rest
        # (aliases, abbreviations, values read as the model: api/vllmflags.py, in policy/tenancy.py).
        json_schema_extra=cel_rules((f"self.all(a, !a.matches('{cel_managed_pattern()}'))", _MANAGED_MESSAGE)),
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


class PreflightSpec(Model):
    """Judge, at the end of the GPU-only baseline and before any canary, whether offload can pay at all.

    When it cannot (restore not faster than recompute on the GPU class's profile; GPU memory
    not the constraint; prompts that almost never share a prefix), the policy holds on GPU-only
    with the condition OffloadWillNotPay, and no canary is spent.
    """

    prompt_tokens: int | None = Field(
        default=None,
        ge=1,
        le=10_000_000,
        description="The typical prompt, in tokens, priced for restore against recompute; "
        "default: the baseline's p50 prompt length, else 1480.",
    )
    kv_pressure: float = Field(
        default=0.9,
        gt=0.0,
        le=1.0,
        description="GPU KV cache usage that counts as near full; below it, with no preemptions, "
        "GPU memory is not the constraint.",
    )
    min_prefix_reuse: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description="Least prefix-cache hit rate (cached / looked-up prompt tokens) that shows prompts share "
        "prefixes, judged when GPU memory is not the constraint.",
    )


_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"


class ObserveSelector(Model):
    """The pods of a fleet kvoffload did not render, in the policy's namespace."""

    match_labels: dict[str, Annotated[str, Field(max_length=63, pattern=_LABEL_VALUE)]] = Field(
        min_length=1,
        max_length=16,
        description="Labels every pod of the observed fleet carries (a Deployment's selector, e.g. app: vllm).",
    )

    @field_validator("match_labels")
    @classmethod
    def _label_keys(cls, labels: dict[str, str]) -> dict[str, str]:
        # Keys end up in a label selector the operator sends: a key that is no label key could widen it.
        bad = [k for k in labels if len(k) > 316 or not _LABEL_KEY.match(k)]
        if bad:
            raise ValueError(f"not label keys: {', '.join(map(repr, sorted(bad)))}")
        return labels

    def label_selector(self) -> str:
        """The selector as the API server's ``labelSelector`` query parameter takes it."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.match_labels.items()))


class ObserveSpec(Model):
    """What an observe-only policy analyses: a running fleet the operator leaves alone."""

    selector: ObserveSelector = Field(description="The fleet's pods, in the policy's namespace.")


class RolloutSpec(Model):
    """How each ladder level is introduced."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "!has(self.observeOnly) || !self.observeOnly || has(self.observe)",
                "rollout.observe.selector is required when rollout.observeOnly is true",
                ".observe",
            )
        )
    )

    canary_replicas: int = Field(default=1, ge=1, le=1000, description="Replicas that run a new level first.")
    max_surge: int = Field(default=0, ge=0, le=1000, description="Extra replicas allowed; 0 uses no extra GPUs.")
    pilot_cpu: Quantity | None = Field(default=None, description="A small CPU tier tried first; omit to skip.")
    baseline_duration: Duration = Field(default="10m", description="How long the GPU-only baseline is measured.")
    step_duration: Duration = Field(default="15m", description="How long each canary or promotion step lasts.")
    promotion_steps: list[Annotated[int, Field(ge=1, le=100)]] = Field(
        default_factory=lambda: [25, 50, 100],
        min_length=1,
        max_length=20,
        description="Percent of replicas on the new level, step by step; ends at 100.",
        # isSorted() is Kubernetes' CEL list library; with exists_one it means strictly rising.
        json_schema_extra=cel_rules(
            (
                "self.isSorted() && self.all(s, self.exists_one(t, t == s)) && self[size(self) - 1] == 100",
                "must rise strictly and end at 100",
            )
        ),
    )
    progress_deadline: Duration = Field(default="20m", description="A canary not Ready by then is a failure.")
    auto_promote: bool = Field(default=True, description="false: wait for `kvoffload promote` at each level.")
    preflight: PreflightSpec | None = Field(
        default=None,
        description="Judge whether offload can pay before the first canary; omit to climb without it.",
    )
    observe_only: bool = Field(
        default=False,
        description="true: analyse the fleet of rollout.observe and climb the ladder in status only; no "
        "Deployment, Service or PodMonitor is written. Switching it starts a new ladder from GPU-only.",
    )
    observe: ObserveSpec | None = Field(
        default=None, description="The running fleet an observe-only policy analyses; required with observeOnly."
    )

    @field_validator("promotion_steps")
    @classmethod
    def _steps(cls, steps: list[int]) -> list[int]:
        if any(b <= a for a, b in itertools.pairwise(steps)) or steps[-1] != 100:
            raise ValueError("must rise strictly and end at 100")
        return steps

    @model_validator(mode="after")
    def _observed_fleet(self) -> RolloutSpec:
        if self.observe_only and self.observe is None:
            raise ValueError("rollout.observe.selector is required when rollout.observeOnly is true")
        return self


class WarmupSpec(Model):
    """How long a fresh canary's cache fills before its comparison with the warm stable engines counts."""

    enabled: bool = Field(default=True, description="False: canary/stable comparisons count from the step start.")
    duration: Duration | None = Field(
        default=None,
        description="Least time from the step start; default: analysis.window (then no cold request is left in it).",
    )
    requests: int | None = Field(
        default=None,
        ge=0,
        le=10_000_000,
        description="Least canary requests in the analysis window; default: analysis.minRequests. "
        "The later of the two ends the warm-up.",
    )
    cache_parity: float = Field(
        default=0.9,
        ge=0.0,
        le=1.0,
        description="Warm means warm: the canary's GPU prefix-cache hit rate over the window must reach this share "
        "of the stable's (0: not required). A fresh engine's cache is empty while the stable's is full, so until "
        "it catches up its tail latency measures coldness, not the tier.",
    )
    max_duration: Duration | None = Field(
        default=None,
        description="The longest wait for the cache: after it the warm-up ends even if the canary's cache never "
        "caught up, and the canary is judged one window later (a tier that keeps it cold is what the analysis is "
        "for); never under duration; default: half of rollout.stepDuration.",
    )


class PayoffGate(StrEnum):
    """Whether the live payoff (``analysis.payoff``) gates a canary: what a restored request saves against
    recomputing its prompt, fitted from the canary's and the stable's own series. Not on/off: YAML 1.1 (kubectl's)
    reads those as booleans."""

    AUTO = "auto"
    """Gate levels with a secondary tier; report it on the first CPU tier."""
    GATE = "gate"
    """Gate every level with an offload tier."""
    REPORT = "report"
    """Report it only."""


class ErrorsSpec(Model):
    """The built-in error gate: the share of finished requests the engine failed (vLLM's
    ``vllm:request_success_total`` with ``finished_reason`` abort or error), held to an absolute budget and,
    while a stable side runs, compared with the stable engines' share in the same window."""

    max_share: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description="Absolute budget: the most failed / finished requests of the canary (and of the fleet at the "
        "top, under the Stable guard), 0..1.",
    )
    max_increase: float = Field(
        default=0.02,
        ge=0.0,
        le=1.0,
        description="The most the canary's failed share may exceed the stable's, in share points (0.02: two "
        "percentage points): a difference, so a stable that fails nothing still gives a bound.",
    )


class AnalysisSpec(Model):
    """What Prometheus must show for a level to advance."""

    interval: Duration = Field(default="30s", description="How often analysis runs.")
    window: Duration = Field(default="2m", description="The rate() window.")
    ttft_p99: Duration = Field(default="1500ms", description="Absolute p99 time-to-first-token budget.")
    itl_p99: Duration = Field(default="80ms", description="Absolute p99 inter-token latency budget.")
    max_regression: float = Field(default=1.2, ge=1.0, le=100.0, description="Most canary p99 / stable p99.")
    min_external_share: float = Field(
        default=0.02, ge=0.0, le=1.0, description="Least share of prompt tokens loaded from offload tiers."
    )
    sustained_for: Duration = Field(default="2m", description="How long a breach must last to roll back.")
    false_rollback_rate: float = Field(
        default=0.01,
        gt=0.0,
        le=0.5,
        description="The most share of canary steps that may roll back a canary no worse than the stable: a latency "
        "breach (p99 over its budget, canary/stable over maxRegression) or a failed share over errors.maxShare needs "
        "evidence, a one-sided test at this rate divided by the step's analyses and those five gates, so the bound "
        "holds however often the analysis looks.",
    )
    min_requests: int = Field(default=50, ge=1, le=10_000_000, description="Fewer in the window: inconclusive.")
    max_inconclusive: int = Field(default=10, ge=1, le=10_000, description="Inconclusive verdicts in a row that pause.")
    errors: ErrorsSpec = Field(
        default_factory=ErrorsSpec,
        description="The error gate: failed requests (aborted or errored) against an absolute budget and the stable's.",
    )
    payoff: PayoffGate = Field(
        default=PayoffGate.AUTO,
        description="The live payoff: the saving of a restored request against recomputing it, fitted from both "
        "variants' TTFT and prompt-token series; a canary whose saving is below 0 beyond chance (at "
        "falseRollbackRate) does not pay and fails. auto gates levels with a secondary tier and reports it on the "
        "first CPU tier; gate gates every offload level; report reports it only.",
    )
    warmup: WarmupSpec = Field(
        default_factory=WarmupSpec,
        description="Until one analysis window after it ends, the canary's latency (budgets and ratios) and offload "
        "hit checks are reported, not gated; the error gate and hard failures act at once (like Argo Rollouts' "
        "initialDelay).",
    )
    # Custom metrics (issue 24, items 3 and 4): api/analysistemplate.py.
    metrics: CustomMetrics = Field(
        description="Your own PromQL gates (or, with dryRun, readings), judged beside the built-in ones."
    )
    templates: list[TemplateRef] = Field(
        default_factory=list,
        max_length=8,
        description="KVOffloadAnalysisTemplates whose metrics judge this policy too, read at every analysis.",
    )

    def warmup_seconds(self) -> float:
        """The warm-up's least duration: ``warmup.duration``, else the analysis window."""
        return parse_duration(self.warmup.duration if self.warmup.duration is not None else self.window)

    def warmup_requests(self) -> int:
        """The canary requests the window must hold: ``warmup.requests``, else ``minRequests``."""
        return self.warmup.requests if self.warmup.requests is not None else self.min_requests


class SecretKeyRef(Model):
    name: DnsLabel = Field(description="Secret name, in the policy's namespace.")
    key: str = Field(min_length=1, max_length=253, description="Key holding the token.")


class PrometheusSpec(Model):
    """Where the metrics live."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (f"!has(self.url) || !self.url.matches('{CRD_DOT_SEGMENT}')", "url: no . or .. path segment", ".url")
        )
    )

    url: str = Field(
        default="http://prometheus-operated.monitoring.svc:9090",
        pattern=CRD_PATTERN,
        max_length=2048,
        description="Prometheus base URL: scheme, host, optional port and path; no user, query or fragment.",
    )
    bearer_token_secret: SecretKeyRef | None = Field(default=None, description="Secret with a bearer token.")
    extra_matchers: str | None = Field(
        default=None,
        max_length=1024,
        # Each value a PromQL string literal: a backslash always escapes the next character, so a value cannot
        # end in one and close its literal early (``\"`` reads as a quote inside the string).
        pattern=r'^[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"(\s*,\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*")*$',
        description='Label matchers added to every query, e.g. cluster="prod".',
    )
    monitor_labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=32,
        description="More labels for the rendered PodMonitor, e.g. the release label your Prometheus selects on.",
    )

    @field_validator("url")
    @classmethod
    def _base_url(cls, url: str) -> str:
        problem = base_url_problem(url)
        if problem is not None:
            raise ValueError(problem)
        return url

    @field_validator("extra_matchers")
    @classmethod
    def _matchers_decode(cls, text: str | None) -> str | None:
        # The pattern admits any escape; PromQL knows a few (\q is refused by Prometheus): decode it as the
        # operator will, so a value the queries could not carry is refused here, not each cycle.
        if text is not None:
            try:
                render_matchers(text)
            except TemplateError as exc:
                raise ValueError(str(exc)) from None
        return text


class KVOffloadPolicySpec(Model):
    """The desired state: a vLLM fleet and the offload ladder it should climb."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "self.gpu.count == self.model.tensorParallelSize",
                "gpu.count must equal model.tensorParallelSize (one engine spans its GPUs)",
                ".gpu.count",
            ),
            (
                "!has(self.rollout.pilotCpu)"
                " || quantity(string(self.rollout.pilotCpu)).isLessThan(quantity(string(self.offload.cpu)))",
                "rollout.pilotCpu must be smaller than offload.cpu",
                ".rollout.pilotCpu",
            ),
            (
                "self.rollout.maxSurge != 0 || self.rollout.canaryReplicas < self.replicas",
                "rollout.canaryReplicas must be fewer than replicas when maxSurge is 0",
                ".rollout.canaryReplicas",
            ),
            (
                "!(has(self.model.architecture) && has(self.model.configMap))",
                "set model.architecture or model.configMap, not both",
                ".model.configMap",
            ),
            (
                "has(self.workloadRef) != has(self.model.image)",
                "set model.image or workloadRef, exactly one",
                ".workloadRef",
            ),
            (
                "!has(self.workloadRef) || (!has(self.podTemplate) && !has(self.model.extraArgs)"
                " && !has(self.model.env))",
                "with workloadRef, the referenced Deployment carries the pod, flags and environment: drop "
                "podTemplate, model.extraArgs and model.env",
                ".workloadRef",
            ),
            (
                "!has(self.rollout.preflight) || !has(self.rollout.preflight.promptTokens)"
                " || self.rollout.preflight.promptTokens <= self.model.maxModelLen",
                "rollout.preflight.promptTokens must be at most model.maxModelLen",
                ".rollout.preflight",
            ),
        )
    )

    engine: EngineName = Field(
        default=EngineName.VLLM,
        description="The serving engine: vllm (`vllm serve`, its native OffloadingConnector or LMCache) or sglang "
        "(`sglang.launch_server` with its hierarchical cache; one filesystem tier through its file backend).",
    )
    model: ModelSpec = Field(description="The model and engine.")
    gpu: GPUSpec = Field(description="The GPU class and count per replica.")
    replicas: int = Field(ge=1, le=1000, description="Engine replicas in total.")
    resources: ResourceSpec = Field(description="Host resources per replica.")
    offload: OffloadSpec = Field(description="The offload tiers.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="The staged rollout.")
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec, description="The analysis rules.")
    prometheus: PrometheusSpec = Field(default_factory=PrometheusSpec, description="The metrics source.")
    pod_template: PodTemplate | None = Field(
        default=None,
        description="What to add to the engine pods (Secrets as variables, volumes, scheduling, labels), merged "
        "under what the operator manages.",
    )
    workload_ref: WorkloadRef | None = Field(
        default=None,
        description="A Deployment the team already runs, instead of model.image: each level is its pod template "
        "with only the offload flags, memory, /dev/shm and tier volumes changed; the operator scales it down as "
        "its own engines become Ready, and back up before they go.",
    )
    notifications: NotificationsSpec | None = Field(
        default=None,
        description="Tell the cluster admin's webhook sinks, by name, of promotions, rollbacks, pauses, a step "
        "awaiting kvoffload.io/promote and an invalid spec (absent: no notification). Changing it starts no "
        "new ladder.",
    )

    @model_validator(mode="after")
    def _cross_field(self) -> KVOffloadPolicySpec:
        if self.gpu.count != self.model.tensor_parallel_size:
            raise ValueError("gpu.count must equal model.tensorParallelSize (one engine spans its GPUs)")
        if self.rollout.pilot_cpu is not None and parse_quantity(self.rollout.pilot_cpu) >= parse_quantity(
            self.offload.cpu
        ):
            raise ValueError("rollout.pilotCpu must be smaller than offload.cpu")
        if self.rollout.canary_replicas >= self.replicas and self.rollout.max_surge == 0:
            raise ValueError("rollout.canaryReplicas must be fewer than replicas when maxSurge is 0")
        if self.model.architecture is not None and self.model.config_map is not None:
            raise ValueError("set model.architecture or model.configMap, not both")
        if (self.workload_ref is None) == (self.model.image is None):
            raise ValueError("set model.image or workloadRef, exactly one")
        if self.workload_ref is not None and (self.pod_template is not None or self.model.extra_args or self.model.env):
            raise ValueError(
                "with workloadRef, the referenced Deployment carries the pod, flags and environment: drop "
                "podTemplate, model.extraArgs and model.env"
            )
        tokens = self.rollout.preflight.prompt_tokens if self.rollout.preflight is not None else None
        if tokens is not None and tokens > self.model.max_model_len:
            raise ValueError("rollout.preflight.promptTokens must be at most model.maxModelLen")
        return self

    _workload: AdoptedWorkload | None = PrivateAttr(default=None)

    @property
    def workload(self) -> AdoptedWorkload | None:
        """The Deployment spec.workloadRef names, once read (None before, and without workloadRef)."""
        return self._workload

    def with_workload(self, workload: AdoptedWorkload) -> KVOffloadPolicySpec:
        """This spec with its referenced Deployment read."""
        if self.workload_ref is None:
            raise ValueError("only a spec with workloadRef adopts a Deployment")
        spec = self.model_copy()
        spec._workload = workload
        return spec

    @property
    def image(self) -> str | None:
        """The engine image: model.image, else the referenced container's (None until it is read)."""
        if self.model.image is not None:
            return self.model.image
        return self._workload.image if self._workload is not None else None


class ObjectMeta(BaseModel):
    """The parts of metadata the operator reads; the rest passes through."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, alias_generator=to_camel)

    name: Name = Field(description="Policy name.")
    namespace: str = Field(default="default", description="Policy namespace.")
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


# --- status ------------------------------------------------------------------


class Status(BaseModel):
    """Base for status models: camelCase on the wire, tolerant of older fields."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Phase(StrEnum):
    PENDING = "Pending"
    BASELINE = "Baseline"
    CANARY = "Canary"
    PROMOTING = "Promoting"
    STABLE = "Stable"
    PAUSED = "Paused"
    ROLLED_BACK = "RolledBack"
    HELD = "Held"
    """The preflight found that offload cannot pay: every replica stays on GPU-only (OffloadWillNotPay)."""
    INVALID = "Invalid"


class Mode(StrEnum):
    """Where the ladder's state machine is; Paused is a flag on top of these, not a mode."""

    BASELINE = "Baseline"
    STEP = "Step"
    """A canary or promotion step: a canary Deployment runs."""
    STABLE = "Stable"
    """At the top of the ladder, the guard watching."""
    ROLLED_BACK = "RolledBack"
    """Halted until kvoffload.io/retry or a new generation."""
    HELD = "Held"
    """Held on the GPU-only level by the preflight (offload cannot pay) until kvoffload.io/retry or a new generation."""


class Verdict(StrEnum):
    PASS = "Pass"
    FAIL = "Fail"
    INCONCLUSIVE = "Inconclusive"


class Condition(Status):
    """A Kubernetes-style condition."""

    type: str = Field(description="Condition type, e.g. Ready, Progressing, Degraded.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: datetime = Field(description="When status last changed.")
    observed_generation: int | None = Field(default=None, description="Spec generation this was computed for.")


class StageStatus(Status):
    index: int = Field(description="Ladder level index (0 = GPU-only).")
    name: str = Field(description="Ladder level name.")
    tiers: list[str] = Field(default_factory=list, description="Offload tiers at this level.")
    step: int = Field(default=0, description="0 = canary; n = promotion step n.")
    started_at: datetime | None = Field(default=None, description="When this level or step started.")


class WarmupStatus(Status):
    """The current step's warm-up: the canary's latency is judged from ``judgedFrom``, one window after ``warmAt``."""

    since: datetime = Field(description="When the warm-up started (the step start).")
    duration: str = Field(description="Least warm-up time.")
    requests: int = Field(description="Least canary requests in the analysis window.")
    served: float | None = Field(default=None, description="Canary requests in the window at the latest analysis.")
    cache_parity: float | None = Field(
        default=None, description="Least canary / stable prefix-cache hit rate; unset when not required."
    )
    canary_hit_rate: float | None = Field(
        default=None, description="The canary's GPU prefix-cache hit rate over the window at the latest analysis."
    )
    stable_hit_rate: float | None = Field(
        default=None, description="The stable engines' GPU prefix-cache hit rate over the same window."
    )
    warm_at: datetime | None = Field(default=None, description="When the warm-up ended; unset while it runs.")
    judged_from: datetime | None = Field(
        default=None,
        description="When the canary's latency is judged: warmAt plus the analysis window, so no window that "
        "held a cold request counts.",
    )


class VariantStatus(Status):
    config_hash: str = Field(description="Hash of the rendered engine config.")
    level: int = Field(description="Ladder level index.")
    tiers: list[str] = Field(default_factory=list, description="Offload tiers.")
    cpu_size: str | None = Field(default=None, description="CPU tier size, if any.")
    replicas: int = Field(default=0, description="Desired replicas.")
    ready: int = Field(default=0, description="Ready replicas.")


class RetiringStatus(Status):
    """A level whose Deployment drains after the roles moved off it (the old stable after a promotion)."""

    level_name: str = Field(description="Ladder level name; the Deployment is <policy>-<level name>.")
    config_hash: str = Field(description="Hash of the engine config its pods run.")
    replicas: int = Field(
        default=0, description="Replicas it keeps this cycle; they go as the new level's pods become Ready."
    )
    ready: int = Field(default=0, description="Ready replicas.")


class Percentiles(Status):
    p50: float | None = Field(default=None, description="Median (histogram_quantile 0.5).")
    p95: float | None = Field(default=None, description="95th percentile.")
    p99: float | None = Field(default=None, description="99th percentile.")


class BaselineStatus(Status):
    ttft_p99: float | None = Field(default=None, description="p99 TTFT, seconds.")
    itl_p99: float | None = Field(default=None, description="p99 ITL, seconds.")
    request_rate: float | None = Field(default=None, description="Requests per second.")
    gpu_kv_usage: float | None = Field(
        default=None, description="GPU KV cache usage, 0 to 1, averaged over the window."
    )
    taken_at: datetime | None = Field(default=None, description="When the baseline was taken.")
    # The workload, as a careful operator records it before offloading (issue 11, part 5).
    prompt_tokens: Percentiles | None = Field(
        default=None, description="Prompt length per request, tokens, at p50/p95/p99."
    )
    ttft: Percentiles | None = Field(default=None, description="Time to first token, seconds, at p50/p95/p99.")
    itl: Percentiles | None = Field(default=None, description="Inter-token latency, seconds, at p50/p95/p99.")
    e2e_latency: Percentiles | None = Field(
        default=None, alias="e2eLatency", description="End-to-end request latency, seconds, at p50/p95/p99."
    )
    concurrency: float | None = Field(
        default=None, description="Requests running per engine, averaged over the window and the engines."
    )
    prefix_cache_hit_rate: float | None = Field(
        default=None, description="Prompt tokens found in the GPU prefix cache / prompt tokens looked up, 0 to 1."
    )
    gpu_kv_usage_max: float | None = Field(
        default=None, description="Highest GPU KV cache usage an engine showed in the window, 0 to 1."
    )
    preemption_rate: float | None = Field(
        default=None,
        description="Requests preempted per second for lack of GPU KV blocks, whole fleet (eviction pressure).",
    )


class PreflightStatus(Status):
    judged_at: datetime = Field(description="When the preflight judged, at the end of the GPU-only baseline.")
    pays: bool = Field(description="false: offload cannot pay and the policy holds (OffloadWillNotPay).")
    prompt_tokens: int | None = Field(default=None, description="The prompt priced, tokens.")
    recompute_ms: float | None = Field(default=None, description="Prefill of that prompt from nothing cached, ms.")
    restore_ms: float | None = Field(default=None, description="Loading that prompt's KV from the CPU tier, ms.")
    ratio: float | None = Field(default=None, description="recomputeMs / restoreMs; at most 1: restore is no faster.")
    profile: str = Field(default="", description="The cost profile priced: GPU class and measured or estimated.")
    refused: list[str] = Field(default_factory=list, description="Reasons of the rules that found offload cannot pay.")
    not_judged: list[str] = Field(default_factory=list, description="Rules that could not be judged, and why.")
    message: str = Field(default="", description="The verdict with its figures.")


class PayoffFigures(Status):
    """What the live payoff fitted: TTFT = fixed x requests + prefill x computed tokens + restore x restored tokens
    (+ a GPU-hit term where it can be told apart), by weighted least squares over both variants' sub-windows."""

    fixed_ms: float | None = Field(
        default=None, description="Per-request fixed cost of TTFT, ms; null where not separable from prefill."
    )
    prefill_us_per_token: float | None = Field(
        default=None, description="Prefill per computed prompt token, µs; null where not separable from fixed."
    )
    restore_us_per_token: float | None = Field(
        default=None, description="The canary's restore per restored token, µs; null where prefill is not separable."
    )
    saving_us_per_token: float = Field(description="Prefill minus restore per restored token, µs.")
    restored_tokens_per_request: float = Field(description="The canary's restored tokens per request.")
    sub_windows: int = Field(description="Sub-windows fitted, both variants.")
    degrees_of_freedom: int = Field(description="Sub-windows less the figures fitted.")


class MetricResult(Status):
    name: str = Field(description="Metric, e.g. ttftP99.")
    canary: float | None = Field(default=None, description="Canary value.")
    stable: float | None = Field(default=None, description="Stable value.")
    threshold: float | None = Field(default=None, description="The bound it is held to.")
    passed: bool | None = Field(default=None, description="true pass, false breach, null not judged.")
    message: str = Field(default="", description="Why.")
    # Built-in latency and error gates (analysis/evidence.py): how sure the verdict is.
    p_value: float | None = Field(
        default=None,
        description="One-sided p-value: the chance of evidence this strong against a canary no worse than the bound.",
    )
    alpha: float | None = Field(
        default=None, description="The p-value a breach must come under to count (analysis.falseRollbackRate shared)."
    )
    interval: list[float] | None = Field(
        default=None, max_length=2, description="95 % confidence interval of the canary value: [low, high]."
    )
    requests_needed: int | None = Field(
        default=None,
        description="Canary requests the window would need for the breach seen to count, when it is Inconclusive.",
    )
    # The payoff row only (analysis/payoff.py).
    payoff: PayoffFigures | None = Field(
        default=None, description="The payoff row: the figures fitted from both variants' sub-windows."
    )
    forecast_saving_ms: float | None = Field(
        default=None,
        description="The payoff row: the saving per restored request the economics forecast (kvoffload plan), ms.",
    )
    # Custom metrics only (api/analysistemplate.py); unset on the built-in ones.
    dry_run: bool | None = Field(default=None, description="Custom metric: true when it is shown and never decides.")
    template: str | None = Field(
        default=None, description="Custom metric: the KVOffloadAnalysisTemplate that judged it, as name@generation."
    )
    failing_since: datetime | None = Field(
        default=None, description="Custom metric: when its current run of breaches began."
    )
    sustained: bool | None = Field(
        default=None,
        description="Custom metric: its breach has lasted its sustainedFor (a gated one then rolls back; a dry-run "
        "one would have).",
    )

    @field_serializer("canary", "stable", "threshold")
    def _finite(self, value: float | None) -> float | None:
        # A custom metric may read +Inf or -Inf (judged: a breach of a max or a min; the message says so), which
        # JSON cannot carry: the API server would refuse the whole status. Written as null.
        return value if value is None or math.isfinite(value) else None


class AnalysisStatus(Status):
    time: datetime = Field(description="When the analysis ran.")
    verdict: Verdict = Field(description="Pass, Fail or Inconclusive.")
    message: str = Field(default="", description="Summary.")
    metrics: list[MetricResult] = Field(default_factory=list, description="Each metric judged.")
    consecutive_failures: int = Field(default=0, description="Fail verdicts in a row.")
    consecutive_inconclusive: int = Field(default=0, description="Inconclusive verdicts in a row.")
    failing_since: datetime | None = Field(default=None, description="Start of the current run of Fail verdicts.")


class HostMemoryStatus(Status):
    pinned: str = Field(description="Pinned pool per replica.")
    shm: str = Field(description="/dev/shm size limit per replica.")
    request: str = Field(description="Memory request per replica.")
    limit: str = Field(description="Memory limit per replica (= request).")


class HistoryEntry(Status):
    time: datetime = Field(description="When it was decided.")
    stage: str = Field(description="Ladder level name then.")
    decision: str = Field(description="What was decided, e.g. Promote, Rollback.")
    reason: str = Field(description="CamelCase reason.")
    message: str = Field(default="", description="Detail with figures.")


class ObserveStatus(Status):
    """An observe-only policy's fleet: what it analyses, and what it cannot judge there."""

    selector: str = Field(description="The label selector of the observed pods (spec.rollout.observe.selector).")
    pods: int = Field(default=0, description="Pods that match it now (terminating ones left out).")
    ready: int = Field(default=0, description="Of those, the Ready ones: what the ladder's steps wait for.")
    not_judged: list[str] = Field(
        default_factory=list, description="What observe mode cannot judge on a fleet without the tier, and why."
    )


class WorkloadStatus(Status):
    """The Deployment spec.workloadRef took over."""

    name: str = Field(description="The Deployment.")
    template_digest: str = Field(description="Digest of its pod template: a change starts a new ladder.")
    original_replicas: int = Field(description="What it ran before the takeover; given back on release.")
    replicas: int = Field(description="What the operator leaves it: fewer as the operator's engines become Ready.")


class KVOffloadPolicyStatus(Status):
    """What the operator observed and decided; written only by the operator."""

    phase: Phase = Field(default=Phase.PENDING, description="Derived from the conditions.")
    mode: Mode | None = Field(
        default=None, description="Where the ladder's state machine is: Baseline, Step, Stable or RolledBack."
    )
    observed_generation: int | None = Field(default=None, description="Spec generation last acted on.")
    stage: StageStatus | None = Field(default=None, description="Where on the ladder the rollout is.")
    ladder: list[str] = Field(default_factory=list, description="Ladder level names, bottom first.")
    stable: VariantStatus | None = Field(default=None, description="The stable variant.")
    canary: VariantStatus | None = Field(default=None, description="The canary variant, while one runs.")
    retiring: list[RetiringStatus] = Field(
        default_factory=list, description="Levels draining after the roles moved off them, while they have pods."
    )
    warmup: WarmupStatus | None = Field(default=None, description="The current step's canary warm-up.")
    baseline: BaselineStatus | None = Field(default=None, description="The GPU-only baseline.")
    preflight: PreflightStatus | None = Field(
        default=None, description="The preflight's verdict on this ladder, when spec.rollout.preflight judged one."
    )
    observe: ObserveStatus | None = Field(
        default=None, description="Set while spec.rollout.observeOnly: the fleet analysed, nothing applied."
    )
    last_analysis: AnalysisStatus | None = Field(default=None, description="The latest analysis.")
    host_memory: HostMemoryStatus | None = Field(default=None, description="Host memory per replica.")
    conditions: list[Condition] = Field(default_factory=list, description="Kubernetes-style conditions.")
    history: list[HistoryEntry] = Field(default_factory=list, description="The last 20 decisions.")
    annotations_seen: dict[str, str] = Field(
        default_factory=dict, description="Manual-control annotation values already acted on."
    )
    message: str = Field(default="", description="A one-line summary.")
    replicas: int | None = Field(
        default=None, description="Engine replicas the policy's Deployments run now, every level together (/scale)."
    )
    selector: str | None = Field(
        default=None, description="Label selector of every engine pod of the policy (/scale, for HPA and KEDA)."
    )
    workload: WorkloadStatus | None = Field(
        default=None, description="spec.workloadRef's Deployment: its template digest and the replicas it keeps."
    )
    spec_digest: str | None = Field(
        default=None,
        description="Digest of the spec without replicas: a change of replicas alone resizes the shares, "
        "any other change starts a new ladder.",
    )
    # Display strings for `kubectl get kvop`: printer columns take one JSONPath and cannot join or format.
    tiers_summary: str = Field(
        default="",
        description="Offload tiers of the current stage joined for display, e.g. cpu+nvme; none if GPU-only.",
    )
    canary_summary: str = Field(default="", description="Canary and stable replicas for display, e.g. 1/3.")
    ttft_p99: str = Field(
        default="", description="Latest p99 time to first token for display (canary while one runs), e.g. 212ms."
    )
    external_share: str = Field(
        default="", description="Latest share of prompt tokens loaded from offload tiers for display, e.g. 31.0%."
    )


class KVOffloadPolicy(BaseModel):
    """A whole KVOffloadPolicy object."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    api_version: Literal["kvoffload.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["KVOffloadPolicy"]
    metadata: ObjectMeta
    spec: KVOffloadPolicySpec
    status: KVOffloadPolicyStatus | None = None
