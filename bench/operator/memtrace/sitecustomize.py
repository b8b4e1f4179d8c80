"""Bench-only: put this folder on PYTHONPATH and the operator process reports on its memory.

- ``$KVOFFLOAD_TRACEMALLOC`` (``bench_operator.py --tracemalloc``): allocations are traced, and SIGUSR2 writes the
  40 largest allocation sites, by line and by file, to that path, then those of the highest traced moment seen
  (checked every 2 s).
- ``$KVOFFLOAD_MALLINFO`` (``--mallinfo``): SIGUSR1 writes glibc's ``mallinfo2`` and the RSS to that path, calls
  ``malloc_trim(0)`` and writes the RSS again: how much of the RSS is memory freed but still held by malloc. Then
  pymalloc's own totals: its arenas now and at their highest, and the bytes in used and in free blocks.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import os
import signal
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from types import FrameType

OUT = os.environ.get("KVOFFLOAD_TRACEMALLOC")
MALLINFO = os.environ.get("KVOFFLOAD_MALLINFO")

if OUT:
    tracemalloc.start(1)
    _at_peak: list[str] = []

    def _watch_peak() -> None:
        """Every 2 s: when the traced memory is a new high by 5%, keep the 40 largest sites by line of that moment."""
        high = 0
        while True:
            time.sleep(2.0)
            current = tracemalloc.get_traced_memory()[0]
            if current > high * 1.05:
                high = current
                stats = tracemalloc.take_snapshot().statistics("lineno")[:40]
                _at_peak[:] = [f"--- at the highest seen, {current / 2**20:.1f} MiB traced, by lineno"]
                _at_peak.extend(str(stat) for stat in stats)

    threading.Thread(target=_watch_peak, name="tracemalloc peak", daemon=True).start()

    def _dump(_signum: int, _frame: FrameType | None) -> None:
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        lines = [
            f"traced: {sum(s.size for s in snapshot.statistics('filename')) / 2**20:.1f} MiB"
            f" (peak {tracemalloc.get_traced_memory()[1] / 2**20:.1f} MiB)"
        ]
        for key in ("filename", "lineno"):
            lines.append(f"--- by {key}")
            lines += [str(stat) for stat in snapshot.statistics(key)[:40]]
        lines += _at_peak
        lines.append("--- objects the collector tracks, by type")
        census = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
        lines += [f"{n:9d} {name}" for name, n in census.most_common(40)]
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


def _pymalloc_summary() -> list[str]:
    """The totals of ``sys._debugmallocstats()``, which writes to C's stderr: Python's arenas, used and free."""
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        sink.seek(0)
        text = sink.read().decode(errors="replace")
    keep = ("# arenas allocated current", "# arenas highwater", "# bytes in allocated blocks", "# bytes in available")
    return ["pymalloc " + " ".join(line.split()) for line in text.splitlines() if line.startswith(keep)]


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
        pymalloc = _pymalloc_summary()
        before = _rss_mib()
        libc.malloc_trim(0)
        lines = [f"rss before trim: {before:.1f} MiB", f"rss after trim: {_rss_mib():.1f} MiB"]
        # arena: heap from sbrk/arenas; hblkhd: mmapped blocks; uordblks in use, fordblks free but held.
        lines += [
            f"{name}: {getattr(info, name) / 2**20:.1f} MiB"
            for name in ("arena", "hblkhd", "uordblks", "fordblks", "keepcost")
        ]
        Path(MALLINFO).write_text("\n".join(lines + pymalloc) + "\n")

    signal.signal(signal.SIGUSR1, _mallinfo)
