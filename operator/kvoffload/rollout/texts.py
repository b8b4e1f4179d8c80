"""The words of the status: messages, figures and names as a person reads them in ``kubectl describe``."""

from __future__ import annotations

from collections.abc import Sequence

from kvoffload.analysis import measurements
from kvoffload.analysis.assess import EXTERNAL_SHARE, ITL_P99, TTFT_P99
from kvoffload.api.quantity import format_duration, to_quantity
from kvoffload.api.status import AnalysisStatus, BaselineStatus
from kvoffload.policy.ladder import Level
from kvoffload.rollout.context import Ctx, Outcome, inconclusive_count, too_inconclusive
from kvoffload.rollout.observations import PodObservation


def unschedulable_text(pods: Sequence[PodObservation]) -> str:
    """Why the scheduler cannot place a canary pod, when it cannot: the first such pod, in its own words."""
    stuck = next((p for p in pods if p.unschedulable), None)
    return f"; pod {stuck.name} cannot be scheduled: {stuck.unschedulable}" if stuck is not None else ""


def display_of(o: Outcome, analysis: AnalysisStatus | None) -> dict[str, str]:
    """The printer-column strings: tiers, canary/stable replicas, the subject's p99 TTFT and external share."""

    def subject(name: str) -> float | None:
        found = next((m for m in analysis.metrics if m.name == name), None) if analysis is not None else None
        if found is None:
            return None
        return found.canary if o.canary is not None else found.stable

    ttft, share = subject(TTFT_P99), subject(EXTERNAL_SHARE)
    return {
        "tiers_summary": "+".join(o.stage.tiers) or "none",
        "canary_summary": f"{o.canary.replicas if o.canary is not None else 0}/{o.stable.replicas}",  # the targets
        "ttft_p99": "" if ttft is None else f"{ttft * 1000:.0f}ms",
        "external_share": "" if share is None else f"{share:.1%}",
    }


def not_scraped_message(ctx: Ctx) -> str | None:
    """Why the evidence is missing, when the reason is that no Prometheus scrapes the policy's pods: Prometheus
    answered with no series of any of them, ``maxInconclusive`` cycles in a row (so not a pod's first scrape)."""
    if not (measurements.not_scraped(ctx.obs.measurements) and too_inconclusive(ctx)):
        return None
    monitor = ctx.obs.pod_monitor
    if monitor is not None:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(monitor.labels.items())) or "none"
        named = f"its PodMonitor {monitor.name} (labels: {labels})"
    else:
        policy = (ctx.status.selector or "").partition("=")[2]
        own = ", ".join(f"{k}={v}" for k, v in sorted(ctx.spec.prometheus.monitor_labels.items()))
        named = f"its PodMonitor {policy or '(named after the policy)'}"
        named += f" (labels from spec.prometheus.monitorLabels: {own or 'none'}, and the operator's --monitor-label)"
    return (
        f"Prometheus holds no series of any pod of this policy after {inconclusive_count(ctx)} analysis cycles: "
        f"no Prometheus scrapes {named}, or what scrapes the pods does not copy their kvoffload.io labels. "
        "A Prometheus scrapes only the PodMonitors its podMonitorSelector selects (kube-prometheus-stack's "
        "selects release: <its release name>); give the PodMonitor that label with kvoffload run "
        "--monitor-label KEY=VALUE or spec.prometheus.monitorLabels"
    )


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else format_duration(value)


def baseline_text(b: BaselineStatus) -> str:
    rate = "n/a" if b.request_rate is None else f"{b.request_rate:.2f} req/s"
    usage = "n/a" if b.gpu_kv_usage is None else f"{b.gpu_kv_usage:.0%}"
    text = f"p99 TTFT {_seconds(b.ttft_p99)}, p99 ITL {_seconds(b.itl_p99)}, {rate}, GPU KV {usage}"
    extra: list[str] = []
    if b.prompt_tokens is not None and b.prompt_tokens.p50 is not None:
        extra.append(f"p50 prompt {b.prompt_tokens.p50:,.0f} tokens")
    if b.concurrency is not None:
        extra.append(f"{b.concurrency:.1f} running per engine")
    if b.prefix_cache_hit_rate is not None:
        extra.append(f"prefix-cache hits {b.prefix_cache_hit_rate:.1%}")
    if b.gpu_kv_usage_max is not None:
        extra.append(f"max GPU KV {b.gpu_kv_usage_max:.0%}")
    if b.preemption_rate is not None:
        extra.append(f"{b.preemption_rate:.3g} preemptions/s")
    return ", ".join([text, *extra])


def figures_text(analysis: AnalysisStatus | None) -> str:
    """A verdict with its key figures, for Events and messages."""
    if analysis is None:
        return "no analysis yet"
    parts: list[str] = []
    for m in analysis.metrics:
        if m.name not in (TTFT_P99, ITL_P99, EXTERNAL_SHARE):
            continue
        show = (lambda v: f"{v:.1%}") if m.name == EXTERNAL_SHARE else _seconds
        values = [f"{who} {show(v)}" for who, v in (("canary", m.canary), ("stable", m.stable)) if v is not None]
        if values:
            parts.append(f"{m.name} {' / '.join(values)}")
    figures = f"; {', '.join(parts)}" if parts else ""
    return f"{analysis.verdict.value}: {analysis.message}{figures}"


def verdict_text(ctx: Ctx) -> str:
    return f"last verdict {figures_text(ctx.evidence)}" if ctx.evidence is not None else "no verdict yet"


def failing_for(ctx: Ctx) -> str:
    since = ctx.evidence.failing_since if ctx.evidence is not None else None
    return format_duration((ctx.now - since).total_seconds()) if since is not None else "?"


def progress_text(ctx: Ctx, duration: float) -> str:
    return f"{format_duration(ctx.elapsed)} of {format_duration(duration)}"


def step_name(ctx: Ctx) -> str:
    level = ctx.level(ctx.stage.index)
    step = ctx.stage.step
    if step == 0:
        return f"canary {level.name}"
    return f"{level.name} at {ctx.spec.rollout.promotion_steps[step - 1]}%"


def cpu_text(level: Level) -> str:
    return f" ({to_quantity(level.cpu_bytes)} CPU tier)" if level.cpu_bytes is not None else ""
