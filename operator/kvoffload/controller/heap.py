"""The operator's heap: when Python's collector walks it, and handing freed memory back to the OS.

- **Full collections on a schedule.** What the process has made by the time it starts watching (modules, classes,
  schemas: most of its objects) lives as long as it does, so ``full_collections_on_schedule`` freezes it, out of every
  collection. Python's own full collections then start whenever enough objects outlive two younger ones, and a
  start over 1,000 policies, which keeps hundreds of cycles' objects alive at once, ran four of them in one sweep
  over 170,000 objects: 0.47 s of a 2.8 s sweep (bench/operator). So the operator turns them off and makes one
  every ``HEAP_INTERVAL`` seconds itself; the young generations are collected as before.
- **Trims.** glibc's malloc keeps what Python frees above its small-object allocator (objects over 512 bytes: JSON
  texts, large dicts and lists) for reuse, and returns it to the OS only from the top of its heap. After a climb of
  1,000 policies the operator's glibc heap held 38-86 MiB free of 59-109 MiB, and ``malloc_trim(0)`` gave 18-69 MiB
  of it back (``bench/operator``, ``--mallinfo``). So after each full collection the operator calls it, from a
  thread. Where the C library has no ``malloc_trim`` (musl), only the collection is made.
- **Large buffers are mapped, always.** glibc raises its mmap threshold to the size of each large block freed (up to
  32 MiB), so after one 16 MiB answer body, bodies below that come from the heap and stay there: 32 hostile
  policies' Prometheus sources left the process at 238 MiB after a trim (peak 280 MiB), against 78 MiB (peak
  132 MiB) with the threshold fixed at 1 MiB (``bench/security/hostile_policies.py``, issue 33).
  ``fix_mmap_threshold`` fixes it; ``tend_heap`` calls it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

HEAP_INTERVAL = 30.0
"""Seconds between two full collections and trims: a resting policy's analysis interval, so a sweep's garbage goes
back once."""
NO_AUTOMATIC_FULL_COLLECTION = 2**30
"""A third-generation threshold that Python's count of second-generation collections never reaches."""


MMAP_THRESHOLD = 1 << 20
"""Blocks from this size up are mapped on their own, and unmapped when freed."""
M_MMAP_THRESHOLD = -3
"""glibc's mallopt parameter (malloc.h)."""


def fix_mmap_threshold(size: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``size`` (which stops its dynamic raising); False where there is no mallopt."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, size))


def malloc_trim() -> Callable[[], bool] | None:
    """glibc's ``malloc_trim(0)`` (True when it gave memory back), or None where the C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: bool(trim(0))


@contextlib.contextmanager
def full_collections_on_schedule() -> Iterator[None]:
    """Within: every object made before is frozen, and Python's automatic full collections are off (``tend_heap``
    makes them). After: as before, for a process that goes on (tests run the operator in theirs)."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(thresholds[0], thresholds[1], NO_AUTOMATIC_FULL_COLLECTION)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


async def tend_heap(interval: float = HEAP_INTERVAL) -> None:
    """Every ``interval`` seconds until cancelled: a full collection, then a trim (first: ``fix_mmap_threshold``)."""
    if not fix_mmap_threshold():
        log.debug("the C library has no mallopt: large blocks freed may stay with malloc")
    trim = malloc_trim()
    if trim is None:
        log.debug("the C library has no malloc_trim: freed memory stays with malloc")
    while True:
        await asyncio.sleep(interval)
        gc.collect()
        if trim is not None:
            await asyncio.to_thread(trim)
