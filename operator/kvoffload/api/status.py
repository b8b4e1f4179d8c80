"""What the operator observed and decided: the KVOffloadPolicy status models, written only by the operator."""

from __future__ import annotations

import math
from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer
from pydantic.alias_generators import to_camel


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
