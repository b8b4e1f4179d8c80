"""What SGLang pins for a level's CPU tier: its host KV pool, exactly the tier.

Each TP rank's pool is ``--hicache-size`` × 10^9 bytes of anonymous host memory pinned with cudaHostRegister
(SGLang 0.5.23, ``mem_cache/pool_host/base.py`` line 223, ``pool_host/common.py`` ``alloc_with_host_register``),
never a /dev/shm file (``command.SGLang.pool_in_shm``). ``check`` refuses a tier that does not split into whole
gigabytes per rank, so the ranks together pin the tier's bytes, no more.
"""

from __future__ import annotations

from kvoffload.engines.engine import Rung


def pinned_bytes(level: Rung) -> int:
    """Host bytes SGLang pins for the level's CPU tier, before overheadFactor (0 without one)."""
    return level.cpu_bytes if level.cpu_bytes is not None else 0
