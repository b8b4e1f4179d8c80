"""Bench-only: put this folder on PYTHONPATH and the operator process reports on its memory.

- ``$KVOFFLOAD_TRACEMALLOC`` (``bench_operator.py --tracemalloc``): allocations are traced, and SIGUSR2 writes the
  40 largest allocation sites, by line and by file, to that path.
- ``$KVOFFLOAD_MALLINFO`` (``--mallinfo``): SIGUSR1 writes glibc's ``mallinfo2`` and the RSS to that path, calls
  ``malloc_trim(0)`` and writes the RSS again: how much of the RSS is memory freed but still held by malloc.
"""

from __future__ import annotations

import ctypes
import os
import signal
import tracemalloc
from pathlib import Path
from types import FrameType

OUT = os.environ.get("KVOFFLOAD_TRACEMALLOC")
MALLINFO = os.environ.get("KVOFFLOAD_MALLINFO")

if OUT:
    tracemalloc.start(1)

    def _dump(_signum: int, _frame: FrameType | None) -> None:
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        lines = [f"traced: {sum(s.size for s in snapshot.statistics('filename')) / 2**20:.1f} MiB"]
        for key in ("filename", "lineno"):
            lines.append(f"--- by {key}")
            lines += [str(stat) for stat in snapshot.statistics(key)[:40]]
        Path(OUT).write_text("\n".join(lines) + "\n")

    signal.signal(signal.SIGUSR2, _dump)


MALLINFO2_FIELDS = [
    "arena",
    "ordblks",
    "smblks",
    "hblks",
    "hblkhd",
    "usmblks",
    "fsmblks",
    "uordblks",
    "fordblks",
    "keepcost",
]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in MALLINFO2_FIELDS]


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


if MALLINFO:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2

    def _mallinfo(_signum: int, _frame: FrameType | None) -> None:
        info = libc.mallinfo2()
        before = _rss_mib()
        libc.malloc_trim(0)
        lines = [f"rss before trim: {before:.1f} MiB", f"rss after trim: {_rss_mib():.1f} MiB"]
        # arena: heap from sbrk/arenas; hblkhd: mmapped blocks; uordblks in use, fordblks free but held.
        lines += [
            f"{name}: {getattr(info, name) / 2**20:.1f} MiB"
            for name in ("arena", "hblkhd", "uordblks", "fordblks", "keepcost")
        ]
        Path(MALLINFO).write_text("\n".join(lines) + "\n")

    signal.signal(signal.SIGUSR1, _mallinfo)
