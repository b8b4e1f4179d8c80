"""Injected faults: added latency, TTFT and ITL multipliers from a given time on, an outage (503 everywhere), a
share of requests that fail (finished_reason ``error``, HTTP 500) while the others keep their latency, a cold
start (latency added to each request that misses the GPU prefix cache), and slow restores (latency added to each
request that restored prompt tokens from an offload tier: a tier slower than recomputing what it holds).

Set by flags (or ``KVOFFLOAD_EMULATE_*`` variables), or at runtime with ``POST /emulator/faults``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class Faults:
    """Injected faults. Times are ``time.monotonic()`` values; None: not scheduled."""

    added_latency_s: float = 0.0
    ttft_multiplier: float = 1.0
    ttft_multiplier_from: float | None = None
    itl_multiplier: float = 1.0
    itl_multiplier_from: float | None = None
    outage_from: float | None = None
    outage_until: float | None = None
    error_share: float = 0.0
    """Share of the requests that fail, as vLLM fails a request whose KV load failed (``kv_load_failure_policy``
    "fail", its default): ``finished_reason="error"`` and HTTP 500."""
    error_share_from: float | None = None
    miss_latency_s: float = 0.0
    """Added to the first token of a request that found none of its prompt in the GPU prefix cache. A fresh engine
    misses each shared prefix once and a warm one hits it, so this raises TTFT only while the cache fills."""
    restore_latency_s: float = 0.0
    """Added to the first token of a request that restored any prompt tokens from an offload tier (CPU or
    secondary): the restore costs this much more than priced, so a tier can cost more than the prefill it saves."""
    _arrivals: int = 0
    """Requests that arrived while ``error_share`` held: which fail is counted, not drawn, so the share is exact."""

    def fails(self, now: float) -> bool:
        """Whether the request arriving at ``now`` fails: the n-th fails when floor(n x share) steps up."""
        if self.error_share <= 0 or self.error_share_from is None or now < self.error_share_from:
            return False
        self._arrivals += 1
        return int(self._arrivals * self.error_share) > int((self._arrivals - 1) * self.error_share)

    def ttft_factor(self, now: float) -> float:
        if self.ttft_multiplier_from is not None and now >= self.ttft_multiplier_from:
            return self.ttft_multiplier
        return 1.0

    def itl_factor(self, now: float) -> float:
        if self.itl_multiplier_from is not None and now >= self.itl_multiplier_from:
            return self.itl_multiplier
        return 1.0

    def added_for(self, gpu_hit_tokens: int, restored_tokens: int = 0) -> float:
        """The latency added to a request's first token, by what it found in the GPU prefix cache and what it
        restored from the offload tiers."""
        miss = self.miss_latency_s if gpu_hit_tokens == 0 else 0.0
        restore = self.restore_latency_s if restored_tokens > 0 else 0.0
        return self.added_latency_s + miss + restore

    def in_outage(self, now: float) -> bool:
        if self.outage_from is None or now < self.outage_from:
            return False
        return self.outage_until is None or now < self.outage_until

    def describe(self, now: float) -> dict[str, Any]:
        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - now, 3)

        return {
            "added_latency": self.added_latency_s,
            "ttft_multiplier": self.ttft_multiplier,
            "ttft_multiplier_in": rel(self.ttft_multiplier_from),
            "itl_multiplier": self.itl_multiplier,
            "itl_multiplier_in": rel(self.itl_multiplier_from),
            "outage_in": rel(self.outage_from),
            "outage_ends_in": rel(self.outage_until),
            "in_outage": self.in_outage(now),
            "error_share": self.error_share,
            "error_share_in": rel(self.error_share_from),
            "miss_latency": self.miss_latency_s,
            "restore_latency": self.restore_latency_s,
        }


def apply_faults(faults: Faults, body: Mapping[str, Any], now: float) -> None:
    """Update ``faults`` from a ``POST /emulator/faults`` body; ``*_after`` are seconds from ``now``."""

    def num(key: str) -> float | None:
        value = body.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{key}: must be a number")
        if value < 0:
            raise ValueError(f"{key}: must be >= 0")
        return float(value)

    known = {
        "clear",
        "added_latency",
        "ttft_multiplier",
        "ttft_multiplier_after",
        "itl_multiplier",
        "itl_multiplier_after",
        "outage_after",
        "outage_for",
        "error_share",
        "error_share_after",
        "miss_latency",
        "restore_latency",
    }
    unknown = sorted(set(body) - known)
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown fault (known: {', '.join(sorted(known))})")
    if body.get("clear"):
        fresh = Faults()
        for key, value in vars(fresh).items():
            setattr(faults, key, value)
    if (v := num("added_latency")) is not None:
        faults.added_latency_s = v
    if (v := num("ttft_multiplier")) is not None:
        faults.ttft_multiplier = v
        faults.ttft_multiplier_from = now + (num("ttft_multiplier_after") or 0.0)
    if (v := num("itl_multiplier")) is not None:
        faults.itl_multiplier = v
        faults.itl_multiplier_from = now + (num("itl_multiplier_after") or 0.0)
    if (v := num("error_share")) is not None:
        if v > 1:
            raise ValueError("error_share: must be at most 1")
        faults.error_share = v
        faults.error_share_from = now + (num("error_share_after") or 0.0)
        faults._arrivals = 0
    if (v := num("miss_latency")) is not None:
        faults.miss_latency_s = v
    if (v := num("restore_latency")) is not None:
        faults.restore_latency_s = v
    if (v := num("outage_after")) is not None or "outage_for" in body:
        start = now + (v or 0.0)
        duration = num("outage_for")
        faults.outage_from = start
        faults.outage_until = None if duration is None else start + duration


def faults_from_options(
    *,
    added_latency: float = 0.0,
    ttft_multiplier: float = 1.0,
    ttft_multiplier_after: float | None = None,
    itl_multiplier: float = 1.0,
    itl_multiplier_after: float | None = None,
    outage_after: float | None = None,
    outage_for: float | None = None,
    error_share: float = 0.0,
    error_share_after: float | None = None,
    restore_latency: float = 0.0,
    start: float,
) -> Faults:
    """Faults from command-line options, whose times count from engine start."""
    f = Faults(
        added_latency_s=added_latency,
        ttft_multiplier=ttft_multiplier,
        itl_multiplier=itl_multiplier,
        restore_latency_s=restore_latency,
    )
    if ttft_multiplier != 1.0:
        f.ttft_multiplier_from = start + (ttft_multiplier_after or 0.0)
    if itl_multiplier != 1.0:
        f.itl_multiplier_from = start + (itl_multiplier_after or 0.0)
    if error_share > 0:
        f.error_share = error_share
        f.error_share_from = start + (error_share_after or 0.0)
    if outage_after is not None:
        f.outage_from = start + outage_after
        f.outage_until = None if outage_for is None else f.outage_from + outage_for
    return f
