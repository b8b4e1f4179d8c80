"""The operator hands memory that glibc's malloc holds freed back to the OS (``controller/heap.py``)."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest

from kvoffload.controller.heap import malloc_trim, trim_periodically

pytestmark = pytest.mark.skipif(malloc_trim() is None, reason="the C library has no malloc_trim (not glibc)")


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def fragmented_heap() -> tuple[list[bytes], float]:
    """About 60 MiB of glibc heap (blocks over pymalloc's 512 bytes), freed but for every 64th block, so the top
    of the heap stays in use and malloc cannot shrink it by itself; the blocks kept, and the RSS after the free."""
    blocks = [bytes(1000) + bytes([i % 256]) for i in range(60_000)]
    kept = blocks[::64]
    del blocks
    gc.collect()
    return kept, rss_mib()


def test_a_trim_gives_back_the_freed_heap_that_malloc_held() -> None:
    trim = malloc_trim()
    assert trim is not None
    kept, held = fragmented_heap()
    trim()
    assert rss_mib() < held - 30, "malloc_trim(0) gave back less than half of the 60 MiB freed"
    assert len(kept) == 938


async def test_the_operators_trim_runs_every_interval() -> None:
    kept, held = fragmented_heap()
    trimming = asyncio.create_task(trim_periodically(0.05))
    try:
        for _ in range(100):
            if rss_mib() < held - 30:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"the RSS stayed at {rss_mib():.0f} MiB (held {held:.0f} MiB)")
    finally:
        trimming.cancel()
    assert len(kept) == 938
