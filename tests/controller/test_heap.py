"""The operator's heap (``controller/heap.py``): full collections on its own schedule, and memory that glibc's malloc
holds freed handed back to the OS."""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path

import pytest

from kvoffload.controller.heap import full_collections_on_schedule, malloc_trim, tend_heap

needs_trim = pytest.mark.skipif(malloc_trim() is None, reason="the C library has no malloc_trim (not glibc)")


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


@needs_trim
def test_a_trim_gives_back_the_freed_heap_that_malloc_held() -> None:
    trim = malloc_trim()
    assert trim is not None
    kept, held = fragmented_heap()
    trim()
    assert rss_mib() < held - 30, "malloc_trim(0) gave back less than half of the 60 MiB freed"
    assert len(kept) == 938


@needs_trim
async def test_the_operators_trim_runs_every_interval() -> None:
    kept, held = fragmented_heap()
    trimming = asyncio.create_task(tend_heap(0.05))
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


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def old_garbage_cycle() -> weakref.ref[Node]:
    """Two objects that refer to each other, kept through a full collection (so they sit in the oldest generation)
    and then dropped: only a full collection frees them."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    gc.collect()
    return weakref.ref(a)


def churn() -> None:
    """Enough surviving allocations to start Python's own full collections many times over."""
    kept = [[i] for i in range(300_000)]
    del kept


async def test_full_collections_wait_for_the_operators_schedule_and_come_with_it() -> None:
    before = gc.get_threshold()
    with full_collections_on_schedule():
        dropped = old_garbage_cycle()
        churn()
        assert dropped() is not None, "a full collection ran on Python's own schedule"

        tending = asyncio.create_task(tend_heap(0.05))
        try:
            for _ in range(100):
                if dropped() is None:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the operator's schedule made no full collection")
        finally:
            tending.cancel()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_without_the_schedule_python_collects_the_oldest_generation_itself() -> None:
    dropped = old_garbage_cycle()
    churn()
    assert dropped() is None  # the churn does start full collections: the test above would see one
