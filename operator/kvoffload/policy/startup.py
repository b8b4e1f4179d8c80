"""How long an engine may take to start: the startup probe's budget (model load plus pinning the pool) and
the progress deadline stretched to it (docs/design.md, "Startup").
"""

from __future__ import annotations

import math

from kvoffload.api.quantity import GIB, parse_duration
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.policy.catalog import find_model
from kvoffload.policy.hostmemory import pinned_pool_bytes
from kvoffload.policy.ladder import Level

# --- figures ---------------------------------------------------------------------

# Pinning host memory on an H200 host: 0.6 s / 1 GiB, 2.8 s / 4 GiB, 12.6 s / 16 GiB
# (docs/design.md "Startup"); the slope between the ends is (12.6 - 0.6) / 15 = 0.8 s/GiB.
# Raw cuMemHostAlloc / shm + cuMemHostRegister on an H200 host measured 0.40-0.69 s/GiB
# (1-32 GiB); 0.8 is the slower, end-to-end figure.
PIN_SECONDS_PER_GIB = 0.8
# Engine start without offload: process start, CUDA init, profiling and graph capture.
# An assumption (typical vLLM start of a small model is 1-3 min), not measured here.
MODEL_LOAD_BASE_SECONDS = 180.0
# Reading weights into GPU memory, from a node-local cache. An assumption (~1 GiB/s
# safetensors load), not measured here; it only makes big models' budgets longer.
WEIGHT_LOAD_SECONDS_PER_GIB = 1.0
# Startup budget = this × the estimate: pinning and loading vary with NUMA, THP and disks.
STARTUP_SAFETY_FACTOR = 2.0
# Scheduling, image start and the first readiness probe, on top of the startup budget.
PROGRESS_DEADLINE_MARGIN_SECONDS = 120.0
# The stretch of rollout.progressDeadline stops here (docs/design.md, "Startup"). The largest
# budget a policy that fits a catalog node can have: a pool of a whole 2 TiB node (1,638 s of
# pinning) plus the 180 s base and a model's weights on one GPU (at most ~625 s, DeepSeek-V3),
# doubled: about 81 minutes. Two hours is above every such budget, so it bites only where the
# estimate has run away, and an unschedulable canary cannot hold the ladder for longer.
MAX_STRETCHED_PROGRESS_DEADLINE_SECONDS = 2 * 3600.0


def weight_bytes(spec: KVOffloadPolicySpec) -> int | None:
    """Rough weight bytes (all ranks) from the catalog; None for models it does not know."""
    entry = find_model(spec.model.name)
    return entry.weight_bytes if entry is not None else None


def startup_seconds(spec: KVOffloadPolicySpec, level: Level) -> int:
    """Seconds the startup probe allows: model load plus pinning the pool (grows with the pool).

    ``STARTUP_SAFETY_FACTOR × (base + weights GiB × load rate + pool GiB × pin rate)``,
    rounded up to 10 s. Weights of a model outside the catalog count as zero.
    """
    weights = (weight_bytes(spec) or 0) / spec.gpu.count  # ranks load their shards in parallel
    estimate = (
        MODEL_LOAD_BASE_SECONDS
        + weights / GIB * WEIGHT_LOAD_SECONDS_PER_GIB
        + pinned_pool_bytes(spec, level) / GIB * PIN_SECONDS_PER_GIB
    )
    return math.ceil(estimate * STARTUP_SAFETY_FACTOR / 10) * 10


def progress_deadline_seconds(spec: KVOffloadPolicySpec, level: Level) -> float:
    """rollout.progressDeadline, stretched to the startup budget plus a margin when that is longer,
    but by no more than to ``MAX_STRETCHED_PROGRESS_DEADLINE_SECONDS`` (a longer progressDeadline
    that the spec sets itself is kept)."""
    stretched = min(
        startup_seconds(spec, level) + PROGRESS_DEADLINE_MARGIN_SECONDS, MAX_STRETCHED_PROGRESS_DEADLINE_SECONDS
    )
    return max(parse_duration(spec.rollout.progress_deadline), stretched)
