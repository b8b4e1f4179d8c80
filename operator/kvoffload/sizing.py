"""Sizing: KV bytes per token, tokens per tier, the pinned pool, /dev/shm and host memory.

INTERFACE DRAFT: the signatures below are the contract other modules code
against; the sizing helper fills in the bodies.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.ladder import Level
from kvoffload.models import KVOffloadPolicy, KVOffloadPolicySpec
from kvoffload.validation import FieldError


@dataclass(frozen=True)
class HostMemory:
    """Host memory of one replica at one ladder level, in bytes."""

    pinned: int
    """Pinned CPU pool: the CPU tier times the overhead factor (0 without offload)."""
    shm: int
    """/dev/shm emptyDir sizeLimit: the pool plus 1 GiB (0 when no pool)."""
    request: int
    """Memory request = limit = base + pool + headroom (tmpfs pages count once)."""

    @property
    def limit(self) -> int:
        return self.request


def kv_bytes_per_token(spec: KVOffloadPolicySpec) -> int:
    """KV bytes per token for the whole model (all layers, all TP ranks together)."""
    raise NotImplementedError


def host_memory(spec: KVOffloadPolicySpec, level: Level) -> HostMemory:
    """Host memory of one replica running ``level``."""
    raise NotImplementedError


def startup_seconds(spec: KVOffloadPolicySpec, level: Level) -> int:
    """Seconds the startup probe allows: model load plus pinning the pool (grows with the pool)."""
    raise NotImplementedError


def progress_deadline_seconds(spec: KVOffloadPolicySpec, level: Level) -> float:
    """rollout.progressDeadline, stretched when pinning the pool alone needs longer."""
    raise NotImplementedError


def check_policy(policy: KVOffloadPolicy) -> list[FieldError]:
    """Problems the schema cannot see (unknown catalog entries); empty when the policy can be sized."""
    return []
