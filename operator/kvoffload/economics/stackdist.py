"""LRU hit ratios at every cache size from one pass over a block stream (Mattson's stack algorithm).

An access is a hit in an LRU cache of ``C`` blocks exactly when its **reuse distance**, the number
of distinct other blocks accessed since the same block's previous access, is below ``C``
(Mattson et al., 1970: LRU is a stack algorithm). A block's first access is a miss at every size.
So one histogram of reuse distances gives the whole hit-ratio curve.

Reuse distances of all accesses, at once: a re-access at position ``i`` of a block last accessed at
``p`` sees ``i - p - 1`` accesses in between, of which those that repeat a block already seen in the
window do not add a distinct block. Those are the re-accesses ``j`` whose own previous access lies
in ``(p, i)`` too: the intervals ``(prev(j), j)`` nested in ``(p, i)``. Counting nested intervals
for every interval is counting, for each interval start in end order, the earlier starts that are
greater: a per-element inversion count, done here merge-sort style with whole-array numpy steps,
O(n log n) in all. Same answer as the textbook Fenwick tree over last-access times, without a
Python loop per access.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Int64Array = npt.NDArray[np.int64]

# Interval indices fit int32 below this many re-accesses: half the memory traffic per step.
_INT32_LIMIT = 2**31


@dataclass(frozen=True, eq=False)
class ReuseProfile:
    """The LRU hit curve of one block stream, for every cache size."""

    accesses: int
    """Accesses in the stream (every block of every request)."""
    unique: int
    """Distinct blocks: the first access of each is a miss at any size."""
    hits_by_size: Int64Array
    """``hits_by_size[c]``: hits of an LRU cache of ``c`` blocks; past the end, the last entry."""

    @property
    def reaccesses(self) -> int:
        """Accesses to a block seen before: the hits of an infinite cache."""
        return self.accesses - self.unique

    @property
    def histogram(self) -> Int64Array:
        """``histogram[d]``: re-accesses at reuse distance ``d`` (the reuse-distance distribution)."""
        return np.diff(self.hits_by_size)

    def hits(self, blocks: int | None = None) -> int:
        """Hits of an LRU cache of ``blocks`` blocks (``None``: unbounded)."""
        if blocks is None:
            return self.reaccesses
        if blocks < 0:
            raise ValueError(f"blocks: must be >= 0, got {blocks}")
        return int(self.hits_by_size[min(blocks, len(self.hits_by_size) - 1)])

    def hit_ratio(self, blocks: int | None = None) -> float:
        """Share of accesses that hit an LRU cache of ``blocks`` blocks (``None``: unbounded); 0 on no access."""
        return self.hits(blocks) / self.accesses if self.accesses else 0.0

    def hit_ratios(self, sizes: Sequence[int]) -> list[float]:
        """:meth:`hit_ratio` at each of ``sizes``."""
        return [self.hit_ratio(size) for size in sizes]

    def distance_buckets(self) -> list[tuple[int, int, int]]:
        """The reuse-distance distribution in power-of-two buckets: ``(low, high, re-accesses)`` for
        distances in ``[low, high)``: ``[0, 1)``, ``[1, 2)``, ``[2, 4)``, ... up to the largest distance
        seen. First accesses have no distance and are not counted (there are :attr:`unique` of them)."""
        out: list[tuple[int, int, int]] = []
        last = len(self.hits_by_size) - 1  # distances run 0 .. last - 1
        low, high = 0, 1
        while low < last:
            top = min(high, last)
            out.append((low, high, int(self.hits_by_size[top] - self.hits_by_size[low])))
            low, high = high, high * 2
        return out


def reuse_profile(stream: npt.ArrayLike) -> ReuseProfile:
    """The LRU hit curve of a block stream (one integer block id per access), from one pass."""
    ids = _as_stream(stream)
    distances = _reuse_distances(ids, previous_access(ids))
    hits = distances[distances >= 0]
    histogram = np.bincount(hits) if hits.size else np.zeros(0, dtype=np.int64)
    hits_by_size = np.zeros(len(histogram) + 1, dtype=np.int64)
    np.cumsum(histogram, out=hits_by_size[1:])
    return ReuseProfile(accesses=int(ids.size), unique=int(ids.size - hits.size), hits_by_size=hits_by_size)


def reuse_distances(stream: npt.ArrayLike) -> Int64Array:
    """Per access: distinct other blocks accessed since the same block's previous access; -1 on a
    first access. An LRU cache of ``C`` blocks hits exactly the accesses with ``0 <= distance < C``."""
    ids = _as_stream(stream)
    return _reuse_distances(ids, previous_access(ids))


def previous_access(stream: npt.ArrayLike) -> Int64Array:
    """Per access: the position of the same block's previous access, or -1."""
    ids = _as_stream(stream)
    prev = np.full(ids.size, -1, dtype=np.int64)
    if ids.size < 2:
        return prev
    order = np.argsort(ids, kind="stable")  # equal ids stay in stream order
    ordered = ids[order]
    same = ordered[1:] == ordered[:-1]
    prev[order[1:]] = np.where(same, order[:-1], -1)
    return prev


