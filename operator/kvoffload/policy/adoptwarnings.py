"""What the derived levels of an adopted Deployment (spec.workloadRef) replace in the referenced pod, or keep
though the spec says otherwise: told once per render input, from the sized plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvoffload.api.types import KVOffloadPolicy
from kvoffload.engines import engine_for
from kvoffload.policy.sized import Sized
from kvoffload.policy.workload import adopted_container


def _probe_seconds(probe: Mapping[str, Any]) -> int:
    """How long a probe lets a container start before the kubelet restarts it (Kubernetes' defaults)."""
    return int(probe.get("initialDelaySeconds", 0)) + int(probe.get("periodSeconds", 10)) * int(
        probe.get("failureThreshold", 3)
    )


def workload_warnings(policy: KVOffloadPolicy, sized: Sized) -> list[str]:
    """What the derived levels replace in the referenced pod, or keep though the spec says otherwise: for an
    Event and for ``kvoffload render --workload``, from the policy's sized plan. Empty without an adopted workload."""
    spec = policy.spec
    workload = spec.workload
    if workload is None:
        return []
    engine = engine_for(spec)
    container = adopted_container(workload)
    name = workload.container
    derived = engine.derive(container, spec, sized[0].level)
    found: list[str] = []
    if derived.removed_flags:
        found.append(
            f"container {name!r} sets {', '.join(derived.removed_flags)}, which every level replaces with its own "
            "offload flags"
        )
    if derived.removed_env:
        found.append(
            f"container {name!r} sets {', '.join(derived.removed_env)}, which every level replaces with its own "
            "offload variables"
        )
    served = engine.served(container)
    if served.max_model_len is None:
        found.append(
            f"container {name!r} sets no context length: {engine.title} takes the model's own, while the sizing "
            f"assumes spec.model.maxModelLen ({spec.model.max_model_len})"
        )
    if spec.gpu.node_selector or spec.gpu.tolerations:
        found.append(
            "spec.gpu.nodeSelector and spec.gpu.tolerations are not applied: the derived pods keep the referenced "
            "pod's scheduling"
        )
    probe = container.get("startupProbe")
    if isinstance(probe, Mapping):
        allowed = _probe_seconds(probe)
        needed = max(level.startup_seconds for level in sized)
        if allowed < needed:
            found.append(
                f"container {name!r}'s startupProbe allows {allowed} s; loading the model and pinning the top "
                f"level's pool may take up to {needed} s, and the derived pods keep the probe as written"
            )
    ports = [p.get("containerPort") for p in container.get("ports") or []]
    if served.port not in ports:
        found.append(
            f"container {name!r} declares no containerPort {served.port}, where {engine.title} serves: Prometheus "
            "finds no target to scrape"
        )
    return found
