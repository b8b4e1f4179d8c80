"""spec.workloadRef: how far the taken-over Deployment may shrink, and when its template starts a new ladder.

Its replicas go down only as the operator's own engines become Ready, so the Ready engines of both never fall
below what it served before (or spec.replicas, if fewer); they never go back up while the policy holds it. The
hand-back on deletion is the adapter's (``controller/takeover.py``).
"""

from __future__ import annotations

from kvoffload.api.status import WorkloadStatus
from kvoffload.rollout.context import Ctx


def operator_ready(ctx: Ctx) -> int:
    """The operator's Ready engines this cycle, whatever level or role they hold."""
    seen = (ctx.obs.stable, ctx.obs.canary, *ctx.obs.retiring)
    return sum(sum(1 for p in s.pods if p.ready) if s.pods else s.ready_replicas for s in seen)


def workload_status(ctx: Ctx) -> WorkloadStatus | None:
    """The taken-over Deployment's status: the replicas it keeps now."""
    seen = ctx.obs.workload
    if seen is None:
        return None
    serving = min(seen.original_replicas, ctx.spec.replicas)
    return WorkloadStatus(
        name=seen.name,
        template_digest=seen.digest,
        original_replicas=seen.original_replicas,
        replicas=min(seen.replicas, max(0, serving - operator_ready(ctx))),
    )


def template_changed(ctx: Ctx) -> str | None:
    """What changed, when the taken-over Deployment's pod template is not the one the ladder started on."""
    seen, held = ctx.obs.workload, ctx.status.workload
    if seen is None or held is None or seen.digest == held.template_digest:
        return None
    return f"Deployment {seen.name}'s pod template changed ({held.template_digest} → {seen.digest})"
