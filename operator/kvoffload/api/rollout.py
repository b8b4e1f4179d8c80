"""How a policy climbs its ladder and what judges each level: the rollout (preflight, observe-only, steps)
and the analysis (warm-up, error gate, live payoff, budgets); parts of the spec."""

from __future__ import annotations

import itertools
import re
from enum import StrEnum
from typing import Annotated

from pydantic import ConfigDict, Field, field_validator, model_validator

from kvoffload.api.analysistemplate import CustomMetrics, TemplateRef
from kvoffload.api.fields import Duration, Model, Quantity, cel_rules
from kvoffload.api.quantity import parse_duration


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