def _as_stream(stream: npt.ArrayLike) -> Int64Array:
    ids = np.asarray(stream)
    if ids.ndim != 1:
        raise ValueError(f"stream: expected one block id per access (1-D), got shape {ids.shape}")
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"stream: expected integer block ids, got {ids.dtype}")
    return ids.astype(np.int64, copy=False)


def _reuse_distances(ids: Int64Array, prev: Int64Array) -> Int64Array:
    ends = np.flatnonzero(prev >= 0)
    starts = prev[ends]
    nested = _nested_counts(starts, ids.size)
    distances = np.full(ids.size, -1, dtype=np.int64)
    distances[ends] = ends - starts - 1 - nested
    return distances


def _nested_counts(starts: Int64Array, n: int) -> Int64Array:
    """For intervals ordered by end, with distinct ``starts`` in ``[0, n)``: per interval ``k``, how
    many intervals ``k' < k`` have ``starts[k'] > starts[k]``.

    Top down over the bits of the interval index ``k``: at bit ``b``, each group of ``2**(b+1)``
    consecutive intervals is held ordered by start, descending. An interval in the group's upper half
    (bit ``b`` set) gains the lower-half intervals ahead of it: earlier and with a greater start. Then
    each group splits, stably, into its halves, which keeps both halves ordered for the next bit.
    """
    m = starts.size
    if m < 2:
        return np.zeros(m, dtype=np.int64)
    itype: type[np.signedinteger[Any]] = np.int32 if m < _INT32_LIMIT else np.int64
    # Interval indices by start, descending, without a sort: starts are distinct positions < n.
    by_start = np.full(n, -1, dtype=itype)
    by_start[starts] = np.arange(m, dtype=itype)
    order = by_start[by_start >= 0][::-1]
    # Index and tally travel together through each split: one scatter moves both.
    pairs = np.zeros((m, 2), dtype=itype)
    pairs[:, 0] = order
    spare = np.empty_like(pairs)
    ahead = np.zeros(m + 1, dtype=itype)
    shifted = np.empty(m, dtype=itype)
    upper = np.empty(m, dtype=itype)
    lower = np.empty(m, dtype=itype)
    gained = np.empty(m, dtype=itype)
    scratch = np.empty(m, dtype=itype)
    is_upper = np.empty(m, dtype=bool)
    # Positions that index arrays are intp: numpy's fast path for take and scatter.
    position = np.arange(m, dtype=np.intp)
    group = np.empty(m, dtype=np.intp)
    target = np.empty(m, dtype=np.intp)
    moved = np.empty(m, dtype=np.intp)
    wide = np.dtype(np.int64) if itype is np.int32 else np.dtype((np.void, 16))
    for bit in range((m - 1).bit_length() - 1, -1, -1):
        index, tally = pairs[:, 0], pairs[:, 1]
        np.right_shift(index, bit, out=shifted)
        np.bitwise_and(shifted, 1, out=upper)
        np.bitwise_xor(upper, 1, out=lower)
        np.cumsum(lower, out=ahead[1:])
        np.bitwise_and(shifted, ~1, out=group, casting="unsafe")
        np.left_shift(group, bit, out=group)  # first position of the group
        np.take(ahead, group, out=scratch)
        np.subtract(ahead[:-1], scratch, out=gained)  # lower-half intervals ahead within the group
        np.multiply(gained, upper, out=scratch)
        tally += scratch
        if bit == 0:
            break
        half = 1 << bit
        # Lower half keeps its order at the group's front, upper half follows.
        np.add(group, gained, out=target)
        np.subtract(position, gained, out=moved)
        moved += half
        # Any group with an upper half has a full lower half, the last one included.
        np.not_equal(upper, 0, out=is_upper)
        np.copyto(target, moved, where=is_upper)
        spare.view(wide).reshape(m)[target] = pairs.view(wide).reshape(m)
        pairs, spare = spare, pairs
    count = np.zeros(m, dtype=np.int64)
    count[pairs[:, 0]] = pairs[:, 1]
    return count
