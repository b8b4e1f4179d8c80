"""The preflight: can offload pay on this fleet at all? Judged once, at the end of the GPU-only baseline.

``spec.rollout.preflight`` (off when absent) asks ``decide()`` to judge, before the
first canary of a ladder whose baseline ran on GPU-only, whether any CPU tier can
pay. When it cannot, the policy holds on GPU-only (mode and phase Held,
``OffloadWillNotPay=True``, ``Stalled=True``) and no canary is spent; a new
generation or ``kvoffload.io/retry`` starts a new baseline and judges again.

The rules (issue 11, part 5). Each refuses only on evidence: a figure that is
missing leaves its rule unjudged (listed in ``notJudged``), never refusing.

1. **RestoreNotFaster.** Loading the typical prompt's KV from the CPU tier is not
   faster than recomputing it (recompute / restore ≤ 1), priced on the shipped
   cost profile of the policy's GPU class (``economics.breakeven``). The controller
   prices it (rollout may not import economics) and passes a ``RestorePrice``.
2. **GPUMemoryNotConstrained.** The highest GPU KV cache usage of the baseline stayed
   below ``kvPressure`` and no request was preempted. Then the GPU already keeps every
   reused prefix, and what it hits is all the reuse there is: a CPU tier would hold
   what nobody asks for again. (A proxy, as the issue states it: vLLM's usage gauge
   counts the blocks running requests hold, not the free blocks that still cache
   prefixes, so a prefix can be evicted below ``kvPressure`` when the prompts of the
   window add up to more than the cache; the rule does not see that.)
3. **NoPrefixReuse.** With no memory pressure (rule 2's premise), the prefix-cache
   hit rate is the reuse rate; below ``minPrefixReuse`` prompts almost never share a
   prefix. Under memory pressure the hit rate understates reuse (evicted prefixes
   are misses), so the rule is not judged there.

**Not judged: "the predicted external share is below minExternalShare".** It needs
a trace to predict from (the one-pass LRU curve of ``kvoffload simulate``), and the
policy names no trace. This module does not invent a prediction: every verdict lists
the rule under ``notJudged``.

Pure: the spec, the baseline's figures and a price in, a judgment out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from kvoffload.analysis.measurements import VariantSample
from kvoffload.api.conventions import Reason
from kvoffload.api.rollout import PreflightSpec
from kvoffload.api.status import BaselineStatus, PreflightStatus

DEFAULT_PROMPT_TOKENS = 1480
"""The typical prompt when the policy names none and the baseline saw none: the seed's 1,480 tokens
(the same default as ``economics.breakeven.DEFAULT_PROMPT_TOKENS``; a test keeps them equal)."""

EXTERNAL_SHARE_NOT_JUDGED = "predicted external share vs minExternalShare: needs a trace, and the policy names none"

RULE_TEXT: dict[Reason, str] = {
    Reason.RESTORE_NOT_FASTER: "restore is not faster than recompute",
    Reason.NO_PREFIX_REUSE: "prompts almost never share a prefix",
    Reason.GPU_MEMORY_NOT_CONSTRAINED: "GPU memory is not the constraint",
}
"""Each refusing rule as a person reads it, in the order they are reported (the first is the condition's reason)."""


@dataclass(frozen=True)
class RestorePrice:
    """Recompute against restore of one prompt on the policy's GPU class, or why it could not be priced.

    The controller fills it from ``economics.breakeven`` with the GPU class's shipped profile.
    """

    prompt_tokens: int
    recompute_ms: float | None = None
    """Prefill of the whole prompt from nothing cached."""
    restore_ms: float | None = None
    """Loading the prompt's KV from the CPU tier the way vLLM 0.32 does."""
    profile: str = ""
    """The profile's GPU class."""
    profile_kind: str = ""
    """``measured`` or ``estimated``."""
    error: str | None = None
    """Why there is no price (no profile for the class, no prefill curve for the model)."""

    @property
    def ratio(self) -> float | None:
        """recompute / restore: how many times faster a CPU-tier hit is than a miss; None unpriced."""
        if self.error is not None or self.recompute_ms is None or self.restore_ms is None:
            return None
        return self.recompute_ms / self.restore_ms if self.restore_ms > 0 else math.inf


@dataclass(frozen=True)
class PreflightJudgment:
    """The preflight's verdict: whether offload may pay, which rules refused, and the figures."""

    pays: bool
    refused: tuple[Reason, ...]
    not_judged: tuple[str, ...]
    price: RestorePrice | None
    message: str

    @property
    def reason(self) -> Reason:
        """The condition's reason: the first rule that refused, else OffloadMayPay."""
        return self.refused[0] if self.refused else Reason.OFFLOAD_MAY_PAY

    def status(self, now: datetime) -> PreflightStatus:
        """What ``status.preflight`` shows."""
        price = self.price
        priced = price if price is not None and price.ratio is not None else None
        return PreflightStatus(
            judged_at=now,
            pays=self.pays,
            prompt_tokens=price.prompt_tokens if price is not None else None,
            recompute_ms=priced.recompute_ms if priced is not None else None,
            restore_ms=priced.restore_ms if priced is not None else None,
            ratio=_finite(priced.ratio) if priced is not None else None,
            profile=f"{priced.profile} ({priced.profile_kind})" if priced is not None else "",
            refused=[str(r) for r in self.refused],
            not_judged=list(self.not_judged),
            message=self.message,
        )


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def prompt_tokens_for(preflight: PreflightSpec, sample: VariantSample | None) -> int:
    """The prompt to price: ``promptTokens``, else the baseline's p50 prompt length, else 1,480."""
    if preflight.prompt_tokens is not None:
        return preflight.prompt_tokens
    p50 = sample.workload.prompt_tokens.p50 if sample is not None and sample.workload is not None else None
    if p50 is not None and math.isfinite(p50) and p50 >= 1:
        return round(p50)
    return DEFAULT_PROMPT_TOKENS


def judge(preflight: PreflightSpec, baseline: BaselineStatus, price: RestorePrice | None) -> PreflightJudgment:
    """Whether offload can pay, from the baseline's figures and the restore price (see the module's rules)."""
    refused: list[Reason] = []
    not_judged: list[str] = []

    ratio = price.ratio if price is not None else None
    if ratio is None:
        why = price.error if price is not None and price.error else "no price was given"
        not_judged.append(f"restore vs recompute: {why}")
    elif ratio <= 1.0:
        refused.append(Reason.RESTORE_NOT_FASTER)

    kv_max, preemptions = baseline.gpu_kv_usage_max, baseline.preemption_rate
    pressure: bool | None
    if (kv_max is not None and kv_max >= preflight.kv_pressure) or (preemptions is not None and preemptions > 0):
        pressure = True
    elif kv_max is not None and preemptions is not None:
        pressure = False
    else:
        pressure = None
        missing = " and ".join(n for n, v in (("max KV usage", kv_max), ("preemptions", preemptions)) if v is None)
        not_judged.append(f"GPU memory pressure: no {missing} figures")

    hit_rate = baseline.prefix_cache_hit_rate
    if pressure is False:
        if hit_rate is None:
            not_judged.append("prefix reuse: no prefix-cache figures")
        elif hit_rate < preflight.min_prefix_reuse:
            refused.append(Reason.NO_PREFIX_REUSE)
        refused.append(Reason.GPU_MEMORY_NOT_CONSTRAINED)
    elif pressure is True:
        not_judged.append("prefix reuse: under memory pressure the hit rate understates it")
    not_judged.append(EXTERNAL_SHARE_NOT_JUDGED)

    ordered = tuple(r for r in RULE_TEXT if r in refused)
    pays = not ordered
    verdict = "offload may pay" if pays else f"offload will not pay: {', '.join(RULE_TEXT[r] for r in ordered)}"
    message = f"{verdict} ({figures(preflight, baseline, price)}); not judged: {'; '.join(not_judged)}"
    return PreflightJudgment(pays, ordered, tuple(not_judged), price, message)


def figures(preflight: PreflightSpec, baseline: BaselineStatus, price: RestorePrice | None) -> str:
    """The figures every verdict shows: the ratio with recompute and restore ms, max KV usage, preemptions/s,
    the prefix-cache hit rate, each beside the bound it is held to."""
    if price is None:
        restore = "restore vs recompute not priced"
    elif price.ratio is None:
        restore = f"restore vs recompute not priced ({price.prompt_tokens:,}-token prompt)"
    else:
        restore = (
            f"recompute/restore {price.ratio:.2f}x: recompute {price.recompute_ms:.1f} ms, "
            f"restore {price.restore_ms:.1f} ms for a {price.prompt_tokens:,}-token prompt "
            f"({price.profile_kind} profile {price.profile})"
        )
    kv = "n/a" if baseline.gpu_kv_usage_max is None else f"{baseline.gpu_kv_usage_max:.0%}"
    preempt = "n/a" if baseline.preemption_rate is None else f"{baseline.preemption_rate:.3g}/s"
    hits = "n/a" if baseline.prefix_cache_hit_rate is None else f"{baseline.prefix_cache_hit_rate:.1%}"
    return (
        f"{restore}; max GPU KV usage {kv} (kvPressure {preflight.kv_pressure:.0%}); preemptions {preempt}; "
        f"prefix-cache hit rate {hits} (minPrefixReuse {preflight.min_prefix_reuse:.0%})"
    )
