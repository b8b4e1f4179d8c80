"""Sizing: KV bytes per token, tokens per tier, the pinned pool, /dev/shm and host memory."""

from __future__ import annotations

from kvoffload.models import KVOffloadPolicy
from kvoffload.validation import FieldError


def check_policy(policy: KVOffloadPolicy) -> list[FieldError]:
    """Problems the schema cannot see (unknown catalog entries); empty when the policy can be sized."""
    return []
