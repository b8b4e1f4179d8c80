"""Bench-only: put this folder on PYTHONPATH (``bench_operator.py --tracemalloc``) and the operator process traces
its allocations; SIGUSR2 writes the 40 largest allocation sites, by line and by file, to $KVOFFLOAD_TRACEMALLOC."""

from __future__ import annotations

import os
import signal
import tracemalloc
from pathlib import Path
from types import FrameType

OUT = os.environ.get("KVOFFLOAD_TRACEMALLOC")

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
