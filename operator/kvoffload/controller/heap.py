"""Handing memory the operator has freed back to the OS.

glibc's malloc keeps what Python frees above its small-object allocator (objects over 512 bytes: JSON texts,
large dicts and lists) for reuse, and returns it to the OS only from the top of its heap. After a climb of 1,000
policies the operator's glibc heap held 38-86 MiB free of 59-109 MiB, and ``malloc_trim(0)`` gave 18-69 MiB of
it back (``bench/operator``, ``--mallinfo``). So the operator calls it every ``TRIM_INTERVAL`` seconds, from a
thread. Where the C library has no ``malloc_trim`` (musl), nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

TRIM_INTERVAL = 30.0
"""Seconds between two trims: a resting policy's analysis interval, so a sweep's garbage goes back once."""


def malloc_trim() -> Callable[[], bool] | None:
    """glibc's ``malloc_trim(0)`` (True when it gave memory back), or None where the C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: bool(trim(0))


async def trim_periodically(interval: float = TRIM_INTERVAL) -> None:
    """Trim the heap every ``interval`` seconds until cancelled."""
    trim = malloc_trim()
    if trim is None:
        log.debug("the C library has no malloc_trim: freed memory stays with malloc")
        return
    while True:
        await asyncio.sleep(interval)
        await asyncio.to_thread(trim)
